"""Inline tools: a ``tools/call`` of an ``async def`` that never suspends runs in the
connection's task, and nothing a client can observe changes.

What this module guarantees:

* :func:`weir.app.never_suspends` says True only for a plain ``async def`` whose
  own bytecode has no suspension point, and ``App.tool`` records that in
  ``Tool.inline``.  Every ``await`` (even in a branch never taken), ``async with``,
  ``async for``, async comprehension, plain ``def``, ``partial``, callable object,
  async generator and awaiting ``functools.wraps`` wrapper answers False.
* Through the real server, in SSE and in ``json_response`` mode, an inline tool's
  answer -- result, ``isError`` for a ``ToolError``, an exception, bad arguments or
  an unconvertible result, JSON-RPC errors for ``McpError``, non-object arguments,
  unencodable results, an unknown tool, a request id already in use -- is the
  answer the same tool gives when it runs in a handler task (a twin that only
  awaits it, :func:`with_task_twin`), and the connection stays usable.  Context
  variables a tool sets do not leak into the next request.
* The idempotency gate still executes a keyed call once and replays it; a tool
  that can suspend still runs in a handler task and can be cancelled.
* When its frames cannot get credit at once, the inline answer waits (``_deliver``)
  and arrives, in order after its priming event, when credit returns -- never
  more frames than the credit.  ``StreamHandle.try_send_now`` / ``try_respond_now``
  and ``Session.try_acquire_now`` refuse (changing nothing) exactly when
  ``send``/``respond`` would wait.
* The server's deadline heap is asked for a wake-up only when a session's credit
  deadline moves earlier than the one it is scheduled at: a busy session costs
  no scheduling per frame, and a drain window opening still turns the session
  half-open, and liveness tears it down, at the exact instants.

Time is Trio's MockClock (``autojump_clock``); all I/O is in-memory streams.
"""

from __future__ import annotations

import contextvars
import functools
import json
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import pytest
import trio
import trio.testing

from tests.sim.store import SimStore
from weir.app import never_suspends
from weir.engine import App, Context, McpError, Server, ServerConfig, ToolError
from weir.engine._session import Session, StreamHandle
from weir.engine._store_records import SessionRecord
from weir.protocol import CreditLimits
from weir.protocol._credit import SessionCredit
from weir.protocol.sse import SseEvent
from weir.protocol.states import CreditState, StreamInput, StreamState
from weir.protocol.streams import StreamKind

from .helpers import H11Client, Reply, SseReply, connect, open_session, running_server
from .test_half_open import connect_stalling

FRAMES = 8
BYTES = 64 * 1024
DRAIN = 5.0
LIVENESS = 20.0
CREDIT = CreditLimits(frames=FRAMES, bytes=BYTES, drain_window=DRAIN, liveness_timeout=LIVENESS)
CONFIG = ServerConfig(credit=CREDIT, max_stream_events=64, session_idle_timeout=None)
TEST_DEADLINE = 1000.0  # virtual seconds; every test ends long before
MODES = [pytest.param(False, id="sse"), pytest.param(True, id="json")]

ToolFn = Callable[..., Awaitable[Any]]


# ----------------------------------------------------------------- the application

app = App("inline-test")
COUNTS: dict[str, int] = {}
TAG: contextvars.ContextVar[str] = contextvars.ContextVar("TAG", default="unset")


@pytest.fixture(autouse=True)
def fresh_counts() -> Iterator[None]:
    COUNTS.clear()
    yield


def _bump(name: str) -> int:
    COUNTS[name] = COUNTS.get(name, 0) + 1
    return COUNTS[name]


LOOSE_SCHEMA = {"type": "object", "properties": {"count": {"type": "integer"}}}


def with_task_twin(**options: Any) -> Callable[[ToolFn], ToolFn]:
    """Register the tool (it runs inline) and its ``<name>_task`` twin.

    The twin only awaits the tool.  The tool never suspends, so neither does the
    twin, but its ``await`` is enough to make it run in a handler task.
    """

    def register(fn: ToolFn) -> ToolFn:
        app.tool(**options)(fn)

        @functools.wraps(fn)
        async def twin(*args: Any, **kwargs: Any) -> Any:
            return await fn(*args, **kwargs)

        app.tool(f"{fn.__name__}_task", **options)(twin)
        return fn

    return register


@with_task_twin()
async def echo(text: str) -> str:
    """Echo."""
    return text


@with_task_twin()
async def whoami(ctx: Context, label: str = "") -> dict[str, Any]:
    """What the context says about this call."""
    return {"label": label, "request": ctx.request_id, "progress": ctx.progress_token}


@with_task_twin()
async def refuse() -> str:
    """Fail with a tool error."""
    raise ToolError("refused by policy")


@with_task_twin()
async def crash() -> str:
    """Fail with a plain exception."""
    raise RuntimeError("boom")


@with_task_twin()
async def bad_result() -> object:
    """Return something that is no tool result."""
    return object()


@with_task_twin()
async def rpc_fail() -> str:
    """Answer with a JSON-RPC error."""
    raise McpError(-32001, "custom failure", {"k": 1})


@with_task_twin()
async def unencodable() -> dict[str, Any]:
    """A result msgspec cannot encode."""
    return {"content": [{"type": "text", "text": object()}]}


@with_task_twin(input_schema=LOOSE_SCHEMA)
async def loose(count: int) -> str:
    """Arguments passed through unvalidated (schema override)."""
    return str(count)


@app.tool()
async def counted() -> str:
    """Count one more execution, return the count."""
    return str(_bump("counted"))


@app.tool()
async def tag(value: str) -> str:
    """Set a context variable; return what it reads now."""
    TAG.set(value)
    return TAG.get()


@app.tool()
async def read_tag() -> str:
    """The context variable as this call sees it."""
    return TAG.get()


@app.tool()
async def stamp() -> str:
    """The virtual time at which the tool ran."""
    return str(trio.current_time())


