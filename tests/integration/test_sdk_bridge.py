"""An app written with the official SDK, served by weir, driven by the official SDK client.

The server is ``python -m weir serve tests.integration.sdk_bridge_app:server`` (the
bridge, :func:`weir.app.sdk.from_sdk`, found by ``weir serve`` itself); the client is
the SDK's ``Client`` in ``auto`` mode (it discovers 2026-07-28 and speaks it) and in
``legacy`` mode (the ``initialize`` handshake, 2025-11-25); both also against the
asyncio runtime, ``python -m weir serve --runtime asyncio``, where the SDK's anyio
code runs on asyncio instead of Trio.  The same SDK tools serve
both: progress and logs ride the request's stream; elicitation and sampling are
server-to-client requests on the session era and input-required rounds on
2026-07-28 (the SDK chooses, weir seals the state); a cancelled call cancels the SDK
handler; a session's end unwinds the SDK connection; a resource update reaches the
session's GET stream; a change on the SDK's subscription bus reaches a
``subscriptions/listen`` stream.  Asyncio runs the client (see test_sdk_interop).
"""

from __future__ import annotations

import contextlib
import json
import tempfile
from collections.abc import Callable, Iterator
from typing import Any

import anyio

# (test_sdk_interop skips this module too when the SDK is missing, before these run.)
import httpx2
import mcp_types as types
import pytest
from mcp import Client
from mcp.client import ClientRequestContext
from mcp.client.streamable_http import streamable_http_client

from tests.integration.serverproc import WeirProcess
from tests.integration.test_sdk_interop import (
    NEGOTIATED_VERSION,
    SESSIONLESS_VERSION,
    WireLog,
    http_client,
    on_asyncio,
    text_of,
)

pytestmark = pytest.mark.interop

APP = "tests.integration.sdk_bridge_app:server"
MODES = ("auto", "legacy")
VERSION = {"auto": SESSIONLESS_VERSION, "legacy": NEGOTIATED_VERSION}


@pytest.fixture(scope="module")
def bridge_servers() -> Iterator[Callable[[str], WeirProcess]]:
    """``start(driver)``: the SDK app served by that driver, for the module."""
    with contextlib.ExitStack() as stack:
        started: dict[str, WeirProcess] = {}

        def start(driver: str) -> WeirProcess:
            if driver not in started:
                out = stack.enter_context(tempfile.TemporaryFile())
                err = stack.enter_context(tempfile.TemporaryFile())
                started[driver] = WeirProcess(APP, out, err, driver=driver)
                stack.callback(started[driver].stop)
            return started[driver]

        yield start


@pytest.fixture
def bridge_server(bridge_servers: Callable[[str], WeirProcess]) -> WeirProcess:
    """The Trio engine (both eras)."""
    return bridge_servers("trio")


async def _elicit(
    context: ClientRequestContext, params: types.ElicitRequestParams
) -> types.ElicitResult:
    return types.ElicitResult(action="accept", content={"name": "Ada"})


async def _sample(
    context: ClientRequestContext, params: types.CreateMessageRequestParams
) -> types.CreateMessageResult:
    return types.CreateMessageResult(
        role="assistant", content=types.TextContent(type="text", text="4"), model="m"
    )


async def _stats(url: str) -> dict[str, int]:
    async with Client(url, mode="legacy") as client:
        result = await client.call_tool("stats", {})
    return dict(json.loads(text_of(result)))


async def _eventually(url: str, key: str, at_least: int) -> dict[str, int]:
    """``stats`` until ``key`` reaches ``at_least`` (bounded: 5 s)."""
    with anyio.fail_after(5):
        while True:
            seen = await _stats(url)
            if seen.get(key, 0) >= at_least:
                return seen
            await anyio.sleep(0.05)


