"""The official MCP Python SDK (``mcp==2.3.0``) as a client of ``weir serve``, and of
the asyncio runtime.

Each app (``demo``, ``conformance``) runs once per module and driver, as ``python -m
weir serve APP --host 127.0.0.1 --port 0`` and as ``python -m weir serve --runtime
asyncio APP ...``, in a subprocess, stopped with SIGINT (then killed).  The 2024-11-05
transport and authorization are the Trio engine's alone so far: their tests run on
both, the asyncio case expected to fail (strictly) until it serves them.

Event loop: the tests are written as ``async def`` bodies, but :func:`on_asyncio`
turns each into a *sync* test that runs it with ``anyio.run(..., backend="asyncio")``
inside ``anyio.fail_after(TEST_TIMEOUT)``; pytest-trio (``trio_mode = true``) leaves
sync tests alone. The SDK also works on Trio (every scenario here passed with the
tests as native pytest-trio tests), but there it leaves the SSE async generators of
``httpx2``/``httpcore2`` unexhausted when it stops reading a stream, and Trio's
async-generator finalizer reports each one as a ``ResourceWarning`` at garbage
collection, outside any test's warning filter. asyncio is the loop the SDK's users
run and finalizes those generators silently, so it is the reliable choice. The
server runs in its own process either way, so weir itself is exercised identically.

The client is the SDK's ``Client(...)`` in its default ``mode="auto"``: it first
probes ``server/discover`` at protocol 2026-07-28.  Both runtimes answer it, so the
SDK speaks the sessionless revision (input-required results instead of
server-to-client requests, ``subscriptions/listen``).  Tests of session-era behaviour
(the ``initialize`` handshake at 2025-11-25, resumption, ``DELETE``) pin
``mode="legacy"``; both kinds run on both drivers.  Most tests give the SDK's
``streamable_http_client`` an ``httpx2.AsyncClient`` (the SDK's HTTP client) whose
response hook records every HTTP exchange, so they can check the SDK's wire behaviour
too: the session id, the ``Last-Event-ID`` resumption, the closing ``DELETE``.
All traffic is loopback.

Needs the ``sdk`` extra (``pip install -e '.[sdk]'``); the module is skipped when the
SDK is not installed.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import re
import tempfile
from collections.abc import Callable, Coroutine, Iterator
from dataclasses import dataclass, field
from typing import Any, ParamSpec

import anyio
import pytest

try:
    import httpx2
    import mcp_types as types
    from mcp import Client
    from mcp.client import ClientRequestContext
    from mcp.client.streamable_http import streamable_http_client
except ImportError as exc:  # pragma: no cover - depends on the environment
    if os.environ.get("WEIR_REQUIRE_SDK") == "1":  # CI: a missing SDK is a failure
        raise
    pytest.skip(
        f"the MCP Python SDK is not installed (pip install -e '.[sdk]'): {exc}",
        allow_module_level=True,
    )

from tests.integration.serverproc import WeirProcess

pytestmark = pytest.mark.interop


TEST_TIMEOUT = 30.0
#: What the SDK offers at ``initialize`` (``LATEST_HANDSHAKE_VERSION``) and weir serves.
NEGOTIATED_VERSION = "2025-11-25"
#: The sessionless revision, which ``weir serve`` serves and the SDK's auto mode adopts.
SESSIONLESS_VERSION = "2026-07-28"
_SERVING = re.compile(r"^weir: serving (?P<url>http://\S+)")

_P = ParamSpec("_P")


def on_asyncio(test: Callable[_P, Coroutine[Any, Any, None]]) -> Callable[_P, None]:
    """Run an ``async def`` test body on asyncio, bounded by :data:`TEST_TIMEOUT`.

    ``functools.wraps`` keeps the signature, so pytest still injects fixtures and
    parameters; the wrapper itself is sync, so pytest-trio does not claim it.
    """

    @functools.wraps(test)
    def run(*args: _P.args, **kwargs: _P.kwargs) -> None:
        async def bounded() -> None:
            with anyio.fail_after(TEST_TIMEOUT):
                await test(*args, **kwargs)

        anyio.run(bounded, backend="asyncio")

    return run


# ---------------------------------------------------------------- the server


#: The servers this module has running, checked after every test.
_RUNNING: dict[tuple[str, str], WeirProcess] = {}

#: Both drivers serve the session-era endpoint, the 2024-11-05 transport and
#: authorization; the tests of them run against each.
DRIVERS = ("trio", "asyncio")


@pytest.fixture(scope="module")
def weir_servers() -> Iterator[Callable[[str, str], WeirProcess]]:
    """``start(app, driver)``: that server, started on first use, for the module."""
    with contextlib.ExitStack() as stack:

        def start(app: str, driver: str) -> WeirProcess:
            if (app, driver) not in _RUNNING:
                stdout = stack.enter_context(tempfile.TemporaryFile())
                stderr = stack.enter_context(tempfile.TemporaryFile())
                server = WeirProcess(app, stdout, stderr, driver=driver)
                stack.callback(server.stop)
                stack.callback(_RUNNING.pop, (app, driver), None)
                _RUNNING[app, driver] = server
            return _RUNNING[app, driver]

        yield start


@pytest.fixture(params=DRIVERS)
def demo_server(
    request: pytest.FixtureRequest, weir_servers: Callable[[str, str], WeirProcess]
) -> WeirProcess:
    return weir_servers("demo", request.param)


@pytest.fixture(params=DRIVERS)
def conformance_server(
    request: pytest.FixtureRequest, weir_servers: Callable[[str, str], WeirProcess]
) -> WeirProcess:
    return weir_servers("conformance", request.param)


@pytest.fixture(autouse=True)
def _servers_survive() -> Iterator[None]:
    """Fail with the server's output if a test took its server down."""
    yield
    for (app, driver), server in _RUNNING.items():
        if server.proc.poll() is not None:
            pytest.fail(
                f"the weir {app} server ({driver}) exited with code {server.proc.returncode}\n"
                f"{server.output()}",
                pytrace=False,
            )


