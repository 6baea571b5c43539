"""Live per-session machinery: streams with their writers' wake-ups, running handlers,
and the server-to-client requests awaiting answers.

Theory of operation
-------------------
A :class:`Session` is the in-process half of a session whose record lives in the
store.  Its state changes go through the tables in :mod:`weir.protocol` (here only
:meth:`Session.handle`).  It owns:

* one :class:`StreamHandle` per SSE stream: the pure :class:`weir.protocol.streams.StreamLog`
  plus a Trio wake-up so the attached writer (a connection task) notices appends;
  messages are only ever *appended* to a log, writers only ever *read* it;
* the cancel scope of every running request handler, by JSON-RPC id, so
  ``notifications/cancelled`` and teardown can cancel them;
* the pending server-to-client requests (sampling, elicitation, roots), by the id
  the server gave them, whose answers arrive later in a POST;
* its drain credit (:class:`weir.protocol._credit.SessionCredit`) and the frames waiting
  for credit.  Every frame enters a log through :meth:`StreamHandle.send`, which
  first takes credit for its exact encoded size, waiting when there is none --
  behind earlier frames of *its own stream* only (the stream is its lane in
  :class:`weir.protocol.SessionFlow`), so a stream's frames are never reordered,
  a stalled stream never parks another stream's frames, and a session never holds
  more than its credit.  Credit comes back when a connection's peer acknowledges
  the frame's last byte (:meth:`Session.drained`), when the stream is aborted, or
  when the connection writing it goes away (:meth:`Session.let_go`): the frames
  stay in the log as replay history, charged to the retention budget, but nothing
  is in flight to a peer any more.
"""

from __future__ import annotations

import itertools
import math
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Hashable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import trio

from weir.app import Caller
from weir.protocol import Admit, CreditLimits, SessionFlow
from weir.protocol.budget import RetentionBudget
from weir.protocol.jsonrpc import Message, RequestId
from weir.protocol.messages import server_request_id
from weir.protocol.post import ChannelRecord, PostSession
from weir.protocol.states import (
    CreditState,
    SessionInput,
    SessionState,
    StreamInput,
    StreamState,
    session_transition,
)
from weir.protocol.streams import StreamKind, StreamLog, StreamTable

from ._store import SessionRecord

if TYPE_CHECKING:
    # The core's POST course reads a session through PostSession: this one is.
    def _reads_as_post_session(session: Session) -> PostSession:
        return session


def _closed(log: StreamLog) -> bool:
    return log.state is StreamState.CLOSED


class StreamLost(Exception):
    """A frame could not be enqueued: its stream or session is gone (stop quietly)."""


class SessionClosed(StreamLost):
    """The session ended while a frame waited for credit."""


class FrameTooLarge(ValueError):
    """A message is larger than the session's whole byte credit: it can never be sent."""


