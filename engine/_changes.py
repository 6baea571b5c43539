"""``subscriptions/listen`` and the change bus of the sessionless era (2026-07-28).

Theory of operation
-------------------
A listener is a :class:`~._subscriptions.Listener` on an answer stream of its
request's credit owner: acknowledged at once, then fed the changes it asked for
until the client goes or the server shuts down (each gets its final result).  A
handler's announced change is delivered here at once and, with a shared store, put
on the store's bus, which a replica with listeners reads every :data:`CHANGE_POLL`
seconds; session-era GET streams hear the same notices.

:class:`Changes` owns the listeners (:attr:`Changes.subscribers`) and the bus; the
session table hands its :meth:`Changes.changed` to every session and owner.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Hashable

import trio

from weir.common import ListenMarks, era_capabilities, honoured
from weir.common._listen import (
    TASK_NOTIFICATION,
    deliver_task,
    task_change_read,
    task_change_where,
    tasks_asked,
)
from weir.protocol.jsonrpc import Request, encode_notification
from weir.protocol.messages import CHANGE_POLL, encode_change, first_change_cursor, read_change
from weir.protocol.states import StreamInput, StreamState
from weir.protocol.tasks import TaskRecord, decode_record

from ._connection import Connection
from ._owners import open_answer_stream
from ._session import Session
from ._shared import Shared, log
from ._store_errors import StoreUnavailable
from ._stream_handle import StreamHandle, StreamLost
from ._subscriptions import Listener
from ._writer import SSE_HEADERS, write_stream

#: ``(principal, ids)`` -> the ids among them that are that principal's tasks.
TaskLookup = Callable[[str, list[str]], Awaitable[list[str]]]


class Changes:
    """Listeners and announced changes (see the module docstring).

    Guarantees: an announced change reaches every listener and GET stream here that
    asked for it at once (never waiting on a slow peer) and, with a shared store,
    the other replicas' within about :data:`CHANGE_POLL`; each listener gets its
    final result at shutdown.
    """

    def __init__(self, shared: Shared) -> None:
        self.shared = shared
        self.config = shared.config
        self.store = shared.store
        self.sessions = shared.sessions
        self.replica_id = shared.replica_id
        #: The open ``subscriptions/listen`` streams.
        self.subscribers: set[Listener] = set()
        #: GET streams whose change notice is on its way to the store (one at a time).
        self._storing: set[StreamHandle] = set()

    async def listen(
        self,
        conn: Connection,
        owner: Session,
        req: Request,
        lane: Hashable,
        principal: str = "",
        tasks: TaskLookup | None = None,
        tasks_declared: bool = False,
    ) -> None:
        """``subscriptions/listen``: acknowledge, then stream changes until the end.

        ``tasks``: how to tell which of the ``notifications.taskIds`` asked for are
        ``principal``'s own tasks (None: this runtime serves no tasks);
        ``tasks_declared``: the request declared the tasks extension.

        Raises:
            RemoteProtocolError: 400 -32021 for task ids asked without the tasks
                extension declared.
        """
        params = req.params if isinstance(req.params, dict) else {}
        asked = params.get("notifications")
        flags, kinds, uris = honoured(asked, era_capabilities(self.shared.app))
        task_ids: list[str] = []
        names = tasks_asked(asked, tasks_declared, req.id) if tasks is not None else []
        if tasks is not None and names:
            task_ids = await tasks(principal, names)
            flags["taskIds"] = task_ids
        handle = open_answer_stream(owner, self.config.max_stream_events)
        owner.move_reservations(lane, handle.log.epoch)
        marks = ListenMarks(req.id, kinds, uris, principal, frozenset(task_ids))
        listener = Listener(req, handle, marks)
        if not handle.try_send_now(listener.ack(flags)):
            self.shared.start(handle.send, listener.ack(flags))
        owner.done(1, handle.log.epoch)  # its "answer" (the acknowledgement) is enqueued
        self.subscribers.add(listener)
        sender = trio.CancelScope()

        async def send_changes() -> None:
            with sender:
                await listener.run()

        # The sender is a handler task, not a child of this one: the writer's own
        # errors (a peer gone) then reach the connection loop as they are.
        self.shared.start(send_changes)
        try:
            keepalive = self.config.sse_keepalive
            await write_stream(conn, owner, handle, 0, SSE_HEADERS, keepalive=keepalive)
        finally:
            sender.cancel()
            self.subscribers.discard(listener)
            if handle.log.state is not StreamState.CLOSED:
                handle.handle(StreamInput.ABORT)

    def changed(self, method: str, uri: str | None = None) -> None:
        """A handler announced a change: deliver it here and, with a shared store, put
        it on the store's bus for the other replicas (:meth:`relay_changes`)."""
        self._deliver_change(method, uri)
        if self.store.shared:
            change = encode_change(method, uri, self.replica_id)
            self.shared.start(self._publish_change, change)

    def task_changed(self, principal: str, record: TaskRecord) -> None:
        """A task's record changed here: tell its principal's listeners that follow it
        and, with a shared store, the other replicas (they read the record again)."""
        self._deliver_task(principal, record)
        if self.store.shared:
            where = task_change_where(principal, record.id)
            change = encode_change(TASK_NOTIFICATION, where, self.replica_id)
            self.shared.start(self._publish_change, change)

    def _deliver_task(self, principal: str, record: TaskRecord) -> None:
        deliver_task(self.subscribers, principal, record)

    def _followed(self, where: str) -> tuple[str, str] | None:
        """``(principal, task id)`` of a task change read off the bus, if a listener here
        follows that task (else nothing to do, and no task is started for it)."""
        read = task_change_read(where)
        if read is None:
            return None
        principal, task_id = read
        if not any(task_id in listener.marks.task_ids for listener in self.subscribers):
            return None
        return principal, task_id

    async def _relay_task(self, principal: str, task_id: str) -> None:
        """Another replica changed a task someone here follows: read it and tell."""
        try:
            stored = await self.store.get_task(principal, task_id)
        except StoreUnavailable:
            return
        if stored is not None:
            self._deliver_task(principal, decode_record(stored.data))

    async def _publish_change(self, change: bytes) -> None:
        try:
            await self.store.publish_change(change)
        except StoreUnavailable:
            log.warning("could not put an announced change on the store's bus")

    async def relay_changes(self) -> None:
        """Shared stores only: deliver the changes other replicas announced.

        Reads the bus every :data:`CHANGE_POLL` seconds while anyone here listens, so
        an idle replica costs the store nothing.  Once someone starts to listen, the
        first read goes ``CHANGE_LOOKBACK`` seconds back (the bus's ids are the
        store's clock in milliseconds), so a change announced elsewhere just as the
        listener arrived is not lost; a listener may hear a notice a few seconds
        old, which only asks it to fetch a list again.
        """
        cursor: str | None = None
        while True:
            await trio.sleep(CHANGE_POLL)
            if not self.subscribers and not self.sessions:
                cursor = None
                continue
            if cursor is None:
                cursor = first_change_cursor(time.time())
            try:
                cursor, changes = await self.store.read_changes(cursor)
            except StoreUnavailable:
                continue
            for raw in changes:
                change = read_change(raw, self.replica_id)
                if change is None:
                    continue
                method, where = change
                if method == TASK_NOTIFICATION:  # (never a list change: not for GET streams)
                    followed = self._followed(where) if where is not None else None
                    if followed is not None:
                        self.shared.start(self._relay_task, *followed)
                else:
                    self._deliver_change(method, where)

    def _deliver_change(self, method: str, uri: str | None) -> None:
        """Tell every client here that wants it that a list changed, or resource
        ``uri`` did: sessionless listeners, and session-era GET streams (resource
        updates only where the session subscribed).  Never waits: a GET stream
        without credit for the notice right now misses it (its peer is not reading).
        A GET stream whose events go to a shared store first (``--resume shared``)
        gets the notice from a task of its own (one at a time per stream: a notice
        that comes while one is being stored is missed, as one without credit is)."""
        for listener in list(self.subscribers):
            listener.notify(method, uri)
        params = {"uri": uri} if uri is not None else None
        payload = encode_notification(method, params).decode()
        for session in self.sessions.values():
            standalone = session.standalone
            if standalone is None or standalone.log.state is StreamState.CLOSED:
                continue
            if uri is None or uri in session.caller.subscriptions:
                if standalone.try_send_now(payload) or standalone.sink is None:
                    continue
                if standalone not in self._storing:
                    self._storing.add(standalone)
                    self.shared.start(self._store_then_send, standalone, payload)

    async def _store_then_send(self, standalone: StreamHandle, payload: str) -> None:
        """A change notice on a GET stream whose events go to the store first."""
        try:
            await standalone.send(payload)  # (a credit wait ends with the session)
        except StreamLost:
            pass  # the stream or its session ended meanwhile: nobody to tell
        except Exception as exc:  # (the store's refusal: the handle has ended the stream)
            log.info("a change notice was not stored (%r): its GET stream ends", exc)
        finally:
            self._storing.discard(standalone)

    def end_subscriptions(self) -> None:
        """At shutdown: end each subscription gracefully (its final result)."""
        for listener in list(self.subscribers):
            if not listener.handle.try_respond_now(listener.closing()):
                self.shared.start(listener.handle.respond, listener.closing())
