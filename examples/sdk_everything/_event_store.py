"""The in-memory SSE event store ``python -m examples.sdk_everything`` serves with.

The SDK's Streamable HTTP app needs an :class:`~mcp.server.streamable_http.EventStore`
for SSE resumability; :class:`MemoryEventStore` is a small in-process one.
"""

from __future__ import annotations

import anyio
from mcp.server.streamable_http import EventCallback, EventMessage, EventStore
from mcp.types import JSONRPCMessage


class MemoryEventStore(EventStore):
    """Keeps every SSE event in memory so a client can resume with ``Last-Event-ID``.

    Event ids are a process-wide counter; replay sends the events of the same stream
    that came after the given id.  Unbounded: this is a test fixture.
    """

    def __init__(self) -> None:
        self._events: list[tuple[str, JSONRPCMessage | None]] = []  # index + 1 is the id
        self._lock = anyio.Lock()

    async def store_event(self, stream_id: str, message: JSONRPCMessage | None) -> str:
        async with self._lock:
            self._events.append((stream_id, message))
            return str(len(self._events))

    async def replay_events_after(
        self, last_event_id: str, send_callback: EventCallback
    ) -> str | None:
        try:
            last = int(last_event_id)
        except ValueError:
            return None
        if not 1 <= last <= len(self._events):
            return None
        stream_id = self._events[last - 1][0]
        for index in range(last, len(self._events)):
            stream, message = self._events[index]
            if stream == stream_id and message is not None:  # None marks a priming event
                await send_callback(EventMessage(message, str(index + 1)))
        return stream_id
