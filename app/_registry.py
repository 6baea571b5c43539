"""The application API: tools, resources, prompts and completions as decorated functions.

Theory of operation
-------------------
An :class:`App` is a registry, nothing more: decorators record functions together
with the metadata MCP lists (names, descriptions, JSON Schemas, annotations).  It
has no I/O and no knowledge of sessions or of an event loop; a driver (the Trio
engine, the asyncio runtime) looks handlers up here, through :func:`weir.app.dispatch`,
and calls them with a :class:`~weir.app.Context`.

* A tool's ``inputSchema`` is derived from its type hints with msgspec (a Struct is
  built from the parameters), and incoming ``arguments`` are validated and
  converted with the same Struct before the function runs.  Bad arguments become a
  tool result with ``isError: true`` (MCP 2025-11-25: input validation errors are
  tool execution errors), never a crash.
* A parameter annotated as :class:`~weir.app.Context` receives the per-call context
  and is not part of the schema.
* Return values are normalised into MCP result objects by :func:`tool_result`
  (``str`` -> one text block, a content block or a list of them, or a full result
  ``dict`` with ``content``).  Raising :class:`ToolError` yields ``isError: true``.
"""

from __future__ import annotations

import base64
import contextlib
import dis
import importlib
import inspect
import re
import types
from collections.abc import Awaitable, Callable, Mapping
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from typing import Any, TypeVar, get_type_hints

import msgspec

from weir.protocol.sessionless_run import (
    Tasking,
)
from weir.protocol.tasks import TaskSupport

from ._hooks import AppHooks

F = TypeVar("F", bound=Callable[..., Any])

_TOOL_NAME = re.compile(r"[A-Za-z0-9_\-.]{1,128}")


#: Bytecodes through which a coroutine can give control back to the event loop
#: (``await``, ``async with``, ``async for``; ``YIELD_VALUE`` underlies them all).
_SUSPENDING_OPS = frozenset(
    {"GET_AWAITABLE", "SEND", "YIELD_VALUE", "YIELD_FROM", "BEFORE_ASYNC_WITH", "GET_AITER"}
    | {"GET_ANEXT", "END_ASYNC_FOR", "ASYNC_GEN_WRAP"}
)


def never_suspends(fn: Callable[..., Any]) -> bool:
    """True if ``fn`` is an ``async def`` whose body contains no suspension point.

    Such a coroutine runs to completion on its first step: it cannot block the
    event loop any longer than the same code in a task would, cannot be cancelled
    half-way, and cannot observe which task runs it.  That is what lets the server
    execute it inline.  Anything else -- a function with an ``await`` anywhere in
    its body (taken or not), a plain ``def``, a wrapper object, a ``partial`` --
    answers False and runs in a handler task as usual.  The check reads the
    function's own bytecode only; what it calls synchronously cannot suspend it.
    """
    if not isinstance(fn, types.FunctionType) or not inspect.iscoroutinefunction(fn):
        return False
    return not any(ins.opname in _SUSPENDING_OPS for ins in dis.get_instructions(fn))


class ToolError(Exception):
    """Raise from a tool to return ``isError: true`` with this message as text."""


class StreamGone(Exception):
    """Raised by a context's sends (``report_progress``, ``log``...) when the call's
    stream can no longer carry anything: the client went away, or -- with a shared
    store -- the message could not be stored, and a message not stored is not sent.

    The call cannot be answered on that stream.  A tool may catch it to stop early;
    one that lets it out ends with a one-line warning in the log (the reason, no
    traceback: nothing in the tool is wrong).
    """


