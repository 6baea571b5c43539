"""Per-session SSE streams: their event logs, cursors and replay.

Theory of operation
-------------------
Every message the server sends on an SSE stream is first appended to that
stream's :class:`StreamLog` and only then written, by whichever writer is attached,
from the log.  A writer is nothing but a cursor into the log, so:

* a reconnect with ``Last-Event-ID: <epoch>:<n>`` gets exactly the frames with
  ``seq > n`` of *that* stream (the epoch names the stream), then continues live
  from the same log -- no gap and no duplicate at the switch, by construction;
* nothing is ever reordered: frames leave in append order.

Each frame is SSE-encoded once, at append time (``id: <epoch>:<seq>`` unless ids
are disabled).  Logs are bounded: a log keeps at most ``max_events`` frames (older
ones are dropped; a cursor older than what is kept is ``cursor_unknown``, never
silently skipped).  :class:`StreamTable` holds one session's logs by epoch and
forgets the oldest closed streams beyond ``max_closed``.

State changes go through :mod:`protocol._states`.
"""

from __future__ import annotations

import enum
from collections import OrderedDict
from collections.abc import Callable, Iterator

from ._errors import Reason, RemoteProtocolError
from ._event_ids import EventId, _trusted
from ._sse import encode_comment, encode_event
from ._states import StreamInput, StreamState, stream_transition

#: A stream log cuts its dropped frames off the list's front after this many.
_COMPACT_AFTER = 64


class StreamKind(enum.Enum):
    """What a stream carries."""

    REQUEST = "request"  # the response stream of one POSTed request
    STANDALONE = "standalone"  # the session's GET stream
    LEGACY = "legacy"  # the single stream of the 2024-11-05 HTTP+SSE transport