# ---------------------------------------------------------------- the client


@dataclass(frozen=True, slots=True)
class Exchange:
    """One HTTP request the SDK made and the status line it got."""

    method: str
    request_headers: httpx2.Headers
    body: Any  # the request's JSON body, or None
    status: int
    response_headers: httpx2.Headers


@dataclass(slots=True)
class WireLog:
    """Every HTTP exchange of one SDK client, recorded by an httpx2 response hook."""

    exchanges: list[Exchange] = field(default_factory=list)

    async def on_response(self, response: httpx2.Response) -> None:
        request = response.request
        content = request.content  # requests are never streamed by the SDK
        self.exchanges.append(
            Exchange(
                method=request.method,
                request_headers=request.headers,
                body=json.loads(content) if content else None,
                status=response.status_code,
                response_headers=response.headers,
            )
        )

    def session_id(self) -> str:
        """The session id the server assigned at ``initialize``."""
        inits = self.posts_of("initialize")
        assert len(inits) == 1, self.describe()
        assert inits[0].status == 200, self.describe()
        sid = inits[0].response_headers.get("mcp-session-id")
        assert sid, f"initialize answered without Mcp-Session-Id\n{self.describe()}"
        return sid

    def posts_of(self, method: str) -> list[Exchange]:
        """The POSTs carrying a JSON-RPC request or notification named ``method``."""
        return [
            ex
            for ex in self.exchanges
            if ex.method == "POST" and isinstance(ex.body, dict) and ex.body.get("method") == method
        ]

    def tool_call(self, name: str) -> Exchange:
        """The single ``tools/call`` POST for tool ``name``."""
        calls = [ex for ex in self.posts_of("tools/call") if ex.body["params"]["name"] == name]
        assert len(calls) == 1, self.describe()
        return calls[0]

    def describe(self) -> str:
        lines = []
        for ex in self.exchanges:
            what = ex.body.get("method") if isinstance(ex.body, dict) else ""
            resume = ex.request_headers.get("last-event-id")
            lines.append(
                f"  {ex.method} {what or ''} -> {ex.status}"
                + (f" (Last-Event-ID {resume})" if resume else "")
            )
        return "HTTP exchanges:\n" + "\n".join(lines)


