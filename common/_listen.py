"""What a ``subscriptions/listen`` stream says (MCP 2026-07-28), whichever loop writes it.

Theory of operation
-------------------
A listener's first message acknowledges what the server will send it
(:func:`honoured`: the kinds asked for that this app can change, and at most
:data:`MAX_URIS` resource URIs of at most :data:`MAX_URI` characters); every message
on its stream carries the request's id as
``_meta["io.modelcontextprotocol/subscriptionId"]`` (:func:`listen_frame`), and the
stream's last message, when the server ends it, is :func:`listen_closing`.  Both
runtimes send these same bytes; how they wait, and within whose credit, is theirs.
"""

from __future__ import annotations

from typing import Any, Final

from weir.protocol.jsonrpc import RequestId, encode_notification, encode_result
from weir.protocol.sessionless import META_SUBSCRIPTION_ID

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


def listen_frame(request_id: RequestId, method: str, params: dict[str, Any] | None = None) -> str:
    """A notification on the listen stream of request ``request_id``."""
    body = {**(params or {}), "_meta": {META_SUBSCRIPTION_ID: request_id}}
    return encode_notification(method, body).decode()


def listen_ack(request_id: RequestId, honoured_flags: dict[str, Any]) -> str:
    """The stream's first message: what it will be told about."""
    return listen_frame(
        request_id, "notifications/subscriptions/acknowledged", {"notifications": honoured_flags}
    )


def listen_closing(request_id: RequestId) -> str:
    """The final result of a subscription the server ends (at shutdown)."""
    meta = {META_SUBSCRIPTION_ID: request_id}
    return encode_result(request_id, {"resultType": "complete", "_meta": meta}).decode()


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