@app.tool()
async def sleepy(seconds: float = 1) -> str:
    """Sleep (a real suspension point), counting starts and finishes."""
    _bump("sleepy started")
    await trio.sleep(seconds)
    _bump("sleepy finished")
    return f"slept {seconds:g}"


@app.tool()
async def chatty(ctx: Context, n: int, delay: float = 0) -> str:
    """After ``delay`` seconds, send ``n`` log notifications."""
    await trio.sleep(delay)
    for i in range(n):
        await ctx.info(f"log {i}")
    return f"sent {n}"


INLINE = {
    "echo",
    "whoami",
    "refuse",
    "crash",
    "bad_result",
    "rpc_fail",
    "unencodable",
    "loose",
    "counted",
    "tag",
    "read_tag",
    "stamp",
}


# ----------------------------------------------------------------- fixtures and helpers


def inline_runs(server: Server) -> Counter[str]:
    """Tool calls the server answered inline (no handler task), by tool: its metrics."""
    return server.metrics.inline_calls


def deliveries(server: Server) -> Counter[str]:
    """Inline answers that had to wait for credit, by whether the priming event waited."""
    return server.metrics.inline_deferred


@asynccontextmanager
async def serving(
    config: ServerConfig | None = None,
) -> AsyncIterator[tuple[Server, trio.Nursery]]:
    """:func:`running_server` for ``app``, failing (in virtual time) if a test gets stuck."""
    with trio.fail_after(TEST_DEADLINE):
        async with running_server(app, config or CONFIG) as (server, nursery):
            yield server, nursery


def config_for(json_response: bool) -> ServerConfig:
    return ServerConfig(
        credit=CREDIT,
        max_stream_events=64,
        session_idle_timeout=None,
        json_response=json_response,
    )


def state_of(credit: SessionCredit) -> CreditState:
    """The state, read through a call (so the type checker does not over-narrow it)."""
    return credit.state


def log_state(handle: StreamHandle) -> StreamState:
    """The stream's state, read through a call (as :func:`state_of`)."""
    return handle.log.state


async def settle() -> None:
    """Let every task run until all are blocked (the clock does not move)."""
    await trio.testing.wait_all_tasks_blocked()


def call_msg(request_id: int, name: str, arguments: Any = None) -> dict[str, Any]:
    return {
        "jsonrpc": "2.0",
        "id": request_id,
        "method": "tools/call",
        "params": {"name": name, "arguments": {} if arguments is None else arguments},
    }


def as_session(server: Server, nursery: trio.Nursery, client: H11Client) -> H11Client:
    other = connect(server, nursery)
    other.session_id, other.protocol_version = client.session_id, client.protocol_version
    return other


def seqs(events: list[SseEvent]) -> list[int]:
    return [int((e.id or "x:-1").split(":")[1]) for e in events]


async def answer(
    client: H11Client,
    msg: dict[str, Any],
    *,
    json_mode: bool,
    headers: dict[str, str] | None = None,
) -> dict[str, Any]:
    """POST one request; its one JSON-RPC answer (checked to be the whole response)."""
    reply = await client.post(msg, headers)
    if json_mode:
        assert isinstance(reply, Reply), reply
        assert reply.status == 200 and reply.headers["content-type"] == "application/json"
        body: dict[str, Any] = reply.json()
        return body
    assert isinstance(reply, SseReply), reply
    assert reply.status == 200
    events = await reply.events()
    # The priming event, then the answer as the stream's final event: nothing else.
    assert [e.data == "" for e in events] == [True, False], events
    assert seqs(events) == [0, 1]
    out: dict[str, Any] = json.loads(events[1].data)
    return out


def untwin(message: dict[str, Any], request_id: int) -> dict[str, Any]:
    """A ``_task`` twin's answer as the inline tool's: its name and request id replaced."""
    out: dict[str, Any] = json.loads(json.dumps(message).replace("_task", ""))
    assert out["id"] != request_id  # (the id is the gate key: the twin needs its own)
    out["id"] = request_id
    return out


async def started(server: Server, nursery: trio.Nursery) -> tuple[H11Client, Session]:
    """An initialized client (2025-11-25) and its live session."""
    client, sid = await open_session(server, nursery)
    return client, server.sessions[sid]


# ----------------------------------------------------------------- 1. never_suspends


async def _coro_helper(x: int) -> int:
    return x


def _sync_helper(x: int) -> int:
    return x * 2


async def returns(x: int) -> int:
    return x


async def sync_work(xs: list[int]) -> int:
    squares = [x * x for x in xs]
    doubled = {_sync_helper(x) for x in xs}
    total = sum(x for x in squares) + len(doubled)
    return total + len(json.dumps(squares))


async def defines_but_never_awaits(x: int) -> int:
    async def inner() -> int:
        await trio.lowlevel.checkpoint()
        return x

    del inner
    return x


async def awaits(x: int) -> int:
    return await _coro_helper(x)


async def awaits_in_untaken_branch(x: int) -> int:
    if x < 0:
        await trio.lowlevel.checkpoint()
    return x


async def awaits_after_return_in_loop(xs: list[int]) -> int:
    for x in xs:
        if x:
            return x
        await trio.sleep(0)
    return 0


async def async_with(x: int) -> int:
    async with trio.open_nursery():
        pass
    return x


class _AsyncIter:
    def __aiter__(self) -> _AsyncIter:
        return self

    async def __anext__(self) -> int:
        raise StopAsyncIteration


async def async_for(x: int) -> int:
    async for _ in _AsyncIter():
        pass
    return x


async def async_comprehension(x: int) -> list[int]:
    return [y async for y in _AsyncIter()] + [x]


async def await_in_comprehension(xs: list[int]) -> list[int]:
    return [await _coro_helper(x) for x in xs]


def plain_def(x: int) -> int:
    return x


async def async_generator(x: int) -> AsyncIterator[int]:
    yield x


class CallableObject:
    async def __call__(self, x: int) -> int:
        return x

    async def method(self, x: int) -> int:
        return x


