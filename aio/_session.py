"""One session of the asyncio runtime: its credit, streams, handler tasks and timer.

Theory of operation
-------------------
A :class:`Session` owns everything a client's session makes the driver hold, and
each piece is bounded: one :class:`~weir.protocol.SessionFlow` (requests are admitted,
and frames enter a log, only within the session's drain credit; waiters are granted
strictly in order), a :class:`~weir.protocol.streams.StreamTable` of logs (a stream keeps
its last ``MAX_EVENTS`` frames, at most ``MAX_CLOSED_STREAMS`` closed ones are known),
the handler tasks it admitted (teardown cancels them; a dropped connection does not),
and the server-to-client requests those handlers wait on.

What a session keeps after it is needed -- its streams' frames (replay history,
delivered streams' too) and its calls' results (the gate's, and those kept for a
rebind) -- is charged to the driver's :class:`~weir.protocol.budget.RetentionBudget`
under the session's id, as on the Trio engine: ``--session-retain-bytes`` per session,
``--memory-budget`` across all of them.  Over either, the budget asks a session to
:meth:`~Session.shed`, oldest first: whole closed streams (a cursor into one is then
``409 cursor_unknown``), then the acknowledged frames of live ones, then results (a
retry of one is ``409 outcome_evicted``, never run again).  Unacknowledged frames
hold credit and stay.

One ``loop.call_at`` per session sits at :meth:`SessionFlow.deadline`: past the drain
window a session that does not drain is half-open (new requests get 429), past the
liveness timeout it is torn down: its connections still holding bytes the peer never
acknowledged are cut (:attr:`Session.carrying`), its logs keep no history, and with a
store of this process only its record goes too, so nothing of it stays in memory.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import math
import time
from collections import OrderedDict
from collections.abc import Callable, Coroutine, Hashable
from typing import TYPE_CHECKING, Any, Final, TypeVar

from weir.app import Caller, StreamGone
from weir.engine._memory_store import MemoryStore
from weir.engine._store_errors import epoch_reissued
from weir.engine._store_records import SessionRecord
from weir.protocol import Admit, CreditLimits, SessionFlow
from weir.protocol.event_ids import format_epoch
from weir.protocol.jsonrpc import ErrorResponse, RequestId, Response
from weir.protocol.messages import server_request_id
from weir.protocol.states import (
    CreditState,
    SessionInput,
    SessionState,
    StreamInput,
    StreamState,
    session_transition,
)
from weir.protocol.streams import StreamKind, StreamLog, StreamTable

if TYPE_CHECKING:
    from ._connection import Connection
    from ._driver import AsyncioDriver

T = TypeVar("T")

#: Replay history: frames a live stream keeps, and closed streams a session remembers.
MAX_EVENTS = 256
MAX_CLOSED_STREAMS = 16
#: Bytes of replay history and results one session, and all together, keep by
#: default (the Trio engine's ``--session-retain-bytes`` and ``--memory-budget``).
SESSION_RETAIN_BYTES: Final = 4 * 1024 * 1024
MEMORY_BUDGET: Final = 256 * 1024 * 1024
#: What the gate remembers per session: finished calls, and bytes of keys and results.
MAX_CALLS = 256
MAX_CALL_BYTES = 256 * 1024
#: The finished results a rebind hands back (as on Trio), kept here only with a
#: shared store (the memory store keeps them itself), within ``MAX_CALL_BYTES``.
MAX_FINISHED = 100


class Gone(StreamGone):
    """The session ended while something waited on it (to a tool, the app's
    :class:`~weir.app.StreamGone`)."""


def loop_clock(loop: asyncio.AbstractEventLoop) -> Callable[[], float]:
    """``loop``'s clock: :func:`time.monotonic` itself where the loop's ``time`` is the
    standard one (which returns just that), else the loop's own (uvloop's, a test's)."""
    if type(loop).time is asyncio.BaseEventLoop.time:
        return time.monotonic
    return loop.time