def http_client(wire: WireLog) -> httpx2.AsyncClient:
    """An httpx2 client like the SDK's default one, plus the recording hook."""
    return httpx2.AsyncClient(
        timeout=httpx2.Timeout(TEST_TIMEOUT),
        event_hooks={"response": [wire.on_response]},
    )


def text_of(result: types.CallToolResult) -> str:
    assert not result.is_error, result
    assert len(result.content) == 1, result
    block = result.content[0]
    assert isinstance(block, types.TextContent), result
    return block.text


# ---------------------------------------------------------------- (1) handshake and listings


@pytest.mark.parametrize("mode", ["auto", "legacy"])
@on_asyncio
async def test_initialize_lists_and_echo(demo_server: WeirProcess, mode: str) -> None:
    wire = WireLog()
    async with (
        http_client(wire) as hc,
        Client(streamable_http_client(demo_server.url, http_client=hc), mode=mode) as client,
    ):
        # Both runtimes answer the auto mode's server/discover probe: the SDK speaks
        # the sessionless revision; pinned to legacy it does the initialize handshake.
        sessionless = mode == "auto"
        assert client.protocol_version == (
            SESSIONLESS_VERSION if sessionless else NEGOTIATED_VERSION
        )
        assert (client.session.initialize_result is None) is sessionless
        info = client.server_info
        assert info is not None
        assert (info.name, info.version) == ("weir-demo", "0.1.0")
        assert client.instructions is not None and "demo" in client.instructions
        caps = client.server_capabilities
        assert caps.tools is not None
        assert caps.resources is not None
        assert caps.prompts is not None

        tools = {t.name: t for t in (await client.list_tools()).tools}
        assert set(tools) == {"echo", "increment", "countdown"}
        assert tools["echo"].input_schema["properties"]["text"]["type"] == "string"
        echo_ann, inc_ann = tools["echo"].annotations, tools["increment"].annotations
        assert echo_ann is not None and echo_ann.read_only_hint is True
        assert inc_ann is not None and inc_ann.idempotent_hint is False

        resources = [(str(r.uri), r.mime_type) for r in (await client.list_resources()).resources]
        assert resources == [("demo://counter", "text/plain")]

        prompts = (await client.list_prompts()).prompts
        assert [p.name for p in prompts] == ["summarize"]
        assert [a.name for a in prompts[0].arguments or []] == ["text"]
        prompt = await client.get_prompt("summarize", {"text": "weir is a transport"})
        assert len(prompt.messages) == 1
        content = prompt.messages[0].content
        assert isinstance(content, types.TextContent)
        assert content.text.endswith("weir is a transport")

        result = await client.call_tool("echo", {"text": "héllo, wörld"})
        assert text_of(result) == "héllo, wörld"

    if sessionless:
        (probe,) = wire.posts_of("server/discover")
        assert wire.exchanges.index(probe) == 0, wire.describe()
        # On the wire: the answered probe, then self-contained POSTs -- no session
        # id, no GET stream, no DELETE -- each naming its method and revision.
        assert probe.status == 200, wire.describe()
        assert not wire.posts_of("initialize"), wire.describe()
        for ex in wire.exchanges:
            assert ex.method == "POST", wire.describe()
            assert "mcp-session-id" not in ex.request_headers, wire.describe()
            assert "mcp-session-id" not in ex.response_headers, wire.describe()
            assert ex.request_headers.get("mcp-protocol-version") == SESSIONLESS_VERSION
            assert ex.request_headers.get("mcp-method") == ex.body["method"], wire.describe()
        return
    # On the wire: no probe, the handshake first.
    assert not wire.posts_of("server/discover"), wire.describe()
    (init,) = wire.posts_of("initialize")
    assert wire.exchanges.index(init) == 0, wire.describe()
    assert init.body["params"]["protocolVersion"] == NEGOTIATED_VERSION
    # Every request after initialize named the session and the negotiated version.
    sid = wire.session_id()
    later = wire.exchanges[wire.exchanges.index(init) + 1 :]
    assert [ex for ex in later if ex.method == "DELETE"], wire.describe()
    for ex in later:
        assert ex.request_headers.get("mcp-session-id") == sid, wire.describe()
        assert ex.request_headers.get("mcp-protocol-version") == NEGOTIATED_VERSION, wire.describe()