@pytest.mark.parametrize(
    ("mode", "driver"),
    [("auto", "trio"), ("legacy", "trio"), ("auto", "asyncio"), ("legacy", "asyncio")],
)
@on_asyncio
async def test_the_sdk_client_drives_an_sdk_app_through_weir(
    bridge_servers: Callable[[str], WeirProcess], mode: Any, driver: str
) -> None:
    bridge_server = bridge_servers(driver)
    steps: list[tuple[float, float | None, str | None]] = []
    logs: list[Any] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        steps.append((progress, total, message))

    async def on_log(params: types.LoggingMessageNotificationParams) -> None:
        logs.append(params.data)

    wire = WireLog()
    async with (
        http_client(wire) as hc,
        Client(
            streamable_http_client(bridge_server.url, http_client=hc),
            mode=mode,
            elicitation_callback=_elicit,
            sampling_callback=_sample,
            logging_callback=on_log,
            log_level="debug",
        ) as client,
    ):
        assert client.protocol_version == VERSION[mode]
        names = {t.name for t in (await client.list_tools()).tools}
        assert {"state", "steps", "greet", "compute", "wait"} <= names
        assert text_of(await client.call_tool("state", {})) == "open"  # the SDK's lifespan
        done = await client.call_tool("steps", {"n": 3}, progress_callback=on_progress)
        assert text_of(done) == "3 steps"
        assert text_of(await client.call_tool("greet", {})) == "hello Ada"
        assert text_of(await client.call_tool("compute", {})) == "4"
        contents = (await client.read_resource("note://one")).contents
        assert isinstance(contents[0], types.TextResourceContents) and contents[0].text == "one"

    assert steps == [(1, 3, "step 1"), (2, 3, "step 2"), (3, 3, "step 3")]
    assert logs == ["did step 1", "did step 2", "did step 3"]
    greets = [ex for ex in wire.posts_of("tools/call") if ex.body["params"]["name"] == "greet"]
    if mode == "auto":  # an input-required round, then the answer with weir's sealed state
        assert len(greets) == 2
        assert isinstance(greets[1].body["params"]["requestState"], str)
        assert all(ex.method == "POST" for ex in wire.exchanges), wire.describe()
    else:  # one call; the elicitation was a server-to-client request on its stream
        assert len(greets) == 1
        assert wire.posts_of("notifications/initialized")


@pytest.mark.parametrize("mode", MODES)
@on_asyncio
async def test_a_cancelled_call_cancels_the_sdk_handler(
    bridge_server: WeirProcess, mode: Any
) -> None:
    before = await _stats(bridge_server.url)
    async with Client(bridge_server.url, mode=mode) as client:
        with anyio.move_on_after(0.5):  # the client gives up on the call: it cancels it
            await client.call_tool("wait", {})
    started = before.get("wait started", 0) + 1
    seen = await _eventually(bridge_server.url, "wait cancelled", started)
    assert seen["wait started"] == started == seen["wait cancelled"]


@pytest.mark.parametrize("driver", ["trio", "asyncio"])
@on_asyncio
async def test_the_end_of_a_session_unwinds_its_sdk_connection(
    bridge_servers: Callable[[str], WeirProcess], driver: str
) -> None:
    bridge_server = bridge_servers(driver)
    before = (await _stats(bridge_server.url)).get("connection closed", 0)
    async with Client(bridge_server.url, mode="legacy") as client:
        await client.call_tool("steps", {"n": 1})
        assert (await _stats(bridge_server.url)).get("connection closed", 0) == before
    # The client's DELETE ended the session; weir's session-close hook closed the
    # SDK connection, whose exit stack ran the tool's callback.
    await _eventually(bridge_server.url, "connection closed", before + 1)


