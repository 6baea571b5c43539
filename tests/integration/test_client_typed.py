"""weir's client: typed results, the typed methods, pagination, and a server that is gone.

* **Typed methods against weir** (both runtimes, both eras): ``call_tool``,
  ``read_resource``, ``get_prompt`` and the four ``list_*`` methods answer Structs
  with the schema's fields (``is_error``, ``structured_content``, ``mime_type``...).
* **Pagination** against the scripted fake of ``test_client`` (weir's own server
  answers every list in one page): three pages followed to the end, one page by
  cursor, a server that loops its cursors refused at once, a page limit.
* **Malformed answers**: a result that does not have MCP's shape raises
  :class:`MalformedResponse` (a :class:`WeirError`), never a msgspec error, and the
  session stays usable; a broken event stream on 2026-07-28 is a :class:`BadResponse`.
* **A dead server**: a port nobody listens on, and a real ``weir serve`` process
  killed mid-call, raise :class:`TransportError` itself -- out of the
  ``async with`` too, never wrapped in an exception group by the client's nursery.
"""

from __future__ import annotations

import socket
import tempfile
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio

from tests.integration.runtimes import serving
from tests.integration.serverproc import WeirProcess
from tests.integration.test_client import Answer, Seen, fake, json_answer
from weir.app.samples import demo
from weir.engine import App
from weir.engine.client import (
    BadResponse,
    CallToolResult,
    EmbeddedResource,
    GetPromptResult,
    MalformedResponse,
    PaginationError,
    ReadResourceResult,
    RetryPolicy,
    RpcError,
    SessionClient,
    SessionGone,
    SessionlessClient,
    TextContent,
    Tool,
    TransportError,
    UnknownContent,
    WeirError,
    open_client,
    open_session,
)

TEST_TIMEOUT = 20.0
#: Few, fast retries: a dead server is declared dead within a second or two.
GONE = RetryPolicy(max_attempts=2, max_reconnects=2, base_delay=0.01, max_delay=0.5)

app = App("typed-client-tests", "1.0.0")


@app.tool()
def point(x: int, y: int) -> dict[str, int]:
    """A structured result."""
    return {"x": x, "y": y}


@app.tool()
def fail() -> dict[str, Any]:
    """Always fails: a result with isError, not a JSON-RPC error."""
    return {"content": [{"type": "text", "text": "no luck"}], "isError": True}


@app.resource("typed://note", name="note", mime_type="text/plain", description="A note")
def note() -> str:
    return "hello, note"


@app.resource_template("typed://item/{n}", name="item", mime_type="text/plain")
def item(n: str) -> str:
    return f"item {n}"


@app.prompt(description="Greets someone", arguments={"who": "whom to greet"})
def greet(who: str) -> str:
    return f"Say hello to {who}"


@asynccontextmanager
async def client_of(runtime: str, era: str) -> AsyncIterator[SessionClient | SessionlessClient]:
    with serving(runtime, app) as server:
        mode = "session" if era == "session" else "sessionless"
        async with open_client(server.url, mode=mode) as client:
            yield client


# ---------------------------------------------------------------- typed methods against weir
@pytest.mark.parametrize("era", ["session", "sessionless"])
@pytest.mark.parametrize("runtime", ["trio", "asyncio"])
async def test_typed_methods_against_weir(runtime: str, era: str) -> None:
    with trio.fail_after(TEST_TIMEOUT):
        async with client_of(runtime, era) as client:
            kind = SessionClient if era == "session" else SessionlessClient
            assert isinstance(client, kind)
            tools = await client.list_tools()
            assert all(isinstance(t, Tool) for t in tools)
            by_name = {t.name: t for t in tools}
            assert set(by_name) == {"point", "fail"}
            assert by_name["point"].input_schema["properties"].keys() == {"x", "y"}
            assert by_name["point"].description == "A structured result."

            result = await client.call_tool("point", {"x": 1, "y": 2})
            assert isinstance(result, CallToolResult) and not result.is_error
            assert result.structured_content == {"x": 1, "y": 2}
            assert isinstance(result.content[0], TextContent)
            failed = await client.call_tool("fail")
            assert failed.is_error is True and "no luck" in failed.text

            resources = await client.list_resources()
            assert [(r.uri, r.name, r.mime_type) for r in resources] == [
                ("typed://note", "note", "text/plain")
            ]
            templates = await client.list_resource_templates()
            assert [(t.uri_template, t.name) for t in templates] == [("typed://item/{n}", "item")]
            read = await client.read_resource("typed://note")
            assert isinstance(read, ReadResourceResult)
            assert [(c.uri, c.text, c.blob) for c in read.contents] == [
                ("typed://note", "hello, note", None)
            ]
            assert (await client.read_resource("typed://item/7")).contents[0].text == "item 7"

            prompts = await client.list_prompts()
            assert [p.name for p in prompts] == ["greet"]
            assert prompts[0].arguments is not None
            assert [(a.name, a.required) for a in prompts[0].arguments] == [("who", True)]
            prompt = await client.get_prompt("greet", {"who": "Ada"})
            assert isinstance(prompt, GetPromptResult)
            assert prompt.messages[0].role == "user"
            block = prompt.messages[0].content
            assert isinstance(block, TextContent) and block.text == "Say hello to Ada"

            raw = await client.request("tools/list")  # the escape hatch: JSON as it came
            assert isinstance(raw, dict) and {t["name"] for t in raw["tools"]} == set(by_name)
            with pytest.raises(RpcError) as unknown:  # (was SessionGone on 2026-07-28)
                await client.request("no/such-method")
            assert not isinstance(unknown.value, SessionGone)


