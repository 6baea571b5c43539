"""Serving a cursor from a shared store: replay, then tail, as steps a driver performs.

Theory of operation
-------------------
With a shared store, a client may resume (``Last-Event-ID``) on any replica a
stream another replica produced.  That replica's log is not here, so the events
come from the store: exactly those after the cursor, in order, then the live ones
as the producer appends them, until the final one.  :class:`StoreTail` decides
everything about that walk and does none of its I/O; the driver loops::

    tail = StoreTail(cursor, info..., token, now=..., ...)   # may refuse: 409
    events = read_events(epoch, cursor.seq)
    while True:
        for step in tail.feed(events, now):     # the first feed may refuse: 409
            ...perform TailSend / TailExpire / TailPause...
        if tail.ended:
            break
        events = read_events(epoch, tail.after)

The rules it keeps:

* **Never from the head.**  A cursor whose stream the store does not know, or whose
  events it no longer holds (trimmed, or past the newest: a cursor the stream never
  issued), is 409 ``cursor_unknown``.  A cursor of another channel generation is refused as the
  channel rules say (fenced clients do not read their successor's stream).
* **Exact framing.**  Each event is framed as the producing replica framed it
  (same id), after a ``: replica=<id>`` comment naming the replica that produced it.
* **Bounded waiting.**  While the store has nothing new, the tail polls with a
  backoff (10 ms doubling to 250 ms), sends a keep-alive comment when the stream
  was quiet for ``keepalive`` seconds, and gives up at ``give_up_after``.
* **A dead producer is noticed.**  After a whole lease of silence the tail asks
  the store (at most every half lease) to expire the producer's claim
  (:class:`TailExpire`); if its lease ran out, the call's outcome becomes
  ``interrupted`` and arrives as the final event on the next read.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final, Protocol

from ._errors import Reason, RemoteProtocolError
from ._event_ids import EventId
from ._resume import check_cursor_channel
from ._sse import encode_comment
from ._streams import StreamKind, StreamLog

#: The keep-alive comment a quiet stream gets (an SSE comment line, no event).
KEEPALIVE: Final = b": \n\n"


class StoredFrame(Protocol):
    """What the tail needs of one stored event (a store's own event type)."""

    @property
    def seq(self) -> int: ...
    @property
    def data(self) -> bytes: ...
    @property
    def final(self) -> bool: ...
    @property
    def replica(self) -> str: ...


@dataclass(frozen=True, slots=True)
class TailSend:
    """Write ``data`` to the response's body."""

    data: bytes


@dataclass(frozen=True, slots=True)
class TailExpire:
    """Ask the store to expire the producing replica's claim if its lease ran out
    (a store that cannot answer now is no reason to stop: carry on)."""


@dataclass(frozen=True, slots=True)
class TailPause:
    """Wait until ``until`` before the next read."""

    until: float


TailStep = TailSend | TailExpire | TailPause

_EXPIRE: Final = TailExpire()


def _unknown(text: str) -> RemoteProtocolError:
    return RemoteProtocolError(text, http_status=409, reason=Reason.CURSOR_UNKNOWN)


class StoreTail:
    """One resumption served from a shared store (see the module docstring).

    ``binding``/``last_seq``/``finished`` are the store's answer about the cursor's
    stream (``binding`` ``None``: no such stream); ``token`` the request's channel
    token.  ``after`` is the seq of the last event sent (the next read's cursor);
    ``ended`` says the response is complete.
    """

    FIRST_POLL: Final = 0.01
    MAX_POLL: Final = 0.25

    __slots__ = (
        "_delay",
        "_give_up_at",
        "_keepalive",
        "_last_check",
        "_last_event",
        "_lease",
        "_quiet_since",
        "_replica",
        "_shape",
        "_started",
        "after",
        "cursor",
        "ended",
    )

    def __init__(
        self,
        cursor: EventId,
        *,
        binding: int | None,
        last_seq: int,
        finished: bool,
        token: tuple[int, str] | None,
        now: float,
        keepalive: float | None,
        lease: float,
        give_up_after: float,
        replica: str,
    ) -> None:
        """Raises: RemoteProtocolError: 409 ``cursor_unknown`` (no such stream), or
        the channel refusal of ``token``."""
        if binding is None:
            raise _unknown(f"no stream with epoch {cursor.epoch} in this session")
        check_cursor_channel(binding, token)
        self.cursor = cursor
        self.after = cursor.seq
        self.ended = finished and cursor.seq >= last_seq  # nothing more will come
        self._shape = StreamLog(cursor.epoch, StreamKind.REQUEST)
        self._replica = replica
        self._keepalive = keepalive
        self._lease = lease
        self._give_up_at = now + give_up_after
        self._quiet_since = self._last_event = now
        self._last_check = -math.inf
        self._delay = self.FIRST_POLL
        self._started = False

    def feed(self, events: Sequence[StoredFrame] | None, now: float) -> list[TailStep]:
        """The store's answer to the last read (``None``: it holds no events after
        :attr:`after` any more) -> what to do before the next read.

        Raises:
            RemoteProtocolError: 409 ``cursor_unknown`` if the *first* read finds
                the cursor's events gone (after that, a gap just ends the stream).
        """
        first, self._started = not self._started, True
        if events is None:
            if first:
                raise _unknown(f"event {self.cursor} is not held for this session")
            self.ended = True
            return []
        if self.ended:
            return []
        if now >= self._give_up_at:
            self.ended = True
            return []
        if events:
            return [self._frames(events, now)]
        steps: list[TailStep] = []
        if self._keepalive is not None and now - self._quiet_since >= self._keepalive:
            steps.append(TailSend(KEEPALIVE))
            self._quiet_since = now
        if now - self._last_event >= self._lease and now - self._last_check >= self._lease / 2:
            self._last_check = now
            steps.append(_EXPIRE)
        steps.append(TailPause(min(now + self._delay, self._give_up_at)))
        self._delay = min(self._delay * 2, self.MAX_POLL)
        return steps

    def _frames(self, events: Sequence[StoredFrame], now: float) -> TailSend:
        parts: list[bytes] = []
        for e in events:
            if e.seq <= self.after:
                continue  # already sent (a store may answer with an overlap)
            parts.append(encode_comment(f"replica={e.replica or self._replica}", blank_line=False))
            parts.append(self._shape.frame(e.seq, e.data.decode()))
            self.after = e.seq
            if e.final:
                self.ended = True
                break
        self._delay = self.FIRST_POLL
        self._quiet_since = self._last_event = now
        return TailSend(b"".join(parts))
