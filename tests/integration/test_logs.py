"""What ``weir serve`` logs, read from a real server process's stderr, on both runtimes.

One access line per request with the right fields (text and JSON), a refusal's line
carrying its reason, never a raw session id anywhere; a store that goes away and
comes back logs one "lost" and one "recovered" line; a shutdown with a call running
logs the drain's start and how many calls it cancelled.  Waits are on what the
server writes (bounded), never on how long something takes.
"""

from __future__ import annotations

import base64
import json
import re
import signal
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import trio

from .conftest import ValkeyProcess
from .rawhttp import Client, call, initialize, raw_request
from .serverproc import WeirProcess
from .test_auth import ISSUER, RESOURCE, jwks, token

RUNTIMES = ("trio", "asyncio")
STAMP = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z"


async def wait_for(server: WeirProcess, done: Callable[[str], bool], what: str) -> str:
    """The server's stderr once ``done(stderr)`` (at most 20 s)."""
    with trio.move_on_after(20):
        while not done(server.stderr(limit=10**7)):
            await trio.sleep(0.05)
    text = server.stderr(limit=10**7)
    assert done(text), f"never saw {what}\n{server.output()}"
    return text


def access_lines(text: str, fmt: str) -> list[dict[str, Any]]:
    """The access lines in ``text``, as dicts of their fields."""
    out = []
    for line in text.splitlines():
        if fmt == "json":
            if line.startswith("{") and '"weir.access"' in line:
                out.append(json.loads(line))
        elif " weir.access: " in line:
            assert re.match(rf"^{STAMP} INFO \[main\] weir\.access: ", line), line
            _, _, rest = line.partition(" weir.access: ")
            method, path, *pairs = rest.split(" ")
            fields: dict[str, Any] = dict(p.split("=", 1) for p in pairs)
            fields.update(method=method, path=path, mcp_method=fields.pop("mcp"))
            fields["status"] = int(fields["status"])
            fields["bytes_sent"] = int(fields.pop("bytes"))
            fields["duration_ms"] = float(fields.pop("ms"))
            out.append(fields)
    return out


@pytest.mark.parametrize("fmt", ["text", "json"])
@pytest.mark.parametrize("runtime", RUNTIMES)
async def test_one_access_line_per_request_with_its_fields(runtime: str, fmt: str) -> None:
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        server = WeirProcess("demo", out, err, ("--log-format", fmt), driver=runtime)
        try:
            with trio.fail_after(30):
                c = await Client.connect(server.port)
                try:
                    sid = await initialize(c)  # initialize + notifications/initialized
                    echo = await c.request(
                        "POST", "/mcp", call(1, "echo", {"text": "hi"}), session=sid
                    )
                    assert echo.status == 200
                    gone = await c.request(
                        "POST", "/mcp", call(2, "echo", {"text": "x"}), session="nope"
                    )
                    assert gone.status == 404 and gone.reason == "session_not_found"
                finally:
                    await c.aclose()
                text = await wait_for(
                    server, lambda t: len(access_lines(t, fmt)) >= 4, "four access lines"
                )
        finally:
            server.stop()
        text = server.stderr(limit=10**7)
    lines = access_lines(text, fmt)
    assert [line["mcp_method"] for line in lines] == [
        "initialize",
        "notifications/initialized",
        "tools/call",
        "tools/call",
    ], text
    init, _, tool_call, refused = lines
    assert init["session"] == tool_call["session"]  # (the new session's line names it)
    assert tool_call["method"] == "POST" and tool_call["path"] == "/mcp"
    assert tool_call["tool"] == "echo" and tool_call["status"] == 200
    assert tool_call["reason"] == "-" and tool_call["bytes_sent"] > 0
    assert tool_call["duration_ms"] >= 0 and re.fullmatch(r"[0-9a-f]{12}", tool_call["session"])
    assert tool_call["principal"] == "-"  # (no authorization: nobody vouched)
    assert re.fullmatch(r"127\.0\.0\.1:\d+", tool_call["client"])
    assert refused["status"] == 404 and refused["reason"] == "session_not_found"
    assert refused["session"] not in ("-", tool_call["session"])
    # The session id is a bearer secret: never in the logs, in any form we wrote.
    assert sid not in text and "nope" not in text
    if fmt == "json":
        for line in text.splitlines():
            if line.startswith("{"):
                entry = json.loads(line)
                assert re.fullmatch(STAMP, entry["ts"]) and entry["worker"] == "main"


@pytest.mark.parametrize("runtime", RUNTIMES)
async def test_no_access_log_writes_no_access_line(runtime: str) -> None:
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        server = WeirProcess("demo", out, err, ("--no-access-log",), driver=runtime)
        try:
            with trio.fail_after(30):
                c = await Client.connect(server.port)
                try:
                    await initialize(c)
                finally:
                    await c.aclose()
        finally:
            server.stop()
        assert "weir.access" not in server.stderr(limit=10**7)