class StreamHandle:
    """A stream's log, the wake-up its writer waits on, and the writer's cancel scope."""

    __slots__ = (
        "_changed",
        "_lock",
        "abandoned",
        "close_retry_ms",
        "generation",
        "log",
        "outstanding",
        "session",
        "sink",
        "writer_scope",
    )

    def __init__(self, log: StreamLog, session: Session) -> None:
        self.log = log
        self.session = session
        #: The session generation the stream belongs to (fencing).
        self.generation = session.record.generation
        #: Where frames go before the wire (the shared store), or None.
        self.sink: Callable[[int, str, bool, str | None], Awaitable[None]] | None = None
        self._lock: trio.Lock | None = None  # created on first use (see :attr:`lock`)
        self._changed: trio.Event | None = None  # created only when a writer waits
        self.outstanding = 0  # requests whose response is still to come on this stream
        self.close_retry_ms: int | None = None  # set: server closes the connection early
        self.writer_scope: trio.CancelScope | None = None
        #: True from the moment its writer's connection went away until a reader
        #: attaches again: frames appended meanwhile are history, holding no credit.
        self.abandoned = False

    @property
    def lock(self) -> trio.Lock:
        """Held while a frame goes to the store and the log, so store order is log order."""
        lock = self._lock
        if lock is None:
            lock = self._lock = trio.Lock()
        return lock

    async def send(self, payload: str, *, final: bool = False, event: str | None = None) -> None:
        """Take credit for one frame (waiting behind this stream's earlier frames if none
        is left), append it, wake the writer.

        Frames for a CLOSED stream are dropped without taking credit.

        Raises:
            SessionClosed: the session ended while waiting for credit.
        """
        await self._enqueue(payload, final=final, event=event, call_key=None)

    async def respond(self, payload: str | None, *, call_key: str | None = None) -> None:
        """Enqueue one request's response (``None``: it was cancelled and has none).

        ``call_key`` (shared stores): record the response in the idempotency gate
        in the same store step that appends it.

        The response of the stream's last outstanding request is its final frame;
        this is decided under the stream's lock, so responses of a batch finishing
        in any order never put a frame after the final one.
        """
        if payload is None:
            async with self.lock:
                self.outstanding -= 1
                if (
                    self.outstanding <= 0
                    and self.log.kind is not StreamKind.LEGACY
                    and not _closed(self.log)
                ):
                    self.handle(StreamInput.ABORT)  # nothing more will come: end the stream
            return
        if _closed(self.log):
            self.outstanding -= 1
            return
        await self._enqueue(payload, final=None, event=None, call_key=call_key)

    async def _enqueue(
        self, payload: str, *, final: bool | None, event: str | None, call_key: str | None
    ) -> None:
        # The one way into the log: credit first (in stream order), then -- under the stream's
        # lock, so store order is log order -- the store (if shared), then the log.
        # ``final=None`` means "a response": one fewer outstanding, and final if last.
        log = self.log
        if final is not None and _closed(log):
            return
        encoded = log.encode_next(payload, event=event)
        size = len(encoded[1])
        limit = self.session.credit.limits.bytes
        if size > limit:
            raise FrameTooLarge(
                f"a {size}-byte message is larger than the session's credit ({limit} bytes)"
            )
        await self.session.acquire(size, lane=log.epoch)
        async with self.lock:
            if final is None:
                final = self._count_response()
            if _closed(log):  # aborted while we waited
                self.session.release(1, size, log.epoch)
                return
            if self.sink is not None:
                try:
                    await self.sink(log.next_seq, payload, final, call_key)
                except BaseException:
                    # Not in the store, so never on the wire: give the credit back
                    # and end the stream (a rebind fenced it, or the store failed).
                    self.session.release(1, size, log.epoch)
                    if not _closed(log):
                        self.handle(StreamInput.ABORT)
                    raise
            self._append(payload, final, event, size, encoded)
        self.wake()

    def try_send_now(self, payload: str) -> bool:
        """:meth:`send` without waiting, where that is possible; True if it was done.

        Possible when the stream has no store sink, nothing holds its lock, no
        frame of this stream waits for credit and there is credit for this one --
        exactly the cases where :meth:`send` would not block.  Otherwise nothing
        changes and the caller awaits :meth:`send`.
        """
        return self._enqueue_now(payload, final=False)

    def try_respond_now(self, payload: str) -> bool:
        """:meth:`respond` without waiting, where that is possible (see :meth:`try_send_now`)."""
        return self._enqueue_now(payload, final=None)

    def _enqueue_now(self, payload: str, *, final: bool | None) -> bool:
        log = self.log
        if self.sink is not None or (self._lock is not None and self._lock.locked()):
            return False
        if _closed(log):  # dropped without credit, as _enqueue does
            if final is None:
                self.outstanding -= 1
            return True
        encoded = log.encode_next(payload)
        size = len(encoded[1])
        if not self.session.try_acquire_now(size, lane=log.epoch):
            return False
        if final is None:
            final = self._count_response()
        self._append(payload, final, None, size, encoded)
        self.wake()
        return True

    def _count_response(self) -> bool:
        # One fewer response to come; the last one is the stream's final frame.
        self.outstanding -= 1
        return self.outstanding <= 0 and self.log.kind is not StreamKind.LEGACY

    def _append(
        self,
        payload: str,
        final: bool,
        event: str | None,
        size: int,
        encoded: tuple[int, bytes] | None = None,
    ) -> int:
        log = self.log
        before = log.retained_bytes
        log.append(payload, final=final, event=event, encoded=encoded)
        actual = log.last_frame_size()
        session = self.session
        session.credit.correct(size, actual)
        session.flow.observe_frame(actual)
        budget = session.budget
        if budget is not None:
            budget.charge(session.record.session_id, log.retained_bytes - before)
        if self.abandoned:  # nobody will write it until a resumption: history only
            session.release(*log.mark_drained(log.next_seq), log.epoch)
        return actual

    def wake(self) -> None:
        """Wake whoever waits in :meth:`wait_changed` (nothing to do if nobody does)."""
        changed = self._changed
        if changed is not None:
            self._changed = None
            changed.set()

    async def wait_changed(self) -> None:
        """Block until the next append or lifecycle change."""
        changed = self._changed
        if changed is None:
            changed = self._changed = trio.Event()
        await changed.wait()

    def drained(self, upto_seq: int) -> None:
        """A peer acknowledged every frame of this stream below ``upto_seq``."""
        self.session.drained(self, upto_seq)

    def handle(self, event: StreamInput) -> None:
        """Apply a lifecycle input to the log's state machine and wake the writer."""
        self.log.handle(event)
        self.wake()

    def request_close(self, retry_ms: int) -> None:
        """Ask the attached writer to send ``retry:`` and end the HTTP response early."""
        self.close_retry_ms = retry_ms
        self.wake()