class Session:
    """One session: its flow control, its streams, its handler tasks, its timer."""

    def __init__(
        self,
        sid: str,
        version: str,
        credit: CreditLimits,
        driver: AsyncioDriver,
        caller: Caller,
    ):
        self.sid, self.version, self.driver = sid, version, driver
        #: Where this session's history and kept results are charged (under ``sid``).
        self.budget = driver.budget
        self.budget.register(sid, self.shed)
        #: What the app layer keeps about the client (capabilities, log level, …).
        self.caller = caller
        self.loop = asyncio.get_running_loop()
        self.clock = loop_clock(self.loop)  # (read on every frame)
        self.state = SessionState.NEW
        self.closed = False  # (set by close(), the one way to CLOSED; read per frame)
        self.flow = SessionFlow(credit, self.clock(), driver.credit_pool)
        self.streams = StreamTable(max_closed=MAX_CLOSED_STREAMS)
        self.epochs = 0  # streams opened so far; the next one's epoch
        self.tasks: set[asyncio.Task[Any]] = set()
        #: The connection tasks writing this session's streams (teardown cancels them),
        #: and which one writes each stream (a resumption displaces it).
        self.writers: set[asyncio.Task[Any]] = set()
        #: The connections holding bytes of this session that their peer has not
        #: acknowledged (a liveness teardown cuts those still stalled).
        self.carrying: set[Connection] = set()
        self.stream_writers: dict[str, asyncio.Task[Any]] = {}
        #: Streams whose connection went away, until a reader attaches again: frames
        #: appended meanwhile are history, holding no credit (see :meth:`let_go`).
        self.abandoned: set[str] = set()
        self._grants: dict[int, asyncio.Future[None]] = {}
        self._changed = asyncio.Event()  # replaced on every pulse
        self._wakeups: dict[str, asyncio.Event] = {}  # per stream epoch, for its writer
        self._timer: asyncio.TimerHandle | None = None
        #: When a request last named this session (idle expiry counts from here).
        self.last_seen = self.clock()
        #: Made by ``initialize`` and named by no request since: forgotten after the
        #: driver's ``initialize_timeout`` rather than its idle timeout.
        self.provisional = False
        #: Handlers by request id (``notifications/cancelled`` names them), the ids a
        #: client cancelled, and server-to-client requests waiting for an answer --
        #: each bounded by the admitted handlers that created them.
        self.running: dict[RequestId, asyncio.Task[None]] = {}
        self.started: dict[RequestId, float] = {}  # (when each began: mail polls)
        self.cancelled: set[RequestId] = set()
        self.pending: dict[str, asyncio.Future[Response | ErrorResponse]] = {}
        self._ids = itertools.count(1)
        #: The gate's keys whose calls run in this process (their records are the
        #: store's: see ``._shared``), and the wake-ups of deliveries waiting for one
        #: to finish (made on first need).
        self.holding: set[str] = set()
        self.call_done: dict[str, asyncio.Event] = {}
        #: Responses of calls recently finished here, handed back by a rebind (see
        #: :meth:`keep_result`), and their bytes.
        self.finished: OrderedDict[str, bytes] = OrderedDict()
        self._finished_bytes = 0
        #: Streams a handler asked to end early (``Context.close_stream``): epoch -> retry ms.
        self.close_requests: dict[str, int] = {}
        #: A sessionless credit owner (never in the session table): its streams'
        #: heads name no session, and ``carrier`` is its connection's task, which
        #: its teardown ends (a stalled peer's connection goes with its owner).
        self.sessionless = False
        self.carrier: asyncio.Task[Any] | None = None
        #: Who owns it: its opener's principal (another principal's request finds
        #: no such session, 404); ``"anonymous"`` without authorization.
        self.principal = "anonymous"
        #: Every event of this session's streams is appended to a shared store before
        #: it enters its log (``--resume shared``: another replica can replay it), at
        #: the record's channel ``generation``; one append at a time per stream.
        self.logged = False
        #: The store's record of the session as last read (its channel binding:
        #: generation, secret, bound); None for a sessionless owner, which has none.
        self.record: SessionRecord | None = None
        self._log_locks: dict[str, asyncio.Lock] = {}

    @property
    def channel(self) -> SessionRecord | None:
        """The channel binding the courses check tokens on: the record as last read."""
        return self.record

    @property
    def generation(self) -> int:
        """The channel generation this process last saw (events are stored under it)."""
        return self.record.generation if self.record is not None else 1

    def take_record(self, record: SessionRecord) -> None:
        """The store's record, read again (or changed here).  A newer generation fences
        every stream opened before it (as a rebind on the Trio runtime ends them)."""
        fenced = self.record is not None and record.generation > self.record.generation
        self.record = record
        if fenced:
            for stream in self.streams:
                if stream.state is not StreamState.CLOSED:
                    stream.handle(StreamInput.ABORT)
                    self.wake(stream)

    @property
    def protocol_version(self) -> str:
        """The revision ``initialize`` negotiated."""
        return self.version

    # ------------------------------------------------------------------ timers
    def arm_timer(self) -> None:
        """(Re)schedule the one timer at the credit's next deadline."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        when = self.flow.deadline()
        if not self.closed and when != math.inf:
            self._timer = self.loop.call_at(when, self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        if self.flow.credit.handle_timer(self.clock()) is CreditState.DEAD:
            self.driver.metrics.teardowns += 1
            self.driver.end(self)  # no progress for the liveness timeout
            # The peer stalled: its connections go too, with what the kernel and the
            # transport still buffer for it (as the Trio engine's teardown cuts them).
            for conn in list(self.carrying):
                conn.cut_if_stalled(self)
            return
        self._pulse()
        self.arm_timer()

    def _pulse(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    # --------------------------------------------------------------- admission
    async def admit(
        self, n: int, request_id: RequestId | None, lane: Hashable | None = None
    ) -> None:
        """Wait for room for ``n`` requests, each reserving room for its result in
        ``lane`` (429 once half-open; :class:`Gone`)."""
        while True:
            if self.closed:
                raise Gone
            verdict = self.flow.try_admit(n, self.clock(), request_id, lane)
            if verdict is Admit.ADMITTED:
                return
            if verdict is Admit.BLOCKED:
                self.arm_timer()
            changed = self._changed
            wait = max(0.0, self.flow.deadline() - self.clock())
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(changed.wait(), None if wait == math.inf else wait)

    def done(self, lane: Hashable | None = None) -> None:
        """One admitted request of ``lane`` is answered (or never will be)."""
        self._granted(self.flow.done(1, self.clock(), lane))

    # ------------------------------------------------------------------ frames
    async def append(
        self,
        stream: StreamLog,
        payload: str,
        *,
        final: bool = False,
        event: str | None = None,
        call_key: str | None = None,
    ) -> None:
        """Take credit for the frame (waiting behind this stream's earlier frames), then
        append it to ``stream`` (``event``: its SSE event type, e.g. the legacy
        transport's ``endpoint``) -- to the shared store first, if the session is
        :attr:`logged`; with ``call_key`` that append records the call's outcome too.

        Raises:
            Gone: the session or the stream ended, or the store did not take the event
                (not stored means not sent: the stream is aborted).
        """
        encoded = stream.encode_next(payload, event=event)
        size = len(encoded[1])
        await self.take_credit(size, lane=stream.epoch)
        if stream.state is StreamState.CLOSED:
            self.release(1, size, stream.epoch)  # aborted while we waited: nothing to send
            raise Gone
        if not self.logged:
            before = stream.retained_bytes
            stream.append(payload, final=final, event=event, encoded=encoded)
            self._appended(stream, before)
            return
        try:
            await self._log(stream, payload, final, call_key, event)
        except BaseException:
            if not self.closed:
                self.release(1, size, stream.epoch)  # never entered the log
            raise

    async def _log(
        self,
        stream: StreamLog,
        payload: str,
        final: bool,
        call_key: str | None,
        event: str | None,
    ) -> None:
        """Append to the store, then to the log, as one step per stream (the store's
        log must be contiguous: seq is the log's next)."""
        lock = self._log_locks.get(stream.epoch)
        if lock is None:
            lock = self._log_locks[stream.epoch] = asyncio.Lock()
        async with lock:
            if self.closed or stream.state is StreamState.CLOSED:
                raise Gone
            seq = stream.next_seq
            if seq or payload:  # (the priming event carries nothing to replay)
                await self.driver.shared.append_event(self, stream, seq, payload, final, call_key)
            before = stream.retained_bytes
            stream.append(payload, final=final, event=event)
            self._appended(stream, before)
            if final:
                self._log_locks.pop(stream.epoch, None)

    def try_append(self, stream: StreamLog, payload: str, *, final: bool = False) -> bool:
        """:meth:`append` if it needs no wait (credit now, nothing of this stream queued);
        True if done; then its size feeds the typical frame size, as
        :meth:`take_credit`'s does (admission divides the free credit by it)."""
        encoded = stream.encode_next(payload)
        size = len(encoded[1])
        if self.closed or stream.state is StreamState.CLOSED:
            return False
        if not self.flow.try_acquire(size, self.clock(), stream.epoch):
            return False
        self.flow.observe_frame(size)
        if self.flow.credit.frames_in_use == 1:
            self.arm_timer()
        if self.logged:  # the store first: in a task of the session's, in order
            self.spawn(self._log_or_release(stream, payload, final, size))
            return True
        before = stream.retained_bytes
        stream.append(payload, final=final, encoded=encoded)
        self._appended(stream, before)
        return True

    async def _log_or_release(
        self, stream: StreamLog, payload: str, final: bool, size: int
    ) -> None:
        try:
            await self._log(stream, payload, final, None, None)
        except Gone:
            if not self.closed:
                self.release(1, size, stream.epoch)  # never entered the log

    def _appended(self, stream: StreamLog, before: int) -> None:
        """``stream`` took a frame; its log held ``before`` bytes until then."""
        self._charge(stream.retained_bytes - before)
        if stream.epoch in self.abandoned:  # nobody writes it until a resumption: history
            self.release(*stream.mark_drained(stream.next_seq), stream.epoch)
            if stream.finished:
                self.abandoned.discard(stream.epoch)  # nothing more will come
        self.wake(stream)

    async def take_credit(self, size: int, lane: Hashable | None = None) -> None:
        """Credit for one frame (or JSON body) of ``size`` bytes, behind earlier waiters
        of ``lane`` (a frame's stream; ``None`` for a JSON body: behind nothing).

        Its size also feeds the session's typical frame size, which admission
        divides the remaining credit by (as on the Trio engine).
        """
        now = self.clock()
        self.flow.observe_frame(size)
        if self.flow.try_acquire(size, now, lane):
            if self.flow.credit.frames_in_use == 1:
                self.arm_timer()  # the first pending frame starts the liveness clock
        else:
            if self.closed:
                raise Gone
            ticket = self.flow.wait_for(size, now, lane)
            granted = self._grants[ticket] = self.loop.create_future()
            self.arm_timer()
            try:
                await granted
            except asyncio.CancelledError:
                self._grants.pop(ticket, None)
                if not self.flow.cancel(ticket, self.clock()) and not self.closed:
                    self.release(1, size, lane)  # granted while we were cancelled
                raise
            if self.closed:
                raise Gone

    def release(self, frames: int, nbytes: int, lane: Hashable | None = None) -> None:
        """Credit back (frames of ``lane`` acknowledged or discarded); grant waiters in
        order."""
        self._granted(self.flow.release(frames, nbytes, self.clock(), lane))
        self.arm_timer()

    def _granted(self, tickets: list[int]) -> None:
        for ticket in tickets:
            future = self._grants.pop(ticket)
            if not future.done():
                future.set_result(None)
        self._pulse()

    def let_go(self, stream: StreamLog) -> None:
        """The connection writing ``stream`` went away and no other writes it: its
        frames give their credit back (they stay in the log as replay history), and
        frames appended until a reader attaches again do not hold credit either --
        nothing is in flight to a peer, so holding credit would only starve the
        session's other streams until the liveness teardown."""
        if self.closed or stream.epoch in self.stream_writers:
            return
        if not stream.finished:
            self.abandoned.add(stream.epoch)
        self.release(*stream.mark_drained(stream.next_seq), stream.epoch)

    def drained(self, stream: StreamLog, upto_seq: int) -> None:
        """The peer acknowledged every frame of ``stream`` below ``upto_seq`` (they
        stay as replay history, within the budget: see :meth:`shed`)."""
        self.release(*stream.mark_drained(upto_seq), stream.epoch)

    # --------------------------------------------------------------- retention
    def _charge(self, nbytes: int) -> None:
        """The session keeps ``nbytes`` more (fewer, if negative); the budget may ask
        it, or others, to shed before this returns.  A closed session keeps nothing
        (its budget record went with it)."""
        if nbytes and not self.closed:
            self.budget.charge(self.sid, nbytes)

    def shed(self, nbytes: int) -> None:
        """Free at least ``nbytes`` of what the session keeps, oldest history first
        (the budget asks; as the Trio engine's sessions do).

        First whole closed streams, in the order they closed (a cursor into one is
        then ``cursor_unknown``); then the acknowledged frames of live streams (their
        unacknowledged frames hold credit and stay); then kept results, oldest first
        (a retry of one is told ``outcome_evicted`` and does not run again).
        """
        budget, sid = self.budget, self.sid
        target = budget.owner_held(sid) - nbytes
        while budget.owner_held(sid) > target:
            log = self.streams.drop_oldest_closed()
            if log is None:
                break
            self._forget_stream(log.epoch)
            budget.charge(sid, -log.retained_bytes)
        for stream in self.streams:
            if budget.owner_held(sid) <= target:
                return
            before = stream.retained_bytes
            budget.charge(sid, stream.trim_drained() - before)
        left = budget.owner_held(sid) - target
        if left > 0:
            self.shed_results(left)

    def shed_results(self, nbytes: int) -> None:
        """Drop kept results, oldest first, until ``nbytes`` are freed: the memory
        store's (the gate's records of this process; each leaves a tombstone), else
        those kept here for a rebind."""
        store = self.driver.shared.store
        if isinstance(store, MemoryStore):
            store.shed_results(self.principal, self.sid, nbytes)
            return
        freed = 0
        while self.finished and freed < nbytes:
            freed += len(self.finished.popitem(last=False)[1])
        self._finished_bytes -= freed
        self._charge(-freed)

    def _forget_stream(self, epoch: str) -> None:
        """A closed stream the table no longer holds: nothing of it stays here."""
        self.abandoned.discard(epoch)
        self.close_requests.pop(epoch, None)
        self._log_locks.pop(epoch, None)

    # ----------------------------------------------------------------- streams
    def allocate_epoch(self) -> str:
        """A fresh stream epoch counted here (a sessionless owner's: nothing resumes
        its streams; a session's come from the store, see ``._shared``)."""
        epoch = format_epoch(self.epochs)
        self.epochs += 1
        return epoch

    def open_stream(
        self,
        kind: StreamKind,
        epoch: str | None = None,
        *,
        emit_ids: bool | None = None,
        binding: int = 0,
    ) -> StreamLog:
        """A new stream of this session (``emit_ids`` False: its frames carry no
        event ids, as nothing resumes a sessionless answer; None: they do unless the
        driver resumes nothing, ``resume="off"``), opened under channel generation
        ``binding`` (0: no token; its cursors are bound to it)."""
        log = StreamLog(
            epoch or self.allocate_epoch(),
            kind,
            max_events=MAX_EVENTS,
            emit_ids=self.driver.event_ids if emit_ids is None else emit_ids,
            binding=binding,
        )
        try:
            self.streams.add(log)
        except ValueError:  # a shared store handed the epoch out twice: it lost writes
            raise epoch_reissued(log.epoch) from None
        for stale in self.streams.evicted:  # (closed streams past MAX_CLOSED_STREAMS)
            self._forget_stream(stale)
        if self.streams.evicted:
            self._charge(-self.streams.evicted_bytes)
        return log

    def wake(self, stream: StreamLog) -> None:
        event = self._wakeups.pop(stream.epoch, None)
        if event is not None:
            event.set()

    async def wait_for_frames(self, stream: StreamLog, timeout: float | None) -> None:
        event = self._wakeups.setdefault(stream.epoch, asyncio.Event())
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):  # (no task per wait, as wait_for makes)
                await event.wait()

    def spawn(self, work: Coroutine[Any, Any, T]) -> asyncio.Task[T]:
        """Run ``work`` as a task of the session (teardown cancels it, a hang-up does not)."""
        task = self.loop.create_task(work)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)
        return task

    def next_request_id(self) -> str:
        """A fresh id for a server-to-client request."""
        return server_request_id(self.driver.shared.replica_id, next(self._ids))

    def answer(self, msg: Response | ErrorResponse) -> None:
        """The client answered a server-to-client request (unknown ids are dropped)."""
        future = self.pending.get(msg.id) if isinstance(msg.id, str) else None
        if future is not None and not future.done():
            future.set_result(msg)

    def cancel(self, request_id: RequestId) -> None:
        """``notifications/cancelled``: stop that request's handler; it sends no response."""
        task = self.running.get(request_id)
        if task is not None:
            self.cancelled.add(request_id)
            task.cancel()

    def finish_call(self, key: str) -> None:
        """A gated call here is over (its outcome is in the store): wake its waiters."""
        self.holding.discard(key)
        finished = self.call_done.pop(key, None)
        if finished is not None:
            finished.set()

    def keep_result(self, key: str, payload: bytes) -> None:
        """Keep a call's response for a rebind: the newest :data:`MAX_FINISHED`, at most
        :data:`MAX_CALL_BYTES` of them (oldest dropped first; a larger one is not
        kept), charged to the budget; nothing for a closed session."""
        finished = self.finished
        before = self._finished_bytes
        old = finished.pop(key, None)
        if old is not None:
            self._finished_bytes -= len(old)
        if not self.closed and len(payload) <= MAX_CALL_BYTES:
            finished[key] = payload
            self._finished_bytes += len(payload)
            while len(finished) > MAX_FINISHED or self._finished_bytes > MAX_CALL_BYTES:
                self._finished_bytes -= len(finished.popitem(last=False)[1])
        self._charge(self._finished_bytes - before)

    def request_close(self, stream: StreamLog, retry_ms: int) -> None:
        """Ask ``stream``'s writer to send ``retry:`` and end its HTTP response."""
        if stream.state is not StreamState.CLOSED:
            self.close_requests[stream.epoch] = retry_ms
            self.wake(stream)

    # -------------------------------------------------------------------- end
    def close(self) -> None:
        """Cancel handlers, abort streams and release the credit their frames hold
        (as the Trio engine's teardown does), wake every waiter (which then finds it
        gone)."""
        if self.closed:
            return
        self.state = session_transition(self.state, SessionInput.TEARDOWN)
        self.closed = True
        if self._timer is not None:
            self._timer.cancel()
        self.flow.close()
        for future in self._grants.values():
            if not future.done():
                future.set_result(None)
        self._grants.clear()
        now = self.clock()
        for stream in self.streams:
            if stream.state is not StreamState.CLOSED:
                stream.handle(StreamInput.ABORT)
            frames, nbytes = stream.forget()  # no credit held, nothing to resume
            if frames or nbytes:
                self.flow.credit.release(frames, nbytes, now)
            self.wake(stream)
        for answer in self.pending.values():
            if not answer.done():
                answer.set_exception(Gone())
        for finished in self.call_done.values():
            finished.set()  # the waiters find the session closed
        self.finished.clear()  # (kept for a rebind's answer: no rebind of a closed session)
        self._finished_bytes = 0
        self.budget.release_owner(self.sid)  # (its history and results went above)
        for task in (*self.tasks, *self.writers):
            task.cancel()
        if self.carrier is not None:
            self.carrier.cancel()
        self._pulse()