# ---------------------------------------------------------------- (2) progress


@pytest.mark.parametrize("driver", DRIVERS)
@pytest.mark.parametrize(
    ("app", "tool", "arguments", "expected"),
    [
        pytest.param(
            "demo",
            "countdown",
            {"seconds": 2},
            [(0.0, 2.0, "2 s left"), (1.0, 2.0, "1 s left"), (2.0, 2.0, "lift-off")],
            id="demo-countdown",
        ),
        pytest.param(
            "conformance",
            "test_tool_with_progress",
            {},
            [
                (0.0, 100.0, "Completed step 0 of 100"),
                (50.0, 100.0, "Completed step 50 of 100"),
                (100.0, 100.0, "Completed step 100 of 100"),
            ],
            id="conformance-test_tool_with_progress",
        ),
    ],
)
@on_asyncio
async def test_progress_arrives_before_result(
    weir_servers: Callable[[str, str], WeirProcess],
    driver: str,
    app: str,
    tool: str,
    arguments: dict[str, Any],
    expected: list[tuple[float, float, str]],
) -> None:
    server = weir_servers(app, driver)
    wire = WireLog()
    # The progress callback and the arrival of the result, in the order the SDK saw them.
    seen: list[tuple[float, float | None, str | None] | str] = []
    tokens: list[str | int] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        seen.append((progress, total, message))

    async def on_message(message: Any) -> None:
        if isinstance(message, types.ProgressNotification):
            tokens.append(message.params.progress_token)

    async with (
        http_client(wire) as hc,
        Client(
            streamable_http_client(server.url, http_client=hc), message_handler=on_message
        ) as client,
    ):
        result = await client.call_tool(tool, arguments, progress_callback=on_progress)
        seen.append("result")
        # The raw notifications reach the message handler in tasks of their own.
        while len(tokens) < len(expected):
            await anyio.sleep(0.01)

    assert not result.is_error, result
    assert seen == [*expected, "result"], wire.describe()
    values = [entry[0] for entry in seen[:-1]]
    assert values == sorted(set(values))  # strictly increasing
    call = wire.tool_call(tool)
    sent_token = call.body["params"]["_meta"]["progressToken"]
    assert tokens == [sent_token] * len(expected)
    assert call.response_headers.get("content-type", "").startswith("text/event-stream")


# ---------------------------------------------------------------- (3) exactly-once execution


@on_asyncio
async def test_increment_executes_exactly_once_per_call(demo_server: WeirProcess) -> None:
    sequential, concurrent = 5, 6

    async def read_counter(client: Client) -> int:
        res = await client.read_resource("demo://counter", cache_mode="bypass")
        (contents,) = res.contents
        assert isinstance(contents, types.TextResourceContents)
        return int(contents.text)

    async with Client(demo_server.url, cache=None) as client:
        before = await read_counter(client)

        answers = []
        for _ in range(sequential):
            answers.append(int(text_of(await client.call_tool("increment", {}))))
        assert answers == list(range(before + 1, before + sequential + 1))
        assert await read_counter(client) == before + sequential

        many: list[int] = []

        async def bump() -> None:
            many.append(int(text_of(await client.call_tool("increment", {"by": 1}))))

        async with anyio.create_task_group() as tg:
            for _ in range(concurrent):
                tg.start_soon(bump)
        start = before + sequential
        assert sorted(many) == list(range(start + 1, start + concurrent + 1))

        assert await read_counter(client) == before + sequential + concurrent


