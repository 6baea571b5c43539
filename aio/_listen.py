"""``subscriptions/listen`` on the asyncio runtime: its open listen responses.

Theory of operation
-------------------
A change (a list, a resource, with the tasks extension a task's state) only marks what
a :class:`Listener` wants and wakes its task, which sends within its owner's credit, so
announcing never waits on a slow peer.  What is marked, how marks coalesce and in which
order they are sent is :class:`weir.common.ListenMarks`'s, the same object the Trio
runtime's listener holds; this module only adds the task and its wake-up, and
:func:`serve_listen` opens one (acknowledge, then stream until the response ends).
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import TYPE_CHECKING, Any

from weir.common import ListenMarks, era_capabilities, honoured, listen_ack
from weir.common._listen import tasks_asked
from weir.protocol.jsonrpc import Request
from weir.protocol.sessionless_post import Listen
from weir.protocol.states import StreamInput, StreamState
from weir.protocol.streams import StreamKind, StreamLog

from ._session import Gone, Session

if TYPE_CHECKING:
    from ._connection import Connection
    from ._driver import AsyncioDriver


class Listener:
    """One open ``subscriptions/listen`` response: its :class:`ListenMarks`, the
    owner and stream it sends on, and the event that wakes its sender."""

    __slots__ = ("marks", "owner", "request", "stream", "wake")

    def __init__(self, req: Request, owner: Session, stream: StreamLog, marks: ListenMarks) -> None:
        self.request, self.owner, self.stream = req, owner, stream
        self.marks = marks
        self.wake = asyncio.Event()

    def notify(self, method: str, uri: str | None) -> None:
        """Mark a change this listener wants (coalesced) and wake its task."""
        if self.marks.mark(method, uri):
            self.wake.set()

    def notify_task(self, principal: str, task_id: str, state: dict[str, Any]) -> None:
        """Mark task ``task_id``'s new state, if this listener follows it and is that
        task's principal's, and wake its task."""
        if self.marks.mark_task(principal, task_id, state):
            self.wake.set()

    async def run(self) -> None:
        """Send what is marked, in credit, until the stream ends."""
        with contextlib.suppress(Gone):
            while True:
                await self.wake.wait()
                self.wake.clear()
                for frame in self.marks.take():
                    await self.owner.append(self.stream, frame)


async def serve_listen(
    driver: AsyncioDriver, conn: Connection, owner: Session, effect: Listen, principal: str
) -> None:
    """``subscriptions/listen``: acknowledge, then stream changes until the end.

    Raises:
        RemoteProtocolError: 400 -32021 for task ids asked without the tasks
            extension declared.
    """
    req, lane = effect.request, effect.lane
    params = req.params if isinstance(req.params, dict) else {}
    asked = params.get("notifications")
    flags, kinds, uris = honoured(asked, era_capabilities(driver.app))
    task_ids: list[str] = []
    names = tasks_asked(asked, effect.tasks_declared, req.id)
    if names:
        task_ids = await driver.tasks.owned(principal, names)
        flags["taskIds"] = task_ids
    stream = owner.open_stream(StreamKind.REQUEST, emit_ids=False)
    owner.flow.move(lane, stream.epoch)
    listener = Listener(
        req, owner, stream, ListenMarks(req.id, kinds, uris, principal, frozenset(task_ids))
    )
    ack = listen_ack(req.id, flags)
    if not owner.try_append(stream, ack):
        owner.spawn(_append_quietly(owner, stream, ack))
    owner.done(stream.epoch)  # its "answer" (the acknowledgement) is enqueued
    driver.listeners.add(listener)
    sender = owner.spawn(listener.run())
    try:
        await conn.write_stream(owner, stream, 0)
    finally:
        sender.cancel()
        driver.listeners.discard(listener)
        if stream.state is not StreamState.CLOSED:
            stream.handle(StreamInput.ABORT)


async def _append_quietly(owner: Session, stream: StreamLog, payload: str) -> None:
    with contextlib.suppress(Gone):
        await owner.append(stream, payload)