class McpError(Exception):
    """Raise from any handler to answer with a JSON-RPC error.

    Args:
        code: the JSON-RPC error code (e.g. ``-32602`` invalid params).
        message: the error message.
        data: optional ``error.data``.
    """

    def __init__(self, code: int, message: str, data: Any = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.data = data


# ---------------------------------------------------------------- content helpers
def text(value: str) -> dict[str, Any]:
    """A text content block."""
    return {"type": "text", "text": value}


def image(data: bytes, mime_type: str) -> dict[str, Any]:
    """An image content block (``data`` is base64-encoded for you)."""
    return {"type": "image", "data": base64.b64encode(data).decode(), "mimeType": mime_type}


def audio(data: bytes, mime_type: str) -> dict[str, Any]:
    """An audio content block (``data`` is base64-encoded for you)."""
    return {"type": "audio", "data": base64.b64encode(data).decode(), "mimeType": mime_type}


def embedded_resource(
    uri: str, *, text: str | None = None, blob: bytes | None = None, mime_type: str | None = None
) -> dict[str, Any]:
    """An embedded resource content block holding either ``text`` or ``blob``."""
    res: dict[str, Any] = {"uri": uri}
    if mime_type is not None:
        res["mimeType"] = mime_type
    if (text is None) == (blob is None):
        raise ValueError("give exactly one of text or blob")
    if text is not None:
        res["text"] = text
    else:
        assert blob is not None
        res["blob"] = base64.b64encode(blob).decode()
    return {"type": "resource", "resource": res}


def tool_result(value: Any) -> dict[str, Any]:
    """Normalise a tool's return value into a ``CallToolResult`` object.

    Raises:
        TypeError: for a value that cannot be shown to a client.
    """
    if isinstance(value, str):
        return {"content": [text(value)]}
    if isinstance(value, Mapping):
        if "content" in value:
            return dict(value)
        if "type" in value:
            return {"content": [dict(value)]}
        return {
            "content": [text(msgspec.json.encode(value).decode())],
            "structuredContent": dict(value),
        }
    if isinstance(value, list | tuple):
        return {"content": [c if isinstance(c, Mapping) else text(str(c)) for c in value]}
    if value is None:
        return {"content": []}
    if isinstance(value, int | float | bool):
        return {"content": [text(str(value))]}
    raise TypeError(f"cannot turn {type(value).__name__} into a tool result")


# ---------------------------------------------------------------- registry records
@dataclass(slots=True, kw_only=True)
class Tool:
    """A registered tool."""

    name: str
    description: str
    fn: Callable[..., Awaitable[Any] | Any]
    input_schema: dict[str, Any]
    args_type: type[msgspec.Struct] | None
    context_param: str | None
    annotations: dict[str, Any] | None = None
    title: str | None = None
    #: True when ``fn`` is a coroutine function that can never suspend (see
    #: :func:`never_suspends`): the server then runs it to completion in the
    #: connection's task, with no handler task and no cancel scope.
    inline: bool = False
    #: Whether a call may (or must) be answered with a task (the tasks extension).
    task: TaskSupport = TaskSupport.FORBIDDEN
    #: True: the task starts with the call; False: the handler runs in the request
    #: and becomes a task when it calls :meth:`Context.become_task`.
    task_upfront: bool = True

    def listing(self) -> dict[str, Any]:
        """The entry for ``tools/list``."""
        out: dict[str, Any] = {
            "name": self.name,
            "description": self.description,
            "inputSchema": self.input_schema,
        }
        if self.title:
            out["title"] = self.title
        if self.annotations:
            out["annotations"] = self.annotations
        if self.task is not TaskSupport.FORBIDDEN:
            out["execution"] = {"taskSupport": self.task.value}
        return out


def _resource_listing(
    out: dict[str, Any], name: str, description: str | None, mime_type: str | None
) -> dict[str, Any]:
    out["name"] = name
    if description:
        out["description"] = description
    if mime_type:
        out["mimeType"] = mime_type
    return out


@dataclass(slots=True, kw_only=True)
class Resource:
    """A registered static resource."""

    uri: str
    name: str
    description: str | None
    mime_type: str | None
    fn: Callable[..., Any]
    context_param: str | None

    def listing(self) -> dict[str, Any]:
        """The entry for ``resources/list``."""
        return _resource_listing({"uri": self.uri}, self.name, self.description, self.mime_type)


@dataclass(slots=True, kw_only=True)
class ResourceTemplate:
    """A registered URI template (RFC 6570 level 1: ``{name}`` segments)."""

    uri_template: str
    name: str
    description: str | None
    mime_type: str | None
    fn: Callable[..., Any]
    context_param: str | None
    pattern: re.Pattern[str] = field(init=False)

    def __post_init__(self) -> None:
        parts = re.split(r"\{([A-Za-z_][A-Za-z0-9_]*)\}", self.uri_template)
        rx = "".join(re.escape(p) if i % 2 == 0 else f"(?P<{p}>[^/]+)" for i, p in enumerate(parts))
        self.pattern = re.compile(rx)

    def match(self, uri: str) -> dict[str, str] | None:
        """The template variables if ``uri`` matches, else ``None``."""
        m = self.pattern.fullmatch(uri)
        return m.groupdict() if m else None

    def listing(self) -> dict[str, Any]:
        """The entry for ``resources/templates/list``."""
        return _resource_listing(
            {"uriTemplate": self.uri_template}, self.name, self.description, self.mime_type
        )


@dataclass(slots=True, kw_only=True)
class Prompt:
    """A registered prompt."""

    name: str
    description: str
    arguments: list[dict[str, Any]]
    fn: Callable[..., Any]
    context_param: str | None

    def listing(self) -> dict[str, Any]:
        """The entry for ``prompts/list``."""
        out: dict[str, Any] = {"name": self.name, "description": self.description}
        if self.arguments:
            out["arguments"] = self.arguments
        return out


CompletionFn = Callable[
    [dict[str, Any], str, str, dict[str, str]], Awaitable[list[str]] | list[str]
]


def _context_param(fn: Callable[..., Any], hints: Mapping[str, Any]) -> str | None:
    from ._context import Context

    for name, hint in hints.items():
        if hint is Context:
            return name
    return None


def _describe(fn: Callable[..., Any], description: str | None, what: str) -> str:
    desc = description or inspect.getdoc(fn)
    if not desc:
        raise ValueError(f"{what} {fn.__name__!r} needs a description (argument or docstring)")
    return desc


def _schema_for(
    fn: Callable[..., Any], hints: Mapping[str, Any], skip: str | None
) -> tuple[dict[str, Any], type[msgspec.Struct] | None]:
    fields: list[tuple[str, Any] | tuple[str, Any, Any]] = []
    for pname, param in inspect.signature(fn).parameters.items():
        if pname == skip:
            continue
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            raise TypeError(f"{fn.__name__}: *args/**kwargs cannot be described as a schema")
        hint = hints.get(pname, Any)
        if param.default is inspect.Parameter.empty:
            fields.append((pname, hint))
        else:
            fields.append((pname, hint, param.default))
    if not fields:
        return {"type": "object", "properties": {}}, None
    struct = msgspec.defstruct(f"{fn.__name__}_args", fields, forbid_unknown_fields=False)
    schema = msgspec.json.schema(struct)
    ref = schema.pop("$ref").rsplit("/", 1)[1]
    defs: dict[str, Any] = schema.pop("$defs")
    top = dict(defs.pop(ref))
    top.pop("title", None)
    if not top.get("required"):
        top.pop("required", None)
    if defs:
        top["$defs"] = defs
    return top, struct


#: ``lifespan(app)``: an async context manager entered around serving.
Lifespan = Callable[["App"], AbstractAsyncContextManager[Any]]


class App(AppHooks):
    """An MCP application: a named registry of tools, resources, prompts and completions.

    Args:
        name: ``serverInfo.name``.
        version: ``serverInfo.version``.
        instructions: optional ``instructions`` returned by ``initialize``.
        lifespan: optional ``lifespan(app)`` returning an async context manager that
            the server enters before it serves and exits after its last request
            (see :meth:`lifespan`).
    """

    def __init__(
        self,
        name: str,
        version: str = "0.1.0",
        *,
        instructions: str | None = None,
        lifespan: Lifespan | None = None,
    ) -> None:
        self.name = name
        self.version = version
        self.instructions = instructions
        #: Entered around serving; what it yields is ``Context.state`` in every handler.
        self.lifespan_fn: Lifespan | None = lifespan
        self.tools: dict[str, Tool] = {}
        self.resources: dict[str, Resource] = {}
        self.templates: list[ResourceTemplate] = []
        self.prompts: dict[str, Prompt] = {}
        self.completion_fn: CompletionFn | None = None
        self._init_hooks()

    def lifespan(self, fn: Lifespan) -> Lifespan:
        """Register the app's lifespan: ``@app.lifespan`` on an ``@asynccontextmanager``.

        The server enters it before it accepts a connection and exits it after the
        last request has finished (graceful shutdown included), once per process.
        What it yields is ``ctx.state`` in every handler: a database pool, a client,
        a cache, opened once instead of per call.  If entering it raises, the server
        does not start.
        """
        self.lifespan_fn = fn
        return fn

    def lifespan_context(self) -> AbstractAsyncContextManager[Any]:
        """What a driver enters around serving: the app's lifespan, or, without one,
        a context that yields ``None``."""
        if self.lifespan_fn is None:
            return contextlib.nullcontext()
        return self.lifespan_fn(self)

    # ---------------------------------------------------------------- tools
    def tool(
        self,
        name: str | None = None,
        *,
        description: str | None = None,
        title: str | None = None,
        input_schema: dict[str, Any] | None = None,
        read_only: bool | None = None,
        destructive: bool | None = None,
        idempotent: bool | None = None,
        open_world: bool | None = None,
        task: str = "forbidden",
        task_upfront: bool = True,
    ) -> Callable[[F], F]:
        """Register a tool.  Usable as ``@app.tool()`` or ``@app.tool("name", ...)``.

        ``task`` (the tasks extension): ``"forbidden"`` (the default: the call is
        answered in its request), ``"optional"`` (a client that declared the
        extension gets a task handle at once, others the result) or
        ``"required"`` (only as a task: a client that did not declare the
        extension is refused, -32021).  With ``task_upfront=False`` the handler
        runs in its request -- asking for input in rounds as usual -- and turns
        into a task where it calls :meth:`Context.become_task`.

        The hint flags become ``annotations`` (``readOnlyHint``, ``destructiveHint``,
        ``idempotentHint``, ``openWorldHint``); clients treat them as untrusted, and
        so does weir.  ``input_schema`` overrides the derived schema verbatim (then
        arguments are passed through unvalidated).

        Raises:
            ValueError: a duplicate or malformed name, or no description.
        """

        def register(fn: F) -> F:
            tname = name or fn.__name__
            if not _TOOL_NAME.fullmatch(tname):
                raise ValueError(f"tool name {tname!r}: use 1-128 of A-Z a-z 0-9 _ - .")
            if tname in self.tools:
                raise ValueError(f"tool {tname!r} registered twice")
            try:
                support = TaskSupport(task)
            except ValueError:
                raise ValueError(
                    f"tool {tname!r}: task must be 'forbidden', 'optional' or 'required'"
                ) from None
            hints = get_type_hints(fn)
            hints.pop("return", None)
            ctx = _context_param(fn, hints)
            if input_schema is not None:
                schema, struct = input_schema, None
            else:
                schema, struct = _schema_for(fn, hints, ctx)
            ann: dict[str, Any] = {
                k: v
                for k, v in (
                    ("readOnlyHint", read_only),
                    ("destructiveHint", destructive),
                    ("idempotentHint", idempotent),
                    ("openWorldHint", open_world),
                )
                if v is not None
            }
            if title:
                ann["title"] = title
            self.tools[tname] = Tool(
                name=tname,
                description=_describe(fn, description, "tool"),
                fn=fn,
                input_schema=schema,
                args_type=struct,
                context_param=ctx,
                annotations=ann or None,
                title=title,
                inline=never_suspends(fn) and support is TaskSupport.FORBIDDEN,
                task=support,
                task_upfront=task_upfront,
            )
            return fn

        return register

    # ---------------------------------------------------------------- resources
    def resource(
        self,
        uri: str,
        *,
        name: str | None = None,
        description: str | None = None,
        mime_type: str | None = None,
    ) -> Callable[[F], F]:
        """Register a static resource; the function returns ``str`` (text) or ``bytes`` (blob)."""

        def register(fn: F) -> F:
            if uri in self.resources:
                raise ValueError(f"resource {uri!r} registered twice")
            hints = get_type_hints(fn)
            self.resources[uri] = Resource(
                uri=uri,
                name=name or fn.__name__,
                description=description or inspect.getdoc(fn),
                mime_type=mime_type,
                fn=fn,
                context_param=_context_param(fn, hints),
            )
            return fn

        return register

    def resource_template(
        self,
        uri_template: str,
        *,
        name: str | None = None,
        description: str | None = None,
        mime_type: str | None = None,
    ) -> Callable[[F], F]:
        """Register a templated resource; template variables are passed as keyword arguments."""

        def register(fn: F) -> F:
            hints = get_type_hints(fn)
            self.templates.append(
                ResourceTemplate(
                    uri_template=uri_template,
                    name=name or fn.__name__,
                    description=description or inspect.getdoc(fn),
                    mime_type=mime_type,
                    fn=fn,
                    context_param=_context_param(fn, hints),
                )
            )
            return fn

        return register

    # ---------------------------------------------------------------- prompts
    def prompt(
        self,
        name: str | None = None,
        *,
        description: str | None = None,
        arguments: dict[str, str] | None = None,
    ) -> Callable[[F], F]:
        """Register a prompt.  Its parameters are the prompt's (string) arguments.

        ``arguments`` optionally maps parameter names to their descriptions.
        The function returns ``str`` (one user message) or a list of messages.
        """

        def register(fn: F) -> F:
            pname = name or fn.__name__
            hints = get_type_hints(fn)
            ctx = _context_param(fn, hints)
            args = []
            for p, param in inspect.signature(fn).parameters.items():
                if p == ctx:
                    continue
                entry: dict[str, Any] = {
                    "name": p,
                    "required": param.default is inspect.Parameter.empty,
                }
                if arguments and p in arguments:
                    entry["description"] = arguments[p]
                args.append(entry)
            self.prompts[pname] = Prompt(
                name=pname,
                description=_describe(fn, description, "prompt"),
                arguments=args,
                fn=fn,
                context_param=ctx,
            )
            return fn

        return register

    # ---------------------------------------------------------------- completion
    def completion(self, fn: CompletionFn) -> CompletionFn:
        """Register the completion handler: ``fn(ref, argument_name, value, context_arguments)``."""
        self.completion_fn = fn
        return fn

    def tasking(self, name: str) -> Tasking | None:
        """How tool ``name`` runs as a task (None: unknown, or it never does)."""
        tool = self.tools.get(name)
        if tool is None or tool.task is TaskSupport.FORBIDDEN:
            return None
        return Tasking(tool.task, tool.task_upfront)

    def input_schema(self, name: str) -> Mapping[str, Any] | None:
        """The ``inputSchema`` of tool ``name``: the registry's, else the
        :meth:`tool_schema` hook's (None if unknown or if the hook fails)."""
        tool = self.tools.get(name)
        if tool is not None:
            return tool.input_schema
        if self.tool_schema_fn is None:
            return None
        try:
            return self.tool_schema_fn(name)
        except Exception:
            return None  # header checks never break a call path

    def find_template(self, uri: str) -> tuple[ResourceTemplate, dict[str, str]] | None:
        """The first template matching ``uri``, with its variables."""
        for t in self.templates:
            found = t.match(uri)
            if found is not None:
                return t, found
        return None


#: The applications that ship with weir, by the short name ``weir serve`` accepts.
BUILTIN_APPS = {
    "demo": "weir.app.samples.demo:app",
    "conformance": "weir.app.samples.conformance:app",
}


def load_app(spec: str) -> App:
    """Resolve ``demo``, ``conformance`` or ``module:attribute`` to an :class:`App`.

    The attribute may also be a function taking no arguments that returns one, or
    a server written with the official MCP SDK (an ``MCPServer`` or a low-level
    ``Server``), which is wrapped with :func:`weir.app.sdk.from_sdk`.

    Raises:
        LookupError: the spec is malformed, the module cannot be imported, or the
            attribute is missing or is not an :class:`App` (the message says which).
    """
    target = BUILTIN_APPS.get(spec, spec)
    module_name, sep, attr = target.partition(":")
    if not sep or not module_name or not attr:
        raise LookupError(f"APP must be 'demo', 'conformance' or 'module:attribute', got {spec!r}")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise LookupError(f"cannot import {module_name!r}: {exc}") from None
    obj = getattr(module, attr, None)
    if obj is None:
        raise LookupError(f"module {module_name!r} has no attribute {attr!r}")
    from .sdk import from_sdk, is_sdk_server

    if not isinstance(obj, App) and not is_sdk_server(obj) and callable(obj):
        obj = obj()
    if is_sdk_server(obj):
        try:
            return from_sdk(obj)
        except (RuntimeError, TypeError) as exc:
            raise LookupError(f"{spec!r}: {exc}") from None
    if not isinstance(obj, App):
        raise LookupError(
            f"{spec!r} is a {type(obj).__name__}, not a weir.app.App or an mcp SDK server"
        )
    return obj
