"""``weir serve --reload``: an edit to the app's code is served without a restart by hand.

A real ``weir serve --reload`` process (both runtimes) serves an app from a temporary
folder; the test edits the file and polls the endpoint (bounded) until the new code
answers.
"""

from __future__ import annotations

import os
import signal
import tempfile
import time
from pathlib import Path

import pytest
import trio

from weir.engine._reload import serving_port

from .rawhttp import Client, call, initialize
from .runtimes import RUNTIMES
from .serverproc import WeirProcess
from .test_cli_startup import one_line_failure, weir

APP = """
from weir.app import App

app = App("reloaded", "0.0.0")


@app.tool()
async def version() -> str:
    '''The version of this code.'''
    return "{answer}"
"""


async def _answer(port: int) -> str | None:
    """What the ``version`` tool says now, or None while no server answers."""
    try:
        c = await Client.connect(port)
    except OSError:  # (between two children)
        return None
    try:
        sid = await initialize(c)
        reply = await c.request("POST", "/mcp", call(1, "version", {}), session=sid)
        text: str = reply.json()["result"]["content"][0]["text"]
        return text
    except Exception:  # (the old child stopping under us)
        return None
    finally:
        await c.aclose()


@RUNTIMES
async def test_an_edit_is_served_by_the_new_code(
    runtime: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("WEIR_MAX_SESION", "1")  # a typo: warned about once, not per child
    module = tmp_path / "reloadme.py"
    module.write_text(APP.format(answer="one"))
    args = ["--app-dir", str(tmp_path), "--reload"]
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        server = WeirProcess("reloadme:app", out, err, args, driver=runtime)
        try:
            with trio.fail_after(30):
                assert await _answer(server.port) == "one"
            module.write_text(APP.format(answer="two"))
            later = time.time() + 2  # (a distinct mtime even on a coarse clock)
            os.utime(module, (later, later))
            with trio.fail_after(60):
                while (said := await _answer(server.port)) != "two":
                    assert said in (None, "one"), said
                    await trio.sleep(0.2)
            stderr = server.stderr()
            assert "weir: reloading (" in stderr, stderr
            assert stderr.count("$WEIR_MAX_SESION") == 1, stderr
            server.proc.send_signal(signal.SIGINT)
            assert server.proc.wait(20) == 0, server.output()
        finally:
            server.stop()


def test_reload_with_workers_is_refused(tmp_path: Path) -> None:
    done = weir(tmp_path, "serve", "--reload", "--workers", "2", "--port", "0")
    assert one_line_failure(done) == (
        "weir: --reload runs one server process: not with --workers > 1"
    )


def test_a_first_start_that_fails_ends_the_supervisor(tmp_path: Path) -> None:
    (tmp_path / "broken.py").write_text("raise RuntimeError('not today')\n")
    done = weir(tmp_path, "serve", "broken:app", "--reload", "--port", "0")
    assert one_line_failure(done).startswith("weir: loading 'broken:app' failed: RuntimeError")


def test_the_supervisor_reads_the_port_or_the_socket_a_child_serves_on() -> None:
    assert serving_port("weir: serving http://127.0.0.1:8123/mcp\n") == 8123
    assert serving_port("weir: serving https://[::1]:443/x\n") == 443
    assert serving_port("weir: serving unix:/run/weir.sock\n") == -1
    assert serving_port("weir: shutting down\n") is None