@pytest.mark.filterwarnings("ignore:The roots capability is deprecated")
@pytest.mark.parametrize("driver", ["trio", "asyncio"])
@on_asyncio
async def test_a_client_notification_reaches_the_sdk_handler(
    bridge_servers: Callable[[str], WeirProcess], driver: str
) -> None:
    bridge_server = bridge_servers(driver)
    before = (await _stats(bridge_server.url)).get("roots changed", 0)
    async with Client(bridge_server.url, mode="legacy") as client:
        await client.call_tool("state", {})  # (a request first: the SDK connection exists)
        await client.send_roots_list_changed()
        await _eventually(bridge_server.url, "roots changed", before + 1)


@on_asyncio
async def test_a_resource_update_reaches_the_sessions_get_stream(
    bridge_server: WeirProcess,
) -> None:
    updated = anyio.Event()
    uris: list[str] = []

    async def on_message(message: Any) -> None:
        if isinstance(message, types.ResourceUpdatedNotification):
            uris.append(message.params.uri)
            updated.set()

    async with Client(bridge_server.url, mode="legacy", message_handler=on_message) as client:
        with anyio.fail_after(5):
            while True:  # the GET stream opens in the background; touch until it hears
                await client.call_tool("touch", {"uri": "note://one"})
                with anyio.move_on_after(0.2):
                    await updated.wait()
                if updated.is_set():
                    break
    assert set(uris) == {"note://one"}


@on_asyncio
async def test_a_change_on_the_sdk_bus_reaches_a_listen_stream(
    bridge_server: WeirProcess,
) -> None:
    async with Client(bridge_server.url) as client:
        assert client.protocol_version == SESSIONLESS_VERSION
        async with client.listen(tools_list_changed=True) as sub:
            assert sub.honored.tools_list_changed is True
            await client.call_tool("change_tools", {})
            with anyio.fail_after(5):
                event = await sub.__anext__()
    assert type(event).__name__ == "ToolsListChanged"


@on_asyncio
async def test_an_sdk_apps_request_state_is_sealed_by_weir(bridge_server: WeirProcess) -> None:
    meta = {
        "io.modelcontextprotocol/protocolVersion": SESSIONLESS_VERSION,
        "io.modelcontextprotocol/clientCapabilities": {"elicitation": {}},
        "io.modelcontextprotocol/clientInfo": {"name": "raw", "version": "1"},
    }
    headers = {
        "accept": "application/json, text/event-stream",
        "mcp-protocol-version": SESSIONLESS_VERSION,
        "mcp-method": "tools/call",
        "mcp-name": "greet",
    }

    def call(rid: int, **more: Any) -> dict[str, Any]:
        params = {"name": "greet", "arguments": {}, "_meta": meta, **more}
        return {"jsonrpc": "2.0", "id": rid, "method": "tools/call", "params": params}

    async def post(client: httpx2.AsyncClient, body: dict[str, Any]) -> httpx2.Response:
        return await client.post(bridge_server.url, json=body, headers=headers)

    def result_of(response: httpx2.Response) -> dict[str, Any]:
        if response.headers["content-type"].startswith("text/event-stream"):
            data = [ln[5:].strip() for ln in response.text.splitlines() if ln.startswith("data:")]
            return dict(json.loads(data[-1]))
        return dict(response.json())

    async with httpx2.AsyncClient(timeout=10) as raw:
        first = result_of(await post(raw, call(1)))["result"]
        assert first["resultType"] == "input_required"
        [key] = first["inputRequests"]
        state = first["requestState"]
        answer = {key: {"action": "accept", "content": {"name": "Bo"}}}
        tampered = state[:-4] + ("AAAA" if not state.endswith("AAAA") else "BBBB")
        refused = await post(raw, call(2, inputResponses=answer, requestState=tampered))
        assert refused.status_code == 400
        assert refused.json()["error"]["data"]["reason"] == "request_state_invalid"
        other = call(3, inputResponses=answer, requestState=state)
        other["params"]["arguments"] = {"unexpected": 1}  # another request's state
        assert (await post(raw, other)).status_code == 400
        done = result_of(await post(raw, call(4, inputResponses=answer, requestState=state)))
        assert done["result"]["content"][0]["text"] == "hello Bo"
