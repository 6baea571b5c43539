"""MCP methods: turn one JSON-RPC request into a result, using the application registry.

Theory of operation
-------------------
:func:`dispatch` is the only place that knows MCP method names.  It returns the
``result`` object or raises :class:`~weir.app.McpError` (a JSON-RPC error).  Tool
failures are *results* with ``isError: true`` (MCP), not JSON-RPC errors.
It does no I/O of its own and needs no particular event loop: the handlers it awaits
reach the client only through the call's :class:`~weir.app.Context`, whose backend
the driver supplies.  Transport concerns (streams, sessions, HTTP, which requests the
transport answers itself) stay in the drivers.
"""

from __future__ import annotations

import contextvars
import inspect
import logging
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, cast

import msgspec

from weir.protocol import (
    INTERNAL_ERROR,
    INVALID_PARAMS,
    INVALID_REQUEST,
    METHOD_NOT_FOUND,
    RESOURCE_NOT_FOUND,
    Reason,
)
from weir.protocol.jsonrpc import Request, RequestId, encode_error
from weir.protocol.lifecycle import initialize_result

from ._context import LOG_LEVELS, Context
from ._registry import App, McpError, StreamGone, Tool, ToolError, text, tool_result

log = logging.getLogger(__name__)


async def _call(
    fn: Callable[..., Any], ctx_param: str | None, ctx: Context, kwargs: dict[str, Any]
) -> Any:
    if ctx_param is not None:
        kwargs = {**kwargs, ctx_param: ctx}
    out = fn(**kwargs)
    if inspect.isawaitable(out):
        out = await out
    return out


def _params(req: Request) -> dict[str, Any]:
    return req.params or {}


def _require_str(params: dict[str, Any], key: str) -> str:
    value = params.get(key)
    if not isinstance(value, str):
        raise McpError(INVALID_PARAMS, f"params.{key} must be a string")
    return value


def capabilities(app: App) -> dict[str, Any]:
    """The server capabilities advertised at ``initialize``."""
    caps: dict[str, Any] = {"logging": {}}
    if app.tools:
        caps["tools"] = {"listChanged": False}
    if app.resources or app.templates:
        caps["resources"] = {"subscribe": True, "listChanged": False}
    if app.prompts:
        caps["prompts"] = {"listChanged": False}
    if app.completion_fn is not None:
        caps["completions"] = {}
    return caps


def describe(app: App, version: str) -> dict[str, Any]:
    """What ``initialize`` and ``server/discover`` say about ``app`` at ``version``:
    ``capabilities``, ``serverInfo`` and ``instructions`` -- the app's own
    :meth:`~weir.app.App.describe` hook's, else derived from its registries.

    Raises:
        TypeError: the hook returned something without a ``capabilities`` and a
            ``serverInfo`` object.
    """
    if app.describe_fn is None:
        return {
            "capabilities": capabilities(app),
            "serverInfo": {"name": app.name, "version": app.version},
            "instructions": app.instructions,
        }
    described = app.describe_fn(version)
    if not isinstance(described, dict) or not all(
        isinstance(described.get(k), dict) for k in ("capabilities", "serverInfo")
    ):
        raise TypeError("App.describe must return capabilities and serverInfo objects")
    return described


def initialize_result_for(app: App, version: str, **driver_capabilities: Any) -> dict[str, Any]:
    """The ``initialize`` result for ``app`` at the negotiated ``version``: the app's
    capabilities (plus any the driver itself adds, e.g. ``experimental``, merged
    into the app's own entry of that name) and its identity and instructions."""
    described = describe(app, version)
    caps = dict(described["capabilities"])
    for name, value in driver_capabilities.items():
        mine = caps.get(name)
        caps[name] = (
            {**mine, **value} if isinstance(mine, dict) and isinstance(value, dict) else value
        )
    return initialize_result(
        version,
        caps,
        server_info=described["serverInfo"],
        instructions=described.get("instructions"),
    )


