"""Live per-session machinery: streams with their writers' wake-ups, running handlers,
and the server-to-client requests awaiting answers.

Theory of operation
-------------------
A :class:`Session` is the in-process half of a session whose record lives in the
store.  Its state changes go through the tables in :mod:`protocol` (here only
:meth:`Session.handle`).  It owns:

* one :class:`StreamHandle` per SSE stream: the pure :class:`protocol.StreamLog`
  plus a Trio wake-up so the attached writer (a connection task) notices appends;
  messages are only ever *appended* to a log, writers only ever *read* it;
* the cancel scope of every running request handler, by JSON-RPC id, so
  ``notifications/cancelled`` and teardown can cancel them;
* the pending server-to-client requests (sampling, elicitation, roots), by the id
  the server gave them, whose answers arrive later in a POST.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any

import trio

from protocol import (
    Message,
    RequestId,
    SessionInput,
    SessionState,
    StreamInput,
    StreamKind,
    StreamLog,
    StreamState,
    StreamTable,
    session_transition,
)

from ._store import SessionRecord

LOG_LEVELS: dict[str, int] = {
    "debug": 0,
    "info": 1,
    "notice": 2,
    "warning": 3,
    "error": 4,
    "critical": 5,
    "alert": 6,
    "emergency": 7,
}


class StreamHandle:
    """A stream's log, the wake-up its writer waits on, and the writer's cancel scope."""

    __slots__ = ("_changed", "close_retry_ms", "log", "outstanding", "writer_scope")

    def __init__(self, log: StreamLog) -> None:
        self.log = log
        self._changed = trio.Event()
        self.outstanding = 0  # requests whose response is still to come on this stream
        self.close_retry_ms: int | None = None  # set: server closes the connection early
        self.writer_scope: trio.CancelScope | None = None

    def append(self, payload: str, *, final: bool = False) -> None:
        """Append one message and wake the writer.  Appends to a CLOSED stream are dropped."""
        if self.log.state is StreamState.CLOSED:
            return
        self.log.append(payload, final=final)
        self.wake()

    def wake(self) -> None:
        """Wake whoever waits in :meth:`wait_changed`."""
        self._changed.set()
        self._changed = trio.Event()

    async def wait_changed(self) -> None:
        """Block until the next append or lifecycle change."""
        await self._changed.wait()

    def handle(self, event: StreamInput) -> None:
        """Apply a lifecycle input to the log's state machine and wake the writer."""
        self.log.handle(event)
        self.wake()

    def request_close(self, retry_ms: int) -> None:
        """Ask the attached writer to send ``retry:`` and end the HTTP response early."""
        self.close_retry_ms = retry_ms
        self.wake()


@dataclass
class PendingRequest:
    """A server-to-client request waiting for the client's answer."""

    done: trio.Event = field(default_factory=trio.Event)
    answer: Message | None = None


class Session:
    """Live state of one session in this process."""

    def __init__(self, record: SessionRecord, *, max_closed_streams: int = 64) -> None:
        self.record = record
        self.state = SessionState.NEW
        self.streams = StreamTable(max_closed=max_closed_streams)
        self.handles: dict[str, StreamHandle] = {}
        self.running: dict[RequestId, trio.CancelScope] = {}
        self.pending: dict[RequestId, PendingRequest] = {}
        self.log_level: str | None = None
        self.subscriptions: set[str] = set()
        self.client_info: dict[str, Any] = {}
        self.client_capabilities: dict[str, Any] = {}
        self._ids = itertools.count(1)

    @property
    def session_id(self) -> str:
        """The ``Mcp-Session-Id``."""
        return self.record.session_id

    @property
    def closed(self) -> bool:
        """True once deleted or torn down."""
        return self.state is SessionState.CLOSED

    def handle(self, event: SessionInput) -> None:
        """Apply a lifecycle input (see :mod:`protocol._states`)."""
        self.state = session_transition(self.state, event)

    def open_stream(self, epoch: str, kind: StreamKind, *, max_events: int) -> StreamHandle:
        """Create and register a stream with a store-allocated epoch."""
        h = StreamHandle(self.streams.add(StreamLog(epoch, kind, max_events=max_events)))
        self.handles[epoch] = h
        for stale in [e for e in self.handles if e not in {s.epoch for s in self.streams}]:
            del self.handles[stale]
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
        """A fresh id for a server-to-client request (never collides with client ids' meaning)."""
        return f"weir-{next(self._ids)}"

    def log_enabled(self, level: str) -> bool:
        """Whether a ``notifications/message`` at ``level`` passes ``logging/setLevel``."""
        if self.log_level is None:
            return True
        return LOG_LEVELS.get(level, 0) >= LOG_LEVELS.get(self.log_level, 0)

    def close(self) -> None:
        """End the session: cancel handlers, abort streams, fail pending requests."""
        if self.state is not SessionState.CLOSED:
            self.handle(SessionInput.TEARDOWN)
        for scope in list(self.running.values()):
            scope.cancel()
        for h in list(self.handles.values()):
            if h.log.state is not StreamState.CLOSED:
                h.handle(StreamInput.ABORT)
        for p in self.pending.values():
            p.done.set()