class StreamLog:
    """The ordered, bounded log of one stream's frames.

    Args:
        epoch: the stream's epoch (8 lowercase hex digits), unique in its session.
        kind: what the stream carries.
        max_events: how many frames are retained for replay.
        emit_ids: write ``id:`` lines (False for resumption policy ``off``).
    """

    __slots__ = (
        "_drained",
        "_frames",
        "_head",
        "_next_seq",
        "_undrained_bytes",
        "binding",
        "emit_ids",
        "epoch",
        "kind",
        "max_events",
        "on_closed",
        "prefix",
        "retained_bytes",
        "state",
    )

    def __init__(
        self,
        epoch: str,
        kind: StreamKind,
        *,
        max_events: int = 4096,
        emit_ids: bool = True,
        replica: str | None = None,
        binding: int = 0,
    ) -> None:
        EventId(epoch, 0)  # validates the epoch
        if max_events < 1:
            raise ValueError("max_events must be >= 1")
        self.epoch = epoch
        self.kind = kind
        self.max_events = max_events
        self.emit_ids = emit_ids
        #: Written as ``: replica=<id>`` before every event (event ids), or nothing.
        self.prefix = encode_comment(f"replica={replica}", blank_line=False) if replica else b""
        #: The channel generation the stream was opened under (0: no channel token).
        self.binding = binding
        self.state = StreamState.LIVE_DETACHED
        #: Called with the epoch when the stream becomes CLOSED (its table's bookkeeping).
        self.on_closed: Callable[[str], object] | None = None
        #: (seq, frame), oldest first, from index ``_head`` on: a list, as an empty
        #: deque costs 760 bytes and every retained stream holds one.  Dropping from
        #: the front moves ``_head``; the dropped entries are cut off in one ``del``
        #: every ``_COMPACT_AFTER`` drops, so a stream at its retention limit pays
        #: O(1) per event, not a shift of the whole list.
        self._frames: list[tuple[int, bytes]] = []
        self._head = 0
        self._next_seq = 0
        self._drained = 0  # frames with seq < _drained have been acknowledged by a peer
        #: Encoded bytes of every frame the log holds now (for the retention budget).
        self.retained_bytes = 0
        self._undrained_bytes = 0  # encoded bytes of frames with seq >= _drained

    # ---------------------------------------------------------------- appending
    def append(
        self,
        payload: str,
        *,
        final: bool = False,
        event: str | None = None,
        encoded: tuple[int, bytes] | None = None,
    ) -> EventId:
        """Append one message (already JSON text) and return its id.

        Args:
            payload: the ``data`` of the event.
            final: this is the stream's last message (a request's response);
                the stream moves to a FINAL state.
            event: optional SSE event type (the legacy transport uses it).
            encoded: what :meth:`encode_next` returned for this payload and event;
                used as the frame if no other frame was appended since (its seq
                is still the next), so a frame sized for credit is not encoded
                twice.  Otherwise the frame is encoded here.

        Raises:
            LocalProtocolError: appending after the final message, or to a
                CLOSED stream.
        """
        if self.state in (
            StreamState.FINAL_ATTACHED,
            StreamState.FINAL_DETACHED,
            StreamState.CLOSED,
        ):
            stream_transition(self.state, StreamInput.FINISH)  # raises: nothing after final
        seq = self._next_seq
        self._next_seq = seq + 1
        if encoded is not None and encoded[0] == seq:
            data = encoded[1]
        else:
            data = self.frame(seq, payload, event=event)
        self._frames.append((seq, data))
        self.retained_bytes += len(data)
        self._undrained_bytes += len(data)
        # Retention never drops a frame no peer has acknowledged yet (it holds
        # credit, and dropping it would lose data); drained ones go first.
        frames = self._frames
        if len(frames) - self._head > self.max_events:
            self._drop_oldest_drained(frames)
        if final:
            self.state = stream_transition(self.state, StreamInput.FINISH)
        return _trusted(self.epoch, seq)

    def _drop_oldest_drained(self, frames: list[tuple[int, bytes]]) -> None:
        head = self._head
        while len(frames) - head > self.max_events and frames[head][0] < self._drained:
            self.retained_bytes -= len(frames[head][1])
            head += 1
        if head and (head >= _COMPACT_AFTER or head * 2 >= len(frames)):
            del frames[:head]
            head = 0
        self._head = head

    def prime(self) -> EventId:
        """Append the priming event (an id and empty data; MCP 2025-11-25)."""
        return self.append("")

    def frame(self, seq: int, payload: str, *, event: str | None = None) -> bytes:
        """Encode event ``seq`` of this stream exactly as the log does (also for store replay)."""
        eid = f"{self.epoch}:{seq}" if self.emit_ids else None
        return self.prefix + encode_event(payload, id=eid, event=event)

    def encode_next(self, payload: str, *, event: str | None = None) -> tuple[int, bytes]:
        """(seq, frame) the next :meth:`append` of ``payload`` would produce; hand it to
        that ``append`` as ``encoded``."""
        seq = self._next_seq
        return seq, self.frame(seq, payload, event=event)

    def size_of(self, payload: str, *, event: str | None = None) -> int:
        """The exact encoded size the next frame would have (for credit, before append)."""
        return len(self.frame(self._next_seq, payload, event=event))

    def last_frame_size(self) -> int:
        """The encoded size of the newest frame (0 if none is retained)."""
        return len(self._frames[-1][1]) if len(self._frames) > self._head else 0

    # ---------------------------------------------------------------- credit
    @property
    def drained_seq(self) -> int:
        """Every frame with a lower seq has been acknowledged by a peer."""
        return self._drained

    def mark_drained(self, upto: int) -> tuple[int, int]:
        """Frames below seq ``upto`` are acknowledged; return (frames, bytes) newly drained."""
        upto = min(upto, self._next_seq)
        drained = self._drained
        if upto <= drained:
            return 0, 0
        frames = upto - drained
        # Undrained frames are never dropped, so they sit contiguously at the end:
        # only the newly drained ones are visited (O(frames), not O(retained)).
        log = self._frames
        start = len(log) - (self._next_seq - drained)
        nbytes = 0
        for i in range(start, start + frames):
            nbytes += len(log[i][1])
        self._drained = upto
        self._undrained_bytes -= nbytes
        return frames, nbytes

    def undrained(self) -> tuple[int, int]:
        """(frames, bytes) appended but not yet acknowledged."""
        return self._next_seq - self._drained, self._undrained_bytes

    def forget(self) -> tuple[int, int]:
        """The stream's owner is gone: nothing it holds is pending any more and nothing
        will resume it, so every frame goes now.  Returns the (frames, bytes) that were
        still unacknowledged, the credit its owner releases.

        Later cursors into it are ``cursor_unknown``; :attr:`next_seq` is unchanged.
        """
        held = self.undrained()
        self._drained = self._next_seq
        self._undrained_bytes = 0
        self.trim_drained()
        return held

    def trim_drained(self) -> int:
        """Drop every acknowledged frame (replay history); return the bytes still held.

        What stays is exactly the unacknowledged frames, which hold drain credit.
        A later cursor into what was dropped is ``cursor_unknown``.
        """
        frames = self._frames
        n = self._head
        while n < len(frames) and frames[n][0] < self._drained:
            self.retained_bytes -= len(frames[n][1])
            n += 1
        del frames[:n]
        self._head = 0
        return self.retained_bytes

    # ---------------------------------------------------------------- reading
    @property
    def next_seq(self) -> int:
        """The seq the next appended frame will get."""
        return self._next_seq

    def first_retained(self) -> int:
        """The oldest seq still held (``next_seq`` when the log is empty)."""
        frames = self._frames
        return frames[self._head][0] if len(frames) > self._head else self._next_seq

    def frames_from(self, seq: int) -> list[bytes]:
        """All retained frames with ``seq >= seq``, in order.

        Raises:
            RemoteProtocolError: 409 ``cursor_unknown`` if frames at or after
                ``seq`` were already dropped, or ``seq`` is beyond the head.
        """
        if seq > self._next_seq or seq < self.first_retained():
            raise RemoteProtocolError(
                f"event {self.epoch}:{seq - 1} is outside what this stream retains "
                f"(seq {self.first_retained()}..{self._next_seq - 1})",
                http_status=409,
                reason=Reason.CURSOR_UNKNOWN,
            )
        if seq == self._next_seq:
            return []
        frames = self._frames
        start = self._head + seq - frames[self._head][0]
        return [f for _, f in frames[start:]]

    def cursor_after(self, cursor: EventId) -> int:
        """The next seq to write for a client whose last event was ``cursor``.

        Raises:
            RemoteProtocolError: 409 ``cursor_unknown`` if the cursor names
                another stream or a seq this log does not retain.
        """
        if cursor.epoch != self.epoch or cursor.seq >= self._next_seq:
            raise RemoteProtocolError(
                f"event {cursor} was never sent on this stream",
                http_status=409,
                reason=Reason.CURSOR_UNKNOWN,
            )
        nxt = cursor.seq + 1
        self.frames_from(nxt)  # validates retention
        return nxt

    # ---------------------------------------------------------------- lifecycle
    def handle(self, event: StreamInput) -> StreamState:
        """Apply a lifecycle input (see :mod:`protocol._states`); return the new state."""
        before = self.state
        self.state = stream_transition(before, event)
        closed_now = self.state is StreamState.CLOSED and before is not StreamState.CLOSED
        if closed_now and self.on_closed is not None:
            self.on_closed(self.epoch)
        return self.state

    @property
    def finished(self) -> bool:
        """True once the final message is in the log (or the stream is closed)."""
        return self.state in (
            StreamState.FINAL_ATTACHED,
            StreamState.FINAL_DETACHED,
            StreamState.CLOSED,
        )