class JsonCharge:
    """The drain credit one ``application/json`` response holds until acknowledged.

    In JSON response mode a response is one body written by its connection, not a
    frame in a log; it takes credit for its exact size all the same, so a client
    that stops reading its responses is found half-open and torn down like one
    that stops reading an SSE stream.
    """

    __slots__ = ("lane", "nbytes", "session")

    def __init__(self, session: Session, nbytes: int, lane: Hashable | None = None) -> None:
        self.session = session
        self.nbytes = nbytes
        self.lane = lane

    def drained(self, upto_seq: int) -> None:
        """The body's last byte was acknowledged (or it was abandoned): give the credit back."""
        if self.nbytes and not self.session.closed:
            self.session.release(1, self.nbytes, self.lane)
        self.nbytes = 0


@dataclass
class PendingRequest:
    """A server-to-client request waiting for the client's answer."""

    done: trio.Event = field(default_factory=trio.Event)
    answer: Message | None = None


class Session:
    """Live state of one session in this process."""

    def __init__(
        self,
        record: SessionRecord,
        *,
        max_closed_streams: int = 64,
        credit: CreditLimits | None = None,
        now: float = 0.0,
        budget: RetentionBudget | None = None,
    ) -> None:
        self.record = record
        #: Where this session's replay history and kept results are charged.
        self.budget = budget
        #: Frees at least ``n`` bytes of kept results, oldest first (set by the server:
        #: the memory store keeps them, or :attr:`finished` with a shared store).
        self.shed_results: Callable[[int], object] | None = self.shed_finished
        if budget is not None:
            budget.register(record.session_id, self.shed)
        #: Admission and in-order credit grants (the pure part; see weir.protocol).
        self.flow = SessionFlow(credit or CreditLimits(), now)
        self.credit = self.flow.credit
        #: The waiting frames' wake-ups, by the flow's ticket.
        self._grants: dict[int, trio.Event] = {}
        #: The instant this session is scheduled at in the server's deadline heap
        #: (inf: not scheduled), and the key of that entry (see engine._timers).
        self.timer_at = math.inf
        self.timer_key = 0
        #: Asks for a wake-up at an earlier deadline (set by the server: the heap).
        self.schedule: Callable[[Session, float], None] | None = None
        #: Told when a handler ends, a response is enqueued or a writer detaches (the
        #: server's shutdown waits on it instead of polling).
        self.on_activity: Callable[[], None] | None = None
        #: Told when a handler announces a change (``Context.changed``; set by the server).
        self.on_change: Callable[[str, str | None], None] | None = None
        #: True from ``initialize`` until the session's first other request or
        #: notification: an abandoned ``initialize`` is forgotten sooner.
        self.provisional = False
        # Created on demand by whoever waits, set and dropped by the next pulse.
        self._credit_event: trio.Event | None = None
        self.state = SessionState.NEW
        self.streams = StreamTable(max_closed=max_closed_streams)
        self.handles: dict[str, StreamHandle] = {}
        self.running: dict[RequestId, trio.CancelScope] = {}
        self.pending: dict[RequestId, PendingRequest] = {}
        #: Cancel scopes of JSON responses being written (teardown cancels them).
        self.json_writers: set[trio.CancelScope] = set()
        #: What the app layer keeps about the client (capabilities, log level, …).
        self.caller = Caller()
        self._ids = itertools.count(1)
        #: This process's replica id (in server-to-client request ids).
        self.replica = "local"
        #: When each running request started (cross-replica cancellation polls old ones).
        self.started: dict[RequestId, float] = {}
        #: Calls this process is running, by gate key; the Event (made when a duplicate
        #: first waits) is set when the call finishes.
        self.calls: dict[str, trio.Event | None] = {}
        #: Responses of recently finished calls, handed back by a rebind (kept here
        #: only with a shared store; the memory store keeps them itself).
        self.finished: OrderedDict[str, bytes] = OrderedDict()
        self.max_finished = 100

    def keep_result(self, key: str, payload: bytes) -> None:
        """Keep a finished call's response for a rebind, charged to the budget.

        Nothing is kept for a closed session (its budget record is gone with it).
        """
        if self.closed:
            return
        finished = self.finished
        delta = len(payload) - len(finished.get(key, b""))
        finished[key] = payload
        finished.move_to_end(key)
        while len(finished) > self.max_finished:
            delta -= len(finished.popitem(last=False)[1])
        if self.budget is not None:
            self.budget.charge(self.record.session_id, delta)

    def shed_finished(self, nbytes: int) -> None:
        """Drop kept results (for a rebind), oldest first, until ``nbytes`` are freed."""
        freed = 0
        while self.finished and freed < nbytes:
            freed += len(self.finished.popitem(last=False)[1])
        if self.budget is not None:
            self.budget.charge(self.record.session_id, -freed)

    def shed(self, nbytes: int) -> None:
        """Free at least ``nbytes`` of what the session keeps, oldest history first.

        First whole closed streams, in the order they closed (a cursor into one is
        then ``cursor_unknown``); then the acknowledged frames of live streams (their
        unacknowledged frames hold credit and stay); then kept results, oldest first
        (a retry of one is told ``outcome_evicted`` and does not run again).
        """
        budget = self.budget
        if budget is None:
            return
        sid = self.record.session_id
        target = budget.owner_held(sid) - nbytes
        while budget.owner_held(sid) > target:
            log = self.streams.drop_oldest_closed()
            if log is None:
                break
            self.handles.pop(log.epoch, None)
            budget.charge(sid, -log.retained_bytes)
        for h in list(self.handles.values()):
            if budget.owner_held(sid) <= target:
                return
            before = h.log.retained_bytes
            budget.charge(sid, h.log.trim_drained() - before)
        left = budget.owner_held(sid) - target
        if left > 0 and self.shed_results is not None:
            self.shed_results(left)

    @property
    def credit_changed(self) -> trio.Event:
        """Set at the next credit change (admission waiters and samplers wait on it)."""
        ev = self._credit_event
        if ev is None:
            ev = self._credit_event = trio.Event()
        return ev

    @property
    def session_id(self) -> str:
        """The ``Mcp-Session-Id``."""
        return self.record.session_id

    @property
    def channel(self) -> ChannelRecord:
        """The channel binding (generation, secret, bound) the course checks tokens on."""
        return self.record

    @property
    def protocol_version(self) -> str:
        """The revision ``initialize`` negotiated."""
        return self.record.protocol_version

    @property
    def closed(self) -> bool:
        """True once deleted or torn down."""
        return self.state is SessionState.CLOSED

    def handle(self, event: SessionInput) -> None:
        """Apply a lifecycle input (see :mod:`protocol._states`)."""
        self.state = session_transition(self.state, event)

    def open_stream(
        self,
        epoch: str,
        kind: StreamKind,
        *,
        max_events: int,
        emit_ids: bool = True,
        replica: str | None = None,
        binding: int = 0,
    ) -> StreamHandle:
        """Create and register a stream with a store-allocated epoch."""
        log = StreamLog(
            epoch, kind, max_events=max_events, emit_ids=emit_ids, replica=replica, binding=binding
        )
        h = StreamHandle(self.streams.add(log), self)
        self.handles[epoch] = h
        for stale in self.streams.evicted:
            self.handles.pop(stale, None)
        if self.streams.evicted and self.budget is not None:
            self.budget.charge(self.record.session_id, -self.streams.evicted_bytes)
        return h

    def handle_for(self, log: StreamLog) -> StreamHandle:
        """The handle of a registered log."""
        return self.handles[log.epoch]

    @property
    def standalone(self) -> StreamHandle | None:
        """The GET stream's handle, if the client ever opened one."""
        s = self.streams.standalone
        return self.handles.get(s.epoch) if s is not None else None

    def next_request_id(self) -> str:
        """A fresh id for a server-to-client request: ``weir:<replica>:<n>``.

        It names the replica waiting for the answer, so whichever replica the
        client's answer reaches can forward it there through the store.
        """
        return server_request_id(self.replica, next(self._ids))

    # ------------------------------------------------------------ credit
    @property
    def queue_depth(self) -> int:
        """Frames enqueued and not yet acknowledged (always <= the frame credit)."""
        return self.credit.frames_in_use

    def _pulse(self, *, timer: bool = False) -> None:
        ev = self._credit_event
        if ev is not None:
            self._credit_event = None
            ev.set()
        # The credit's deadline may have moved: ask the heap for a wake-up only if it
        # now lies before the one already scheduled (a later one is found when that
        # wake-up comes), so a busy session costs nothing per frame.
        if timer and not self.closed and self.schedule is not None:
            deadline = self.credit.deadline()
            if deadline < self.timer_at:
                self.schedule(self, deadline)

    @property
    def inflight(self) -> int:
        """Admitted requests whose response is not enqueued yet."""
        return self.flow.inflight

    async def admit(
        self, n: int, request_id: RequestId | None, lane: Hashable | None = None
    ) -> None:
        """Admission for ``n`` session-scoped requests, before anything is dispatched;
        each reserves room for its result in ``lane`` (its stream's epoch, or a key
        :meth:`move_reservations` later gives the stream).

        The rule is :meth:`weir.protocol.SessionFlow.try_admit`; here, the waiting:
        in order, before any handler runs, until a change or the credit's deadline.

        Raises:
            RemoteProtocolError: 429 ``stream_half_open`` as soon as the session is
                half-open (also while waiting).
            SessionClosed: the session ended while waiting.
        """
        while True:
            if self.closed:
                raise SessionClosed(self.session_id)
            verdict = self.flow.try_admit(n, trio.current_time(), request_id, lane)
            if verdict is Admit.ADMITTED:
                return
            if verdict is Admit.BLOCKED:
                # Pulse only on a real change, or two waiters would wake each other forever.
                self._pulse(timer=True)
            changed = self.credit_changed
            with trio.move_on_at(self.flow.deadline()):
                await changed.wait()

    def done(self, n: int = 1, lane: Hashable | None = None, *, keep: bool = False) -> None:
        """``n`` admitted requests of ``lane`` have their response enqueued (or will
        never have one): their reservations end (``keep``: at :meth:`settle`)."""
        self._granted(self.flow.done(n, trio.current_time(), lane, keep=keep))
        if self.on_activity is not None:
            self.on_activity()

    def settle(self, lane: Hashable | None) -> None:
        """Whatever ``lane`` still reserves ends (a JSON body took its credit, or
        will never be sent)."""
        self._granted(self.flow.settle(lane, trio.current_time()))

    def move_reservations(self, key: Hashable, lane: str) -> None:
        """What was reserved under ``key`` before the stream existed is ``lane``'s."""
        self.flow.move(key, lane)

    def _granted(self, tickets: list[int]) -> None:
        for ticket in tickets:
            self._grants.pop(ticket).set()
        self._pulse()

    async def acquire(self, nbytes: int, lane: Hashable | None = None) -> None:
        """Take credit for one frame of ``nbytes``, behind earlier waiters of ``lane``
        (its stream's epoch; ``None``: a JSON body, ordered after nothing).

        Raises:
            SessionClosed: the session is (or becomes) closed.
        """
        if self.try_acquire_now(nbytes, lane):
            await trio.lowlevel.checkpoint()
            return
        if self.closed:
            raise SessionClosed(self.session_id)
        ticket = self.flow.wait_for(nbytes, trio.current_time(), lane)
        granted = self._grants[ticket] = trio.Event()
        self._pulse(timer=True)
        try:
            await granted.wait()
        except BaseException:
            self._grants.pop(ticket, None)
            if not self.flow.cancel(ticket, trio.current_time()) and not self.closed:
                self.release(1, nbytes, lane)  # granted, but we are cancelled: give it back
            raise
        if self.closed:
            raise SessionClosed(self.session_id)

    def try_acquire_now(self, nbytes: int, lane: Hashable | None = None) -> bool:
        """Take credit for one frame if that needs no wait (it fits, and no earlier
        frame of ``lane`` waits)."""
        if not self.flow.try_acquire(nbytes, trio.current_time(), lane):
            return False
        # A first pending frame starts the liveness clock: a new deadline.
        self._pulse(timer=self.credit.frames_in_use == 1)
        return True

    def release(self, frames: int, nbytes: int, lane: Hashable | None = None) -> None:
        """Return credit of frames of ``lane`` (drained or discarded) and grant waiting
        frames in order."""
        if not frames and not nbytes:
            return
        self._granted(self.flow.release(frames, nbytes, trio.current_time(), lane))

    def drained(self, handle: StreamHandle, upto_seq: int) -> None:
        """A peer acknowledged every frame of ``handle``'s stream below ``upto_seq``."""
        frames, nbytes = handle.log.mark_drained(upto_seq)
        self.release(frames, nbytes, handle.log.epoch)

    def let_go(self, handle: StreamHandle) -> None:
        """The connection writing ``handle``'s stream went away (and no newer reader
        took over): its frames give their credit back and stay in the log as replay
        history (charged to the retention budget, dropped first when it sheds).

        Credit bounds what is queued *towards a peer*; with no connection nothing
        is, so holding it would only starve the session's other streams until the
        liveness teardown.  A resumption writes the frames again without taking
        credit for them (they are marked drained), and frames appended until a
        reader attaches are released at once (:attr:`StreamHandle.abandoned`).
        """
        if self.closed:
            return
        handle.abandoned = True
        self.release(*handle.log.mark_drained(handle.log.next_seq), handle.log.epoch)

    def progress(self) -> None:
        """A peer acknowledged some bytes (not necessarily a whole frame)."""
        self.credit.progress(trio.current_time())
        self._pulse()

    @property
    def half_open(self) -> bool:
        """True while the credit state is HALF_OPEN (or DEAD)."""
        return self.credit.state in (CreditState.HALF_OPEN, CreditState.DEAD)

    def close(self) -> None:
        """End the session: cancel handlers and writers, abort streams, release credit."""
        if self.state is not SessionState.CLOSED:
            self.handle(SessionInput.TEARDOWN)
        for scope in list(self.running.values()):
            scope.cancel()
        for scope in list(self.json_writers):
            scope.cancel()
        for h in list(self.handles.values()):
            if h.log.state is not StreamState.CLOSED:
                h.handle(StreamInput.ABORT)
            if h.writer_scope is not None:
                h.writer_scope.cancel()
            frames, nbytes = h.log.drain_all()
            if frames or nbytes:
                self.credit.release(frames, nbytes, trio.current_time())
        self.flow.close()
        for ev in self._grants.values():
            ev.set()
        self._grants.clear()
        for p in self.pending.values():
            p.done.set()
        if self.budget is not None:
            self.budget.release_owner(self.record.session_id)
        self.finished.clear()
        self._pulse(timer=True)
