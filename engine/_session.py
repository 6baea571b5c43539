"""Live per-session machinery: streams with their writers' wake-ups, running handlers,
and the server-to-client requests awaiting answers.

Theory of operation
-------------------
A :class:`Session` is the in-process half of a session whose record lives in the
store.  Its state changes go through the tables in :mod:`weir.protocol` (here only
:meth:`Session.handle`).  It owns:

* one :class:`~weir.engine._stream_handle.StreamHandle` per SSE stream (its own
  module: the pure :class:`weir.protocol.streams.StreamLog` plus a Trio wake-up so
  the attached writer, a connection task, notices appends);
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
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

import trio

from weir.app import Caller
from weir.protocol import Admit, CreditLimits, CreditPool, SessionFlow
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

from ._store_errors import epoch_reissued
from ._store_records import SessionRecord

# (Re-exported: their importers name them from here.)
from ._stream_handle import SessionClosed as SessionClosed
from ._stream_handle import StreamHandle as StreamHandle
from ._stream_handle import StreamLost as StreamLost

if TYPE_CHECKING:
    # The core's POST course reads a session through PostSession: this one is.
    def _reads_as_post_session(session: Session) -> PostSession:
        return session


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


class KeepsResults(Protocol):
    """A store that keeps sessions' finished results itself (the memory store)."""

    def shed_results(self, principal: str, session_id: str, nbytes: int) -> None:
        """Free at least ``nbytes`` of the session's kept results, oldest first."""


def _run_clock() -> Callable[[], float]:
    """The current Trio run's clock's ``current_time`` (outside a run, Trio's own
    function, which raises when called there).  A session reads the clock directly:
    ``trio.current_time()`` reaches it through two more Python calls, and credit
    reads the time several times per call."""
    try:
        return trio.lowlevel.current_clock().current_time
    except RuntimeError:
        return trio.current_time