class WriterStep(enum.Enum):
    """What a stream's writer does next (:func:`writer_step`)."""

    SEND = "send"  # frames follow the cursor: write them
    FINISH = "finish"  # the final frame is written: mark DELIVERED, end the response
    END = "end"  # the stream or its session ended: end the response
    RETRY = "retry"  # the server asked this stream to close: send ``retry:``, then end
    WAIT = "wait"  # nothing to write yet: wait for an append (keep-alives aside)


def writer_step(
    log: StreamLog, next_seq: int, *, session_closed: bool, close_retry_ms: int | None
) -> WriterStep:
    """The writer's next move for a cursor at ``next_seq`` into ``log``.

    Frames first, always: a stream is never ended, or told to retry, while it
    holds frames the reader has not been sent.  Then, in order: the final
    message delivered ends the response (the only way to DELIVERED); a closed
    stream or session ends it; a close the server asked for (shutdown, a stream
    the tool closed) sends ``retry:`` so the client reconnects, then ends it.
    """
    if next_seq < log.next_seq:
        return WriterStep.SEND
    if log.state is StreamState.FINAL_ATTACHED:
        return WriterStep.FINISH
    if log.state is StreamState.CLOSED or session_closed:
        return WriterStep.END
    if close_retry_ms is not None:
        return WriterStep.RETRY
    return WriterStep.WAIT