def _prepare(app: App, params: dict[str, Any]) -> tuple[str, Tool, dict[str, Any]]:
    """The tool's name, the tool and its converted keyword arguments.

    Raises:
        McpError: an unknown tool, or ``arguments`` that is not an object.
        _InvalidArguments: the arguments do not validate (a tool error, not a JSON-RPC one).
    """
    name = _require_str(params, "name")
    tool = app.tools.get(name)
    if tool is None:
        raise McpError(INVALID_PARAMS, f"unknown tool {name!r}")
    arguments = params.get("arguments") or {}
    if not isinstance(arguments, dict):
        raise McpError(INVALID_PARAMS, "params.arguments must be an object")
    try:
        if tool.args_type is not None:
            converted = msgspec.convert(arguments, tool.args_type, strict=False)
            kwargs = {f: getattr(converted, f) for f in tool.args_type.__struct_fields__}
        else:
            kwargs = dict(arguments) if tool.input_schema.get("properties") else {}
    except msgspec.ValidationError as exc:
        raise _InvalidArguments(f"invalid arguments for {name}: {exc}") from None
    return name, tool, kwargs


class _InvalidArguments(Exception):
    pass


def _tool_failed(name: str, exc: Exception) -> dict[str, Any]:
    """A tool's failure as its result: a :class:`ToolError`'s own message, else a
    generic one -- an exception's text can hold anything (paths, keys, other users'
    data), so it goes to the log, with its traceback, once, and never to the client.
    A tool that used an asyncio-only library on another loop is logged as that, with
    the fix, and its result says it needs asyncio (see :mod:`weir.app._foreign`)."""
    if isinstance(exc, ToolError):
        return {"content": [text(str(exc))], "isError": True}
    if isinstance(exc, StreamGone):
        # The driver's own signal (the stream cannot carry the call's messages):
        # nothing in the tool is wrong, so no traceback.
        log.warning("tool %s stopped: its stream is gone (%s)", name, exc)
        return {"content": [text(f"tool {name} stopped: its stream is gone")], "isError": True}
    from ._foreign import asyncio_only_failure, asyncio_only_hint, asyncio_only_result

    if asyncio_only_failure(exc) is not None:
        # An asyncio-only library on another loop: say so, and name the fix.
        log.error("%s", asyncio_only_hint(f"tool {name}"), exc_info=exc)
        return {"content": [text(asyncio_only_result(f"tool {name}"))], "isError": True}
    log.exception("tool %s failed", name)
    return {
        "content": [text(f"tool {name} failed; the server logged the details")],
        "isError": True,
    }


async def call_tool(app: App, params: dict[str, Any], ctx: Context) -> dict[str, Any]:
    """Run ``tools/call``; every failure inside the tool becomes ``isError: true``."""
    try:
        name, tool, kwargs = _prepare(app, params)
    except _InvalidArguments as exc:
        return {"content": [text(str(exc))], "isError": True}
    try:
        return tool_result(await _call(tool.fn, tool.context_param, ctx, kwargs))
    except McpError:
        raise
    except Exception as exc:
        return _tool_failed(name, exc)


def inline_tool(app: App, req: Request) -> Tool | None:
    """The tool ``req`` calls if it is a ``tools/call`` that can run inline, else None
    (also None when the app's fallback serves every method, tools included)."""
    if req.method != "tools/call" or not req.params:
        return None
    if app.fallback_every_method and app.fallback_fn is not None:
        return None
    name = req.params.get("name")
    tool = app.tools.get(name) if isinstance(name, str) else None
    return tool if tool is not None and tool.inline else None


def call_tool_now(app: App, params: dict[str, Any], ctx: Context) -> dict[str, Any]:
    """:func:`call_tool` for a tool whose function never suspends, run synchronously.

    Same results and errors as :func:`call_tool`; the caller has checked
    :func:`inline_tool`.  The coroutine is stepped once and must finish on that
    step (:func:`weir.app.never_suspends` guarantees it); it runs in a copy of
    the current context, as a task would, so context variables it sets do not leak.
    """
    try:
        name, tool, kwargs = _prepare(app, params)
    except _InvalidArguments as exc:
        return {"content": [text(str(exc))], "isError": True}
    if tool.context_param is not None:
        kwargs[tool.context_param] = ctx
    try:
        coro = cast("Coroutine[Any, Any, Any]", tool.fn(**kwargs))
        contextvars.copy_context().run(coro.send, None)
    except StopIteration as stop:
        value = stop.value
    except McpError:
        raise
    except Exception as exc:
        return _tool_failed(name, exc)
    else:  # pragma: no cover - never_suspends() rules this out
        coro.close()
        raise RuntimeError(f"tool {name!r} suspended although it has no await")
    try:
        return tool_result(value)
    except Exception as exc:
        return _tool_failed(name, exc)


