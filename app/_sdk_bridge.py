"""The SDK side of :func:`weir.app.sdk.from_sdk` (imports the SDK; see that module).

Theory of operation
-------------------
:class:`Bridge` holds one SDK low-level server and, per live session, the SDK
``Connection`` its kernel reads (made on the session's first request here, torn
down when the session closes).  :class:`_Dispatch` is the SDK's per-request
``DispatchContext`` over a weir :class:`~weir.app.Context`; :class:`_SessionOutbound`
the SDK connection's standalone channel over the session's GET stream.  Nothing
here blocks or holds more than those per-session objects: every message goes
through the context's backend, which waits for drain credit.

:func:`security_of` reads the app's own authorization (its verifier, wrapped to
speak weir's :class:`~weir.app.AccessToken`), :func:`unserved_routes_of` what of the
app weir does not serve.  While the app is served, a filter on the SDK's handler
logger turns its log of a handler that failed for want of asyncio into weir's hint
naming the fix, and :meth:`Bridge.request` answers that call as a native tool's.
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import logging
import re
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

import anyio
from mcp.server.auth.middleware.auth_context import auth_context_var
from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser
from mcp.server.auth.provider import AccessToken as SdkAccessToken
from mcp.server.connection import Connection
from mcp.server.lowlevel.server import Server
from mcp.server.mcpserver import MCPServer
from mcp.server.runner import ServerRunner, aclose_shielded, serve_one
from mcp.shared.dispatcher import CallOptions
from mcp.shared.exceptions import MCPError, NoBackChannelError
from mcp.shared.message import ServerMessageMetadata
from mcp.shared.subscriptions import (
    PromptsListChanged,
    ResourcesListChanged,
    ResourceUpdated,
    ServerEvent,
    ToolsListChanged,
)
from mcp.shared.transport_context import TransportContext
from mcp_types import ClientCapabilities, InitializeRequestParams
from pydantic import AnyHttpUrl, BaseModel, ValidationError

from weir.protocol import INTERNAL_ERROR, INVALID_PARAMS
from weir.protocol.jsonrpc import encode_notification
from weir.protocol.sessionless import SESSIONLESS_VERSIONS

from ._context import AccessToken, Context, SessionChannel
from ._foreign import asyncio_only_failure, asyncio_only_hint, asyncio_only_result
from ._registry import App, McpError
from .sdk import SdkSecurity

log = logging.getLogger(__name__)
#: Where MCPServer and FastMCP log a tool, resource or prompt that raised (with the
#: exception): the SDK as ``"Tool %s ..."`` with the name an argument, FastMCP as
#: ``"Error calling tool 'name'"`` with the name in the message.
_HANDLER_LOGS = ("mcp.server.mcpserver.server", "fastmcp.server.server")
_FASTMCP_FAILED = re.compile(r"Error calling (tool|resource|prompt) '([^']{1,200})'")
#: What :class:`_AsyncioHint` saw fail for asyncio in the request this task serves
#: (the handler names it rewrote), so :meth:`Bridge.request` tells the client too.
_ASYNCIO_FAILED: contextvars.ContextVar[list[str] | None] = contextvars.ContextVar(
    "weir_sdk_asyncio_failed", default=None
)

_MODERN = frozenset(SESSIONLESS_VERSIONS)
_EVENT_LISTS: dict[type, str] = {
    ToolsListChanged: "tools",
    PromptsListChanged: "prompts",
    ResourcesListChanged: "resources",
}


def _sdk_user(access: AccessToken) -> AuthenticatedUser:
    """The SDK's view of a token weir verified.  Its ``token`` is empty: weir keeps
    no client token for a handler to pass on (MCP forbids that), so neither does
    this.  ``client_id`` is the ``client_id`` (or ``azp``) claim, else the principal."""
    claims = dict(access.claims)
    client = claims.get("client_id") or claims.get("azp") or access.principal
    subject = claims.get("sub")
    expires = None if access.expires_at is None else int(access.expires_at)
    token = SdkAccessToken(
        token="",
        client_id=str(client),
        scopes=sorted(access.scopes),
        expires_at=expires,
        subject=None if subject is None else str(subject),
        claims=claims,
    )
    return AuthenticatedUser(token)


def _weir_access(got: SdkAccessToken) -> AccessToken:
    """What the app's verifier vouched for, as weir's :class:`AccessToken`.  The
    principal is ``iss#sub`` (as weir's own verifier makes it) when the token names
    both and the issuer holds no ``#`` and does not start with ``[``, else the SDK's
    principal triple as JSON: so two (issuer, subject) pairs are never one principal
    (the first ``#`` ends the issuer; a triple starts with ``[``), whatever issuers
    the app's verifier trusts.  The claims carry ``client_id`` and ``sub`` so the
    SDK's ``get_access_token()`` reads them back unchanged."""
    claims = dict(got.claims or {})
    issuer = claims.get("iss")
    plain = isinstance(issuer, str) and "#" not in issuer and not issuer.startswith("[")
    if plain and got.subject is not None:
        principal = f"{issuer}#{got.subject}"
    else:
        triple = [got.client_id, None if issuer is None else str(issuer), got.subject]
        principal = json.dumps(triple)
    claims["client_id"] = got.client_id
    if got.subject is not None:
        claims["sub"] = got.subject
    return AccessToken(
        principal=principal,
        scopes=frozenset(got.scopes),
        expires_at=None if got.expires_at is None else float(got.expires_at),
        claims=claims,
    )


def _same_resource(resource: str | None, expected: str) -> bool:
    """The SDK's own comparison: as URLs, a trailing slash aside."""
    try:
        got = str(AnyHttpUrl(resource or ""))
    except ValidationError:
        return False
    return got.removesuffix("/") == expected.removesuffix("/")


def security_of(server: Any) -> SdkSecurity | None:
    """The authorization ``server`` declares, or None.

    An ``MCPServer``'s ``token_verifier`` (or its ``auth_server_provider``'s) with its
    ``AuthSettings``; a FastMCP server's ``auth`` provider is declared with no
    ``verify`` (weir cannot run it: the driver refuses to serve it open).
    """
    if not isinstance(server, MCPServer):
        if getattr(server, "auth", None) is not None and hasattr(server, "_mcp_server"):
            return SdkSecurity(
                verify=None, resource=None, authorization_servers=(), required_scopes=frozenset()
            )
        return None
    verifier = getattr(server, "_token_verifier", None)
    settings = server.settings.auth
    if verifier is None and settings is None:
        return None
    resource = (
        None
        if settings is None or settings.resource_server_url is None
        else (str(settings.resource_server_url))
    )
    check_resource = bool(settings is not None and settings.validate_token_resource)

    return SdkSecurity(
        verify=None if verifier is None else _verifying(verifier, resource, check_resource),
        resource=resource,
        authorization_servers=() if settings is None else (str(settings.issuer_url),),
        required_scopes=frozenset(settings.required_scopes or ()) if settings else frozenset(),
    )


def _verifying(
    verifier: Any, resource: str | None, check_resource: bool
) -> Callable[[str], Awaitable[AccessToken | None]]:
    """``verify(token)`` over the SDK ``verifier`` (see :class:`SdkSecurity`)."""

    async def verify(token: str) -> AccessToken | None:
        try:
            got = await verifier.verify_token(token)
        except Exception as exc:
            if asyncio_only_failure(exc) is not None:
                log.error("%s", _verifier_hint(), exc_info=exc)
            else:
                log.exception("the app's token verifier failed")
            return None
        if got is None:
            return None
        if check_resource and resource is not None and not _same_resource(got.resource, resource):
            log.warning(
                "bearer token resource %r is not resource_server_url %s", got.resource, resource
            )
            return None
        return _weir_access(got)

    return verify


def _verifier_hint() -> str:
    return (
        "the app's token verifier failed: it used a library written for asyncio (aiohttp, "
        "asyncpg, ...), which does not run on Trio, the loop this server ran it on. Decorate "
        "its verify_token with @weir.engine.asyncio_bridge.on_asyncio to run it on a shared "
        "asyncio loop; see docs/asyncio-libraries.md"
    )


def unserved_routes_of(server: Any) -> tuple[str, ...]:
    """The HTTP routes ``server`` declares that weir does not serve: its custom
    routes (``"GET /health"``), and an ``auth_server_provider``'s authorization-server
    endpoints."""
    routes = getattr(server, "_custom_starlette_routes", None)
    if routes is None:
        routes = getattr(server, "_additional_http_routes", None) or []
    named = []
    for route in routes:
        methods = sorted(getattr(route, "methods", None) or ())
        path = getattr(route, "path", "?")
        named.append(f"{','.join(methods)} {path}".strip())
    if getattr(server, "_auth_server_provider", None) is not None:
        named.append("the authorization server (/authorize, /token, /register, ...)")
    return tuple(named)


def _handler_named(record: logging.LogRecord) -> str:
    """``"tool add"`` for the SDK's or FastMCP's log of that tool failing, else
    ``"an SDK handler"``."""
    args = record.args if isinstance(record.args, tuple) else ()
    kind = str(record.msg).split(" ", 1)[0].lower()
    if args and kind in ("tool", "resource"):
        return f"{kind} {args[0]}"
    fastmcp = _FASTMCP_FAILED.match(str(record.msg))
    return f"{fastmcp[1]} {fastmcp[2]}" if fastmcp else "an SDK handler"


class _AsyncioHint(logging.Filter):
    """Rewrites the SDK's log of a tool (or resource, prompt) that raised because it
    used an asyncio-only library into weir's hint naming the fix (traceback kept)."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if getattr(record, "weir_hinted", False):
            return True  # (another bridge in this process rewrote it already)
        if exc is not None and asyncio_only_failure(exc) is not None:
            record.weir_hinted = True
            what = _handler_named(record)
            record.msg, record.args = asyncio_only_hint(what), ()
            failed = _ASYNCIO_FAILED.get()
            if failed is not None and len(failed) < 8:
                failed.append(what)
        return True


def lowlevel_of(server: Any) -> Server[Any]:
    """The SDK low-level ``Server`` behind ``server``.

    Raises:
        TypeError: ``server`` neither is nor holds one (an ``mcp`` 1.x server, e.g.
            a FastMCP built on it, holds another class: the message says so).
    """
    if isinstance(server, Server):
        return server
    for attr in ("_lowlevel_server", "_mcp_server"):
        inner = getattr(server, attr, None)
        if isinstance(inner, Server):
            return inner
        if inner is not None:
            raise TypeError(
                f"{type(server).__name__}.{attr} is a {type(inner).__module__}."
                f"{type(inner).__name__}, not an mcp 2.x low-level Server: "
                "weir serves apps on the installed mcp 2.x SDK only"
            )
    raise TypeError(
        f"cannot serve a {type(server).__name__}: expected an mcp MCPServer or low-level Server"
    )


def _bus_of(server: Any, low: Server[Any]) -> Any:
    """The subscription bus the app publishes changes on, if any."""
    if isinstance(server, MCPServer):
        return getattr(server, "_subscriptions", None)
    entry = low.get_request_handler("subscriptions/listen")
    return getattr(entry.handler, "_bus", None) if entry is not None else None


def _dump(model: BaseModel) -> dict[str, Any]:
    return model.model_dump(by_alias=True, mode="json", exclude_none=True)


class Bridge:
    """One SDK server served through weir: the App hooks' implementations."""

    def __init__(self, low: Server[Any], server: Any) -> None:
        self.low = low
        #: The SDK's own tool-schema lookup (MCPServer has one), for Mcp-Param-* checks.
        self.tool_schema = low.get_tool_input_schema
        self.bus = _bus_of(server, low)
        self.state: Any = None
        #: The SDK connection of each live session seen here (at most one each).
        self.connections: dict[str, Connection] = {}

    @contextlib.asynccontextmanager
    async def serving(self, app: App) -> AsyncIterator[Any]:
        """The SDK server's lifespan, with its bus's events announced to weir."""

        def announce(event: ServerEvent) -> None:
            if isinstance(event, ResourceUpdated):
                app.changed("resources", str(event.uri))
            elif isinstance(event, ToolsListChanged | PromptsListChanged | ResourcesListChanged):
                app.changed(_EVENT_LISTS[type(event)])

        hint = _AsyncioHint()
        handler_logs = [logging.getLogger(name) for name in _HANDLER_LOGS]
        async with self.low.lifespan(self.low) as state:
            self.state = state
            unsubscribe = self.bus.subscribe(announce) if self.bus is not None else None
            for handler_log in handler_logs:
                handler_log.addFilter(hint)
            try:
                yield state
            finally:
                for handler_log in handler_logs:
                    handler_log.removeFilter(hint)
                if unsubscribe is not None:
                    unsubscribe()
                for sid in list(self.connections):
                    await self.session_closed(sid)

    def describe(self, version: str) -> dict[str, Any]:
        """The SDK's own capabilities and identity for ``version``."""
        low = self.low
        if version in _MODERN:
            caps = low.get_capabilities(protocol_version=version)
        else:
            caps = low.create_initialization_options().capabilities
        return {
            "capabilities": _dump(caps),
            "serverInfo": _dump(low.server_info),
            "instructions": low.instructions,
        }

    async def request(self, method: str, params: dict[str, Any], ctx: Context) -> dict[str, Any]:
        """Run the SDK's kernel for one request; its result, or its error as McpError."""
        version = ctx.protocol_version
        modern = version in _MODERN or ctx.session_id is None
        dctx = _Dispatch(ctx, can_send=not modern)
        # The SDK's handlers (and its request-state binding) read the caller's token
        # from its own context variable, which its HTTP transport sets: so does weir.
        user = None if ctx.access_token is None else _sdk_user(ctx.access_token)
        vouched = auth_context_var.set(user)
        failed: list[str] = []
        watching = _ASYNCIO_FAILED.set(failed)
        try:
            if modern:
                connection = Connection.from_envelope(
                    version, ctx.client_info or None, ctx.client_capabilities
                )
                result = await serve_one(
                    self.low,
                    dctx,
                    method,
                    params,
                    connection=connection,
                    lifespan_state=self.state,
                )
            else:
                runner = ServerRunner(self.low, self._connection(ctx), self.state)
                result = await runner.on_request(dctx, method, params)
            if failed and result.get("isError") is True:
                # As a native tool's: it needs asyncio (the log has the fix), nothing more.
                said = {"type": "text", "text": asyncio_only_result(failed[0])}
                result = {k: v for k, v in result.items() if k != "structuredContent"}
                result["content"] = [said]
            return result
        except MCPError as exc:
            raise McpError(exc.error.code, exc.error.message, exc.error.data) from None
        except ValidationError:
            raise McpError(INVALID_PARAMS, "Invalid request parameters", "") from None
        except NotImplementedError as exc:  # the SDK's way to say "not served here"
            raise McpError(INTERNAL_ERROR, str(exc) or "not implemented") from None
        finally:
            _ASYNCIO_FAILED.reset(watching)
            auth_context_var.reset(vouched)

    def _connection(self, ctx: Context) -> Connection:
        """The session's SDK connection, made on its first request in this process."""
        sid = ctx.session_id
        assert sid is not None
        connection = self.connections.get(sid)
        if connection is None:
            connection = Connection(
                _SessionOutbound(ctx.backend.session_channel()),
                protocol_version=ctx.protocol_version,
                session_id=sid,
                client_params=_client_params(ctx),
            )
            if connection.client_capabilities is None:
                with contextlib.suppress(ValidationError):
                    caps = ClientCapabilities.model_validate(ctx.client_capabilities)
                    connection.client_capabilities = caps
            connection.initialized.set()  # weir's transport has gated initialization
            self.connections[sid] = connection
        return connection

    async def notification(self, method: str, params: dict[str, Any], session_id: str) -> None:
        """A client notification, to the SDK's own notification handlers (through its
        kernel, as its transport would), on the session's SDK connection; dropped if
        this process has not served a request of the session yet (nothing to run it
        on, and nobody waits for it)."""
        connection = self.connections.get(session_id)
        if connection is None:
            return
        runner = ServerRunner(self.low, connection, self.state)
        await runner.on_notify(_NoteDispatch(connection), method, params)

    async def session_closed(self, session_id: str) -> None:
        """The session ended (or this process stops serving it): unwind its SDK
        connection's exit stack (bounded by the SDK's own shielded timeout)."""
        connection = self.connections.pop(session_id, None)
        if connection is not None:
            await aclose_shielded(connection)


def _client_params(ctx: Context) -> InitializeRequestParams | None:
    """The ``initialize`` params as the SDK keeps them (None if this process did not
    see the session's ``initialize``: another replica did)."""
    if not ctx.client_info:
        return None
    try:
        return InitializeRequestParams.model_validate(
            {
                "protocolVersion": ctx.protocol_version,
                "capabilities": ctx.client_capabilities,
                "clientInfo": ctx.client_info,
            },
            by_name=False,
        )
    except ValidationError:
        return None


class _SessionOutbound:
    """The SDK connection's standalone channel: the session's GET stream.

    Notifications are best effort (dropped without an open GET stream), as in the
    SDK; a standalone request is refused (weir's server-to-client requests belong
    to a call, whose stream carries them).
    """

    def __init__(self, send: SessionChannel | None) -> None:
        self._send = send

    async def send_raw_request(
        self, method: str, params: Mapping[str, Any] | None, opts: CallOptions | None = None
    ) -> dict[str, Any]:
        raise NoBackChannelError(method)

    async def notify(
        self, method: str, params: Mapping[str, Any] | None, opts: CallOptions | None = None
    ) -> None:
        if self._send is not None:
            await self._send(
                encode_notification(method, dict(params) if params is not None else None)
            )


@dataclass
class _NoteDispatch:
    """The SDK's ``DispatchContext`` for a client notification: no request, no back
    channel but the session's own stream (the SDK connection's outbound)."""

    connection: Connection

    @property
    def transport(self) -> TransportContext:
        return TransportContext(kind="weir", can_send_request=False)

    can_send_request = False
    request_id = None

    @property
    def message_metadata(self) -> None:
        return None

    @property
    def cancel_requested(self) -> anyio.Event:
        return anyio.Event()

    async def progress(
        self, progress: float, total: float | None = None, message: str | None = None
    ) -> None:
        return None  # a notification carries no progress token

    async def notify(
        self, method: str, params: Mapping[str, Any] | None, opts: CallOptions | None = None
    ) -> None:
        await self.connection.outbound.notify(method, params, opts)

    async def send_raw_request(
        self, method: str, params: Mapping[str, Any] | None, opts: CallOptions | None = None
    ) -> dict[str, Any]:
        raise NoBackChannelError(method)


@dataclass
class _Dispatch:
    """The SDK's ``DispatchContext`` for one request, over its weir context."""

    ctx: Context
    can_send: bool

    @property
    def transport(self) -> TransportContext:
        return TransportContext(kind="weir", can_send_request=self.can_send)

    @property
    def can_send_request(self) -> bool:
        return self.can_send

    @property
    def request_id(self) -> Any:
        return self.ctx.request_id

    @property
    def message_metadata(self) -> ServerMessageMetadata:
        async def close_sse_stream() -> None:
            self.ctx.close_stream()

        return ServerMessageMetadata(
            related_request_id=self.ctx.request_id,
            close_sse_stream=close_sse_stream if self.ctx.session_id is not None else None,
            can_send_request=self.can_send,
        )

    @property
    def cancel_requested(self) -> anyio.Event:
        event = anyio.Event()
        if self.ctx.cancel_requested:
            event.set()
        return event

    async def progress(
        self, progress: float, total: float | None = None, message: str | None = None
    ) -> None:
        await self.ctx.report_progress(progress, total, message)

    async def notify(
        self, method: str, params: Mapping[str, Any] | None, opts: CallOptions | None = None
    ) -> None:
        await self.ctx.notify(method, dict(params) if params is not None else None)

    async def send_raw_request(
        self, method: str, params: Mapping[str, Any] | None, opts: CallOptions | None = None
    ) -> dict[str, Any]:
        if not self.can_send:
            raise NoBackChannelError(method)
        timeout = (opts or {}).get("timeout", 300.0)
        try:
            return await self.ctx.request(
                method, dict(params) if params is not None else None, timeout=timeout
            )
        except McpError as exc:
            raise MCPError(exc.code, exc.message, exc.data) from None
