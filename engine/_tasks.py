"""Tasks on either runtime: created in the store, run here, answered from any replica.

Theory of operation
-------------------
The record and its rules are the core's (:mod:`weir.protocol.tasks`); this module
keeps them in the store and runs handlers.  :class:`Tasks` holds every decision and
no event loop: a runtime subclasses it with how a run is started beside its lease
renewal, how a run is stopped, and how shutdown waits (``engine._tasks_trio`` for
Trio, ``weir.asyncio._tasks`` for asyncio), so a task created on one runtime is
read, answered, cancelled or declared lost by a replica on the other.

* **Creation is durable.**  A call that becomes a task (:meth:`Tasks.create`) writes
  its ``working`` record to the store first -- version 0, under the principal's
  cap -- and only then starts the handler and answers with the handle, so a
  ``tasks/get`` sent anywhere right after the answer finds it.  The id is 32
  random bytes, looked up under the principal of the request that names it: a
  guessed id, or another principal's, is "not found" exactly as an unknown one.
* **Every change is a compare-and-set** (:meth:`Tasks._change`): read, apply a pure
  rule of the core, write over the version read; on a conflict, read again.  So
  a ``tasks/cancel`` on one replica and the result of the run on another never
  overwrite each other: whichever lands second sees the first and obeys the rules
  (a terminal task never changes).
* **A run** (the runtime's ``_run``) executes the handler from its start with every
  answer gathered so far.  It renews its lease every third of
  ``ServerConfig.claim_lease`` and, on each renewal, checks that the record still
  names its run: a task cancelled or declared lost elsewhere stops its handler
  within a third of a lease (one cancelled here stops at once).  It ends by
  writing the result (``completed``, a tool's ``isError`` result included), the
  error (``failed``), or the questions (``input_required``: nobody runs it until
  ``tasks/update`` answers the last one, and then the replica that took the
  answer starts the next run).  Each renewal is :meth:`Tasks.renewed`.
* **Who hears of a change.**  Every write that changes what a client sees (not a
  lease renewal) is handed to ``on_change``: the server's change bus, which tells the
  principal's ``subscriptions/listen`` streams that follow the task, on every replica.
  A handler's ``ctx.set_status`` is such a write (``statusMessage``).
* **A replica that dies** stops renewing; the next ``tasks/get`` on any replica
  finds the lease run out and records the task ``failed`` (``interrupted``).  A
  replica that shuts down records its running tasks so itself, before it exits.
  No task is ever run again by someone else: its handler may have had effects.
"""

from __future__ import annotations

import logging
import secrets
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Final, Protocol

import msgspec

from weir.app import (
    AccessToken,
    App,
    BecomeTask,
    Caller,
    Context,
    InputRequired,
    McpError,
    dispatch,
    failure,
)
from weir.common import handler_error
from weir.protocol import INVALID_PARAMS, Reason, RemoteProtocolError
from weir.protocol.jsonrpc import Request
from weir.protocol.tasks import (
    TaskRecord,
    ack,
    create_result,
    decode_record,
    detailed,
    encode_record,
    lease_ran_out,
    lease_renewed,
    new_task,
    runs,
    task_answered,
    task_asked,
    task_cancelled,
    task_completed,
    task_failed,
    task_id_of,
    task_interrupted,
    task_not_found,
    task_status_message,
)

from ._session_store import SessionStore
from ._store_records import TaskWrite

log = logging.getLogger("weir.tasks")

#: Params of a ``tools/call`` that belong to its round, not to the task's runs.
_ROUND_PARAMS: Final = ("inputResponses", "requestState", "task")
#: Compare-and-set attempts before a change gives up (each conflict means another
#: writer made progress, so this is never reached by honest contention).
MAX_ATTEMPTS: Final = 16
#: Seconds a stopping runtime waits for its runs to record their tasks ``failed``.
SHUTDOWN_WAIT: Final = 5.0


class TaskConfig(Protocol):
    """Where :meth:`TaskSettings.of` reads them (a :class:`~weir.engine.ServerConfig`)."""

    @property
    def task_ttl(self) -> float: ...
    @property
    def task_poll_ms(self) -> int: ...
    @property
    def claim_lease(self) -> float: ...
    @property
    def max_tasks_per_principal(self) -> int: ...
    @property
    def max_task_result_bytes(self) -> int: ...