def _awaiting_wrapper(fn: Callable[[int], Awaitable[int]]) -> Callable[[int], Awaitable[int]]:
    @functools.wraps(fn)
    async def wrapper(x: int) -> int:
        return await fn(x)

    return wrapper


def _returning_wrapper(fn: Callable[[int], Awaitable[int]]) -> Callable[[int], Awaitable[int]]:
    @functools.wraps(fn)
    def wrapper(x: int) -> Awaitable[int]:
        return fn(x)  # hands back the inner coroutine: not itself a coroutine function

    return wrapper


@pytest.mark.parametrize(
    ("fn", "expected"),
    [
        pytest.param(returns, True, id="returns-argument"),
        pytest.param(sync_work, True, id="sync-helpers-and-comprehensions"),
        pytest.param(defines_but_never_awaits, True, id="defines-an-inner-async-def"),
        pytest.param(awaits, False, id="await"),
        pytest.param(awaits_in_untaken_branch, False, id="await-in-untaken-branch"),
        pytest.param(awaits_after_return_in_loop, False, id="await-after-early-return"),
        pytest.param(async_with, False, id="async-with"),
        pytest.param(async_for, False, id="async-for"),
        pytest.param(async_comprehension, False, id="async-comprehension"),
        pytest.param(await_in_comprehension, False, id="await-in-comprehension"),
        pytest.param(plain_def, False, id="plain-def"),
        pytest.param(functools.partial(returns, 1), False, id="partial"),
        pytest.param(CallableObject(), False, id="callable-object"),
        pytest.param(CallableObject().method, False, id="bound-method"),
        pytest.param(async_generator, False, id="async-generator"),
        pytest.param(_awaiting_wrapper(returns), False, id="wraps-awaiting-wrapper"),
        pytest.param(_returning_wrapper(returns), False, id="wraps-sync-wrapper"),
        pytest.param(_sync_helper, False, id="sync-helper"),
    ],
)
def test_never_suspends(fn: Callable[..., Any], expected: bool) -> None:
    assert never_suspends(fn) is expected


def test_app_tool_marks_inline_tools() -> None:
    local = App("marks")

    @local.tool()
    async def quick(x: int) -> int:
        """No suspension point."""
        return _sync_helper(x)

    @local.tool()
    async def maybe_slow(x: int) -> int:
        """Await in a branch."""
        if x > 100:
            await trio.sleep(1)
        return x

    @local.tool()
    def sync_tool(x: int) -> int:
        """A plain def."""
        return x

    @local.tool()
    async def uses_nursery(x: int) -> int:
        """Async with."""
        async with trio.open_nursery():
            pass
        return x

    @local.tool("wrapped")
    @_awaiting_wrapper
    async def wrapped(x: int) -> int:
        """Wrapped by an awaiting wrapper."""
        return x

    assert {name: t.inline for name, t in local.tools.items()} == {
        "quick": True,
        "maybe_slow": False,
        "sync_tool": False,
        "uses_nursery": False,
        "wrapped": False,
    }
    # The module's own app: exactly the tools without an await are inline.
    assert {name for name, t in app.tools.items() if t.inline} == INLINE


# ----------------------------------------------------------------- 2. results through the server


