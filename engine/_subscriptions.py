"""``subscriptions/listen`` (MCP 2026-07-28): change notifications on a held response.

Theory of operation
-------------------
A client that wants to hear about changes (tool, prompt or resource lists; updates
of given resources) POSTs ``subscriptions/listen`` and keeps the response open.
The server answers with an SSE stream whose first message acknowledges what it will
send (:func:`weir.common.honoured`: the kinds asked for that this app can change, and at most
:data:`~weir.common.MAX_URIS` resource URIs), and every message on it carries the request's id as
``_meta["io.modelcontextprotocol/subscriptionId"]``.

* **Fan-out never blocks the notifier.**  ``Changes.changed`` (a tool calling
  ``ctx.changed(...)`` on any request) only marks each matching listener's
  :class:`Listener` as having something pending and wakes its task.  The listener's
  own task sends, within its connection's drain credit, so a listener whose peer
  stopped reading holds at most its credit and is torn down after the liveness
  timeout like any stream.  Pending changes coalesce: a list that changed twice
  before the client read the first notice is one notice, which is all a
  ``list_changed`` says ("fetch the list again").
* **Ending.**  The client ends a subscription by closing the response.  At shutdown
  the server ends each one gracefully: the final JSON-RPC result (``resultType:
  "complete"`` and the subscription id), then the end of the stream.
* **Task status** (the tasks extension): a listener may name up to
  :data:`~weir.common._listen.MAX_TASK_IDS` of its principal's tasks
  (``notifications.taskIds``); each change of one is sent as
  ``notifications/tasks`` with the task as ``tasks/get`` would answer it then.
  Pending states coalesce per task: the newest wins.
* **Bounds.**  One listen stream per connection at a time (a connection carries one
  request at a time), so listeners are bounded by the connection limit; each holds
  at most :data:`~weir.common.MAX_URIS` URIs and one pending mark per kind and URI.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import trio

from weir.common import ListenMarks, listen_ack, listen_closing
from weir.protocol.jsonrpc import Request

from ._session import SessionClosed, StreamHandle, StreamLost


@dataclass(eq=False, slots=True)
class Listener:
    """One open ``subscriptions/listen`` response: what it has yet to send is its
    :class:`~weir.common.ListenMarks` (the same rules as the asyncio runtime's);
    this adds the task that sends it and the event that wakes that task."""

    request: Request
    handle: StreamHandle
    marks: ListenMarks
    wake: trio.Event = field(default_factory=trio.Event)

    def notify(self, method: str, uri: str | None) -> None:
        """Mark a change this listener wants (coalesced) and wake its task."""
        if self.marks.mark(method, uri):
            self.wake.set()

    def notify_task(self, principal: str, task_id: str, state: dict[str, Any]) -> None:
        """Mark task ``task_id``'s new state, if this listener follows it and is that
        task's principal's, and wake its task."""
        if self.marks.mark_task(principal, task_id, state):
            self.wake.set()

    def ack(self, honoured_flags: dict[str, Any]) -> str:
        return listen_ack(self.request.id, honoured_flags)

    def closing(self) -> str:
        return listen_closing(self.request.id)

    async def run(self) -> None:
        """Send what is marked, in credit, until the stream ends."""
        try:
            while True:
                await self.wake.wait()
                self.wake = trio.Event()
                for frame in self.marks.take():
                    await self.handle.send(frame)
        except (StreamLost, SessionClosed):
            return