# ---------------------------------------------------------------- pagination (scripted fake)
def tool(name: str) -> dict[str, Any]:
    return {"name": name, "inputSchema": {"type": "object"}}


Pages = dict[str | None, tuple[list[str], str | None]]


def paged(pages: Pages) -> Any:
    """A script answering ``tools/list`` from ``pages``: cursor -> (names, next)."""

    async def script(seen: Seen) -> Answer:
        msg = seen.json()
        assert msg["method"] == "tools/list"
        names, nxt = pages[(msg.get("params") or {}).get("cursor")]
        page: dict[str, Any] = {"tools": [tool(n) for n in names]}
        if nxt is not None:
            page["nextCursor"] = nxt
        return json_answer({"jsonrpc": "2.0", "id": msg["id"], "result": page})

    return script


def cursors_sent(seen: list[Seen]) -> list[str | None]:
    posts = [s.json() for s in seen if s.method == "POST"]
    lists = [m for m in posts if m.get("method") == "tools/list"]
    return [(m.get("params") or {}).get("cursor") for m in lists]


async def test_list_tools_follows_three_pages_to_the_end() -> None:
    pages: Pages = {None: (["a", "b"], "p2"), "p2": (["c"], "p3"), "p3": (["d", "e"], None)}
    with trio.fail_after(TEST_TIMEOUT):
        async with fake(paged(pages)) as server, open_session(server.url) as s:
            assert [t.name for t in await s.list_tools()] == ["a", "b", "c", "d", "e"]
            assert cursors_sent(server.seen) == [None, "p2", "p3"]
            middle = await s.list_tools_page("p2")
            assert [t.name for t in middle.tools] == ["c"] and middle.next_cursor == "p3"
            last = await s.list_tools_page("p3")
            assert last.next_cursor is None


async def test_a_server_that_loops_its_cursors_is_refused() -> None:
    pages: Pages = {None: (["a"], "x"), "x": (["b"], "y"), "y": (["c"], "x")}
    with trio.fail_after(TEST_TIMEOUT):
        async with fake(paged(pages)) as server, open_session(server.url) as s:
            with pytest.raises(PaginationError, match="repeated the cursor 'x'"):
                await s.list_tools()
            assert cursors_sent(server.seen) == [None, "x", "y"]  # refused at once


async def test_pagination_stops_at_the_page_limit() -> None:
    endless: Pages = {f"c{i}": ([f"t{i}"], f"c{i + 1}") for i in range(1, 50)}
    endless[None] = (["t0"], "c1")
    with trio.fail_after(TEST_TIMEOUT):
        async with fake(paged(endless)) as server, open_session(server.url) as s:
            with pytest.raises(PaginationError, match="more than 5 pages"):
                await s.list_tools(max_pages=5)
            assert len(cursors_sent(server.seen)) == 5
            with pytest.raises(ValueError, match="at least 1"):
                await s.list_prompts(max_pages=0)
            assert len(cursors_sent(server.seen)) == 5  # nothing sent


# ---------------------------------------------------------------- malformed answers
async def test_malformed_answers_raise_malformed_response_and_the_session_goes_on() -> None:
    answers: list[dict[str, Any]] = [
        {"content": "not a list"},  # tools/call
        {"content": [{"type": "text"}]},  # a text block without text
        {"tools": [{"description": "a tool without a name", "inputSchema": {}}]},
        {"contents": [{"text": "no uri"}]},  # resources/read
        {"messages": [{"role": "user"}]},  # prompts/get, a message without content
        # forward compatible: unknown fields and block types are kept, not refused
        {"content": [{"type": "hologram", "depth": 3}], "isError": False, "future": 1},
    ]

    async def script(seen: Seen) -> Answer:
        msg = seen.json()
        return json_answer({"jsonrpc": "2.0", "id": msg["id"], "result": answers.pop(0)})

    with trio.fail_after(TEST_TIMEOUT):
        async with fake(script) as server, open_session(server.url) as s:
            with pytest.raises(MalformedResponse, match=r"\$\.content"):
                await s.call_tool("t", {})
            with pytest.raises(MalformedResponse, match="text"):
                await s.call_tool("t", {})
            with pytest.raises(MalformedResponse, match="name") as caught:
                await s.list_tools()
            assert isinstance(caught.value, BadResponse) and isinstance(caught.value, WeirError)
            with pytest.raises(MalformedResponse, match="uri"):
                await s.read_resource("x://y")
            with pytest.raises(MalformedResponse, match="content"):
                await s.get_prompt("p")
            future = await s.call_tool("t", {})
    (block,) = future.content
    assert isinstance(block, UnknownContent) and block.raw == {"type": "hologram", "depth": 3}
    assert not isinstance(block, EmbeddedResource) and future.text == ""