@dataclass(frozen=True, slots=True)
class TaskSettings:
    """The bounds of the tasks extension, as either runtime is configured."""

    #: Seconds a task stays readable after its last change.
    ttl: float = 3600.0
    #: The ``pollIntervalMs`` suggested to clients.
    poll_ms: int = 1000
    #: Seconds a run's lease lasts unless renewed (renewed every third of it).
    lease: float = 15.0
    #: Tasks one principal may hold at once (429 ``task_limit`` beyond).
    max_per_principal: int = 100
    #: The largest result a task keeps (a larger one fails the task).
    max_result_bytes: int = 1024 * 1024

    @classmethod
    def of(cls, config: TaskConfig) -> TaskSettings:
        """The settings a :class:`~weir.engine.ServerConfig` (or the command line's
        checked configuration) asks for."""
        return cls(
            ttl=config.task_ttl,
            poll_ms=config.task_poll_ms,
            lease=config.claim_lease,
            max_per_principal=config.max_tasks_per_principal,
            max_result_bytes=config.max_task_result_bytes,
        )


class Stoppable(Protocol):
    """What stops a run: a Trio cancel scope or an asyncio task."""

    def cancel(self) -> Any: ...


class Tasks:
    """A replica's side of the tasks extension (see the module docstring); a runtime
    subclass supplies ``_run`` (a run beside its lease renewal) and ``shutdown``.

    Guarantees: a task's handle is answered only once its record is stored; every
    change is written over the version it was decided on; a run writes only while
    the record names it; a task this replica runs is recorded ``failed`` before
    the replica exits, unless it is killed.
    """

    def __init__(
        self,
        app: App,
        settings: TaskSettings,
        store: SessionStore,
        replica_id: str,
        start: Callable[..., object],
        wall: Callable[[], float] = time.time,
        on_change: Callable[[str, TaskRecord], None] | None = None,
    ) -> None:
        self.app = app
        self.settings = settings
        self.store = store
        self.replica_id = replica_id
        self._start = start
        self._wall = wall
        #: Told of every change this replica writes (status notifications).
        self.on_change = on_change
        #: Runs in progress here: (principal, task id) -> (run number, its stopper).
        self.running: dict[tuple[str, str], tuple[int, Stoppable]] = {}

    # ------------------------------------------------------------ creation
    async def create(
        self,
        principal: str,
        req: Request,
        access: AccessToken | None,
        answers: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        """Store a new ``working`` task for ``req`` (a ``tools/call``), start its first
        run here, and return its ``CreateTaskResult``.

        Raises:
            RemoteProtocolError: 429 ``task_limit`` when the principal holds its cap.
            StoreUnavailable: the store is down (nothing was created or run).
        """
        cfg = self.settings
        params = {k: v for k, v in (req.params or {}).items() if k not in _ROUND_PARAMS}
        record = new_task(
            secrets.token_urlsafe(32),
            params,
            wall=self._wall(),
            ttl_ms=int(cfg.ttl * 1000),
            poll_ms=cfg.poll_ms,
            owner=self.replica_id,
            lease=cfg.lease,
            answers=answers,
        )
        written = await self.store.put_task(
            principal,
            record.id,
            encode_record(record),
            version=0,
            ttl=cfg.ttl,
            cap=cfg.max_per_principal,
        )
        if written is TaskWrite.FULL:
            raise RemoteProtocolError(
                f"this principal already holds {cfg.max_per_principal} tasks; "
                "wait for some to expire",
                http_status=429,
                reason=Reason.TASK_LIMIT,
                request_id=req.id,
                retry_after_ms=int(cfg.poll_ms),
            )
        if written is TaskWrite.NO_ROOM:
            raise RemoteProtocolError(
                "the server's memory budget has no room for another task",
                http_status=503,
                reason=Reason.OVERLOADED,
                request_id=req.id,
                retry_after_ms=int(cfg.poll_ms),
            )
        if written is not TaskWrite.WRITTEN:  # a 256-bit id already taken: never
            raise RuntimeError("a fresh task id was already in the store")
        self._start(self._run, principal, record, access)
        return create_result(record)

    # ------------------------------------------------------------ tasks/*
    async def serve(
        self, principal: str, req: Request, access: AccessToken | None
    ) -> dict[str, Any]:
        """Answer ``tasks/get``, ``tasks/update`` or ``tasks/cancel`` for ``principal``.

        Raises:
            RemoteProtocolError: 400 -32602 for a missing task id or a task this
                principal does not have, or malformed ``inputResponses``.
            StoreUnavailable: the store is down.
        """
        task_id = task_id_of(req.params, req.id)
        wall = self._wall()
        if req.method == "tasks/get":
            record = await self._change(
                principal,
                task_id,
                lambda r: task_interrupted(r, wall) if lease_ran_out(r, wall) else None,
            )
            if record is None:
                raise task_not_found(req.id)
            return detailed(record)
        if req.method == "tasks/cancel":
            record = await self._change(principal, task_id, lambda r: task_cancelled(r, wall))
            if record is None:
                raise task_not_found(req.id)
            self._stop_here(principal, task_id)
            return ack()
        responses = (req.params or {}).get("inputResponses")
        if not isinstance(responses, dict):
            raise RemoteProtocolError(
                "tasks/update needs params.inputResponses, an object",
                http_status=400,
                reason=Reason.INVALID_REQUEST,
                code=INVALID_PARAMS,
                request_id=req.id,
            )
        lease = self.settings.lease
        before: list[TaskRecord] = []

        def fold(r: TaskRecord) -> TaskRecord | None:
            before[:] = [r]
            return task_answered(r, responses, wall, owner=self.replica_id, lease=lease)

        record = await self._change(principal, task_id, fold)
        if record is None:
            raise task_not_found(req.id)
        if before and record is not before[0] and runs(record, record.run):
            self._start(self._run, principal, record, access)  # the last answer: run again
        return ack()

    # ------------------------------------------------------------ runs
    async def _run(self, principal: str, record: TaskRecord, access: AccessToken | None) -> None:
        """Run the handler of ``record``'s current run here beside its lease renewal
        (:meth:`renewed` every third of a lease; stop the handler once it says no),
        register its stopper in :attr:`running`, then :meth:`_finish` with what
        :meth:`_handle` returned -- or ``task_interrupted`` when the handler was
        stopped, or the runtime is going away (within :data:`SHUTDOWN_WAIT`)."""
        raise NotImplementedError

    async def sleep(self, seconds: float) -> None:
        """The runtime's sleep (a handler's ``ctx.sleep``)."""
        raise NotImplementedError

    async def shutdown(self) -> None:
        """Stop every run here; each records its task ``failed`` (``interrupted``)
        before this returns, or :data:`SHUTDOWN_WAIT` seconds pass."""
        raise NotImplementedError

    async def _handle(
        self, principal: str, record: TaskRecord, access: AccessToken | None
    ) -> Callable[[TaskRecord, float], TaskRecord]:
        """Run the handler once; how its end changes the record."""
        params = record.params
        req = Request(id=f"task-{record.id[:16]}", method="tools/call", params=params)
        sent = params.get("_meta")
        meta: dict[str, Any] = sent if isinstance(sent, dict) else {}
        run = record.run

        async def task_status(message: str) -> None:
            wall = self._wall()
            await self._change(
                principal,
                record.id,
                lambda r: task_status_message(r, message, wall) if runs(r, run) else None,
            )

        ctx = Context(
            TaskBackend(_caller(meta), task_status, self.sleep),
            req.id,
            meta,
            state=None,
            inputs=dict(record.answers),
            access_token=access,
        )
        ctx.task_id = record.id
        try:
            result = await dispatch(self.app, req, ctx)
        except InputRequired as asked_for:
            asks = dict(asked_for.requests)
            return lambda r, wall: task_asked(r, asks, wall)
        except BecomeTask:  # (never raised in a task; a handler that re-raises it)
            return _failure(req, RuntimeError("become_task raised inside a task"))
        except McpError as exc:
            try:
                return _ended_with(handler_error(req, exc))
            except RemoteProtocolError as refusal:
                error = {"code": refusal.code, "message": str(refusal), "data": refusal.data}
                return lambda r, wall: task_failed(r, error, wall)
        except Exception as exc:
            return _failure(req, exc)
        return self._fit(result)

    def _fit(self, result: dict[str, Any]) -> Callable[[TaskRecord, float], TaskRecord]:
        size = len(msgspec.json.encode(result))
        limit = self.settings.max_result_bytes
        if size <= limit:
            return lambda r, wall: task_completed(r, result, wall)
        error = {
            "code": INVALID_PARAMS,
            "message": f"the task's result is {size} bytes; tasks keep at most {limit}",
            "data": {"reason": str(Reason.RESULT_TOO_LARGE), "size": size, "limit": limit},
        }
        return lambda r, wall: task_failed(r, error, wall)

    async def _renew(self, principal: str, task_id: str, run: int, handler: Stoppable) -> None:
        """Renew run ``run``'s lease every third of a lease; stop ``handler`` once the
        record no longer names the run (cancelled, or declared lost, elsewhere)."""
        while True:
            await self.sleep(self.settings.lease / 3)
            if not await self.renewed(principal, task_id, run):
                handler.cancel()
                return

    async def renewed(self, principal: str, task_id: str, run: int) -> bool:
        """One lease renewal of run ``run``: False once the record no longer names it
        (cancelled, or declared lost, elsewhere) -- its handler must stop.  A store
        hiccup is not a no: the next renewal tries again."""
        lease = self.settings.lease
        try:
            record = await self._change(
                principal,
                task_id,
                lambda r: lease_renewed(r, self._wall(), lease) if runs(r, run) else None,
            )
        except Exception:
            log.warning("could not renew the lease of task %s", task_id[:16])
            return True
        return record is not None and runs(record, run)

    async def _finish(
        self,
        principal: str,
        task_id: str,
        run: int,
        outcome: Callable[[TaskRecord, float], TaskRecord],
    ) -> None:
        try:
            await self._change(
                principal,
                task_id,
                lambda r: outcome(r, self._wall()) if runs(r, run) else None,
            )
        except Exception:
            log.warning("could not record the end of task %s", task_id[:16], exc_info=True)

    def _stop_here(self, principal: str, task_id: str) -> None:
        held = self.running.get((principal, task_id))
        if held is not None:
            held[1].cancel()

    # ------------------------------------------------------------ the store
    async def _change(
        self,
        principal: str,
        task_id: str,
        rule: Callable[[TaskRecord], TaskRecord | None],
    ) -> TaskRecord | None:
        """Read the task, apply ``rule`` (None: no change), write over the version
        read; again on a conflict.  The record as it stands after (None: no task)."""
        for _ in range(MAX_ATTEMPTS):
            stored = await self.store.get_task(principal, task_id)
            if stored is None:
                return None
            try:
                record = decode_record(stored.data)
            except msgspec.DecodeError:
                log.warning("task %s: its stored record does not decode", task_id[:16])
                return None
            new = rule(record)
            if new is None or new == record:
                return record
            written = await self.store.put_task(
                principal,
                task_id,
                encode_record(new),
                version=stored.version,
                ttl=new.ttl_ms / 1000,
                cap=self.settings.max_per_principal,
            )
            if written is TaskWrite.WRITTEN:
                if self.on_change is not None and new.updated != record.updated:
                    self.on_change(principal, new)  # (a lease renewal changes nothing seen)
                return new
        raise RuntimeError(f"task {task_id[:16]}: {MAX_ATTEMPTS} conflicting writes in a row")

    async def owned(self, principal: str, task_ids: list[str]) -> list[str]:
        """Which of ``task_ids`` are ``principal``'s tasks (in order, each once)."""
        mine: list[str] = []
        for task_id in dict.fromkeys(task_ids):
            if await self.store.get_task(principal, task_id) is not None:
                mine.append(task_id)
        return mine


def _ended_with(body: bytes) -> Callable[[TaskRecord, float], TaskRecord]:
    """The record's end for an encoded JSON-RPC response: its result or its error."""
    message = msgspec.json.decode(body)
    if isinstance(message, dict) and isinstance(message.get("error"), dict):
        error = message["error"]
        return lambda r, wall: task_failed(r, error, wall)
    result = message.get("result") if isinstance(message, dict) else None
    out = result if isinstance(result, dict) else {"content": [], "isError": True}
    return lambda r, wall: task_completed(r, out, wall)


def _failure(req: Request, exc: Exception) -> Callable[[TaskRecord, float], TaskRecord]:
    return _ended_with(failure(req, exc))


def _caller(meta: dict[str, Any]) -> Caller:
    caps = meta.get("io.modelcontextprotocol/clientCapabilities")
    info = meta.get("io.modelcontextprotocol/clientInfo")
    version = meta.get("io.modelcontextprotocol/protocolVersion")
    return Caller(
        caps if isinstance(caps, dict) else {},
        info if isinstance(info, dict) else {},
        protocol_version=version if isinstance(version, str) else "2026-07-28",
    )


class TaskBackend:
    """What a task's handler talks to: no stream (a task's notifications go nowhere:
    its client polls), no session, the client as the creating request described it;
    ``task_status`` writes the task's ``statusMessage``; ``sleep`` is the runtime's."""

    __slots__ = ("_caller", "_sleep", "task_status")

    def __init__(
        self,
        caller: Caller,
        task_status: Callable[[str], Awaitable[None]],
        sleep: Callable[[float], Awaitable[None]],
    ) -> None:
        self._caller = caller
        self.task_status = task_status
        self._sleep = sleep

    @property
    def session_id(self) -> None:
        return None

    @property
    def caller(self) -> Caller:
        return self._caller

    async def send(self, payload: bytes) -> None:
        await self._sleep(0)  # (a checkpoint: nothing is sent)

    async def request(self, method: str, params: dict[str, Any] | None, timeout: float) -> None:
        raise McpError(-32603, f"a task cannot send {method}: it asks for input instead")

    def close_stream(self, retry_ms: int) -> None:
        return None

    async def sleep(self, seconds: float) -> None:
        await self._sleep(seconds)

    def changed(self, method: str, uri: str | None) -> None:
        return None

    @property
    def protocol_version(self) -> str:
        return self._caller.protocol_version or "2026-07-28"

    def cancel_requested(self, request_id: Any) -> bool:
        return False

    def session_channel(self) -> None:
        return None
