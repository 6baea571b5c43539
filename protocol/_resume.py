"""Which stream a GET attaches to, and who may resume what.

Theory of operation
-------------------
A GET either opens the session's standalone stream or, with ``Last-Event-ID``,
resumes the stream its cursor names.  The rules, the same for every driver:

* **Policy.**  With resumption ``off`` a cursor is 409 ``cursor_unknown``: the
  server keeps no history to resume from, and says so instead of replaying from
  the head (:func:`check_resume_policy`).
* **One live standalone stream.**  A GET without a cursor attaches to the
  session's standalone stream; if one is already being written, the second is
  409 ``stream_conflict`` -- two readers of one live stream would each miss what
  the other read.  A standalone stream that ended (fenced by a rebind, say) is
  replaced by a new one (:func:`standalone_plan`).
* **A cursor is bound to its channel.**  A stream opened under one channel
  generation can be resumed only under the same one, so a client fenced by a
  rebind cannot read what was sent to its successor (:func:`check_cursor_channel`).
* **The newest reader wins.**  A resumption of a stream that is still attached
  to an older connection means the client gave up on that connection (it is
  half-open or gone): the old writer is displaced, not the new reader refused
  (:func:`displaces_writer`).

From a shared store
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
  issued), is 409 ``cursor_unknown``.  A cursor of another channel generation is refused
  as the channel rules say (fenced clients do not read their successor's stream).
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

from ._binding import ChannelVerdict, channel_refusal
from ._errors import Reason, RemoteProtocolError
from ._event_ids import EventId
from ._sse import encode_comment
from ._states import StreamState
from ._streams import StreamKind, StreamLog

#: Resumption policies: also from a shared store (any replica), only from the
#: process that holds the stream (``pinned``), or none.
RESUME_POLICIES: Final = ("shared", "pinned", "off")

_ATTACHED: Final = (StreamState.LIVE_ATTACHED, StreamState.FINAL_ATTACHED)


def check_resume_policy(cursor: EventId | None, policy: str) -> None:
    """Refuse a cursor when resumption is ``off``.

    Raises:
        RemoteProtocolError: 409 ``cursor_unknown``.
    """
    if cursor is not None and policy == "off":
        raise RemoteProtocolError(
            "this server does not resume streams (resumption policy 'off')",
            http_status=409,
            reason=Reason.CURSOR_UNKNOWN,
        )


def standalone_plan(stream: StreamLog | None) -> bool:
    """For a GET without a cursor: True to open a new standalone stream, False to
    attach to ``stream``.

    Raises:
        RemoteProtocolError: 409 ``stream_conflict`` if ``stream`` is being written.
    """
    if stream is None or stream.state is StreamState.CLOSED:
        return True
    if stream.state is StreamState.LIVE_ATTACHED:
        raise RemoteProtocolError(
            "this session already has an open GET stream",
            http_status=409,
            reason=Reason.STREAM_CONFLICT,
        )
    return False


def check_cursor_channel(binding: int, token: tuple[int, str] | None) -> None:
    """A stream opened under channel generation ``binding`` resumes only under it.

    Raises:
        RemoteProtocolError: 409 ``channel_unbound``.
    """
    if binding != (token[0] if token else 0):
        raise channel_refusal(
            ChannelVerdict.UNBOUND,
            None,
            "this cursor was issued on another channel; rebind to resume it",
        )


def displaces_writer(stream: StreamLog) -> bool:
    """Is a writer still attached that a resumption must displace (newest reader wins)?"""
    return stream.state in _ATTACHED


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
