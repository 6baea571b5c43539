"""``subscriptions/listen`` (MCP 2026-07-28): change notifications on a held response.

Theory of operation
-------------------
A client that wants to hear about changes (tool, prompt or resource lists; updates
of given resources) POSTs ``subscriptions/listen`` and keeps the response open.
The server answers with an SSE stream whose first message acknowledges what it will
send (:func:`honoured`: the kinds asked for that this app can change, and at most
:data:`MAX_URIS` resource URIs), and every message on it carries the request's id as
``_meta["io.modelcontextprotocol/subscriptionId"]``.

* **Fan-out never blocks the notifier.**  :meth:`Server._changed` (a tool calling
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
* **Bounds.**  One listen stream per connection at a time (a connection carries one
  request at a time), so listeners are bounded by the connection limit; each holds
  at most :data:`MAX_URIS` URIs and one pending mark per kind and URI.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Final

import trio

from weir.protocol.jsonrpc import Request, encode_notification, encode_result
from weir.protocol.sessionless import META_SUBSCRIPTION_ID

from ._session import SessionClosed, StreamHandle, StreamLost

#: The most resource URIs one subscription may watch (more are not acknowledged).
MAX_URIS: Final = 256
#: The longest resource URI a subscription may watch.
MAX_URI: Final = 2048

#: Listen flag -> the notification it asks for.
KINDS: Final = {
    "toolsListChanged": "notifications/tools/list_changed",
    "promptsListChanged": "notifications/prompts/list_changed",
    "resourcesListChanged": "notifications/resources/list_changed",
}


@dataclass(eq=False, slots=True)
class Listener:
    """One open ``subscriptions/listen`` response."""

    request: Request
    handle: StreamHandle
    kinds: frozenset[str]  # notification methods acknowledged
    uris: frozenset[str]  # resource URIs acknowledged
    pending: set[str] = field(default_factory=set)  # methods to send
    updated: set[str] = field(default_factory=set)  # URIs updated, to send
    wake: trio.Event = field(default_factory=trio.Event)

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

    def _meta(self) -> dict[str, Any]:
        return {META_SUBSCRIPTION_ID: self.request.id}

    def frame(self, method: str, params: dict[str, Any] | None = None) -> str:
        body = {**(params or {}), "_meta": self._meta()}
        return encode_notification(method, body).decode()

    def ack(self, honoured_flags: dict[str, Any]) -> str:
        return self.frame(
            "notifications/subscriptions/acknowledged", {"notifications": honoured_flags}
        )

    def closing(self) -> str:
        return encode_result(
            self.request.id, {"resultType": "complete", "_meta": self._meta()}
        ).decode()

    async def run(self) -> None:
        """Send what is pending, in credit, until the stream ends."""
        try:
            while True:
                await self.wake.wait()
                self.wake = trio.Event()
                methods, self.pending = sorted(self.pending), set()
                uris, self.updated = sorted(self.updated), set()
                for method in methods:
                    await self.handle.send(self.frame(method))
                for uri in uris:
                    await self.handle.send(
                        self.frame("notifications/resources/updated", {"uri": uri})
                    )
        except (StreamLost, SessionClosed):
            return


def honoured(
    asked: object, capabilities: dict[str, Any]
) -> tuple[dict[str, Any], frozenset[str], frozenset[str]]:
    """What a listen request asked for that the server will send: the acknowledged
    flags (as the client spelled them), the notification methods, the URIs."""
    flags: dict[str, Any] = {}
    kinds: set[str] = set()
    uris: list[str] = []
    if not isinstance(asked, dict):
        return flags, frozenset(), frozenset()
    changes = {
        "toolsListChanged": "tools",
        "promptsListChanged": "prompts",
        "resourcesListChanged": "resources",
    }
    for flag, cap in changes.items():
        if asked.get(flag) is True and isinstance(capabilities.get(cap), dict):
            flags[flag] = True
            kinds.add(KINDS[flag])
    wanted = asked.get("resourceSubscriptions")
    if isinstance(wanted, list) and isinstance(capabilities.get("resources"), dict):
        for uri in wanted:
            if isinstance(uri, str) and 0 < len(uri) <= MAX_URI and uri not in uris:
                uris.append(uri)
            if len(uris) >= MAX_URIS:
                break
        if uris:
            flags["resourceSubscriptions"] = uris
    return flags, frozenset(kinds), frozenset(uris)
