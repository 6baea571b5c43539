"""asyncio-only libraries on weir's Trio engine: the clear failure, and ``on_asyncio``.

What this module guarantees, with aiohttp (a real asyncio-only library) fetching from
a local HTTP server on 127.0.0.1:

* Without the route, a tool using aiohttp, served by the real engine, answers
  ``isError`` saying it needs asyncio (nothing internal), and the server logs it once,
  with its traceback and the fix; a resource does the same through ``failure()``.
  The recognition reads causes, contexts and exception groups, boundedly.
* With ``@on_asyncio`` the same tool returns the page; its schema and ``Context``
  parameter are the undecorated tool's, it never runs inline, and its ``Context``
  works from the asyncio side (log messages, progress, sampling).  All calls share
  one daemon loop thread; a forked child starts its own.
* A Trio cancellation of the caller -- ``notifications/cancelled`` through the server,
  or a cancel scope -- cancels the asyncio task, and the caller goes on only once the
  task has finished (or ``cancel_grace`` has passed: logged, the task left running).
* Exceptions propagate as themselves (aiohttp's own included); a task cancelled on the
  asyncio side raises :class:`AsyncioBridgeError`, not ``CancelledError``.
* Where asyncio already runs (``asyncio.run``, weir's asyncio runtime) the decorator
  awaits the function directly, on that loop.
* At process exit the shared loop's remaining tasks are cancelled and unwound.

Real time and real threads (the loop thread, the HTTP server's): nothing waits on a
timer except the grace test, whose subject is the timer; every wait is bounded.
"""

from __future__ import annotations

import asyncio
import json
import logging
import subprocess
import sys
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import trio

from tests.integration.test_asyncio_driver import Client, running_driver
from weir.app._foreign import MAX_LINKS, asyncio_only_failure, asyncio_only_result
from weir.engine import App, Context, ToolError
from weir.engine.asyncio_bridge import THREAD_NAME, AsyncioBridgeError, on_asyncio
from weir.protocol.sse import SseEvent

from .helpers import H11Client, SseReply, connect, running_server

TIMEOUT = 10.0
ROOT = Path(__file__).resolve().parents[2]


# ----------------------------------------------------------------- a local HTTP server
class _Pages(BaseHTTPRequestHandler):
    """``/page/<x>`` answers ``page <x>``; anything else is a 404."""

    def do_GET(self) -> None:
        if self.path.startswith("/page/"):
            status, body = 200, f"page {self.path.removeprefix('/page/')}".encode()
        else:
            status, body = 404, b"no such page"
        self.send_response(status)
        self.send_header("content-type", "text/plain")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def base_url() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Pages)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(TIMEOUT)


class Signal:
    """A :class:`trio.Event` that any thread can set (through the Trio token)."""

    def __init__(self) -> None:
        self.event = trio.Event()
        self.token = trio.lowlevel.current_trio_token()

    def set(self) -> None:
        self.token.run_sync_soon(self.event.set)


# ----------------------------------------------------------------- the application
async def fetch(url: str, ctx: Context) -> str:
    """Fetch a page with aiohttp (asyncio-only)."""
    await ctx.info(f"fetching {url}")
    async with aiohttp.ClientSession() as session, session.get(url) as response:
        response.raise_for_status()
        body = await response.text()
    await ctx.report_progress(1, 1)
    assert not ctx.cancel_requested  # a plain backend method (bridged: run in Trio's thread)
    return f"{body} (on {threading.current_thread().name})"


async def page(url: str) -> str:
    """Fetch a page with aiohttp, without a Context."""
    async with aiohttp.ClientSession() as session, session.get(url) as response:
        response.raise_for_status()
        return await response.text()


app = App("asyncio-bridge-test")
app.tool("fetch_plain")(fetch)  # the tool as written for asyncio: no route
app.tool("fetch")(on_asyncio(fetch))  # the same tool through the bridge
HANGS: dict[str, Any] = {}


@app.tool()
@on_asyncio
async def refuse(url: str) -> str:
    """Raise a ToolError from the asyncio side."""
    raise ToolError(f"will not fetch {url}")


@app.tool()
@on_asyncio
async def hang(ctx: Context) -> str:
    """Say it is waiting, then wait on asyncio until cancelled."""
    try:  # (the cancellation may come while the message's hop is still returning)
        await ctx.info("waiting")
        await asyncio.Event().wait()
    except asyncio.CancelledError:
        HANGS["seen"] = "CancelledError"
        raise
    return "woke"


@app.tool()
@on_asyncio
async def ask(ctx: Context) -> str:
    """Ask the client's model, from the asyncio side."""
    result = await ctx.sample(
        [{"role": "user", "content": {"type": "text", "text": "hi"}}], max_tokens=5
    )
    return f"model said {result['content']['text']} to {threading.current_thread().name}"


