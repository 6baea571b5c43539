"""The Trio server: a composition of components, and its lifecycle.

Theory of operation
-------------------
Each TCP connection gets one task (``engine._connections``): the small
``receive_some -> receive_data -> next_event -> respond -> send`` loop around an
:class:`~weir.engine._connection.Connection` (the :class:`weir.protocol.HttpConnection` plus
byte-exact send accounting).  All MCP endpoint rules come from
:func:`weir.protocol.route`, and the order of each request's decisions from the
core's courses; the server adds what needs state or I/O.

:class:`Server` is made of components, each a plain class owning one concern,
given in its constructor the :class:`~._shared.Shared` state and the components it
calls (no component reaches another any other way):

* :class:`~._session_table.SessionTable` (``engine._session_table``) -- the live
  sessions: creating, adopting, looking up, sweeping and ending them, their limits,
  their credit timers and, with a shared store, their idleness;
* :class:`~._connections.Connections` -- connections: the read loop and its
  deadlines, the in-flight byte cap, lingering after a refusal;
* :class:`~._routing.Router` -- routing a request, authorization, resource
  metadata, ``/metrics``, the refusals before a response;
* :class:`~._calls.Calls` -- a session-era POST: admission, the idempotency gate,
  batches, JSON mode, ``initialize``, notifications and the rebind handshake;
* :class:`~._execution.Execution` -- running handlers (in the handler nursery, or
  inline) and recording their outcomes in the gate;
* :class:`~._streams.Streams` -- SSE streams: GET, resumption and replay from a
  shared store, DELETE;
* :class:`~._legacy.Legacy` -- the 2024-11-05 HTTP+SSE transport;
* :class:`~._sessionless.Sessionless` -- the 2026-07-28 revision, with its credit
  owners (:class:`~._owners.Owners`) and its keyed gate
  (:class:`~._keyed.KeyedCalls`);
* :class:`~._changes.Changes` -- ``subscriptions/listen`` and the change bus;
* :class:`~._replicas.Replicas` -- background work with a shared store (call
  leases, forwarded answers and cancellations).

Calls flow one way: connections -> router -> the request kinds (calls, streams,
legacy, sessionless) -> execution, streams, owners, keyed calls, changes -> the
session table.  The one hook back (a session's handlers announcing a change) is a
callable the table is given.

This module holds the wiring, the public API, and the lifecycle.  **Shutdown**
(:meth:`Server.shutdown`): stop accepting, refuse new requests with 503
``shutting_down``, let running handlers finish within the grace period, end every
open stream with ``retry:``, then cancel what is left.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Callable
from typing import Any

import trio

from weir.app import App
from weir.common import StateSealer
from weir.common._logs import DrainReport
from weir.common._metrics_share import PERIOD as PUBLISH_PERIOD
from weir.common._unix import remove_unix

from ._calls import REBIND_METHOD as REBIND_METHOD
from ._calls import Calls
from ._changes import Changes
from ._config import ServerConfig, _open_listeners
from ._connections import Connections
from ._execution import Execution
from ._keyed import KeyedCalls
from ._legacy import Legacy
from ._listen import AcceptGate
from ._owners import Owners
from ._replicas import Replicas
from ._routing import Router
from ._session_store import SessionStore, replicas_sealer
from ._session_table import SessionTable
from ._sessionless import Sessionless
from ._shared import Shared, with_declared_auth
from ._streams import Streams
from ._tasks import TaskSettings
from ._tasks_trio import TrioTasks


class Server:
    """An MCP server for one :class:`~weir.engine.App` (see the module docstring).

    Its attributes for introspection (``sessions``, ``metrics``, ``budget``,
    ``deadlines``, ``owners``, ...) are the components' own objects.

    Args:
        app: the application.
        config: server configuration.
        store: the session store (default: a new :class:`~weir.engine.MemoryStore`).
        session_id_factory: makes session ids (default: 32 random bytes, base64url);
            every id it returns must match :data:`~weir.engine._store_records.SESSION_ID_FORMAT`
            (an id outside it is refused when minted: ``ValueError``).
    """

    def __init__(
        self,
        app: App,
        config: ServerConfig | None = None,
        *,
        store: SessionStore | None = None,
        session_id_factory: Callable[[], str] | None = None,
    ) -> None:
        config = with_declared_auth(app, config or ServerConfig())
        shared = self._shared = Shared(app, config, store)
        self.app, self.config, self.store = app, config, shared.store
        self.budget, self.metrics, self.replica_id = (
            shared.budget,
            shared.metrics,
            shared.replica_id,
        )
        self.sessions, self.acks, self._heads = shared.sessions, shared.acks, shared.heads
        #: Accept loops under the connection limit (see :mod:`engine._listen`).
        self.gate = AcceptGate(config.connection_limit)
        self.listeners: list[trio.SocketListener] = []
        self._uds_inode = -1  # (the socket file's, with config.uds: removed at the end)
        self._wire(shared, session_id_factory or (lambda: secrets.token_urlsafe(32)))
        self._shutdown = trio.Event()
        #: Set once :meth:`run` has finished (after a shutdown or cancellation).
        self.stopped = trio.Event()
        self._accept_scope = trio.CancelScope()
        self._accepting_done = trio.Event()

    def _wire(self, shared: Shared, new_id: Callable[[], str]) -> None:
        """Make the components, each given what it calls (see the module docstring)."""
        changes = self._changes = Changes(shared)
        table = self._table = SessionTable(shared, new_id=new_id, on_change=changes.changed)
        owners = self._owners = Owners(shared, table.equip)
        keyed = self._keyed = KeyedCalls(shared)
        execution = Execution(shared)
        streams = Streams(shared, table)
        calls = self._calls = Calls(shared, table, streams, execution)
        legacy = Legacy(shared, table, streams, calls, execution)
        tasks = self._tasks = TrioTasks(
            shared.app,
            TaskSettings.of(shared.config),
            shared.store,
            shared.replica_id,
            shared.start,
            on_change=changes.task_changed,
        )
        sessionless = Sessionless(shared, owners, keyed, changes, execution, tasks)
        router = self._router = Router(
            shared,
            calls=calls,
            streams=streams,
            legacy=legacy,
            sessionless=sessionless,
            owners=owners,
            changes=changes,
            gate=self.gate,
        )
        self._connections = Connections(shared, router, owners)
        self._replicas = Replicas(shared, keyed)
        # What tests and tools read: the components' own objects (never copies).
        self.deadlines, self.read_deadlines = table.deadlines, self._connections.read_deadlines
        self.open_connections = self._connections.open_connections
        self.owners, self.principal_owners = owners.owners, owners.principal_owners
        self.keyed_calls, self.subscribers = keyed.calls, changes.subscribers

    # ---------------------------------------------------------------- live state
    @property
    def notes_running(self) -> int:
        """Client notifications the app's hooks are handling right now."""
        return self._calls.notes_running

    @property
    def inbound(self) -> int:
        """Bytes of incomplete requests buffered by all connections right now."""
        return self._connections.inbound

    @property
    def state(self) -> Any:
        """What the app's lifespan yielded (``Context.state``); None without one."""
        return self._shared.state

    @property
    def sealer(self) -> StateSealer:
        """The request-state sealer (with a shared store: the replicas' one key)."""
        return self._shared.sealer

    # ---------------------------------------------------------------- public API
    @property
    def port(self) -> int:
        """The bound port (after :meth:`run` has started)."""
        return int(self.listeners[0].socket.getsockname()[1])

    @property
    def url(self) -> str:
        """``http[s]://host:port/path`` of the endpoint (after start); ``unix:PATH``
        with :attr:`ServerConfig.uds`."""
        if self.config.uds is not None:
            return f"unix:{self.config.uds}"
        host = self.config.host
        if ":" in host:
            host = f"[{host}]"
        return f"{self.config.scheme}://{host}:{self.port}{self.config.path}"

    async def serve_connection(self, stream: trio.abc.Stream) -> None:
        """Serve one already-accepted connection until it closes (needs :meth:`run` started)."""
        if self._shared.handlers is None:
            raise RuntimeError("Server.run() must be started before serve_connection()")
        await self._connections.connection(stream)

    @property
    def shutting_down(self) -> bool:
        """True once :meth:`shutdown` was called."""
        return self._shutdown.is_set()

    def shutdown(self) -> None:
        """Begin a graceful shutdown (idempotent; returns at once)."""
        self._shutdown.set()

    # ---------------------------------------------------------------- lifecycle
    async def run(
        self,
        *,
        task_status: trio.TaskStatus[Server] = trio.TASK_STATUS_IGNORED,
        listen: bool = True,
    ) -> None:
        """Listen and serve until :meth:`shutdown`; usable with ``nursery.start``.

        With ``listen=False`` no socket is opened: connections are handed in with
        :meth:`serve_connection` (in-memory tests, or another accept loop).
        """
        shared = self._shared
        try:
            if self.store.shared and not self.config.state_keys:
                # Replicas must open each other's request state: one key, in the store.
                shared.sealer = await replicas_sealer(self.store)
            async with self.app.lifespan_context() as state:
                shared.state = state
                if listen:
                    self.listeners = await _open_listeners(self.config)
                    if self.config.uds is not None:
                        self._uds_inode = os.stat(self.config.uds).st_ino
                detach = self.app.attach_changes(self._changes.changed)
                try:
                    await self._run(task_status)
                finally:
                    detach()
                    await self._table.close_hooks(list(self.sessions))
        finally:
            self.stopped.set()

    async def _run(self, task_status: trio.TaskStatus[Server]) -> None:
        async with trio.open_nursery() as handlers:
            self._shared.handlers = handlers
            handlers.start_soon(self.deadlines.run)  # every session's credit timers
            # every connection's read deadline, and its unacknowledged bytes
            handlers.start_soon(self._connections.serve_read_deadlines)
            handlers.start_soon(self.acks.run)
            async with trio.open_nursery() as conns:
                conns.start_soon(self._serve_listeners, conns)
                if self._connections.lot is not None:
                    conns.start_soon(self._connections.lot.run, conns)
                conns.start_soon(self._table.sweep)
                if self.store.shared:
                    conns.start_soon(self._replicas.relay_mail)
                    conns.start_soon(self._changes.relay_changes)
                    conns.start_soon(self._replicas.renew_leases)
                if self.metrics.share is not None:
                    conns.start_soon(self._publish_metrics)
                task_status.started(self)
                await self._shutdown.wait()
                await self._drain()
                await self._give_back_unheard()
                conns.cancel_scope.cancel()
                self.metrics.publish(self.sessions, **self._router.metered())  # (the last)
            handlers.cancel_scope.cancel()
        await self.store.aclose()

    async def _give_back_unheard(self) -> None:
        """Before exiting: give back the claims whose answer the store lost
        (``engine._unheard``), within 5 s; what is left ends by its lease."""
        unheard = self._shared.unheard
        if self.store.shared and len(unheard):
            with trio.move_on_after(5.0):
                await unheard.give_back(self.store)

    async def _publish_metrics(self) -> None:
        """With ``--workers``: publish this worker's metrics for the others' scrapes."""
        while True:
            await trio.sleep(PUBLISH_PERIOD)
            self.metrics.publish(self.sessions, **self._router.metered())

    async def _serve_listeners(self, conns: trio.Nursery) -> None:
        serve = self._connections.connection
        try:
            if self.listeners:
                with self._accept_scope:
                    async with trio.open_nursery() as loops:
                        for listener in self.listeners:
                            loops.start_soon(self.gate.serve, listener, serve, conns)
        finally:
            self._accepting_done.set()

    async def _drain(self) -> None:
        shared = self._shared
        shared.closing = True
        # Stop accepting first; close the listening sockets only once no task uses them.
        self._accept_scope.cancel()
        await self._accepting_done.wait()
        for listener in self.listeners:
            await listener.aclose()
        if self.config.uds is not None and self.listeners:
            remove_unix(self.config.uds, self._uds_inode)

        # Each wait below re-checks only when a handler ends, a response is enqueued
        # or a writer detaches.  Calls finish when their response is in the log.
        def running() -> int:
            return sum(s.inflight for s in (*self.sessions.values(), *self.owners))

        report = DrainReport(running(), self.config.shutdown_grace, trio.current_time())
        with trio.move_on_after(self.config.shutdown_grace):
            while any(s.running or s.inflight for s in (*self.sessions.values(), *self.owners)):
                await shared.activity()
                report.progress(running(), trio.current_time())
        report.done(running())
        await self._tasks.shutdown()  # each run records its task failed (interrupted)
        self._changes.end_subscriptions()
        for session in self.sessions.values():
            for h in session.handles.values():
                h.request_close(self.config.retry_ms)
        with trio.move_on_after(1.0):  # let writers send their retry: and end
            while any(
                h.writer_scope is not None
                for s in self.sessions.values()
                for h in s.handles.values()
            ):
                await shared.activity()


async def serve(
    app: App,
    config: ServerConfig | None = None,
    *,
    task_status: trio.TaskStatus[Server] = trio.TASK_STATUS_IGNORED,
    **kwargs: Any,
) -> None:
    """Serve ``app`` until cancelled or shut down.

    ``server = await nursery.start(serve, app, config)`` returns the running
    :class:`Server` once it listens.
    """
    server = Server(app, config, **kwargs)
    await server.run(task_status=task_status)


__all__ = ["Server", "ServerConfig", "serve"]