class Session:
    """Live state of one session in this process.

    Slotted, and its containers cleared when they empty: an idle session should
    cost little more than its records (see benchmarks' idle memory figure).
    """

    __slots__ = (
        "_credit_event",
        "_grants",
        "_ids",
        "budget",
        "caller",
        "calls",
        "clock",
        "closed",
        "credit",
        "finished",
        "flow",
        "handles",
        "json_writers",
        "max_finished",
        "on_activity",
        "on_change",
        "pending",
        "provisional",
        "record",
        "replica",
        "results_kept_by",
        "running",
        "schedule",
        "session_id",
        "started",
        "state",
        "streams",
        "timer_at",
        "timer_key",
    )

    def __init__(
        self,
        record: SessionRecord,
        *,
        max_closed_streams: int = 64,
        credit: CreditLimits | None = None,
        now: float = 0.0,
        budget: RetentionBudget | None = None,
        pool: CreditPool | None = None,
    ) -> None:
        self.record, self.session_id = record, record.session_id  # (never another id)
        #: Where this session's replay history and kept results are charged.
        self.budget = budget
        #: Who keeps this session's finished results (shedding asks it to free the
        #: oldest): the memory store, or None -- :attr:`finished`, with a shared store.
        self.results_kept_by: KeepsResults | None = None
        if budget is not None:
            budget.register(record.session_id, self.shed)
        #: Admission and in-order credit grants (the pure part; see weir.protocol).
        self.flow = SessionFlow(credit or CreditLimits(), now, pool)
        self.credit, self.clock = self.flow.credit, _run_clock()  # (see :func:`_run_clock`)
        #: The waiting frames' wake-ups, by the flow's ticket.
        self._grants: dict[int, trio.Event] = {}
        #: The instant this session is scheduled at in the server's deadline heap
        #: (inf: not scheduled), and the key of that entry (see engine._timers).
        self.timer_at, self.timer_key = math.inf, 0
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
        self.state, self.closed = SessionState.NEW, False  # (closed: kept by handle())
        self.streams = StreamTable(max_closed=max_closed_streams)
        self.handles: dict[str, StreamHandle] = {}
        self.running: dict[RequestId, trio.CancelScope] = {}
        self.pending: dict[RequestId, PendingRequest] = {}
        #: Cancel scopes of JSON responses being written (teardown cancels them); a
        #: dict used as an ordered set (an empty set costs 216 bytes, a dict 64).
        self.json_writers: dict[trio.CancelScope, None] = {}
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
        if left > 0:
            keeper = self.results_kept_by
            if keeper is None:
                self.shed_finished(left)
            else:
                keeper.shed_results(self.record.principal, sid, left)

    @property
    def credit_changed(self) -> trio.Event:
        """Set at the next credit change (admission waiters and samplers wait on it)."""
        ev = self._credit_event
        if ev is None:
            ev = self._credit_event = trio.Event()
        return ev

    @property
    def channel(self) -> ChannelRecord:
        """The channel binding (generation, secret, bound) the course checks tokens on."""
        return self.record

    @property
    def protocol_version(self) -> str:
        """The revision ``initialize`` negotiated."""
        return self.record.protocol_version

    def handle(self, event: SessionInput) -> None:
        """Apply a lifecycle input (see :mod:`protocol._states`)."""
        self.state = state = session_transition(self.state, event)
        self.closed = state is SessionState.CLOSED

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
        """Create and register a stream with a store-allocated epoch.

        Raises:
            StoreUnavailable: the store handed out ``epoch`` before (it lost writes).
        """
        log = StreamLog(
            epoch, kind, max_events=max_events, emit_ids=emit_ids, replica=replica, binding=binding
        )
        try:
            self.streams.add(log)
        except ValueError:
            raise epoch_reissued(epoch) from None
        h = StreamHandle(log, self)
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
            verdict = self.flow.try_admit(n, self.clock(), request_id, lane)
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
        self._granted(self.flow.done(n, self.clock(), lane, keep=keep))
        if self.on_activity is not None:
            self.on_activity()

    def settle(self, lane: Hashable | None) -> None:
        """Whatever ``lane`` still reserves ends (a JSON body took its credit, or
        will never be sent)."""
        self._granted(self.flow.settle(lane, self.clock()))

    def move_reservations(self, key: Hashable, lane: str) -> None:
        """What was reserved under ``key`` before the stream existed is ``lane``'s."""
        self.flow.move(key, lane)

    def _granted(self, tickets: list[int]) -> None:
        for ticket in tickets:
            self._grants.pop(ticket).set()
        if self._credit_event is not None:  # (no timer to move: nothing else to pulse)
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
        ticket = self.flow.wait_for(nbytes, self.clock(), lane)
        granted = self._grants[ticket] = trio.Event()
        self._pulse(timer=True)
        try:
            await granted.wait()
        except BaseException:
            self._grants.pop(ticket, None)
            if not self.flow.cancel(ticket, self.clock()) and not self.closed:
                self.release(1, nbytes, lane)  # granted, but we are cancelled: give it back
            raise
        if self.closed:
            raise SessionClosed(self.session_id)

    def try_acquire_now(self, nbytes: int, lane: Hashable | None = None) -> bool:
        """Take credit for one frame if that needs no wait (it fits, and no earlier
        frame of ``lane`` waits)."""
        if not self.flow.try_acquire(nbytes, self.clock(), lane):
            return False
        # A first pending frame starts the liveness clock: a new deadline.
        first = self.credit.frames_in_use == 1
        if first or self._credit_event is not None:
            self._pulse(timer=first)
        return True

    def release(self, frames: int, nbytes: int, lane: Hashable | None = None) -> None:
        """Return credit of frames of ``lane`` (drained or discarded) and grant waiting
        frames in order."""
        if not frames and not nbytes:
            return
        self._granted(self.flow.release(frames, nbytes, self.clock(), lane))

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
        self.credit.progress(self.clock())
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
            # Nothing resumes a closed session's streams: their frames go now, not
            # when the last reference to this object does (a stale deadline entry,
            # a connection still closing) -- which can be minutes.
            frames, nbytes = h.log.forget()
            if frames or nbytes:
                self.credit.release(frames, nbytes, self.clock())
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
        if self.timer_key and self.schedule is not None:
            # Its entry in the deadline heap is stale now: counted as such, so the
            # heap lets go of it at its next compaction, not at its deadline.
            self.schedule(self, math.inf)
