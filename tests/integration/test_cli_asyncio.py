"""``weir serve --runtime asyncio``: every ``serve`` option, served as on Trio.

Every ``serve`` option is served by the asyncio runtime as the Trio path serves it;
a test keeps the runtime's list of served options equal to the parser's, so that an
option added later is never silently ignored by it.  The server runs as a real
process on a loopback port (``weir serve --runtime asyncio``).
"""

from __future__ import annotations

import base64
import importlib.util
import json
import signal
import socket
import tempfile
import time
from pathlib import Path

import pytest
import trio

from weir.common import StateSealer, new_key
from weir.engine._cli_asyncio import SERVED, TRIO_ONLY
from weir.engine.cli import _parser

from .rawhttp import INIT_PARAMS, Client, call, initialize
from .serverproc import WeirProcess
from .test_cli_startup import MYAPP, one_line_failure, weir


def _serve_dests() -> set[str]:
    parser = _parser()
    (sub,) = [a for a in parser._actions if a.dest == "command"]
    serve = sub.choices["serve"]  # type: ignore[index]
    return {a.dest for a in serve._actions if a.dest != "help"}


def test_every_serve_option_is_served_by_the_asyncio_runtime() -> None:
    dests = _serve_dests()
    classified = SERVED | TRIO_ONLY
    assert not SERVED & TRIO_ONLY
    assert dests == classified, (
        f"not classified for the asyncio runtime: {sorted(dests - classified)}; "
        f"gone from the parser: {sorted(classified - dests)}"
    )


