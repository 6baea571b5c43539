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

import re
from dataclasses import dataclass
from typing import Final

from ._errors import Reason, RemoteProtocolError

_EVENT_ID: Final = re.compile(r"([0-9a-f]{8}):(0|[1-9][0-9]{0,17})")
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
        if len(self.epoch) != 8 or not all(c in "0123456789abcdef" for c in self.epoch):
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