@pytest.mark.parametrize("json_mode", MODES)
async def test_inline_call_answers_like_a_handler_task(
    json_mode: bool,
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with serving(config_for(json_mode)) as (server, nursery):
        client, session = await started(server, nursery)
        got = await answer(client, call_msg(1, "echo", {"text": "hello"}), json_mode=json_mode)
        assert got == {
            "jsonrpc": "2.0",
            "id": 1,
            "result": {"content": [{"type": "text", "text": "hello"}]},
        }
        twin = await answer(
            client, call_msg(1001, "echo_task", {"text": "hello"}), json_mode=json_mode
        )
        assert {**twin, "id": 1} == got

        for rid, name in ((2, "whoami"), (2002, "whoami_task")):
            msg = call_msg(rid, name, {"label": "a"})
            msg["params"]["_meta"] = {"progressToken": "p-7"}
            got = await answer(client, msg, json_mode=json_mode)
            structured = {"label": "a", "request": rid, "progress": "p-7"}
            assert got["result"]["structuredContent"] == structured
            assert json.loads(got["result"]["content"][0]["text"]) == structured
        assert inline_runs(server) == Counter(["echo", "whoami"])  # the twins ran in handler tasks
        assert deliveries(server) == Counter()  # credit was there: nothing had to wait
        assert trio.current_time() == 0.0
        await settle()
        assert session.inflight == 0 and session.running == {}
        assert session.credit.frames_in_use == 0 and state_of(session.credit) is CreditState.OPEN
        assert server.metrics.executions == 4


@pytest.mark.parametrize("json_mode", MODES)
@pytest.mark.parametrize(
    ("name", "arguments", "text"),
    [
        pytest.param("refuse", {}, "refused by policy", id="tool-error"),
        # Anything but a ToolError: a generic text (the exception goes to the log only).
        pytest.param("crash", {}, "tool crash failed; the server logged", id="plain-exception"),
        pytest.param(
            "bad_result", {}, "tool bad_result failed; the server", id="unconvertible-result"
        ),
        pytest.param("echo", {"text": 5}, "invalid arguments for echo: ", id="wrong-type"),
        pytest.param("echo", {}, "invalid arguments for echo: ", id="missing-argument"),
        pytest.param("loose", {}, "tool loose failed; the server", id="unvalidated-missing"),
        pytest.param(
            "loose",
            {"count": 1, "extra": 2},
            "tool loose failed; the server",
            id="unvalidated-unexpected",
        ),
    ],
)
async def test_tool_failures_are_is_error_results(
    name: str,
    arguments: dict[str, Any],
    text: str,
    json_mode: bool,
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with serving(config_for(json_mode)) as (server, nursery):
        client, session = await started(server, nursery)
        got = await answer(client, call_msg(1, name, arguments), json_mode=json_mode)
        assert "error" not in got, got  # a tool result, not a JSON-RPC error (nor a 500)
        assert got["id"] == 1 and got["result"]["isError"] is True
        [content] = got["result"]["content"]
        assert content["type"] == "text" and content["text"].startswith(text), content
        assert "boom" not in content["text"]  # an exception's text never reaches the client
        twin = await answer(client, call_msg(101, f"{name}_task", arguments), json_mode=json_mode)
        assert untwin(twin, 1) == got  # exactly what the handler-task path answers
        assert inline_runs(server) == Counter([name])
        # The connection is still usable, and still runs inline calls.
        after = await answer(client, call_msg(2, "echo", {"text": "ok"}), json_mode=json_mode)
        assert after["result"]["content"][0]["text"] == "ok"
        assert inline_runs(server) == Counter([name, "echo"])
        await settle()
        assert session.inflight == 0 and session.credit.frames_in_use == 0


@pytest.mark.parametrize("json_mode", MODES)
@pytest.mark.parametrize(
    ("name", "arguments", "error"),
    [
        pytest.param(
            "rpc_fail",
            {},
            {"code": -32001, "message": "custom failure", "data": {"k": 1}},
            id="mcp-error",
        ),
        pytest.param(
            "echo",
            ["not", "an", "object"],
            {"code": -32602, "message": "params.arguments must be an object"},
            id="arguments-not-an-object",
        ),
        pytest.param(
            "unencodable",
            {},
            {"code": -32603, "message": "internal error in tools/call"},
            id="unencodable-result",
        ),
    ],
)
async def test_json_rpc_errors_match_the_task_path(
    name: str,
    arguments: Any,
    error: dict[str, Any],
    json_mode: bool,
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with serving(config_for(json_mode)) as (server, nursery):
        client, session = await started(server, nursery)
        got = await answer(client, call_msg(1, name, arguments), json_mode=json_mode)
        assert got == {"jsonrpc": "2.0", "id": 1, "error": error}
        twin = await answer(client, call_msg(101, f"{name}_task", arguments), json_mode=json_mode)
        assert untwin(twin, 1) == got
        after = await answer(client, call_msg(2, "echo", {"text": "ok"}), json_mode=json_mode)
        assert after["result"]["content"][0]["text"] == "ok"
        await settle()
        assert session.inflight == 0


@pytest.mark.parametrize("json_mode", MODES)
async def test_unknown_tool_is_invalid_params(
    json_mode: bool, autojump_clock: trio.testing.MockClock
) -> None:
    async with serving(config_for(json_mode)) as (server, nursery):
        client, session = await started(server, nursery)
        got = await answer(client, call_msg(1, "no_such_tool"), json_mode=json_mode)
        assert got == {
            "jsonrpc": "2.0",
            "id": 1,
            "error": {"code": -32602, "message": "unknown tool 'no_such_tool'"},
        }
        assert not inline_runs(server)
        after = await answer(client, call_msg(2, "echo", {"text": "ok"}), json_mode=json_mode)
        assert after["result"]["content"][0]["text"] == "ok"
        assert inline_runs(server) == Counter(["echo"])
        await settle()
        assert session.inflight == 0


@pytest.mark.parametrize("json_mode", MODES)
async def test_context_variables_do_not_leak_between_calls(
    json_mode: bool, autojump_clock: trio.testing.MockClock
) -> None:
    async with serving(config_for(json_mode)) as (server, nursery):
        client, _session = await started(server, nursery)
        texts: list[str] = []
        for rid, (name, args) in enumerate(
            [
                ("read_tag", {}),
                ("tag", {"value": "first"}),
                ("read_tag", {}),
                ("tag", {"value": "second"}),
                ("read_tag", {}),
            ],
            start=1,
        ):
            got = await answer(client, call_msg(rid, name, args), json_mode=json_mode)
            texts.append(got["result"]["content"][0]["text"])
        # Every call sees the default, whatever the previous call on this connection set.
        assert texts == ["unset", "first", "unset", "second", "unset"]
        assert inline_runs(server) == Counter(["read_tag", "tag", "read_tag", "tag", "read_tag"])
        assert TAG.get() == "unset"


@pytest.mark.parametrize("json_mode", MODES)
async def test_a_shared_store_never_runs_tools_inline(
    json_mode: bool, autojump_clock: trio.testing.MockClock
) -> None:
    with trio.fail_after(TEST_DEADLINE):
        async with trio.open_nursery() as nursery:
            server = Server(app, config_for(json_mode), store=SimStore())
            await nursery.start(functools.partial(server.run, listen=False))
            client, session = await started(server, nursery)
            got = await answer(client, call_msg(1, "echo", {"text": "hi"}), json_mode=json_mode)
            assert got["result"]["content"] == [{"type": "text", "text": "hi"}]
            again = await answer(client, call_msg(1, "echo", {"text": "hi"}), json_mode=json_mode)
            assert again == got and server.metrics.duplicates_replayed == 1
            assert inline_runs(server) == Counter(
                []
            )  # the store's calls may block: handler tasks only
            await settle()
            assert session.inflight == 0
            server.shutdown()
            await server.stopped.wait()


# ----------------------------------------------------------------- 3. semantics preserved


@pytest.mark.parametrize("json_mode", MODES)
async def test_idempotent_replays_execute_once(
    json_mode: bool, autojump_clock: trio.testing.MockClock
) -> None:
    async with serving(config_for(json_mode)) as (server, nursery):
        client, _session = await started(server, nursery)
        key = {"idempotency-key": "order-42"}
        first = await answer(client, call_msg(10, "counted"), json_mode=json_mode, headers=key)
        assert first == {
            "jsonrpc": "2.0",
            "id": 10,
            "result": {"content": [{"type": "text", "text": "1"}]},
        }
        again = await answer(client, call_msg(11, "counted"), json_mode=json_mode, headers=key)
        assert again == {**first, "id": 11}  # the stored result, under the new id
        assert COUNTS["counted"] == 1 and inline_runs(server) == Counter(["counted"])
        assert server.metrics.executions == 1 and server.metrics.duplicates_replayed == 1

        # Without the header the JSON-RPC id is the key: the same id replays too.
        fresh = await answer(client, call_msg(12, "counted"), json_mode=json_mode)
        dup = await answer(client, call_msg(12, "counted"), json_mode=json_mode)
        assert fresh["result"]["content"][0]["text"] == "2"
        assert dup == fresh
        assert COUNTS["counted"] == 2 and inline_runs(server) == Counter(["counted", "counted"])
        assert server.metrics.executions == 2 and server.metrics.duplicates_replayed == 2

        # Same key, different request: refused before anything runs.
        reused = await client.post(call_msg(13, "echo", {"text": "x"}), key)
        assert isinstance(reused, Reply) and reused.status == 422
        assert reused.json()["error"]["data"]["reason"] == "idempotency_key_reused"
        assert inline_runs(server) == Counter(["counted", "counted"])


async def test_a_tool_that_can_suspend_runs_in_a_task_and_can_be_cancelled(
    autojump_clock: trio.testing.MockClock,
) -> None:
    assert app.tools["sleepy"].inline is False
    async with serving() as (server, nursery):
        client, session = await started(server, nursery)
        done = await (await client.call(1, "sleepy", {"seconds": 2})).messages()
        assert trio.current_time() == 2.0
        assert done[-1]["result"]["content"][0]["text"] == "slept 2"

        reply = await client.call(2, "sleepy", {"seconds": 100})
        await trio.sleep_until(5.0)
        assert 2 in session.running  # a handler task, with a cancel scope
        ack = await as_session(server, nursery, client).post(
            {
                "jsonrpc": "2.0",
                "method": "notifications/cancelled",
                "params": {"requestId": 2, "reason": "test"},
            }
        )
        assert isinstance(ack, Reply) and ack.status == 202
        msgs = await reply.messages()
        assert trio.current_time() == 5.0
        assert not any("id" in m for m in msgs)  # no response after cancellation
        assert COUNTS == {"sleepy started": 2, "sleepy finished": 1}
        assert not inline_runs(server)
        await settle()
        assert session.running == {} and session.inflight == 0


@dataclass
class Background:
    """A request answered in the background; ``response`` once it is."""

    response: dict[str, Any] | None = None
    at: float | None = None

    async def run(
        self, client: H11Client, msg: dict[str, Any], json_mode: bool, headers: dict[str, str]
    ) -> None:
        self.response = await answer(client, msg, json_mode=json_mode, headers=headers)
        self.at = trio.current_time()


@pytest.mark.parametrize("json_mode", MODES)
async def test_request_id_in_use_is_refused_like_the_task_path(
    json_mode: bool, autojump_clock: trio.testing.MockClock
) -> None:
    async with serving(config_for(json_mode)) as (server, nursery):
        client, session = await started(server, nursery)
        running = Background()
        nursery.start_soon(
            running.run,
            as_session(server, nursery, client),
            call_msg(1, "sleepy", {"seconds": 10}),
            json_mode,
            {"idempotency-key": "a"},
        )
        await trio.sleep_until(1.0)
        assert 1 in session.running
        # Other keys pass the gate, so the same JSON-RPC id reaches execution.
        inline = await answer(
            client,
            call_msg(1, "echo", {"text": "x"}),
            json_mode=json_mode,
            headers={"idempotency-key": "b"},
        )
        twin = await answer(
            client,
            call_msg(1, "echo_task", {"text": "x"}),
            json_mode=json_mode,
            headers={"idempotency-key": "c"},
        )
        assert (
            inline
            == twin
            == {
                "jsonrpc": "2.0",
                "id": 1,
                "error": {
                    "code": -32600,
                    "message": "request id 1 is already in use",
                    "data": {"reason": "invalid_request"},
                },
            }
        )
        assert not inline_runs(server)  # refused before the tool ran
        await trio.sleep_until(10.0)
        await settle()
        assert running.at == 10.0 and running.response is not None
        assert running.response["result"]["content"][0]["text"] == "slept 10"
        # Once the id is free, a new key runs the inline tool under it.
        free = await answer(
            client,
            call_msg(1, "echo", {"text": "y"}),
            json_mode=json_mode,
            headers={"idempotency-key": "d"},
        )
        assert free["result"]["content"][0]["text"] == "y"
        assert inline_runs(server) == Counter(["echo"])
        # The refused deliveries released their keys: a retry under them runs now,
        # rather than waiting for a claim nobody will finish or replaying the refusal.
        retried = await answer(
            client,
            call_msg(2, "echo", {"text": "x"}),
            json_mode=json_mode,
            headers={"idempotency-key": "b"},
        )
        retried_twin = await answer(
            client,
            call_msg(3, "echo_task", {"text": "x"}),
            json_mode=json_mode,
            headers={"idempotency-key": "c"},
        )
        assert retried["result"]["content"][0]["text"] == "x"
        assert retried_twin["result"]["content"][0]["text"] == "x"
        assert inline_runs(server) == Counter(["echo", "echo"])
        assert session.inflight == 0


# ----------------------------------------------------------------- 4. credit-short fallback


@dataclass
class Streamed:
    """An SSE response read in the background: its head's and its end's instants."""

    head_at: float | None = None
    events: list[SseEvent] | None = None
    at: float | None = None

    async def run(self, client: H11Client, msg: dict[str, Any]) -> None:
        reply = await client.post(msg)
        assert isinstance(reply, SseReply) and reply.status == 200, reply
        self.head_at = trio.current_time()
        self.events = await reply.events()
        self.at = trio.current_time()


@pytest.mark.parametrize(
    ("version", "prime"),
    [
        pytest.param("2025-11-25", True, id="primed"),
        pytest.param("2025-06-18", False, id="plain"),
    ],
)
async def test_inline_call_into_a_full_credit_waits_for_admission_then_runs(
    version: str,
    prime: bool,
    autojump_clock: trio.testing.MockClock,
) -> None:
    """7 log frames + the response hold the whole credit: the inline call is not
    admitted (it would run and find no room for its answer).  It waits for
    admission, before it runs, and runs -- its answer in order after its priming
    event -- once credit returns.  (A response that waits for credit after its
    call ran: :func:`test_inline_response_waits_for_its_own_priming_event_to_drain`.)
    """
    held = FRAMES - 1
    async with serving() as (server, nursery):
        client = connect(server, nursery)
        await client.initialize(version)
        sid = client.session_id
        assert sid is not None
        session = server.sessions[sid]
        credit = session.credit

        # A stream of this session stops draining at t=1, holding every frame of credit.
        stalled, valve = connect_stalling(server, nursery)
        stalled.session_id, stalled.protocol_version = sid, client.protocol_version
        slow = await stalled.call(1, "chatty", {"n": held, "delay": 1})
        if prime:
            [priming] = await slow.next_batch()
            assert priming.data == ""
        valve.shut()
        await trio.sleep_until(1.0)
        await settle()
        assert credit.frames_in_use == FRAMES and state_of(credit) is CreditState.OPEN
        assert session.inflight == 0 and valve.stalled == 1

        # t=2: the inline call waits for admission; nothing runs, no head is sent.
        await trio.sleep_until(2.0)
        got = Streamed()
        nursery.start_soon(got.run, as_session(server, nursery, client), call_msg(2, "stamp"))
        await settle()
        assert state_of(credit) is CreditState.EXHAUSTED and credit.frames_in_use == FRAMES
        assert inline_runs(server) == Counter() and got.head_at is None
        assert session.inflight == 0

        # t=4: the reader drains; the credit returns, the call runs, its answer follows.
        await trio.sleep_until(4.0)
        valve.open()
        slow_msgs = await slow.messages()
        assert [m["params"]["data"] for m in slow_msgs[:-1]] == [f"log {i}" for i in range(held)]
        assert slow_msgs[-1]["result"]["content"][0]["text"] == f"sent {held}"
        await settle()
        assert got.at == 4.0 and got.events is not None
        datas = [e.data for e in got.events]
        response = {
            "jsonrpc": "2.0",
            "id": 2,
            "result": {"content": [{"type": "text", "text": "4.0"}]},  # it ran at t=4
        }
        if prime:
            assert datas[0] == "" and seqs(got.events) == [0, 1]
            datas = datas[1:]
        else:
            assert all(e.id is not None for e in got.events) and seqs(got.events) == [0]
        assert [json.loads(d) for d in datas] == [response]
        assert session.inflight == 0
        assert credit.frames_in_use == 0 and state_of(credit) is CreditState.OPEN
        assert credit.bytes_in_use == 0
        assert inline_runs(server) == Counter(["stamp"])  # it ran once, at t=4
        assert sid in server.sessions and server.metrics.teardowns == 0
    assert server.metrics.credit_peaks(server.sessions.values())[0] == FRAMES


async def test_inline_response_waits_for_its_own_priming_event_to_drain(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """One frame of credit left: the priming event takes it, the response waits for it."""
    async with serving() as (server, nursery):
        client, sid = await open_session(server, nursery)
        session = server.sessions[sid]
        credit = session.credit
        stalled, valve = connect_stalling(server, nursery)
        stalled.session_id, stalled.protocol_version = sid, client.protocol_version
        slow = await stalled.call(1, "chatty", {"n": FRAMES - 2, "delay": 1})
        await slow.next_batch()
        valve.shut()
        await trio.sleep_until(1.0)
        await settle()
        assert credit.frames_in_use == FRAMES - 1

        await trio.sleep_until(2.0)
        got = Streamed()
        nursery.start_soon(got.run, as_session(server, nursery, client), call_msg(2, "stamp"))
        await settle()
        assert inline_runs(server) == Counter(["stamp"]) and deliveries(server) == Counter(
            ["plain"]
        )
        assert got.at == 2.0 and got.events is not None  # the priming drained at once
        assert [e.data == "" for e in got.events] == [True, False]
        assert seqs(got.events) == [0, 1]
        assert json.loads(got.events[1].data)["result"]["content"][0]["text"] == "2.0"
        assert session.inflight == 0
        assert credit.frames_in_use == FRAMES - 1  # only the stalled stream's frames
        valve.open()
        assert (await slow.messages())[-1]["result"]["content"][0]["text"] == f"sent {FRAMES - 2}"
        await settle()
        assert credit.frames_in_use == 0 and state_of(credit) is CreditState.OPEN


# ----------------------------------------------------------------- 4b. try_*_now, unit level

UNIT_CREDIT = CreditLimits(frames=2, bytes=200, drain_window=DRAIN, liveness_timeout=LIVENESS)


def new_session(limits: CreditLimits = UNIT_CREDIT) -> Session:
    record = SessionRecord(
        session_id="unit", principal="anonymous", protocol_version="2025-11-25", created_at=0.0
    )
    return Session(record, credit=limits, now=trio.current_time())


def new_handle(session: Session, epoch: str = "0000000a", outstanding: int = 1) -> StreamHandle:
    handle = session.open_stream(epoch, StreamKind.REQUEST, max_events=64)
    handle.outstanding = outstanding
    return handle


def snapshot(handle: StreamHandle) -> tuple[Any, ...]:
    s, c = handle.session, handle.session.credit
    return (
        handle.log.next_seq,
        handle.log.state,
        handle.outstanding,
        c.frames_in_use,
        c.bytes_in_use,
        c.state,
        c.last_progress,
        s.flow.waiting,
        s.timer_at,
    )


async def test_try_respond_now_appends_and_wakes_the_writer(
    autojump_clock: trio.testing.MockClock,
) -> None:
    session = new_session()
    handle = new_handle(session, outstanding=2)  # a batch of two
    woken: list[float] = []

    async def writer() -> None:
        await handle.wait_changed()
        woken.append(trio.current_time())

    async with trio.open_nursery() as nursery:
        nursery.start_soon(writer)
        await settle()
        assert handle.try_send_now("")  # the priming event
        await settle()
        assert woken == [0.0]
        assert (handle.log.next_seq, handle.outstanding) == (1, 2)
        nursery.start_soon(writer)
        await settle()
        size = handle.log.size_of('{"id":1}')
        assert handle.try_respond_now('{"id":1}')
        await settle()
        assert woken == [0.0, 0.0]
        # Not the last outstanding response: not final.
        assert (handle.log.next_seq, handle.outstanding) == (2, 1)
        assert log_state(handle) is StreamState.LIVE_DETACHED
        assert session.credit.frames_in_use == 2
        frames = handle.log.frames_from(0)
        assert len(frames[1]) == size
        assert session.credit.bytes_in_use == sum(len(f) for f in frames)
        session.drained(handle, 2)  # the peer read both: credit back
        assert handle.try_respond_now('{"id":2}')  # the last response is the final frame
        assert handle.outstanding == 0 and log_state(handle) is StreamState.FINAL_DETACHED


@pytest.mark.parametrize("why", ["waiters", "no-credit", "no-byte-credit", "sink", "lock"])
async def test_try_now_refuses_and_changes_nothing(
    why: str, autojump_clock: trio.testing.MockClock
) -> None:
    session = new_session()
    handle = new_handle(session)
    other = new_handle(session, epoch="0000000b")
    sunk: list[int] = []

    async def sink(seq: int, payload: str, final: bool, call_key: str | None) -> None:
        sunk.append(seq)

    async with trio.open_nursery() as nursery:
        if why == "waiters":
            # A frame of this stream too big for the bytes left waits, though a
            # small one would fit: nothing of its stream may pass it.
            assert other.try_send_now("a")
            nursery.start_soon(handle.send, "x" * 165)
            await settle()
            assert session.flow.waiting == 1
            assert session.credit.fits(handle.log.size_of("small"))
        elif why == "no-credit":
            assert other.try_send_now("a") and other.try_send_now("b")
        elif why == "no-byte-credit":
            assert other.try_send_now("y" * 180)
        elif why == "sink":
            handle.sink = sink
        await trio.sleep(1.0)
        before = snapshot(handle)
        if why == "lock":
            async with handle.lock:
                assert handle.try_send_now("small") is False
                assert handle.try_respond_now("small") is False
        else:
            assert handle.try_send_now("small") is False
            assert handle.try_respond_now("x" * 100) is False
            assert handle.try_respond_now("small") is False
        assert snapshot(handle) == before
        if why in ("no-credit", "no-byte-credit"):
            assert state_of(session.credit) is CreditState.OPEN  # nobody waits: not exhausted
        assert sunk == []
        # What refused now succeeds by waiting, once the obstacle is gone.
        other_frames = other.log.next_seq
        session.drained(other, other_frames)
        handle.sink = None
        await settle()
        first = 0
        if why == "waiters":
            assert session.flow.waiting == 0 and handle.log.next_seq == 1
            session.drained(handle, 1)
            first = 1
        assert handle.try_respond_now("small")
        assert handle.log.next_seq == first + 1
        assert log_state(handle) is StreamState.FINAL_DETACHED


async def test_another_streams_waiting_frame_does_not_hold_this_one_back(
    autojump_clock: trio.testing.MockClock,
) -> None:
    session = new_session()
    handle = new_handle(session)
    other = new_handle(session, epoch="0000000b")
    async with trio.open_nursery() as nursery:
        assert other.try_send_now("a")
        nursery.start_soon(other.send, "x" * 165)  # too big for what is left: it waits
        await settle()
        assert session.flow.waiting == 1
        assert handle.try_respond_now("small")  # fits: goes now, past the other's waiter
        assert handle.log.next_seq == 1 and session.flow.waiting == 1
        session.drained(handle, 1)
        session.drained(other, 1)
        await settle()
        assert session.flow.waiting == 0 and other.log.next_seq == 2


async def test_closed_log_drops_the_frame_and_counts_the_response(
    autojump_clock: trio.testing.MockClock,
) -> None:
    session = new_session()
    handle = new_handle(session, outstanding=2)
    assert handle.try_send_now("")
    handle.handle(StreamInput.ABORT)
    assert log_state(handle) is StreamState.CLOSED
    frames = session.credit.frames_in_use
    assert handle.try_send_now("late notification")  # dropped, nothing to count
    assert (handle.log.next_seq, handle.outstanding) == (1, 2)
    assert handle.try_respond_now('{"id":1}')  # dropped, one response fewer to come
    assert (handle.log.next_seq, handle.outstanding) == (1, 1)
    assert session.credit.frames_in_use == frames  # no credit taken for dropped frames


async def test_try_acquire_now_and_the_timer(autojump_clock: trio.testing.MockClock) -> None:
    limits = CreditLimits(frames=1, bytes=200, drain_window=DRAIN, liveness_timeout=LIVENESS)
    session = new_session(limits)
    handle = new_handle(session)
    asked: list[float] = []

    def schedule(s: Session, when: float) -> None:  # what the server's heap records
        asked.append(when)
        s.timer_at = when

    session.schedule = schedule
    # The first pending frame's liveness deadline is a new, earlier deadline: asked for.
    assert session.try_acquire_now(10)
    assert asked == [0.0 + LIVENESS]
    session.release(1, 10)

    # A later first frame's deadline lies after the one scheduled: nothing asked.
    await trio.sleep_until(5.0)
    assert session.try_acquire_now(10)
    assert session.credit.deadline() == 5.0 + LIVENESS and asked == [LIVENESS]
    # No credit left: refused, and nothing changes (no waiter, still OPEN, nothing asked).
    assert session.try_acquire_now(10) is False
    assert state_of(session.credit) is CreditState.OPEN and asked == [LIVENESS]

    # A frame that waits opens the drain window (5 + 5 = 10 < 20): asked for at once.
    async with trio.open_nursery() as nursery:
        nursery.start_soon(handle.send, "waits")
        await settle()
        assert state_of(session.credit) is CreditState.EXHAUSTED
        assert asked == [LIVENESS, 5.0 + DRAIN] == [LIVENESS, session.credit.deadline()]
        # A waiter is queued: even a frame that would fit is refused (FIFO).
        assert session.try_acquire_now(1) is False
        session.release(1, 10)
    assert handle.log.next_seq == 1 and state_of(session.credit) is CreditState.OPEN

    # A closed session refuses, and asks for nothing.
    session.timer_at = float("inf")
    session.close()
    assert session.try_acquire_now(1) is False
    assert asked == [LIVENESS, 5.0 + DRAIN]


# ----------------------------------------------------------------- 5. the session timer


async def test_busy_session_does_not_wake_its_timer_per_frame(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with serving() as (server, nursery):
        client, sid = await open_session(server, nursery)
        session, heap = server.sessions[sid], server.deadlines
        await settle()
        # An idle session is not in the heap at all.
        assert (heap.scheduled, len(heap), session.timer_at) == (0, 0, float("inf"))

        # t=1: the first pending frame schedules its liveness deadline.
        await trio.sleep_until(1.0)
        got = await answer(client, call_msg(1, "echo", {"text": "a"}), json_mode=False)
        assert got["result"]["content"][0]["text"] == "a"
        await settle()
        assert heap.scheduled == 1

        # Later first frames have later deadlines: nothing is scheduled for them.
        for rid in range(2, 12):
            await trio.sleep_until(float(rid))
            got = await answer(client, call_msg(rid, "echo", {"text": "b"}), json_mode=False)
            assert got["result"]["content"][0]["text"] == "b"
        await settle()
        assert heap.scheduled == 1 and heap.fired == 0
        assert session.credit.frames_in_use == 0

        # Its wake-up finds nothing pending: nothing is scheduled again, and the
        # session stays (idle is not dead).
        await trio.sleep_until(1.0 + LIVENESS)
        await settle()
        assert (heap.scheduled, heap.fired, len(heap)) == (1, 1, 0)
        assert sid in server.sessions and server.metrics.teardowns == 0
        await trio.sleep_until(30.0)
        await answer(client, call_msg(99, "echo", {"text": "c"}), json_mode=False)
        await settle()
        assert heap.scheduled == 2  # the next pending frame asks again
        assert sum(inline_runs(server).values()) == 12
        # The same counts are what an operator scrapes.
        text = server.metrics.render(server.sessions)
        assert 'weir_inline_calls_total{tool="echo"} 12' in text
        assert "weir_inline_deferred_total 0" in text


async def test_an_earlier_deadline_still_wakes_the_timer_on_time(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with serving() as (server, nursery):
        client, sid = await open_session(server, nursery)
        session = server.sessions[sid]
        credit = session.credit
        await trio.sleep_until(1.0)
        await answer(client, call_msg(1, "echo", {"text": "a"}), json_mode=False)
        await settle()
        heap = server.deadlines
        assert heap.scheduled == 1

        # t=2: a stream starts; at t=3 it stalls with more frames than credit.
        stalled, valve = connect_stalling(server, nursery)
        stalled.session_id, stalled.protocol_version = sid, client.protocol_version
        await trio.sleep_until(2.0)
        slow = await stalled.call(2, "chatty", {"n": 20, "delay": 1})
        await slow.next_batch()
        valve.shut()
        await settle()
        assert heap.scheduled == 1  # its priming frame's deadline (22) is later
        await trio.sleep_until(3.0)
        await settle()
        # Exhausted at 3: the drain window ends at 3 + 5 = 8, before 21: woken at once.
        assert state_of(credit) is CreditState.EXHAUSTED and credit.last_progress == 3.0
        assert heap.scheduled == 2 and heap.fired == 0

        await trio.sleep_until(3.0 + DRAIN - 0.01)
        await settle()
        assert state_of(credit) is CreditState.EXHAUSTED
        await trio.sleep_until(3.0 + DRAIN)
        await settle()
        assert state_of(credit) is CreditState.HALF_OPEN  # turned by the timer, on time
        assert heap.fired == 1 and heap.scheduled == 3  # the liveness deadline is next
        refused = await as_session(server, nursery, client).post(call_msg(3, "echo", {"text": "x"}))
        assert isinstance(refused, Reply) and refused.status == 429

        await trio.sleep_until(3.0 + LIVENESS - 0.01)
        await settle()
        assert sid in server.sessions
        await trio.sleep_until(3.0 + LIVENESS)
        await settle()
        assert sid not in server.sessions and session.closed
        assert server.metrics.teardowns == 1
        assert heap.fired == 2 and len(heap) == 0  # woke at 23, then ended
        assert valve.stalled == 0
        valve.open()


async def test_a_stream_aborted_while_the_store_takes_its_event_takes_nothing_more(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Found by the cluster simulator: the store's append of a call's answer was in
    flight when the stream was aborted (its call cancelled); appending to the closed
    log then raised LocalProtocolError, logged with a traceback.  Now the event stays
    stored (any replica can replay it), the stream takes nothing, credit comes back."""
    session = new_session()
    handle = new_handle(session)
    release = trio.Event()
    sunk: list[int] = []

    async def slow_sink(seq: int, payload: str, final: bool, call_key: str | None) -> None:
        sunk.append(seq)
        await release.wait()

    handle.sink = slow_sink
    async with trio.open_nursery() as nursery:
        nursery.start_soon(handle.respond, "the answer")
        await settle()
        assert sunk == [0]
        handle.handle(StreamInput.ABORT)  # aborted meanwhile
        release.set()
    assert log_state(handle) is StreamState.CLOSED
    assert handle.log.next_seq == 0  # nothing appended to the closed log
    assert session.credit.frames_in_use == 0