# ---------------------------------------------------------------- (4) resumption


@on_asyncio
async def test_reconnection_resumes_with_last_event_id(conformance_server: WeirProcess) -> None:
    # Resumption is the session era's: the sessionless revision has none.
    wire = WireLog()
    async with (
        http_client(wire) as hc,
        Client(
            streamable_http_client(conformance_server.url, http_client=hc), mode="legacy"
        ) as client,
    ):
        result = await client.call_tool("test_reconnection", {})
        assert text_of(result) == "Reconnection test completed successfully"

    call = wire.tool_call("test_reconnection")
    assert call.status == 200, wire.describe()
    assert call.response_headers["content-type"].startswith("text/event-stream")
    resumed = [
        ex
        for ex in wire.exchanges[wire.exchanges.index(call) + 1 :]
        if ex.method == "GET" and ex.request_headers.get("last-event-id")
    ]
    assert resumed, f"the SDK never resumed with Last-Event-ID\n{wire.describe()}"
    assert resumed[0].status == 200, wire.describe()
    assert resumed[0].response_headers["content-type"].startswith("text/event-stream")
    assert resumed[0].request_headers.get("mcp-session-id") == wire.session_id()


# ---------------------------------------------------------------- (5) server-to-client requests


@on_asyncio
async def test_sampling_round_trip(conformance_server: WeirProcess) -> None:
    asked: list[types.CreateMessageRequestParams] = []

    async def sampling(
        context: ClientRequestContext, params: types.CreateMessageRequestParams
    ) -> types.CreateMessageResult:
        asked.append(params)
        return types.CreateMessageResult(
            role="assistant",
            content=types.TextContent(type="text", text="forty-two, said the model"),
            model="interop-test-model",
            stop_reason="endTurn",
        )

    async with Client(conformance_server.url, sampling_callback=sampling) as client:
        result = await client.call_tool("test_sampling", {"prompt": "What is 6 x 7?"})
        assert text_of(result) == "LLM response: forty-two, said the model"

    (params,) = asked
    assert params.max_tokens == 100
    (message,) = params.messages
    assert message.role == "user"
    assert isinstance(message.content, types.TextContent)
    assert message.content.text == "What is 6 x 7?"


@pytest.mark.parametrize(
    ("answer", "expected"),
    [
        pytest.param(
            types.ElicitResult(
                action="accept", content={"username": "al", "email": "al@example.com"}
            ),
            "User response: action=accept, content={'username': 'al', 'email': 'al@example.com'}",
            id="accept",
        ),
        pytest.param(
            types.ElicitResult(action="decline"),
            "User response: action=decline, content={}",
            id="decline",
        ),
    ],
)
@on_asyncio
async def test_elicitation_round_trip(
    conformance_server: WeirProcess, answer: types.ElicitResult, expected: str
) -> None:
    asked: list[types.ElicitRequestParams] = []

    async def elicitation(
        context: ClientRequestContext, params: types.ElicitRequestParams
    ) -> types.ElicitResult:
        asked.append(params)
        return answer

    async with Client(conformance_server.url, elicitation_callback=elicitation) as client:
        result = await client.call_tool("test_elicitation", {"message": "Who are you?"})
        assert text_of(result) == expected

    (params,) = asked
    assert isinstance(params, types.ElicitRequestFormParams)
    assert params.message == "Who are you?"
    assert params.requested_schema["required"] == ["username", "email"]


# ---------------------------------------------------------------- (6) session termination