@pytest.mark.parametrize("runtime", RUNTIMES)
async def test_a_store_outage_logs_one_lost_and_one_recovered_line(
    runtime: str, private_valkey: ValkeyProcess
) -> None:
    # (--log-level info: the client library's own chatter must still stay out)
    args = ("--store", private_valkey.url, "--log-format", "json", "--log-level", "info")
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        server = WeirProcess("demo", out, err, args, driver=runtime)
        try:
            with trio.fail_after(60):
                c = await Client.connect(server.port)
                try:
                    await initialize(c)
                finally:
                    await c.aclose()
                private_valkey.stop()
                for _ in range(3):  # several requests fail: one "lost" line
                    c = await Client.connect(server.port)
                    try:
                        init = await c.request("POST", "/mcp", _init())
                        assert init.status == 503, init
                    finally:
                        await c.aclose()
                private_valkey.start()
                status, tries = 0, 0
                while status != 200 and tries < 200:  # until the client reconnects
                    tries += 1
                    c = await Client.connect(server.port)
                    try:
                        status = (await c.request("POST", "/mcp", _init())).status
                    finally:
                        await c.aclose()
                    if status != 200:
                        await trio.sleep(0.1)
                assert status == 200, server.output()
                await wait_for(server, lambda t: "store recovered" in t, "the recovery")
        finally:
            server.stop()
        text = server.stderr(limit=10**7)
        entries = [json.loads(line) for line in text.splitlines() if line.startswith("{")]
        events = [e.get("event") for e in entries if e["logger"] == "weir.ops"]
    assert not [e for e in entries if not e["logger"].startswith("weir")], text
    assert "NoneType: None" not in text
    assert events.count("store_connected") == 1, events
    assert events.count("store_lost") == 1, events
    assert events.count("store_recovered") == 1, events
    assert events.index("store_lost") < events.index("store_recovered")


def _init() -> dict[str, Any]:
    params = {
        "protocolVersion": "2025-06-18",
        "capabilities": {},
        "clientInfo": {"name": "logs-test", "version": "0"},
    }
    return {"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": params}


@pytest.mark.parametrize("runtime", RUNTIMES)
async def test_a_shutdown_with_a_call_running_logs_the_drain(runtime: str) -> None:
    args = ("--shutdown-grace", "1", "--log-format", "json")
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        server = WeirProcess("demo", out, err, args, driver=runtime)
        try:
            with trio.fail_after(30):
                c = await Client.connect(server.port)
                sid = await initialize(c)
                body = json.dumps(call(3, "countdown", {"seconds": 60})).encode()
                headers = {"mcp-session-id": sid}
                await c.send_raw(raw_request("POST", "/mcp", body=body, headers=headers))
                seen = b""
                while b"s left" not in seen:  # the call is running: it reported progress
                    chunk = await c.stream.receive_some(65536)
                    assert chunk, seen
                    seen += chunk
                server.proc.send_signal(signal.SIGINT)
                text = await wait_for(server, lambda t: "drain_done" in t, "the drain's end")
                await c.aclose()
        finally:
            server.stop()
    ops = [
        json.loads(line)
        for line in text.splitlines()
        if line.startswith("{") and '"weir.ops"' in line
    ]
    started = next(o for o in ops if o.get("event") == "drain_started")
    assert started["running"] == 1 and started["left_s"] == 1.0, ops
    done = next(o for o in ops if o.get("event") == "drain_done")
    assert done["cancelled"] == 1, ops
    assert sid not in text


@pytest.mark.parametrize("runtime", RUNTIMES)
async def test_workers_name_themselves_and_the_parent_logs_their_lives(
    runtime: str, valkey_url: str
) -> None:
    args = ("--workers", "2", "--store", valkey_url, "--replica-id", "r", "--log-format", "json")
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        server = WeirProcess("demo", out, err, args, driver=runtime)
        try:
            with trio.fail_after(60):
                for _ in range(4):
                    c = await Client.connect(server.port)
                    try:
                        await initialize(c)
                    finally:
                        await c.aclose()
                await wait_for(
                    server, lambda t: len(access_lines(t, "json")) >= 8, "eight access lines"
                )
            server.proc.send_signal(signal.SIGINT)  # (forwarded to every worker)
            assert server.proc.wait(30) == 0, server.output()
        finally:
            server.stop()
        text = server.stderr(limit=10**7)
    entries = [json.loads(line) for line in text.splitlines() if line.startswith("{")]
    assert {e["worker"] for e in entries if e["logger"] == "weir.access"} <= {"r-0", "r-1"}
    ops = [e for e in entries if e["logger"] == "weir.ops" and e["worker"] == "supervisor"]
    started = sorted(e["replica"] for e in ops if e["event"] == "worker_started")
    exited = sorted((e["replica"], e["status"]) for e in ops if e["event"] == "worker_exited")
    assert started == ["r-0", "r-1"], ops
    assert exited == [("r-0", 0), ("r-1", 0)], ops


