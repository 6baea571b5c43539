"""What the sessionless era (MCP 2026-07-28) answers, the same on every runtime.

Theory of operation
-------------------
The order of a sessionless request's decisions is the core's
(:class:`~weir.protocol.sessionless_post.SessionlessCourse`); what some of its
answers *say* depends on the app, and is decided here once for both runtimes:

* :func:`discover_for`: ``server/discover``'s result (every revision served, this
  era's capabilities, the server's identity, the app's instructions);
* :func:`era_capabilities`: the app's capabilities, with list changes and resource
  updates announced on ``subscriptions/listen`` (unless the app describes itself);
* :func:`server_identity`: the name and version stamped on every result;
* :func:`caller_for`: the client as its request describes itself (``params._meta``);
* :func:`handler_error`: an app's :class:`~weir.app.McpError` as this era answers it
  -- 404 -32601 for a method an app's fallback does not serve, 400 -32021 for a
  capability the request did not declare (both raised: the POST's own status), an
  unknown resource as -32602; anything else is the call's error body.
"""

from __future__ import annotations

from typing import Any, Final

from weir.app import NO_LOGS, App, Caller, McpError, capabilities, describe, failure
from weir.protocol import INVALID_PARAMS, METHOD_NOT_FOUND, RESOURCE_NOT_FOUND
from weir.protocol.jsonrpc import Request
from weir.protocol.lifecycle import ALL_VERSIONS
from weir.protocol.sessionless import (
    MISSING_CAPABILITY,
    SESSIONLESS_VERSIONS,
    SessionlessMessage,
    discover_result,
    method_not_found,
    missing_capability,
)
from weir.protocol.tasks import TASKS_EXTENSION

#: The sessionless revision served.
VERSION: Final = SESSIONLESS_VERSIONS[-1]


def era_capabilities(app: App, described: dict[str, Any] | None = None) -> dict[str, Any]:
    """This era's capabilities: the app's, with list changes and resource updates
    announced on ``subscriptions/listen`` (an app describing itself says so itself;
    ``described`` is its description, if already asked for)."""
    if app.describe_fn is not None:
        return dict((described or describe(app, VERSION))["capabilities"])
    caps = capabilities(app)
    for name in ("tools", "prompts"):
        if name in caps:
            caps[name] = {"listChanged": True}
    if "resources" in caps:
        caps["resources"] = {"subscribe": True, "listChanged": True}
    return caps


def server_identity(app: App) -> dict[str, Any]:
    """The identity stamped on every result: the app's name and version, or what its
    ``describe`` hook says (a runtime asks once and keeps it: an identity does not
    change)."""
    if app.describe_fn is None:
        return {"name": app.name, "version": app.version}
    return dict(describe(app, VERSION)["serverInfo"])


def discover_for(app: App, identity: dict[str, Any], *, tasks: bool = False) -> dict[str, Any]:
    """``server/discover``'s result for ``app`` (``identity``: :func:`server_identity`);
    ``tasks``: the runtime serves the tasks extension (advertised under
    ``capabilities.extensions``)."""
    described = describe(app, VERSION)
    caps = era_capabilities(app, described)
    if tasks:
        extensions = dict(caps.get("extensions") or {})
        extensions.setdefault(TASKS_EXTENSION, {})
        caps["extensions"] = extensions
    return discover_result(
        ALL_VERSIONS,
        caps,
        identity,
        described.get("instructions"),
    )


def caller_for(msg: SessionlessMessage) -> Caller:
    """The client as its request describes itself (``params._meta``)."""
    meta = msg.meta
    assert meta is not None
    return Caller(
        meta.capabilities,
        meta.client_info or {},
        log_level=meta.log_level or NO_LOGS,
        protocol_version=meta.version,
    )


def request_meta(req: Request) -> dict[str, Any] | None:
    """The request's ``params._meta``, if it is an object."""
    meta = (req.params or {}).get("_meta") if isinstance(req.params, dict) else None
    return meta if isinstance(meta, dict) else None


def handler_error(req: Request, exc: McpError) -> bytes:
    """The error body of ``req`` for the app's ``exc``, as this era numbers it.

    Raises:
        RemoteProtocolError: 404 -32601 for a method an app's fallback does not
            serve; 400 -32021 when the handler needs a capability the request did
            not declare.
    """
    if exc.code == METHOD_NOT_FOUND:  # an app's fallback does not serve it
        raise method_not_found(req.method, req.id) from None
    if exc.code == MISSING_CAPABILITY:
        needed = (exc.data or {}).get("requiredCapabilities") or {}
        raise missing_capability(needed, req.id) from None
    if exc.code == RESOURCE_NOT_FOUND:  # this revision says -32602 for it
        exc = McpError(INVALID_PARAMS, exc.message, exc.data)
    return failure(req, exc)
