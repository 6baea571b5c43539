"""The sessionless wire (MCP 2026-07-28): what each POST must say about itself.

Theory of operation
-------------------
From 2026-07-28 there is no ``initialize`` and no session: every request carries
what a session used to remember -- the protocol version, the client's capabilities
and info, its log level -- in ``params._meta``, and says in HTTP headers what it is
(``Mcp-Method``, ``Mcp-Name``, ``Mcp-Param-*``), so that proxies can route it without
reading the body.  A server must check that the two agree.  The endpoint serves both
eras: the ``MCP-Protocol-Version`` header picks the era of each request
(:func:`is_sessionless`), and a session-era request is routed exactly as before.

:func:`check_sessionless` runs the checks that need no state, in this order (the
first failure wins, and every refusal names the request's id):

1. the message is a single request or notification (a client sends no responses);
2. ``params._meta`` has the protocol version and the client capabilities
   (400, -32602);
3. the header's version equals the ``_meta`` one (400, -32020 *header mismatch*);
4. that version is served (400, -32022 with ``data.supported`` and
   ``data.requested``);
5. ``Mcp-Method`` equals the method, and -- for ``tools/call``, ``prompts/get`` and
   ``resources/read`` -- ``Mcp-Name`` equals the name or URI (400, -32020).  Header
   names are case-insensitive, values are not; a value may be wrapped as
   ``=?base64?...?=`` and is compared decoded (:func:`decode_header_value`).

``Mcp-Param-*`` headers depend on the tool's input schema, so the driver checks them
with :func:`check_param_headers` once it knows the tool.  Results get the fields
every result of this era carries (:func:`complete`): ``resultType``, the server's
identity in ``_meta``, and, for cacheable results, ``ttlMs`` and ``cacheScope``.
"""

from __future__ import annotations

import base64
import binascii
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Final

from ._errors import INVALID_PARAMS, INVALID_REQUEST, Reason, RemoteProtocolError
from ._http_events import Headers
from ._jsonrpc import Message, Notification, Request, RequestId
from ._tasks import task_id_of

#: Revisions served without sessions, newest first.
SESSIONLESS_VERSIONS: Final = ("2026-07-28",)

META_VERSION: Final = "io.modelcontextprotocol/protocolVersion"
META_CAPABILITIES: Final = "io.modelcontextprotocol/clientCapabilities"
META_CLIENT_INFO: Final = "io.modelcontextprotocol/clientInfo"
META_LOG_LEVEL: Final = "io.modelcontextprotocol/logLevel"
META_SERVER_INFO: Final = "io.modelcontextprotocol/serverInfo"
META_SUBSCRIPTION_ID: Final = "io.modelcontextprotocol/subscriptionId"

#: JSON-RPC codes this revision defines.
HEADER_MISMATCH: Final = -32020
MISSING_CAPABILITY: Final = -32021
UNSUPPORTED_VERSION: Final = -32022

#: Methods whose ``Mcp-Name`` header names their target, and the param it names.
NAMED_TARGET: Final = MappingProxyType(
    {"tools/call": "name", "prompts/get": "name", "resources/read": "uri"}
)
#: The tasks extension's methods, whose ``Mcp-Name`` header names their task.
TASK_TARGET: Final = MappingProxyType(
    {"tasks/get": "taskId", "tasks/update": "taskId", "tasks/cancel": "taskId"}
)
#: Results that may be cached, and so carry ``ttlMs`` and ``cacheScope``.
CACHEABLE: Final = frozenset(
    {
        "server/discover",
        "tools/list",
        "prompts/list",
        "resources/list",
        "resources/templates/list",
        "resources/read",
    }
)
#: The longest header value decoded for comparison (names and parameters are short).
MAX_HEADER_VALUE: Final = 4096

_B64_PREFIX: Final = "=?base64?"
_B64_SUFFIX: Final = "?="


@dataclass(frozen=True, slots=True)
class RequestMeta:
    """What a sessionless request says about its client, from ``params._meta``."""

    version: str
    capabilities: dict[str, Any]
    client_info: dict[str, Any] | None
    log_level: str | None


@dataclass(frozen=True, slots=True, kw_only=True)
class SessionlessMessage:
    """One routed POST of the sessionless era: a request, or a notification."""

    headers: Headers
    message: Request | Notification
    meta: RequestMeta | None  # None for a notification (this era defines none on HTTP)

    @property
    def request_id(self) -> RequestId | None:
        """The request's id (None: a notification)."""
        return self.message.id if isinstance(self.message, Request) else None

    def without_params(self) -> SessionlessMessage:
        """This message as it stands once its handler has the request: the headers,
        the client's meta, the request's id and method, and not its params (which can
        be as large as a request may be, and would otherwise stay as long as a slow
        peer takes the answer)."""
        message = self.message
        if message.params is None:
            return self
        if isinstance(message, Request):
            light: Request | Notification = message.without_params()
        else:
            light = Notification(method=message.method)
        return SessionlessMessage(headers=self.headers, message=light, meta=self.meta)


