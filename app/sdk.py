"""Serve an app written with the official MCP Python SDK through weir, unchanged.

Theory of operation
-------------------
:func:`from_sdk` wraps an SDK server (``mcp.server.mcpserver.MCPServer``, the
low-level ``mcp.server.lowlevel.Server``, or an object holding one of the latter)
in a weir :class:`~weir.app.App` built only from the App API's public hooks:

* **Requests.**  A fallback for every method weir does not own hands each request
  to the SDK's own per-request kernel (``mcp.server.runner.ServerRunner``, or
  ``serve_one`` on the 2026-07-28 revision), so the SDK validates params, runs its
  middleware and shapes its results exactly as it would behind its own transport.
  weir keeps what is the transport's: ``initialize``, ``ping``, ``weir/rebind``,
  ``server/discover``, ``subscriptions/listen``, notifications -- and with them
  drain credit, the idempotency gate, fencing, shared replay, limits and the
  authorized principal, which apply to the SDK's requests as to any others.
* **The back channel.**  The kernel talks to the client through a
  ``DispatchContext``; here it is the call's :class:`~weir.app.Context`: messages
  related to the request (progress, logs, elicitation, sampling, roots) go on the
  request's own stream, ahead of its response and within the session's credit;
  unrelated ones (the SDK connection's ``outbound``) go on the session's GET
  stream.  On 2026-07-28 there are no server-to-client requests: the SDK answers
  ``input_required`` itself, and weir seals the ``requestState`` it mints (bound to
  the principal and the request, expiring) and hands it back unsealed next round.
* **Per-session state.**  The SDK's ``Connection`` (client info, scratch
  ``state``, ``exit_stack``) is made on a session's first request in this process
  and torn down by the session-close hook, so there is at most one per live
  session; a 2026-07-28 request gets its own, as in the SDK.
* **Security.**  An ``MCPServer`` built with ``token_verifier=`` and
  ``auth=AuthSettings(...)`` keeps it: :attr:`SdkApp.security` hands the driver the
  app's verifier (wrapped to return a weir :class:`~weir.app.AccessToken`, or None
  for a token it refuses) with the resource, issuer and required scopes the app
  declares, and ``weir serve`` enforces them as its own authorization.  What weir
  does not serve -- the app's ``custom_route`` routes, the authorization-server
  routes of an ``auth_server_provider`` -- is listed in
  :attr:`SdkApp.unserved_routes`, for the driver to say so at start-up.
* **Lifespan and changes.**  The SDK server's lifespan is the App's; events the
  SDK publishes on its subscription bus are announced with
  :meth:`~weir.app.App.changed`, so they reach ``subscriptions/listen`` streams on
  every replica sharing the store.

The SDK is an optional dependency (the ``sdk`` extra), tested at the versions in
:data:`TESTED_SDK`; :func:`check_sdk` says precisely which entry point changed when
another version does not fit.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import inspect
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from ._context import AccessToken
from ._registry import App

#: The SDK versions this bridge is tested with (the ``sdk`` extra pins the same range).
TESTED_SDK = (">=2.3.0", "<2.4")

#: What the bridge uses of the SDK: (module, attribute, parameters it must accept).
CONTRACT: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("mcp.server.runner", "ServerRunner", ("server", "connection", "lifespan_state")),
    ("mcp.server.runner", "serve_one", ("server", "dctx", "method", "params", "connection")),
    ("mcp.server.runner", "aclose_shielded", ("connection",)),
    ("mcp.server.connection", "Connection", ("outbound", "protocol_version", "session_id")),
    ("mcp.server.connection.Connection", "from_envelope", ("protocol_version", "client_info")),
    ("mcp.server.runner.ServerRunner", "on_request", ()),
    ("mcp.server.runner.ServerRunner", "on_notify", ()),
    ("mcp.server.lowlevel.server", "Server", ("name", "lifespan", "get_tool_input_schema")),
    ("mcp.server.lowlevel.server.Server", "get_capabilities", ("protocol_version",)),
    ("mcp.server.lowlevel.server.Server", "create_initialization_options", ()),
    ("mcp.server.lowlevel.server.Server", "get_request_handler", ("method",)),
    ("mcp.server.lowlevel.server.Server", "server_info", ()),
    ("mcp.server.mcpserver", "MCPServer", ("name", "token_verifier", "auth")),
    (
        "mcp.server.auth.settings",
        "AuthSettings",
        ("issuer_url", "resource_server_url", "required_scopes", "validate_token_resource"),
    ),
    ("mcp.shared.exceptions", "NoBackChannelError", ()),
    ("mcp.shared.exceptions", "MCPError", ("code", "message", "data")),
    ("mcp.shared.message", "ServerMessageMetadata", ("close_sse_stream",)),
    ("mcp.shared.transport_context", "TransportContext", ("kind", "can_send_request")),
    ("mcp.shared.subscriptions", "ResourceUpdated", ("uri",)),
    ("mcp.server.auth.middleware.auth_context", "auth_context_var", ()),
    ("mcp.server.auth.middleware.bearer_auth", "AuthenticatedUser", ("auth_info",)),
    (
        "mcp.server.auth.provider",
        "AccessToken",
        ("token", "client_id", "scopes", "expires_at", "subject", "claims"),
    ),
)


def check_sdk() -> str:
    """The installed SDK's version, once every entry point the bridge uses is there
    with the parameters it passes.

    Raises:
        RuntimeError: the SDK is not installed, or an entry point is missing or
            changed its parameters (the message names it and the tested versions).
    """
    try:
        version = importlib.metadata.version("mcp")
    except importlib.metadata.PackageNotFoundError:
        raise RuntimeError("serving an SDK app needs the SDK: pip install 'weir[sdk]'") from None
    for module_name, attr, params in CONTRACT:
        owner: Any = None
        with contextlib.suppress(ImportError):
            owner = importlib.import_module(module_name)
        if owner is None:  # a class path: import its module, then the class
            mod, _, cls = module_name.rpartition(".")
            owner = getattr(importlib.import_module(mod), cls, None)
        target = getattr(owner, attr, None)
        if target is None:
            raise RuntimeError(_changed(version, f"{module_name}.{attr} is gone"))
        try:
            accepted = set(inspect.signature(target).parameters)
        except (TypeError, ValueError):
            accepted = set(params)
        missing = [p for p in params if p not in accepted]
        if missing:
            what = f"{module_name}.{attr} no longer takes {', '.join(missing)}"
            raise RuntimeError(_changed(version, what))
    return version


def _changed(version: str, what: str) -> str:
    tested = ",".join(TESTED_SDK)
    return f"mcp {version} does not fit weir's SDK bridge ({what}); tested: mcp{tested}"


@dataclass(frozen=True, slots=True, kw_only=True)
class SdkSecurity:
    """The authorization an SDK app declares (``MCPServer(token_verifier=...,
    auth=AuthSettings(...))``), for the driver that serves it to enforce.

    Attributes:
        verify: ``await verify(token)``: what the app's own verifier vouches for
            (principal ``iss#sub``, else the SDK's ``[client_id, iss, sub]`` as
            JSON), or None for a token it refuses, one issued for another resource
            (with ``validate_token_resource``), or a verifier that failed (logged).
            Expiry is the driver's to check.  None: the app has auth settings but
            no verifier.
        resource: ``resource_server_url``: this server's resource identifier, the
            protected resource metadata's ``resource`` (None: not declared).
        authorization_servers: ``issuer_url``, advertised in that metadata.
        required_scopes: scopes every request's token must carry.
    """

    verify: Callable[[str], Awaitable[AccessToken | None]] | None
    resource: str | None
    authorization_servers: tuple[str, ...]
    required_scopes: frozenset[str]


class SdkApp(App):
    """The :class:`~weir.app.App` :func:`from_sdk` returns: an App, plus what the SDK
    server declares beyond its handlers."""

    #: The app's own authorization, or None if it declares none.
    security: SdkSecurity | None = None
    #: What the app declares that weir does not serve (``"GET /health"``, ...).
    unserved_routes: tuple[str, ...] = ()


def from_sdk(server: Any) -> SdkApp:
    """A weir :class:`~weir.app.App` serving ``server``, an SDK ``MCPServer``, a
    low-level ``Server``, or an object that holds one (as ``_lowlevel_server`` or
    ``_mcp_server``).

    Raises:
        RuntimeError: the SDK is missing or does not fit (see :func:`check_sdk`).
        TypeError: ``server`` is none of those.
    """
    check_sdk()
    from ._sdk_bridge import Bridge, lowlevel_of, security_of, unserved_routes_of

    low = lowlevel_of(server)
    bridge = Bridge(low, server)
    app = SdkApp(str(low.name), str(low.version or ""), instructions=low.instructions)
    app.security = security_of(server)
    app.unserved_routes = unserved_routes_of(server)

    app.lifespan(bridge.serving)
    app.fallback(bridge.request, every_method=True)
    app.describe(bridge.describe)
    if bridge.tool_schema is not None:
        app.tool_schema(bridge.tool_schema)
    app.on_session_close(bridge.session_closed)
    app.on_notification(bridge.notification)
    return app


def is_sdk_server(obj: Any) -> bool:
    """Whether ``obj`` looks like an SDK server :func:`from_sdk` can wrap (without
    importing the SDK when ``obj`` cannot be one)."""
    module = type(obj).__module__ or ""
    if module.split(".")[0] in ("mcp", "fastmcp"):
        return True
    return any(hasattr(obj, a) for a in ("_lowlevel_server", "_mcp_server"))


__all__ = [
    "CONTRACT",
    "TESTED_SDK",
    "SdkApp",
    "SdkSecurity",
    "check_sdk",
    "from_sdk",
    "is_sdk_server",
]