async def test_a_broken_event_stream_on_2026_07_28_is_a_bad_response() -> None:
    """A line past the SSE decoder's limit: a WeirError, not the decoder's ValueError."""

    async def script(seen: Seen) -> Answer:
        msg = seen.json()
        if msg["method"] == "server/discover":
            found = {"supportedVersions": ["2026-07-28"], "capabilities": {"tools": {}}}
            return json_answer({"jsonrpc": "2.0", "id": msg["id"], "result": found})
        return Answer(200, chunks=[b"data: " + b"x" * ((1 << 20) + 16)])

    with trio.fail_after(TEST_TIMEOUT):
        async with fake(script) as server, open_client(server.url, retry=GONE) as client:
            assert isinstance(client, SessionlessClient)
            with pytest.raises(BadResponse, match="bad event stream"):
                await client.call_tool("t")


# ---------------------------------------------------------------- a server that is gone
def unused_port() -> int:
    """A loopback port that was free a moment ago and that nobody listens on."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.mark.parametrize("mode", ["auto", "session", "sessionless"])
async def test_nobody_listening_raises_transport_error(mode: str) -> None:
    url = f"http://127.0.0.1:{unused_port()}/mcp"
    with trio.fail_after(TEST_TIMEOUT), pytest.raises(TransportError) as caught:
        async with open_client(url, mode=mode, retry=GONE, timeout=5.0):
            pytest.fail("connected to a port nobody listens on")
    assert type(caught.value) is TransportError, caught.value


@pytest.fixture
def weir_process() -> Iterator[WeirProcess]:
    """``python -m weir serve demo`` in a subprocess; stopped (or reaped) at the end."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        proc = WeirProcess("demo", out, err)
        try:
            yield proc
        finally:
            proc.stop()


@pytest.mark.parametrize("mode", ["session", "sessionless"])
async def test_a_server_killed_mid_call_raises_transport_error(
    weir_process: WeirProcess, mode: str
) -> None:
    started = trio.Event()

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        if not started.is_set():
            weir_process.proc.kill()  # SIGKILL: no goodbye, connections reset
            started.set()

    with trio.fail_after(TEST_TIMEOUT), pytest.raises(TransportError) as caught:
        async with open_client(weir_process.url, mode=mode, retry=GONE, timeout=5.0) as client:
            # The error leaves the ``async with`` uncaught: it must stay itself.
            await client.call_tool("countdown", {"seconds": 60}, on_progress=on_progress)
    assert started.is_set()
    assert type(caught.value) is TransportError, caught.value
    assert weir_process.proc.wait(timeout=10) != 0


async def test_a_listen_stream_whose_server_dies_raises_transport_error(
    weir_process: WeirProcess,
) -> None:
    with trio.fail_after(TEST_TIMEOUT):
        async with open_client(weir_process.url, retry=GONE, timeout=5.0) as client:
            assert isinstance(client, SessionlessClient)
            async with client.listen(toolsListChanged=True) as messages:
                ack = await anext(aiter(messages))
                assert ack["method"] == "notifications/subscriptions/acknowledged"
                weir_process.proc.kill()
                with pytest.raises(TransportError):
                    await anext(aiter(messages))


# ---------------------------------------------------------------- the README's example
def readme_client_example() -> str:
    """The first Python block of docs/client.md (the README's "weir's client" section)."""
    text = (Path(__file__).resolve().parents[2] / "docs" / "client.md").read_text()
    return text.split("```python\n", 1)[1].split("```", 1)[0]


@pytest.mark.parametrize("mode", ["session", "sessionless"])
async def test_the_readme_client_example_runs_against_the_demo_app(mode: str) -> None:
    code = readme_client_example()
    assert 'open_client("http://127.0.0.1:8000/mcp")' in code
    with serving("trio", demo.app) as server:
        code = code.replace(
            'open_client("http://127.0.0.1:8000/mcp")',
            f"open_client({server.url!r}, mode={mode!r})",
        )
        body = "".join(f"    {line}\n" if line else "\n" for line in code.splitlines())
        scope: dict[str, Any] = {}
        exec(f"async def example():\n{body}    return locals()\n", scope)
        with trio.fail_after(TEST_TIMEOUT):
            done = await scope["example"]()
    assert isinstance(done["result"], CallToolResult) and not done["result"].is_error
    assert {t.name for t in done["tools"]} >= {"increment", "echo"}
    assert done["counter"].contents[0].uri == "demo://counter"
    assert "Summarise" in done["prompt"].messages[0].content.text
    assert {t["name"] for t in done["raw"]["tools"]} == {t.name for t in done["tools"]}