def is_sessionless(header_version: str | None) -> bool:
    """Does ``MCP-Protocol-Version`` put this request in the sessionless era?"""
    return header_version is not None and header_version.strip() in SESSIONLESS_VERSIONS


def _mismatch(text: str, request_id: RequestId | None) -> RemoteProtocolError:
    return RemoteProtocolError(
        text,
        http_status=400,
        reason=Reason.HEADER_MISMATCH,
        code=HEADER_MISMATCH,
        request_id=request_id,
    )


def unsupported_version(
    requested: str, supported: Sequence[str], request_id: RequestId | None
) -> RemoteProtocolError:
    """400, -32022: ``requested`` is not served; ``data.supported`` says what is."""
    return RemoteProtocolError(
        f"unsupported protocol version {requested[:64]!r}",
        http_status=400,
        reason=Reason.UNSUPPORTED_PROTOCOL_VERSION,
        code=UNSUPPORTED_VERSION,
        request_id=request_id,
        data={"supported": list(supported), "requested": requested[:64]},
    )


def missing_capability(
    required: Mapping[str, Any], request_id: RequestId | None
) -> RemoteProtocolError:
    """400, -32021: the request needs a client capability it did not declare."""
    names = ", ".join(sorted(required))
    return RemoteProtocolError(
        f"this request needs the client capability {names}, which it did not declare",
        http_status=400,
        reason=Reason.MISSING_CAPABILITY,
        code=MISSING_CAPABILITY,
        request_id=request_id,
        data={"requiredCapabilities": dict(required)},
    )


def method_not_found(method: str, request_id: RequestId | None) -> RemoteProtocolError:
    """404, -32601: this era has no such method (``initialize`` and ``ping`` included)."""
    return RemoteProtocolError(
        f"method {method[:64]!r} not found",
        http_status=404,
        reason=Reason.METHOD_NOT_FOUND,
        code=-32601,
        request_id=request_id,
    )


def request_meta(req: Request) -> RequestMeta:
    """``params._meta``'s protocol fields.

    Raises:
        RemoteProtocolError: 400, -32602 when the version or the capabilities are
            missing or of the wrong type.
    """
    params = req.params if isinstance(req.params, dict) else {}
    meta = params.get("_meta")
    if not isinstance(meta, dict):
        raise _invalid_meta("params._meta is required", req.id)
    version = meta.get(META_VERSION)
    if not isinstance(version, str) or not version:
        raise _invalid_meta(f"params._meta[{META_VERSION!r}] is required", req.id)
    caps = meta.get(META_CAPABILITIES)
    if not isinstance(caps, dict):
        raise _invalid_meta(f"params._meta[{META_CAPABILITIES!r}] is required", req.id)
    info = meta.get(META_CLIENT_INFO)
    level = meta.get(META_LOG_LEVEL)
    return RequestMeta(
        version=version,
        capabilities=caps,
        client_info=info if isinstance(info, dict) else None,
        log_level=level if isinstance(level, str) else None,
    )


def _invalid_meta(text: str, request_id: RequestId) -> RemoteProtocolError:
    return RemoteProtocolError(
        text,
        http_status=400,
        reason=Reason.INVALID_REQUEST,
        code=INVALID_PARAMS,
        request_id=request_id,
    )


def decode_header_value(raw: str) -> str | None:
    """A header value as the body would have it: ``=?base64?...?=`` decoded strictly
    (UTF-8, padded standard alphabet), anything else as sent, around optional
    whitespace.  ``None`` if a wrapped value does not decode."""
    value = raw.strip(" \t")
    if not (value.startswith(_B64_PREFIX) and value.endswith(_B64_SUFFIX)):
        return value
    inner = value[len(_B64_PREFIX) : -len(_B64_SUFFIX)]
    if len(value) < len(_B64_PREFIX) + len(_B64_SUFFIX):
        return value
    try:
        return base64.b64decode(inner, validate=True).decode("utf-8")
    except (binascii.Error, ValueError):
        return None


def check_sessionless(
    headers: Headers, messages: list[Message], is_batch: bool, supported: Sequence[str]
) -> SessionlessMessage:
    """Check one decoded POST of the sessionless era (see the module docstring).

    ``supported``: every revision the server serves (both eras), for ``-32022``.

    Raises:
        RemoteProtocolError: the refusal, with the request's id.
    """
    msg = messages[0] if len(messages) == 1 and not is_batch else None
    if not isinstance(msg, Request | Notification):
        raise RemoteProtocolError(
            "a POST carries one JSON-RPC request or notification in this revision",
            reason=Reason.INVALID_REQUEST,
            code=INVALID_REQUEST,
        )
    header_version = (headers.get("mcp-protocol-version") or "").strip()
    if isinstance(msg, Notification):
        return SessionlessMessage(headers=headers, message=msg, meta=None)
    meta = request_meta(msg)
    if meta.version != header_version:
        raise _mismatch(
            f"MCP-Protocol-Version {header_version!r} does not match "
            f"params._meta version {meta.version[:64]!r}",
            msg.id,
        )
    if meta.version not in SESSIONLESS_VERSIONS:
        raise unsupported_version(meta.version, supported, msg.id)
    _check_routing(headers, msg)
    return SessionlessMessage(headers=headers, message=msg, meta=meta)


