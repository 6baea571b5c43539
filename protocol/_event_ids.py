"""The ``<epoch>:<seq>`` event-id namespace.

Theory of operation
-------------------
Every SSE event weir emits carries an id ``<epoch>:<seq>``:

* ``epoch`` is exactly 8 lowercase hex digits.  An epoch is allocated by the session
  store for one (session, stream, generation) and is never reused within a session,
  so the id alone names its stream (MCP 2025-11-25 asks that event ids identify the
  originating stream) and ids are unique across all of a session's streams.
* ``seq`` is a decimal counter starting at 0 within the epoch (0 is the priming
  event where one is sent).

Because epochs come from the store and not from a per-process counter, a cursor
means the same thing on every replica.  Anything that does not match the grammar --
a per-process counter such as ``42`` in particular -- is *malformed* and refused
with 400 ``cursor_invalid``; this module never guesses.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from typing import Final

from ._errors import Reason, RemoteProtocolError

_EVENT_ID: Final = re.compile(r"([0-9a-f]{8}):(0|[1-9][0-9]{0,17})")
_EPOCH: Final = re.compile(r"[0-9a-f]{8}")
MAX_EPOCH: Final = 0xFFFFFFFF


@dataclass(frozen=True, slots=True, order=True)
class EventId:
    """A parsed event id; ordering is by ``(epoch, seq)``.

    Raises:
        ValueError: on construction with an epoch that is not 8 lowercase hex
            digits or a negative ``seq``.
    """

    epoch: str
    seq: int

    def __post_init__(self) -> None:
        if _EPOCH.fullmatch(self.epoch) is None:
            raise ValueError(f"epoch must be 8 lowercase hex digits, got {self.epoch!r}")
        if self.seq < 0:
            raise ValueError(f"seq must be >= 0, got {self.seq}")

    def __str__(self) -> str:
        return f"{self.epoch}:{self.seq}"

    def next(self) -> EventId:
        """The id that follows this one on the same stream."""
        return _trusted(self.epoch, self.seq + 1)


def _trusted(epoch: str, seq: int) -> EventId:
    # For ids the core formats itself from a validated epoch: skip re-validation.
    eid = object.__new__(EventId)
    object.__setattr__(eid, "epoch", epoch)
    object.__setattr__(eid, "seq", seq)
    return eid


def format_epoch(n: int) -> str:
    """Render an epoch number (0 .. 2**32-1) as 8 lowercase hex digits."""
    if not 0 <= n <= MAX_EPOCH:
        raise ValueError(f"epoch number out of range: {n}")
    return f"{n:08x}"


class EpochPermutation:
    """A session's epochs: its stream counter under a keyed permutation.

    A four-round Feistel network on the 32-bit counter, keyed by the session's
    secret ``salt`` (round ``i`` of half ``h``: the first two bytes of
    ``SHA-1(salt || i || h)``).  A bijection, so epochs are still unique within the
    session, but without the salt the next epoch (or any other stream's) cannot be
    guessed from one seen.  The Redis store computes the same function in Lua.
    Build one per session and keep it: the keyed hash state is prepared once.
    """

    __slots__ = ("_keyed",)

    def __init__(self, salt: str) -> None:
        self._keyed = hashlib.sha1(salt.encode("latin-1"))

    def _round(self, i: int, half: int) -> int:
        h = self._keyed.copy()
        h.update(bytes((i, half >> 8, half & 0xFF)))
        return int.from_bytes(h.digest()[:2], "big")

    def epoch(self, n: int) -> str:
        """The epoch of the ``n``-th stream (``n`` in 0 .. 2**32-1).

        Raises:
            ValueError: ``n`` out of range.
        """
        if not 0 <= n <= MAX_EPOCH:
            raise ValueError(f"epoch number out of range: {n}")
        left, right = n >> 16, n & 0xFFFF
        for i in (0, 1, 2, 3):
            left, right = right, left ^ self._round(i, right)
        return "%08x" % ((left << 16) | right)

    def number(self, epoch: str) -> int:
        """The counter value that :meth:`epoch` turned into ``epoch`` (its inverse)."""
        value = int(epoch, 16)
        left, right = value >> 16, value & 0xFFFF
        for i in (3, 2, 1, 0):
            left, right = right ^ self._round(i, left), left
        return (left << 16) | right


def scramble_epoch(n: int, salt: str) -> str:
    """``EpochPermutation(salt).epoch(n)`` (see :class:`EpochPermutation`)."""
    return EpochPermutation(salt).epoch(n)


def epoch_number(epoch: str, salt: str) -> int:
    """``EpochPermutation(salt).number(epoch)``: the inverse of :func:`scramble_epoch`."""
    return EpochPermutation(salt).number(epoch)


def parse_event_id(raw: str) -> EventId:
    """Parse a ``Last-Event-ID`` value.

    Raises:
        RemoteProtocolError: 400 with reason ``cursor_invalid`` if ``raw`` is not in
            the ``<epoch>:<seq>`` namespace.
    """
    m = _EVENT_ID.fullmatch(raw.strip(" \t"))
    if m is None:
        shown = raw if len(raw) <= 64 else raw[:61] + "..."
        raise RemoteProtocolError(
            f"Last-Event-ID {shown!r} is not an event id of this server "
            "(expected '<8 hex digit epoch>:<seq>')",
            http_status=400,
            reason=Reason.CURSOR_INVALID,
        )
    return EventId(m.group(1), int(m.group(2)))