def completes(log: StreamLog, next_seq: int) -> bool:
    """Does writing up to ``next_seq`` deliver the stream's final message?"""
    return log.state is StreamState.FINAL_ATTACHED and next_seq == log.next_seq


class StreamTable:
    """One session's streams, by epoch, with bounded retention of closed ones.

    At most ``max_closed`` CLOSED streams are kept; when a stream is added, those
    that closed longest ago are dropped (in O(1) per stream: the table learns of
    each closure from the log).  Live and FINAL streams are never dropped.
    """

    __slots__ = ("_closed", "_streams", "evicted", "evicted_bytes", "max_closed", "standalone")

    def __init__(self, *, max_closed: int = 64) -> None:
        self.max_closed = max_closed
        self._streams: OrderedDict[str, StreamLog] = OrderedDict()
        #: Epochs of CLOSED streams, in closing order (at most ``max_closed`` + 1; a list,
        #: as an empty deque costs 760 bytes per session).
        self._closed: list[str] = []
        self.standalone: StreamLog | None = None
        #: The epochs the last :meth:`add` dropped (so owners can forget them too),
        #: and the bytes their logs held.
        self.evicted: list[str] = []
        self.evicted_bytes = 0

    def add(self, log: StreamLog) -> StreamLog:
        """Register a new stream.

        Raises:
            ValueError: if the epoch is already in use in this session.
        """
        if log.epoch in self._streams:
            raise ValueError(f"epoch {log.epoch} already used in this session")
        self._streams[log.epoch] = log
        log.on_closed = self._closed.append
        if log.state is StreamState.CLOSED:
            self._closed.append(log.epoch)
        if log.kind is StreamKind.STANDALONE:
            self.standalone = log
        if len(self._closed) > self.max_closed:
            self.evicted = self._evict()
        elif self.evicted:
            self.evicted, self.evicted_bytes = [], 0
        return log

    def by_epoch(self, epoch: str) -> StreamLog:
        """The stream ``epoch`` this table holds (``KeyError`` if it holds none)."""
        return self._streams[epoch]

    def get(self, cursor: EventId) -> StreamLog:
        """The stream a cursor names.

        Raises:
            RemoteProtocolError: 409 ``cursor_unknown`` for an epoch this session
                never had or no longer retains.
        """
        log = self._streams.get(cursor.epoch)
        if log is None:
            raise RemoteProtocolError(
                f"no stream with epoch {cursor.epoch} in this session",
                http_status=409,
                reason=Reason.CURSOR_UNKNOWN,
            )
        return log

    def drop_oldest_closed(self) -> StreamLog | None:
        """Forget the stream that closed longest ago (the retention budget wants bytes).

        Returns it, or None when no CLOSED stream is held.  Live and FINAL streams
        are never dropped.
        """
        closed = self._closed
        while closed:
            epoch = closed.pop(0)
            log = self._streams.get(epoch)
            if log is not None and log.state is StreamState.CLOSED:
                del self._streams[epoch]
                if self.standalone is log:
                    self.standalone = None
                return log
        return None

    def __iter__(self) -> Iterator[StreamLog]:
        return iter(list(self._streams.values()))

    def __len__(self) -> int:
        return len(self._streams)

    def _evict(self) -> list[str]:
        dropped: list[str] = []
        freed = 0
        while len(self._closed) > self.max_closed:
            epoch = self._closed.pop(0)
            log = self._streams.get(epoch)
            if log is not None and log.state is StreamState.CLOSED:
                del self._streams[epoch]
                dropped.append(epoch)
                freed += log.retained_bytes
        self.evicted_bytes = freed
        return dropped