def _check_routing(headers: Headers, req: Request) -> None:
    sent = headers.get("mcp-method")
    if sent is None:
        raise _mismatch("the Mcp-Method header is required", req.id)
    if sent.strip(" \t") != req.method:
        raise _mismatch(f"Mcp-Method {sent[:64]!r} does not match the method", req.id)
    field = NAMED_TARGET.get(req.method) or TASK_TARGET.get(req.method)
    if field is None:
        return
    params = req.params if isinstance(req.params, dict) else {}
    if field == "taskId":
        task_id_of(params, req.id)  # a task id that can be no task's is refused as that
    target = params.get(field)
    raw = headers.get("mcp-name")
    if raw is None:
        raise _mismatch(f"the Mcp-Name header is required for {req.method}", req.id)
    if len(raw) > MAX_HEADER_VALUE or decode_header_value(raw) != target:
        raise _mismatch(f"Mcp-Name does not match params.{field}", req.id)


def param_headers(schema: Mapping[str, Any]) -> dict[str, str]:
    """A tool input schema's ``x-mcp-header`` annotations: header suffix (lower-case)
    -> the top-level argument it mirrors.  Only string, integer and boolean
    properties reached through ``properties`` alone may be annotated; others are
    ignored (a client would not send their headers either)."""
    out: dict[str, str] = {}
    props = schema.get("properties")
    if not isinstance(props, dict):
        return out
    for name, prop in props.items():
        if not isinstance(prop, dict):
            continue
        suffix = prop.get("x-mcp-header")
        if (
            isinstance(suffix, str)
            and suffix
            and prop.get("type")
            in (
                "string",
                "integer",
                "boolean",
            )
        ):
            out[suffix.lower()] = name
    return out


def check_param_headers(
    headers: Headers,
    annotated: Mapping[str, str],
    arguments: Mapping[str, Any],
    request_id: RequestId,
) -> None:
    """Each annotated argument present in the body must come with its
    ``Mcp-Param-<suffix>`` header, equal once decoded (numbers compared as numbers).

    Raises:
        RemoteProtocolError: 400, -32020.
    """
    for suffix, arg in annotated.items():
        value = arguments.get(arg)
        if value is None:
            continue
        raw = headers.get(f"mcp-param-{suffix}")
        if raw is None:
            raise _mismatch(f"the Mcp-Param-{suffix} header is required", request_id)
        decoded = decode_header_value(raw) if len(raw) <= MAX_HEADER_VALUE else None
        if decoded is None or not _same(decoded, value):
            raise _mismatch(f"Mcp-Param-{suffix} does not match argument {arg!r}", request_id)


def _same(text: str, value: Any) -> bool:
    if isinstance(value, bool):
        return text == ("true" if value else "false")
    if isinstance(value, int | float):
        try:
            number = float(text)
        except ValueError:
            return False
        return math.isfinite(number) and number == value
    return bool(text == value)


def complete(
    method: str,
    result: dict[str, Any],
    server_info: Mapping[str, Any],
    *,
    ttl_ms: int = 0,
    cache_scope: str = "private",
) -> dict[str, Any]:
    """``result`` with what every complete result of this era carries.

    ``resultType`` (unless the result set its own, e.g. ``input_required``), the
    server's identity under ``_meta``, and for a cacheable method (and only a
    complete result) ``ttlMs`` and ``cacheScope`` unless the result chose them.
    """
    out = dict(result)
    out.setdefault("resultType", "complete")
    meta = dict(out.get("_meta") or {})
    meta.setdefault(META_SERVER_INFO, dict(server_info))
    out["_meta"] = meta
    if method in CACHEABLE and out["resultType"] == "complete":
        out.setdefault("ttlMs", ttl_ms)
        out.setdefault("cacheScope", cache_scope)
    return out


def discover_result(
    supported: Sequence[str],
    capabilities: Mapping[str, Any],
    server_info: Mapping[str, Any],
    instructions: str | None = None,
) -> dict[str, Any]:
    """The ``server/discover`` result: served versions, capabilities, identity."""
    result: dict[str, Any] = {
        "supportedVersions": list(supported),
        "capabilities": dict(capabilities),
    }
    if instructions:
        result["instructions"] = instructions
    return complete("server/discover", result, server_info)
