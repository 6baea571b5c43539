"""The nginx, HAProxy and Caddy configurations of docs/proxies.md, run for real.

Each proxy is started with the exact text of the docs' ``tested`` code block (only
its ports changed to free loopback ones), in front of two ``weir serve`` processes
(its ``weir`` pool and its ``weir_tools`` pool for sessionless ``tools/call``), each
trusting the proxy (``--forwarded-allow-ips 127.0.0.1``) and allowing only the
public name ``mcp.example.com`` besides loopback.  Through it: a session-era call
answered over SSE, and a sessionless call routed on ``Mcp-Method``.  The docs and
the test cannot drift: the blocks are read from the docs.

Skipped, saying so, when the proxy's binary is not installed (``apt-get install
nginx-light haproxy caddy``; ``.ci/run`` installs them, so CI never skips).  Caddy's
block names a public site (automatic HTTPS); here it is served over plain HTTP on a
loopback port, with Caddy's admin endpoint off.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import pytest
import trio

from .rawhttp import INIT_PARAMS, Client, call, raw_request
from .serverproc import REPO_ROOT, WeirProcess

DOCS = REPO_ROOT / "docs" / "proxies.md"
_BLOCK = re.compile(r"^```(\w+) tested\n(.*?)^```$", re.DOTALL | re.MULTILINE)
_PATH = os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/sbin"])
PUBLIC = "mcp.example.com"
V = "2026-07-28"
META = {
    "io.modelcontextprotocol/protocolVersion": V,
    "io.modelcontextprotocol/clientCapabilities": {},
}


def documented(kind: str) -> str:
    """The one ``tested`` code block of ``kind`` in docs/proxies.md."""
    blocks = [m.group(2) for m in _BLOCK.finditer(DOCS.read_text()) if m.group(1) == kind]
    assert len(blocks) == 1, f"docs/proxies.md needs exactly one '```{kind} tested' block"
    return blocks[0]


def _binary(name: str) -> str:
    found = shutil.which(name, path=_PATH)
    if found is None:
        pytest.skip(f"{name} is not installed (apt-get install -y nginx-light haproxy caddy)")
    return found


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _replace_once(text: str, old: str, new: str) -> str:
    assert text.count(old) == 1, f"the documented config should hold {old!r} once"
    return text.replace(old, new)


def _ported(text: str, kind: str, listen: int, weir: int, tools: int) -> str:
    text = _replace_once(text, "127.0.0.1:8000", f"127.0.0.1:{weir}")
    text = _replace_once(text, "127.0.0.1:8001", f"127.0.0.1:{tools}")
    if kind == "nginx":
        return _replace_once(text, "listen 8080;", f"listen 127.0.0.1:{listen};")
    if kind == "caddy":
        site = f"http://{PUBLIC}:{listen} {{\n    bind 127.0.0.1"
        text = _replace_once(text, f"{PUBLIC} {{", site)
        return "{\n    auto_https off\n    admin off\n}\n" + text
    return _replace_once(text, "bind :8080", f"bind 127.0.0.1:{listen}")


@contextmanager
def proxy(kind: str, tmp: Path, listen: int, weir: int, tools: int) -> Iterator[None]:
    """The documented ``kind`` proxy on 127.0.0.1:``listen``, until the block ends."""
    binary = _binary(kind)
    config = _ported(documented(kind), kind, listen, weir, tools)
    env = None
    if kind == "nginx":
        # The docs' file is one for conf.d/: included in a minimal nginx.conf whose
        # paths are the test's own (the pid, logs and temporary files).
        (tmp / "weir.conf").write_text(config)
        temps = "".join(
            f"    {what}_temp_path {tmp}/{what};\n"
            for what in ("client_body", "proxy", "fastcgi", "scgi", "uwsgi")
        )
        (tmp / "nginx.conf").write_text(
            f"daemon off;\npid {tmp}/nginx.pid;\nerror_log {tmp}/error.log;\n"
            f"events {{}}\nhttp {{\n    access_log off;\n{temps}"
            f"    include {tmp}/weir.conf;\n}}\n"
        )
        argv = [binary, "-p", str(tmp), "-e", f"{tmp}/error.log", "-c", f"{tmp}/nginx.conf"]
        check = [*argv, "-t"]
    elif kind == "caddy":
        (tmp / "Caddyfile").write_text(config)
        # Caddy keeps its state under $HOME / $XDG_*: the test's own directory.
        env = {**os.environ, "HOME": str(tmp), "XDG_DATA_HOME": str(tmp / "data")}
        env["XDG_CONFIG_HOME"] = str(tmp / "config")
        flags = ["--config", f"{tmp}/Caddyfile", "--adapter", "caddyfile"]
        argv = [binary, "run", *flags]
        check = [binary, "validate", *flags]
    else:
        (tmp / "haproxy.cfg").write_text(config)
        argv = [binary, "-db", "-f", f"{tmp}/haproxy.cfg"]
        check = [*argv, "-c"]
    checked = subprocess.run(check, capture_output=True, env=env)
    assert checked.returncode == 0, checked.stderr.decode(errors="replace")
    log = (tmp / f"{kind}.out").open("wb")
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log, env=env)
    try:
        deadline = time.monotonic() + 10
        for _ in range(400):  # until it accepts (bounded in count and time)
            assert proc.poll() is None, (tmp / f"{kind}.out").read_text(errors="replace")
            try:
                socket.create_connection(("127.0.0.1", listen), timeout=1).close()
                break
            except OSError:
                assert time.monotonic() < deadline, f"{kind} did not listen within 10 s"
                time.sleep(0.025)
        yield
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


def _requests_seen(server: WeirProcess) -> int:
    """How many requests ``server`` logged (``weir.requests``, at DEBUG)."""
    return server.stderr(limit=10**6).count("weir.requests: POST '/mcp' from client ")


@pytest.mark.parametrize("runtime", ["trio", "asyncio"])
@pytest.mark.parametrize("kind", ["nginx", "haproxy", "caddy"])
async def test_the_documented_proxy_serves_both_eras(
    kind: str, runtime: str, tmp_path: Path
) -> None:
    _binary(kind)
    args = ["--forwarded-allow-ips", "127.0.0.1", "--allow-host", PUBLIC, "--log-level", "debug"]
    with ExitStack() as stack:
        servers = []
        for name in ("weir", "tools"):
            out = stack.enter_context((tmp_path / f"{name}.out").open("w+b"))
            err = stack.enter_context((tmp_path / f"{name}.err").open("w+b"))
            server = WeirProcess("demo", out, err, args, driver=runtime)
            stack.callback(server.stop)
            servers.append(server)
        weir, tools = servers
        listen = _free_port()
        stack.enter_context(proxy(kind, tmp_path, listen, weir.port, tools.port))
        host = f"{PUBLIC}:{listen}"
        with trio.fail_after(60):
            c = await Client.connect(listen)
            try:
                # The session era: initialize, then a call answered over SSE.
                init = {"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": INIT_PARAMS}
                await c.send_raw(raw_request("POST", "/mcp", body=_body(init), host=host))
                reply = await c.read_reply()
                assert reply.status == 200, (reply, weir.output())
                sid = reply.headers["mcp-session-id"]
                session = {"mcp-session-id": sid}
                note = {"jsonrpc": "2.0", "method": "notifications/initialized"}
                await c.send_raw(
                    raw_request("POST", "/mcp", body=_body(note), host=host, headers=session)
                )
                assert (await c.read_reply()).status == 202
                echo = call(1, "echo", {"text": "through the proxy"})
                await c.send_raw(
                    raw_request("POST", "/mcp", body=_body(echo), host=host, headers=session)
                )
                reply = await c.read_reply()
                assert reply.status == 200, reply
                assert reply.headers["content-type"].startswith("text/event-stream"), reply
                assert "through the proxy" in str(reply.json()["result"]), reply
                seen_before = _requests_seen(tools)
                # The sessionless era, routed to the tools pool on Mcp-Method.
                bare = call(2, "echo", {"text": "sessionless"})
                bare["params"]["_meta"] = META
                head = {"mcp-protocol-version": V, "mcp-method": "tools/call", "mcp-name": "echo"}
                await c.send_raw(
                    raw_request("POST", "/mcp", body=_body(bare), host=host, headers=head)
                )
                reply = await c.read_reply()
                assert reply.status == 200, (reply, tools.output())
                assert "sessionless" in str(reply.json()["result"]), reply
            finally:
                await c.aclose()
        assert _requests_seen(tools) == seen_before + 1, tools.output()
        assert _requests_seen(weir) == 3, weir.output()


def _body(message: object) -> bytes:
    return json.dumps(message).encode()
