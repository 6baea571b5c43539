"""``subscriptions/listen`` on the asyncio runtime: one open listen response.

Theory of operation
-------------------
A change (a list, a resource, with the tasks extension a task's state) only marks what
a :class:`Listener` wants and wakes its task, which sends within its owner's credit, so
announcing never waits on a slow peer.  What is marked, how marks coalesce and in which
order they are sent is :class:`weir.common.ListenMarks`'s, the same object the Trio
runtime's listener holds; this module only adds the task and its wake-up.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from weir.common import ListenMarks
from weir.protocol.jsonrpc import Request
from weir.protocol.streams import StreamLog

from ._session import Gone, Session


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