@on_asyncio
async def test_session_terminated_when_client_exits(demo_server: WeirProcess) -> None:
    wire = WireLog()
    async with (
        http_client(wire) as hc,
        Client(streamable_http_client(demo_server.url, http_client=hc), mode="legacy") as client,
    ):
        assert text_of(await client.call_tool("echo", {"text": "bye"})) == "bye"
    sid = wire.session_id()

    deletes = [ex for ex in wire.exchanges if ex.method == "DELETE"]
    assert len(deletes) == 1, wire.describe()
    assert deletes[0].request_headers.get("mcp-session-id") == sid
    assert deletes[0].status == 200, wire.describe()

    headers = {
        "accept": "application/json, text/event-stream",
        "content-type": "application/json",
        "mcp-session-id": sid,
        "mcp-protocol-version": NEGOTIATED_VERSION,
    }
    async with httpx2.AsyncClient(timeout=httpx2.Timeout(TEST_TIMEOUT)) as raw:
        post = await raw.post(
            demo_server.url,
            headers=headers,
            json={"jsonrpc": "2.0", "id": 7, "method": "tools/list"},
        )
        get = await raw.get(demo_server.url, headers=headers)
        delete = await raw.delete(demo_server.url, headers=headers)

    assert post.status_code == 404, post.text
    body = post.json()
    assert body["id"] == 7
    assert body["error"]["data"]["reason"] == "session_not_found"
    assert get.status_code == 404, get.text
    assert delete.status_code == 404, delete.text


@on_asyncio
async def test_legacy_http_sse_transport_with_the_sdk_sse_client(
    demo_server: WeirProcess,
) -> None:
    """The 2024-11-05 HTTP+SSE transport (``GET /sse`` + ``POST /messages``), driven
    by the official SDK's ``sse_client``: every response travels on the one stream."""
    from mcp.client.session import ClientSession
    from mcp.client.sse import sse_client

    base = demo_server.url.rsplit("/", 1)[0]
    async with (
        sse_client(f"{base}/sse") as (read, write),
        ClientSession(read, write) as session,
    ):
        init = await session.initialize()
        assert init.server_info.name == "weir-demo"
        tools = await session.list_tools()
        assert {"echo", "increment", "countdown"} <= {t.name for t in tools.tools}
        result = await session.call_tool("echo", {"text": "over the legacy stream"})
        assert result.content[0].text == "over the legacy stream"  # type: ignore[union-attr]
        before = int((await session.call_tool("increment", {"by": 0})).content[0].text)  # type: ignore[union-attr]
        for _ in range(3):
            await session.call_tool("increment", {"by": 1})
        after = int((await session.call_tool("increment", {"by": 0})).content[0].text)  # type: ignore[union-attr]
        assert after == before + 3  # each call executed exactly once


# ---------------------------------------------------------------- (8) a bearer token