@app.resource("test://plain")
async def plain_resource() -> str:
    """A resource that uses aiohttp without the route."""
    async with aiohttp.ClientSession() as session:
        return repr(session)


def _texts(message: dict[str, Any]) -> list[str]:
    return [c["text"] for c in message["result"]["content"]]


def _dispatch_errors(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [
        r for r in caplog.records if r.name == "weir.app._dispatch" and r.levelno >= logging.ERROR
    ]


@asynccontextmanager
async def serving() -> AsyncIterator[Callable[..., Awaitable[H11Client]]]:
    """The real engine serving :data:`app` over in-memory streams; yields a maker of
    clients (initialized unless told otherwise), whose connections close before the
    server shuts down (on real time, an open keep-alive connection would hold it)."""
    clients: list[H11Client] = []
    async with running_server(app) as (server, nursery):

        async def new_client(initialize: bool = True) -> H11Client:
            client = connect(server, nursery)
            clients.append(client)
            if initialize:
                await client.initialize()
            return client

        try:
            yield new_client
        finally:
            for client in clients:
                await client.stream.aclose()


# ----------------------------------------------------------------- (a) the clear failure
async def test_without_the_route_the_tool_fails_saying_it_needs_asyncio(
    base_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.ERROR, logger="weir.app._dispatch")
    with trio.fail_after(TIMEOUT):
        async with serving() as new_client:
            client = await new_client()
            msgs = await (await client.call(1, "fetch_plain", {"url": base_url})).messages()
    assert msgs[0]["method"] == "notifications/message"  # it ran, on Trio, until aiohttp
    result = msgs[-1]["result"]
    assert result["isError"] is True
    assert _texts(msgs[-1]) == [asyncio_only_result("tool fetch_plain")]
    assert "needs an asyncio event loop" in _texts(msgs[-1])[0]
    assert "RuntimeError" not in str(result) and "running event loop" not in str(result)
    [record] = _dispatch_errors(caplog)  # logged once
    assert "tool fetch_plain failed" in record.getMessage()
    assert "asyncio" in record.getMessage() and "on_asyncio" in record.getMessage()
    assert record.exc_info is not None and record.exc_info[1] is not None
    assert "no running event loop" in str(record.exc_info[1])


async def test_other_handlers_log_the_clear_message_through_failure(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.ERROR, logger="weir.app._dispatch")
    with trio.fail_after(TIMEOUT):
        async with serving() as new_client:
            client = await new_client()
            reply = await client.post(
                {
                    "jsonrpc": "2.0",
                    "id": 1,
                    "method": "resources/read",
                    "params": {"uri": "test://plain"},
                }
            )
            assert isinstance(reply, SseReply)
            error = (await reply.messages())[-1]["error"]
    assert error["code"] == -32603 and error["message"] == "internal error in resources/read"
    [record] = _dispatch_errors(caplog)
    assert "handler for resources/read failed" in record.getMessage()
    assert "on_asyncio" in record.getMessage() and record.exc_info is not None


async def _foreign_exception() -> BaseException:
    """What awaiting an asyncio future raises in a Trio task."""
    try:
        await asyncio.sleep(0)
    except TypeError as exc:
        return exc
    raise AssertionError("asyncio.sleep(0) worked on Trio")


async def test_recognition_reads_causes_contexts_and_groups_boundedly() -> None:
    yielded = await _foreign_exception()
    assert "unrecognized yield message" in str(yielded)
    assert asyncio_only_failure(yielded) is yielded
    no_loop = RuntimeError("no running event loop")
    assert asyncio_only_failure(no_loop) is no_loop

    caused = ValueError("the library's own error")
    caused.__cause__ = no_loop
    during = OSError("raised while handling")
    during.__context__ = caused
    group = ExceptionGroup("nursery", [KeyError("x"), during])
    assert asyncio_only_failure(group) is no_loop

    for unrelated in (RuntimeError("the event loop is closed"), TypeError("bad"), KeyError()):
        assert asyncio_only_failure(unrelated) is None
    cycle_a, cycle_b = ValueError("a"), ValueError("b")
    cycle_a.__context__, cycle_b.__context__ = cycle_b, cycle_a
    assert asyncio_only_failure(cycle_a) is None  # ends, each link once

    chain: BaseException = RuntimeError("no running event loop")
    for i in range(MAX_LINKS - 1):
        outer = ValueError(i)
        outer.__cause__ = chain
        chain = outer
    assert asyncio_only_failure(chain) is not None  # the last link within the bound
    beyond = ValueError("one more")
    beyond.__cause__ = chain
    assert asyncio_only_failure(beyond) is None  # past the bound: not searched


# ----------------------------------------------------------------- (b) the route
async def test_with_the_route_the_same_tool_returns_the_page(base_url: str) -> None:
    with trio.fail_after(TIMEOUT):
        async with serving() as new_client:
            client = await new_client()
            url = f"{base_url}/page/one"
            msgs = await (
                await client.call(1, "fetch", {"url": url}, meta={"progressToken": "p"})
            ).messages()
    log_msg, progress, final = msgs
    assert log_msg["method"] == "notifications/message"
    assert log_msg["params"]["data"] == f"fetching {url}"
    assert progress["method"] == "notifications/progress"
    assert progress["params"]["progressToken"] == "p"
    assert final["id"] == 1 and "isError" not in final["result"]
    assert _texts(final) == [f"page one (on {THREAD_NAME})"]


async def test_a_bridged_tool_can_ask_the_client() -> None:
    with trio.fail_after(TIMEOUT):
        async with serving() as new_client:
            client = await new_client()
            reply = await client.call(1, "ask")
            request: dict[str, Any] = {}
            for _ in range(5):  # the priming event, then the request
                request = next((json.loads(e.data) for e in await reply.next_batch() if e.data), {})
                if request:
                    break
            assert request["method"] == "sampling/createMessage", request
            answerer = await new_client(initialize=False)
            answerer.session_id = client.session_id
            answerer.protocol_version = client.protocol_version
            content = {"type": "text", "text": "bonjour"}
            answer = {"role": "assistant", "content": content, "model": "m"}
            await answerer.post({"jsonrpc": "2.0", "id": request["id"], "result": answer})
            final = (await reply.messages())[-1]
    assert _texts(final) == [f"model said bonjour to {THREAD_NAME}"]


def test_the_wrapper_keeps_the_schema_and_the_context_parameter() -> None:
    plain, bridged = app.tools["fetch_plain"], app.tools["fetch"]
    assert bridged.input_schema == plain.input_schema
    assert bridged.input_schema["properties"] == {"url": {"type": "string"}}
    assert bridged.input_schema["required"] == ["url"]
    assert bridged.context_param == plain.context_param == "ctx"
    assert bridged.description == plain.description == "Fetch a page with aiohttp (asyncio-only)."
    assert bridged.inline is False


def test_only_an_async_def_can_be_bridged() -> None:
    def not_async() -> None:
        pass

    with pytest.raises(TypeError, match="async def"):
        on_asyncio(not_async)  # type: ignore[arg-type]


async def test_every_call_shares_one_daemon_loop_thread(base_url: str) -> None:
    @on_asyncio
    async def where() -> tuple[threading.Thread, asyncio.AbstractEventLoop]:
        return threading.current_thread(), asyncio.get_running_loop()

    with trio.fail_after(TIMEOUT):
        (thread, loop), (again, same_loop) = await where(), await where()
        assert await on_asyncio(page)(f"{base_url}/page/two") == "page two"
    assert thread is again and loop is same_loop
    assert thread.name == THREAD_NAME and thread.daemon
    assert thread is not threading.current_thread()


# ----------------------------------------------------------------- (c) cancellation
async def test_notifications_cancelled_cancels_the_asyncio_task() -> None:
    HANGS.clear()
    with trio.fail_after(TIMEOUT):
        async with serving() as new_client:
            client = await new_client()
            reply = await client.call(7, "hang")
            seen: list[SseEvent] = []
            for _ in range(5):  # the priming event, then the log message
                seen += [e for e in await reply.next_batch() if e.data]
                if seen:
                    break
            assert '"waiting"' in seen[0].data
            assert seen, "the tool never said it was waiting"
            other = await new_client(initialize=False)
            other.session_id, other.protocol_version = client.session_id, client.protocol_version
            await other.post(
                {
                    "jsonrpc": "2.0",
                    "method": "notifications/cancelled",
                    "params": {"requestId": 7, "reason": "test"},
                }
            )
            rest = await reply.messages()
    assert not any("id" in m for m in rest)  # no response after cancellation
    # The stream ended after the handler, and the handler after the asyncio task:
    assert HANGS == {"seen": "CancelledError"}


async def test_a_cancelled_caller_waits_for_the_asyncio_task_to_unwind() -> None:
    started, log = Signal(), list[str]()

    @on_asyncio
    async def wait_forever() -> None:
        started.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            await asyncio.sleep(0)  # cleanup that itself awaits
            log.append("CancelledError")
            raise
        finally:
            log.append("finally")

    with trio.fail_after(TIMEOUT):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(wait_forever)
            await started.event.wait()
            nursery.cancel_scope.cancel()
    assert log == ["CancelledError", "finally"]  # already, when the caller went on


async def test_a_task_that_ignores_cancellation_is_waited_for_only_its_grace(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="weir.engine.asyncio_bridge")
    started, finished = Signal(), Signal()
    held: dict[str, Any] = {}

    @on_asyncio(cancel_grace=0.05)
    async def stubborn() -> None:
        release = held["release"] = asyncio.Event()
        held["loop"] = asyncio.get_running_loop()
        started.set()
        try:
            await release.wait()
        except asyncio.CancelledError:
            await release.wait()  # ignores the cancellation until released
        finished.set()

    with trio.fail_after(TIMEOUT):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(stubborn)
            await started.event.wait()
            nursery.cancel_scope.cancel()
        assert not finished.event.is_set()
        [record] = [r for r in caplog.records if r.name == "weir.engine.asyncio_bridge"]
        assert "left running" in record.getMessage()
        held["loop"].call_soon_threadsafe(held["release"].set)
        await finished.event.wait()


# ----------------------------------------------------------------- (d) exceptions
async def test_exceptions_propagate_as_themselves(base_url: str) -> None:
    @on_asyncio
    async def fails() -> None:
        raise ValueError("from asyncio")

    with trio.fail_after(TIMEOUT):
        with pytest.raises(ValueError, match="from asyncio"):
            await fails()
        with pytest.raises(aiohttp.ClientResponseError) as info:
            await on_asyncio(page)(f"{base_url}/missing")
        assert info.value.status == 404
        async with serving() as new_client:
            client = await new_client()
            msgs = await (await client.call(1, "refuse", {"url": "x"})).messages()
    assert msgs[-1]["result"]["isError"] is True
    assert _texts(msgs[-1]) == ["will not fetch x"]


async def test_a_task_cancelled_on_the_asyncio_side_raises_a_bridge_error() -> None:
    @on_asyncio
    async def cancels_itself() -> None:
        task = asyncio.current_task()
        assert task is not None
        task.cancel()
        await asyncio.sleep(0)

    with trio.fail_after(TIMEOUT), pytest.raises(AsyncioBridgeError, match="cancelled"):
        await cancels_itself()


# ----------------------------------------------------------------- (e) on asyncio already
def test_on_a_running_asyncio_loop_it_awaits_directly() -> None:
    @on_asyncio
    async def where() -> tuple[threading.Thread, asyncio.AbstractEventLoop]:
        return threading.current_thread(), asyncio.get_running_loop()

    async def main() -> None:
        thread, loop = await asyncio.wait_for(where(), TIMEOUT)
        assert thread is threading.current_thread() and loop is asyncio.get_running_loop()

    asyncio.run(main())


def test_on_the_asyncio_driver_the_bridged_tool_runs_on_the_drivers_loop(base_url: str) -> None:
    loops: list[asyncio.AbstractEventLoop] = []
    on_driver = App("bridge-on-asyncio")

    @on_driver.tool()
    @on_asyncio
    async def fetch_here(url: str, ctx: Context) -> str:
        """Fetch, noting the loop."""
        loops.append(asyncio.get_running_loop())
        return await fetch(url, ctx)

    with running_driver(on_driver) as running, Client(running.port) as c:
        c.initialize()
        url = f"{base_url}/page/three"
        reply = c.call("tools/call", {"name": "fetch_here", "arguments": {"url": url}})
        *_, msg = [json.loads(e.data) for e in reply.events() if e.data]
    assert loops == [running.loop]
    assert msg["result"].get("isError") is not True, msg
    # The driver's loop thread (running_driver names it), not the bridge's:
    assert _texts(msg) == ["page three (on asyncio-weir)"]


# ----------------------------------------------------------------- process exit
def test_at_exit_the_shared_loop_unwinds_its_tasks() -> None:
    script = (
        "import asyncio, trio\n"
        "from weir.engine.asyncio_bridge import on_asyncio\n"
        "tasks = []\n"
        "async def forever():\n"
        "    try:\n"
        "        await asyncio.Event().wait()\n"
        "    finally:\n"
        "        print('unwound', flush=True)\n"
        "@on_asyncio\n"
        "async def start():\n"
        "    tasks.append(asyncio.get_running_loop().create_task(forever()))\n"
        "    await asyncio.sleep(0)\n"
        "    return 'started'\n"
        "print(trio.run(start), flush=True)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["started", "unwound"]


def test_a_forked_child_starts_a_loop_of_its_own() -> None:
    script = (
        "import os, threading, trio\n"
        "from weir.engine.asyncio_bridge import on_asyncio\n"
        "@on_asyncio\n"
        "async def where():\n"
        "    return os.getpid(), threading.get_ident()\n"
        "parent = trio.run(where)\n"
        "child = os.fork()\n"
        "if child == 0:\n"
        "    pid, ident = trio.run(where)\n"
        "    os._exit(0 if pid == os.getpid() and pid != parent[0] else 3)\n"
        "_, status = os.waitpid(child, 0)\n"
        "assert os.waitstatus_to_exitcode(status) == 0, status\n"
        "assert trio.run(where) == parent  # the parent's loop thread lives on\n"
        "print('ok', flush=True)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["ok"]