@pytest.mark.parametrize("given", ["env", "file"])
async def test_the_state_keys_it_is_given_seal_its_request_state(
    given: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """$WEIR_STATE_KEYS and --state-key-file are served: a sessionless round's
    ``requestState`` opens with the key given (so replicas sharing it could open it)."""
    key = new_key()
    text = base64.b64encode(key).decode()
    args: list[str] = []
    monkeypatch.delenv("WEIR_STATE_KEYS", raising=False)
    if given == "env":
        monkeypatch.setenv("WEIR_STATE_KEYS", text)
    else:
        (tmp_path / "keys").write_text(text + "\n")
        args = ["--state-key-file", str(tmp_path / "keys")]
    meta = {
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": {"elicitation": {}},
    }
    params = {"name": "test_elicitation", "arguments": {"message": "ok?"}, "_meta": meta}
    message = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": params}
    headers = {
        "mcp-protocol-version": "2026-07-28",
        "mcp-method": "tools/call",
        "mcp-name": "test_elicitation",
    }
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        server = WeirProcess("conformance", out, err, args, driver="asyncio")
        try:
            with trio.fail_after(30):
                c = await Client.connect(server.port)
                try:
                    reply = await c.request("POST", "/mcp", message, headers=headers)
                finally:
                    await c.aclose()
        finally:
            server.stop()
    result = reply.json()["result"]
    assert result["resultType"] == "input_required", result
    assert StateSealer([key]).open(result["requestState"]) is not None
    assert StateSealer([new_key()]).open(result["requestState"]) is None


def test_a_store_that_does_not_answer_is_a_one_line_start_up_failure(tmp_path: Path) -> None:
    """``--store`` is served: a store nobody listens on fails the start, in one line."""
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        port = unused.getsockname()[1]  # (closed before the server tries it)
    done = weir(tmp_path, "serve", "--runtime", "asyncio", "--store", f"redis://127.0.0.1:{port}/0")
    assert done.returncode == 1
    line = one_line_failure(done)
    assert line.startswith("weir: --store: the store did not answer"), line
    assert "--runtime asyncio refuses" not in line


def test_start_up_failures_are_one_line_as_on_trio(tmp_path: Path) -> None:
    (tmp_path / "myapp.py").write_text(MYAPP)
    done = weir(tmp_path, "serve", "--runtime", "asyncio", "myapp:app", "--port", "0")
    assert one_line_failure(done) == (
        "weir: the app's lifespan failed at start-up: RuntimeError: myapp's database is unreachable"
    )
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        done = weir(tmp_path, "serve", "--runtime", "asyncio", "--port", str(port))
    line = one_line_failure(done)
    assert line.startswith(f"weir: cannot listen on 127.0.0.1:{port}: the port is in use")


def test_a_lifespan_that_never_finishes_starting_is_cut_and_named(tmp_path: Path) -> None:
    (tmp_path / "slow.py").write_text(
        "import asyncio, contextlib\nfrom weir.app import App\napp = App('slow')\n\n"
        "@app.lifespan\n@contextlib.asynccontextmanager\nasync def opened(served):\n"
        "    await asyncio.Event().wait()\n    yield\n"
    )
    done = weir(tmp_path, "serve", "--runtime", "asyncio", "slow:app", "--startup-timeout", "0.5")
    line = one_line_failure(done)
    assert "did not finish starting within 0.5 s" in line and "--startup-timeout" in line


#: Options the asyncio runtime serves, as the Trio path does.
SERVED_ARGS = (
    "--path", "/x",
    "--max-sessions", "2",
    "--json-response",
    "--allow-host", "mcp.example.test",
    "--max-batch", "2",
    "--session-idle-timeout", "0",
    "--max-body-bytes", "4096",
    "--store", "memory", "--workers", "1", "--resume", "pinned",
    "--retry-window", "0", "--shutdown-grace", "0",
)  # fmt: skip


async def test_it_serves_the_options_it_accepts_and_stops_cleanly_on_a_signal() -> None:
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        server = WeirProcess("demo", out, err, SERVED_ARGS, driver="asyncio")
        try:
            assert server.url.endswith("/x")
            with trio.fail_after(30):
                c = await Client.connect(server.port)
                try:
                    sid = await initialize(c, "/x")
                    # --json-response: JSON, though the client accepts SSE too.
                    echo = await c.request(
                        "POST", "/x", call(1, "echo", {"text": "hi"}), session=sid
                    )
                    assert echo.status == 200, echo
                    assert echo.headers["content-type"] == "application/json"
                    assert echo.json()["result"]["content"][0]["text"] == "hi"
                    # --max-batch 2 (2025-03-26 allows batches).
                    ping = {"jsonrpc": "2.0", "method": "ping"}
                    batch = [{**ping, "id": i} for i in range(3)]
                    hdr = {"mcp-protocol-version": "2025-03-26"}
                    too_many = await c.request("POST", "/x", batch, session=sid, headers=hdr)
                    assert too_many.status == 400 and too_many.reason == "batch_too_large"
                    # --max-body-bytes 4096
                    big = await c.request("POST", "/x", call(2, "echo", {"text": "a" * 5000}))
                    assert big.status == 413
                finally:
                    await c.aclose()
                # --max-sessions 2: the second fits, the third is 503 session_limit.
                c = await Client.connect(server.port)
                try:
                    await initialize(c, "/x")
                    init = {"jsonrpc": "2.0", "id": 0, "method": "initialize"}
                    third = await c.request("POST", "/x", {**init, "params": INIT_PARAMS})
                    assert third.status == 503 and third.reason == "session_limit"
                finally:
                    await c.aclose()
                # --allow-host: a Host named there passes the check, another is 403.
                for host, refused in (("mcp.example.test", False), ("evil.test", True)):
                    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as s:
                        s.sendall(f"GET /x HTTP/1.1\r\nhost: {host}\r\n\r\n".encode())
                        status = s.recv(65536).split(b" ", 2)[1]
                    assert (status == b"403") is refused, (host, status)
            # A keep-alive connection still open at the signal ends with the server,
            # quietly (no handler left to be cancelled by the loop's teardown).
            with socket.create_connection(("127.0.0.1", server.port), timeout=10) as idle:
                idle.sendall(b"GET /x HTTP/1.1\r\nhost: 127.0.0.1\r\n\r\n")
                assert idle.recv(65536).startswith(b"HTTP/1.1 4")
                server.proc.send_signal(signal.SIGTERM)
                assert server.proc.wait(10) == 0
            stderr = server.stderr()
            # uvloop when it can be imported (the 'asyncio' extra), asyncio's own otherwise.
            loop = "uvloop" if importlib.util.find_spec("uvloop") else "asyncio"
            assert f"weir: runtime asyncio, event loop {loop}" in stderr, stderr
            assert "Traceback" not in stderr, stderr
        finally:
            server.stop()


def test_at_a_signal_a_listen_stream_gets_its_final_result() -> None:
    """A ``subscriptions/listen`` stream open at SIGTERM ends as on the Trio engine:
    the subscription's final result (``resultType: complete``, its id), then the end
    of the stream -- not a cut connection."""
    meta = {
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": {},
    }
    params = {"notifications": {"toolsListChanged": True}, "_meta": meta}
    body = json.dumps(
        {"jsonrpc": "2.0", "id": "sub-1", "method": "subscriptions/listen", "params": params}
    ).encode()
    head = (
        "POST /mcp HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\n"
        "accept: application/json, text/event-stream\r\nmcp-protocol-version: 2026-07-28\r\n"
        f"mcp-method: subscriptions/listen\r\ncontent-length: {len(body)}\r\n\r\n"
    )
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        server = WeirProcess("conformance", out, err, driver="asyncio")
        try:
            with socket.create_connection(("127.0.0.1", server.port), timeout=10) as s:
                s.sendall(head.encode() + body)
                seen = b""
                for _ in range(100):
                    if b"acknowledged" in seen:
                        break
                    seen += s.recv(65536)
                assert b"acknowledged" in seen, seen
                server.proc.send_signal(signal.SIGTERM)
                for _ in range(100):
                    chunk = s.recv(65536)
                    if not chunk:
                        break
                    seen += chunk
            assert server.proc.wait(10) == 0
        finally:
            server.stop()
    assert b'"resultType":"complete"' in seen, seen
    assert b'"io.modelcontextprotocol/subscriptionId":"sub-1"' in seen, seen
    assert seen.endswith(b"0\r\n\r\n"), seen  # the chunked stream's end


def test_sigint_stops_it_cleanly() -> None:
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        server = WeirProcess("demo", out, err, driver="asyncio")
        try:
            server.proc.send_signal(signal.SIGINT)
            assert server.proc.wait(10) == 0
            assert "Traceback" not in server.stderr()
        finally:
            server.stop()


def test_serve_help_names_the_runtimes() -> None:
    (sub,) = [a for a in _parser()._actions if a.dest == "command"]
    text = " ".join(sub.choices["serve"].format_help().split())  # type: ignore[index]
    assert "--runtime {trio,asyncio}" in text
    assert "refuses the options it does not serve" in text


def test_a_second_signal_cuts_a_stuck_shutdown_short(tmp_path: Path) -> None:
    (tmp_path / "stuck.py").write_text(
        "import asyncio, contextlib\nfrom weir.app import App\napp = App('stuck')\n\n"
        "@app.lifespan\n@contextlib.asynccontextmanager\nasync def opened(served):\n"
        "    yield\n    print('weir-test: lifespan exiting', flush=True)\n"
        "    await asyncio.Event().wait()  # never finishes on its own\n"
    )
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        server = WeirProcess("stuck:app", out, err, ("--app-dir", str(tmp_path)), driver="asyncio")
        try:
            server.proc.send_signal(signal.SIGTERM)
            for _ in range(200):  # until the lifespan's exit has begun (bounded: 10 s)
                if "weir-test: lifespan exiting" in server.output():
                    break
                time.sleep(0.05)
            assert "weir-test: lifespan exiting" in server.output()
            assert server.proc.poll() is None  # stuck, as the app wants
            server.proc.send_signal(signal.SIGTERM)
            assert server.proc.wait(10) == 0
            assert "Traceback" not in server.stderr(), server.stderr()
        finally:
            server.stop()


def test_a_trio_only_option_is_refused_on_asyncio_not_ignored(tmp_path: Path) -> None:
    """``--park-idle-after 5 --runtime asyncio``: one clear line, status 2; 0 and the
    default are accepted (idle connections keep their task on asyncio)."""
    from weir.engine import ServerConfig
    from weir.engine._cli_asyncio import asyncio_config

    with pytest.raises(ValueError, match="park-idle-after is the Trio runtime"):
        asyncio_config(ServerConfig(park_idle_after=5.0), 10.0)
    asyncio_config(ServerConfig(park_idle_after=0), 10.0)
    asyncio_config(ServerConfig(), 10.0)
    (tmp_path / "plainapp.py").write_text('from weir.app import App\napp = App("plain")\n')
    done = weir(
        tmp_path,
        "serve",
        "plainapp:app",
        "--port",
        "0",
        "--runtime",
        "asyncio",
        "--park-idle-after",
        "5",
    )
    assert done.returncode == 2
    assert one_line_failure(done).startswith("weir: --park-idle-after is the Trio runtime's")