def _resource_contents(uri: str, mime: str | None, value: Any) -> list[dict[str, Any]]:
    import base64

    if isinstance(value, str):
        item: dict[str, Any] = {"uri": uri, "text": value}
    elif isinstance(value, bytes):
        item = {"uri": uri, "blob": base64.b64encode(value).decode()}
    elif isinstance(value, list):
        return value
    elif isinstance(value, dict):
        return [value]
    else:
        raise TypeError(f"resource {uri}: cannot serve {type(value).__name__}")
    if mime:
        item["mimeType"] = mime
    return [item]


async def read_resource(app: App, params: dict[str, Any], ctx: Context) -> dict[str, Any]:
    """Run ``resources/read`` for a static resource or a template match."""
    uri = _require_str(params, "uri")
    res = app.resources.get(uri)
    if res is not None:
        value = await _call(res.fn, res.context_param, ctx, {})
        return {"contents": _resource_contents(uri, res.mime_type, value)}
    found = app.find_template(uri)
    if found is None:
        raise McpError(RESOURCE_NOT_FOUND, f"resource {uri!r} not found", {"uri": uri})
    tpl, variables = found
    value = await _call(tpl.fn, tpl.context_param, ctx, variables)
    return {"contents": _resource_contents(uri, tpl.mime_type, value)}


async def get_prompt(app: App, params: dict[str, Any], ctx: Context) -> dict[str, Any]:
    """Run ``prompts/get``."""
    name = _require_str(params, "name")
    prompt = app.prompts.get(name)
    if prompt is None:
        raise McpError(INVALID_PARAMS, f"unknown prompt {name!r}")
    args = params.get("arguments") or {}
    if not isinstance(args, dict):
        raise McpError(INVALID_PARAMS, "params.arguments must be an object")
    missing = [a["name"] for a in prompt.arguments if a["required"] and a["name"] not in args]
    if missing:
        raise McpError(
            INVALID_PARAMS, f"prompt {name!r} is missing arguments: {', '.join(missing)}"
        )
    known = {a["name"] for a in prompt.arguments}
    value = await _call(
        prompt.fn, prompt.context_param, ctx, {k: v for k, v in args.items() if k in known}
    )
    if isinstance(value, str):
        messages = [{"role": "user", "content": text(value)}]
    elif isinstance(value, dict) and "messages" in value:
        return value
    else:
        messages = list(value)
    return {"description": prompt.description, "messages": messages}


async def complete(app: App, params: dict[str, Any], ctx: Context) -> dict[str, Any]:
    """Run ``completion/complete``."""
    ref = params.get("ref")
    argument = params.get("argument")
    if not isinstance(ref, dict) or not isinstance(argument, dict):
        raise McpError(INVALID_PARAMS, "params.ref and params.argument must be objects")
    values: list[str] = []
    if app.completion_fn is not None:
        context_args = (params.get("context") or {}).get("arguments") or {}
        out = app.completion_fn(
            ref, str(argument.get("name", "")), str(argument.get("value", "")), context_args
        )
        values = list(await out) if inspect.isawaitable(out) else list(out)
    return {
        "completion": {"values": values[:100], "total": len(values), "hasMore": len(values) > 100}
    }


Handler = Callable[[App, dict[str, Any], Context], Awaitable[dict[str, Any]]]


async def _ping(app: App, p: dict[str, Any], c: Context) -> dict[str, Any]:
    return {}


async def _tools_list(app: App, p: dict[str, Any], c: Context) -> dict[str, Any]:
    return {"tools": [t.listing() for t in app.tools.values()]}


async def _tools_call(app: App, p: dict[str, Any], c: Context) -> dict[str, Any]:
    return await call_tool(app, p, c)


async def _resources_list(app: App, p: dict[str, Any], c: Context) -> dict[str, Any]:
    return {"resources": [r.listing() for r in app.resources.values()]}


async def _templates_list(app: App, p: dict[str, Any], c: Context) -> dict[str, Any]:
    return {"resourceTemplates": [t.listing() for t in app.templates]}


async def _resources_read(app: App, p: dict[str, Any], c: Context) -> dict[str, Any]:
    return await read_resource(app, p, c)


#: What one caller may make the server remember through ``resources/subscribe``.
MAX_SUBSCRIPTIONS = 256
MAX_SUBSCRIPTION_URI = 2048


