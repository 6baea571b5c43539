"""``subscriptions/listen`` on the asyncio runtime: one open listen response.

Theory of operation
-------------------
A change (a list, a resource, with the tasks extension a task's state) only marks what
a :class:`Listener` wants and wakes its task, which sends within its owner's credit, so
announcing never waits on a slow peer; pending marks coalesce (a task's newest state
wins).  What each message says is :mod:`weir.common._listen`'s, as on Trio.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from weir.common import listen_frame
from weir.common._listen import TASK_NOTIFICATION
from weir.protocol.jsonrpc import Request
from weir.protocol.streams import StreamLog

from ._session import Gone, Session


class Listener:
    """One open ``subscriptions/listen`` response: the changes it waits to send (list
    kinds, resource URIs and, with the tasks extension, its principal's tasks'
    states; each coalesced, the newest state of a task winning)."""

    def __init__(
        self,
        req: Request,
        owner: Session,
        stream: StreamLog,
        kinds: frozenset[str],
        uris: frozenset[str],
        principal: str = "",
        task_ids: frozenset[str] = frozenset(),
    ) -> None:
        self.request, self.owner, self.stream = req, owner, stream
        self.kinds, self.uris = kinds, uris
        #: Who listens (a task's status goes only to its own principal's listeners).
        self.principal = principal
        #: Tasks whose status this listener agreed to send.
        self.task_ids = task_ids
        self.pending: set[str] = set()
        self.updated: set[str] = set()
        self.task_states: dict[str, dict[str, Any]] = {}
        self.wake = asyncio.Event()

    def notify(self, method: str, uri: str | None) -> None:
        """Mark a change this listener wants (coalesced) and wake its task."""
        if uri is not None:
            if uri not in self.uris:
                return
            self.updated.add(uri)
        elif method in self.kinds:
            self.pending.add(method)
        else:
            return
        self.wake.set()

    def notify_task(self, principal: str, task_id: str, state: dict[str, Any]) -> None:
        """Mark task ``task_id``'s new state for sending, if this listener follows it
        and is that task's principal's; only the newest state is kept."""
        if task_id in self.task_ids and principal == self.principal:
            self.task_states[task_id] = state
            self.wake.set()

    async def run(self) -> None:
        """Send what is pending, in credit, until the stream ends."""
        rid = self.request.id
        with contextlib.suppress(Gone):
            while True:
                await self.wake.wait()
                self.wake.clear()
                methods, self.pending = sorted(self.pending), set()
                uris, self.updated = sorted(self.updated), set()
                for method in methods:
                    await self.owner.append(self.stream, listen_frame(rid, method))
                for uri in uris:
                    frame = listen_frame(rid, "notifications/resources/updated", {"uri": uri})
                    await self.owner.append(self.stream, frame)
                states, self.task_states = self.task_states, {}
                for state in states.values():
                    frame = listen_frame(rid, TASK_NOTIFICATION, state)
                    await self.owner.append(self.stream, frame)