@pytest.mark.parametrize("runtime", RUNTIMES)
async def test_a_principal_is_logged_hashed_and_a_refusal_with_its_reason(
    runtime: str, tmp_path: Path
) -> None:
    keys = tmp_path / "jwks.json"
    keys.write_text(json.dumps(jwks()))
    args = (
        "--auth-issuer", ISSUER, "--auth-resource", RESOURCE,
        "--auth-jwks-file", str(keys), "--auth-scope", "mcp", "--log-format", "json",
    )  # fmt: skip
    bearer = token("alice-in-the-logs")
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        server = WeirProcess("demo", out, err, args, driver=runtime)
        try:
            with trio.fail_after(30):
                c = await Client.connect(server.port)
                try:
                    refused = await c.request("POST", "/mcp", _init())
                    assert refused.status == 401
                    auth = {"authorization": f"Bearer {bearer}"}
                    served = await c.request("POST", "/mcp", _init(), headers=auth)
                    assert served.status == 200
                finally:
                    await c.aclose()
                text = await wait_for(
                    server, lambda t: len(access_lines(t, "json")) >= 2, "two access lines"
                )
        finally:
            server.stop()
    first, second = access_lines(text, "json")
    assert first["status"] == 401 and first["reason"] == refused.reason != "-", first
    assert first["principal"] == "-"
    assert second["status"] == 200 and re.fullmatch(r"[0-9a-f]{12}", second["principal"])
    assert "alice-in-the-logs" not in text and bearer not in text


@pytest.mark.parametrize("runtime", RUNTIMES)
async def test_replicas_sharing_keys_hash_a_session_alike(
    runtime: str, valkey_url: str, tmp_path: Path
) -> None:
    keys = tmp_path / "state.keys"
    keys.write_text(base64.b64encode(bytes(range(32))).decode() + "\n")
    args = ("--store", valkey_url, "--state-key-file", str(keys), "--log-format", "json")
    with (
        tempfile.TemporaryFile() as out_a,
        tempfile.TemporaryFile() as err_a,
        tempfile.TemporaryFile() as out_b,
        tempfile.TemporaryFile() as err_b,
    ):
        a = WeirProcess("demo", out_a, err_a, args, driver=runtime)
        b = WeirProcess("demo", out_b, err_b, args, driver="trio")
        try:
            with trio.fail_after(30):
                c = await Client.connect(a.port)
                try:
                    sid = await initialize(c)
                finally:
                    await c.aclose()
                c = await Client.connect(b.port)
                try:
                    echo = call(1, "echo", {"text": "elsewhere"})
                    assert (await c.request("POST", "/mcp", echo, session=sid)).status == 200
                finally:
                    await c.aclose()
                text_a = await wait_for(a, lambda t: len(access_lines(t, "json")) >= 2, "A's lines")
                text_b = await wait_for(b, lambda t: len(access_lines(t, "json")) >= 1, "B's line")
        finally:
            a.stop()
            b.stop()
    made = access_lines(text_a, "json")[0]
    used = access_lines(text_b, "json")[0]
    assert made["mcp_method"] == "initialize" and used["tool"] == "echo"
    assert made["session"] == used["session"] != "-"
    assert sid not in text_a + text_b


@pytest.mark.parametrize("runtime", RUNTIMES)
async def test_a_client_cannot_break_or_forge_an_access_line(runtime: str) -> None:
    forged = "x\n2026-01-01T00:00:00.000Z INFO [main] weir.access: GET /admin status=200"
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        server = WeirProcess("demo", out, err, (), driver=runtime)
        try:
            with trio.fail_after(30):
                c = await Client.connect(server.port)
                try:
                    sid = await initialize(c)
                    await c.request("POST", "/mcp", call(1, forged, {}), session=sid)
                finally:
                    await c.aclose()
                text = await wait_for(
                    server, lambda t: len(access_lines(t, "text")) >= 3, "three access lines"
                )
        finally:
            server.stop()
    lines = access_lines(text, "text")
    assert len(lines) == 3 and lines[2]["tool"].startswith("x?2026-01-01T00:00:00.000Z?INFO")
    assert not any(line.startswith("2026-01-01") for line in text.splitlines())