@pytest.mark.parametrize("driver", DRIVERS)
@on_asyncio
async def test_sdk_client_with_a_bearer_token(tmp_path: Any, driver: str) -> None:
    # weir serve with --auth-*: a static JWKS file, a token signed with its key.
    import time

    import jwt
    from cryptography.hazmat.primitives.asymmetric import rsa

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    jwk = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(key.public_key()))
    jwk["kid"] = "k1"
    keyfile = tmp_path / "jwks.json"
    keyfile.write_text(json.dumps({"keys": [jwk]}))
    resource = "http://127.0.0.1/mcp"
    args = [
        "--auth-issuer", "https://issuer.test", "--auth-resource", resource,
        "--auth-jwks-file", str(keyfile), "--auth-scope", "mcp",
    ]  # fmt: skip
    now = int(time.time())
    claims = {"iss": "https://issuer.test", "aud": resource, "sub": "sdk-user"}
    bearer = jwt.encode(
        {**claims, "exp": now + 300, "scope": "mcp"}, key, algorithm="RS256", headers={"kid": "k1"}
    )
    with (tmp_path / "out").open("w+b") as out, (tmp_path / "err").open("w+b") as err:
        server = WeirProcess("demo", out, err, args, driver=driver)
        try:
            wire = WireLog()
            async with (
                httpx2.AsyncClient(
                    timeout=httpx2.Timeout(TEST_TIMEOUT),
                    headers={"authorization": f"Bearer {bearer}"},
                    event_hooks={"response": [wire.on_response]},
                ) as hc,
                Client(streamable_http_client(server.url, http_client=hc)) as client,
            ):
                assert text_of(await client.call_tool("echo", {"text": "authorized"})) == (
                    "authorized"
                )
            # Without the token, the same server says 401 and where to look.
            async with httpx2.AsyncClient(timeout=httpx2.Timeout(TEST_TIMEOUT)) as raw:
                refused = await raw.post(
                    server.url,
                    content=b'{"jsonrpc":"2.0","id":1,"method":"ping"}',
                    headers={"content-type": "application/json",
                             "accept": "application/json, text/event-stream"},
                )  # fmt: skip
                assert refused.status_code == 401
                challenge = refused.headers["www-authenticate"]
                assert challenge.startswith("Bearer resource_metadata=")
                meta_url = challenge.split('"')[1]
                assert meta_url == "http://127.0.0.1/.well-known/oauth-protected-resource/mcp"
                port_url = server.url.rsplit("/", 1)[0]
                meta = await raw.get(port_url + "/.well-known/oauth-protected-resource/mcp")
                assert meta.json()["authorization_servers"] == ["https://issuer.test"]
        finally:
            server.stop()


# ---------------------------------------------------------------- (8) the sessionless revision


@on_asyncio
async def test_elicitation_rides_an_input_required_result(
    conformance_server: WeirProcess,
) -> None:
    asked: list[types.ElicitRequestParams] = []

    async def elicitation(
        context: ClientRequestContext, params: types.ElicitRequestParams
    ) -> types.ElicitResult:
        asked.append(params)
        return types.ElicitResult(action="accept", content={"name": "Ada"})

    wire = WireLog()
    async with (
        http_client(wire) as hc,
        Client(
            streamable_http_client(conformance_server.url, http_client=hc),
            elicitation_callback=elicitation,
        ) as client,
    ):
        assert client.protocol_version == SESSIONLESS_VERSION
        result = await client.call_tool("test_input_required_result_elicitation", {})
        assert text_of(result) == "Hello, Ada!"

    assert len(asked) == 1 and asked[0].message == "What is your name?"
    first, second = wire.posts_of("tools/call")
    # Round one asked; round two carried the answer and the sealed state back, with a
    # new id, and nothing but POSTs went over the wire (no server-to-client request).
    assert "inputResponses" not in first.body["params"]
    params = second.body["params"]
    assert params["inputResponses"]["user_name"]["content"] == {"name": "Ada"}
    assert isinstance(params["requestState"], str) and params["requestState"]
    assert first.body["id"] != second.body["id"]
    assert all(ex.method == "POST" for ex in wire.exchanges), wire.describe()


@on_asyncio
async def test_a_listen_stream_hears_a_change_made_by_another_request(
    conformance_server: WeirProcess,
) -> None:
    async with Client(conformance_server.url) as client:
        async with client.listen(tools_list_changed=True) as sub:
            assert sub.honored.tools_list_changed is True
            await client.call_tool("test_trigger_tool_change", {})
            with anyio.fail_after(5):
                event = await sub.__anext__()
        assert type(event).__name__ == "ToolsListChanged"


@on_asyncio
async def test_legacy_mode_still_gets_the_session_era(demo_server: WeirProcess) -> None:
    async with Client(demo_server.url, mode="legacy") as client:
        assert client.protocol_version == NEGOTIATED_VERSION
        assert client.session.initialize_result is not None
        assert text_of(await client.call_tool("echo", {"text": "old"})) == "old"