async def _subscribe(app: App, p: dict[str, Any], c: Context) -> dict[str, Any]:
    uri, held = _require_str(p, "uri"), c.backend.caller.subscriptions
    if len(uri) > MAX_SUBSCRIPTION_URI:
        raise McpError(
            INVALID_PARAMS,
            f"params.uri is longer than {MAX_SUBSCRIPTION_URI} characters",
            {"reason": str(Reason.SUBSCRIPTION_LIMIT), "limit": MAX_SUBSCRIPTION_URI},
        )
    if uri not in held and len(held) >= MAX_SUBSCRIPTIONS:
        raise McpError(
            INVALID_PARAMS,
            f"at most {MAX_SUBSCRIPTIONS} subscriptions at a time; unsubscribe first",
            {"reason": str(Reason.SUBSCRIPTION_LIMIT), "limit": MAX_SUBSCRIPTIONS},
        )
    held.add(uri)
    return {}


async def _unsubscribe(app: App, p: dict[str, Any], c: Context) -> dict[str, Any]:
    c.backend.caller.subscriptions.discard(_require_str(p, "uri"))
    return {}


async def _prompts_list(app: App, p: dict[str, Any], c: Context) -> dict[str, Any]:
    return {"prompts": [pr.listing() for pr in app.prompts.values()]}


async def _prompts_get(app: App, p: dict[str, Any], c: Context) -> dict[str, Any]:
    return await get_prompt(app, p, c)


async def _complete(app: App, p: dict[str, Any], c: Context) -> dict[str, Any]:
    return await complete(app, p, c)


async def _set_level(app: App, p: dict[str, Any], c: Context) -> dict[str, Any]:
    level = _require_str(p, "level")
    if level not in LOG_LEVELS:
        raise McpError(INVALID_PARAMS, f"unknown log level {level!r}")
    c.backend.caller.log_level = level
    return {}


METHODS: dict[str, Handler] = {
    "ping": _ping,
    "tools/list": _tools_list,
    "tools/call": _tools_call,
    "resources/list": _resources_list,
    "resources/templates/list": _templates_list,
    "resources/read": _resources_read,
    "resources/subscribe": _subscribe,
    "resources/unsubscribe": _unsubscribe,
    "prompts/list": _prompts_list,
    "prompts/get": _prompts_get,
    "completion/complete": _complete,
    "logging/setLevel": _set_level,
}


async def dispatch(app: App, req: Request, ctx: Context) -> dict[str, Any]:
    """Serve one request: the registries' method, else the app's fallback.

    Raises:
        McpError: ``-32601`` for a method nobody serves, or whatever the handler raised.
    """
    fallback = app.fallback_fn
    if fallback is not None and app.fallback_every_method and req.method != "ping":
        handler = None  # (ping is the transport's: it only says the server is there)
    else:
        handler = METHODS.get(req.method)
    if handler is not None:
        return await handler(app, _params(req), ctx)
    if fallback is None:
        raise McpError(METHOD_NOT_FOUND, f"method {req.method!r} not found")
    result = await fallback(req.method, _params(req), ctx)
    if not isinstance(result, dict):
        raise TypeError(
            f"the fallback for {req.method} returned {type(result).__name__}, not a dict"
        )
    return result


def failure(req: Request, exc: Exception) -> bytes:
    """The JSON-RPC error answering ``req`` whose handler raised ``exc``.

    An :class:`McpError` is the handler's own answer.  Anything else is logged with
    its traceback and answered with a generic -32603: an exception's text can hold
    anything (paths, keys, other users' data), so it never goes to the client.
    """
    if isinstance(exc, McpError):
        return encode_error(req.id, exc.code, exc.message, exc.data)
    from ._foreign import asyncio_only_failure, asyncio_only_hint

    if asyncio_only_failure(exc) is not None:  # an asyncio-only library: name the fix
        log.error("%s", asyncio_only_hint(f"handler for {req.method}"), exc_info=exc)
    else:
        log.exception("handler for %s failed", req.method)
    return encode_error(req.id, INTERNAL_ERROR, f"internal error in {req.method}")


def id_in_use(request_id: RequestId) -> bytes:
    """The refusal of a request whose id is still running in its session.

    Ids name the request a cancellation or a progress notification is about, so
    two live requests under one id would be ambiguous.
    """
    return encode_error(
        request_id,
        INVALID_REQUEST,
        f"request id {request_id!r} is already in use",
        {"reason": str(Reason.INVALID_REQUEST)},
    )
