"""``WEIR_*`` environment variables for every ``weir serve`` option.

Each option has a variable named after it, generated from the parser (so an option
added later has one too); the command line wins over the environment, the environment
over the default; a value that does not convert is one line naming the variable; a
misspelt variable is a warning naming the option meant.  Real processes on loopback
ports (both runtimes), and ``--workers`` children on a real Valkey store.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import pytest
import trio

from weir.engine._cli_env import overlay, typos, variable
from weir.engine.cli import _parser, _serve_parser

from .rawhttp import Client, call, initialize
from .runtimes import RUNTIMES
from .serverproc import WeirProcess
from .test_cli_startup import one_line_failure, weir


def _parsed(argv: list[str], environ: dict[str, str]) -> argparse.Namespace:
    top = _parser()
    args = top.parse_args(argv)
    overlay(top, _serve_parser(top), args, argv, environ)
    return args


def test_every_option_has_its_variable_in_the_help() -> None:
    serve = _serve_parser(_parser())
    shown = " ".join(serve.format_help().split())
    for action in serve._actions:
        if action.dest == "help" or action.help is argparse.SUPPRESS:
            continue
        assert f"[env: {variable(action)}]" in (action.help or ""), action.dest
        assert f"[env: {variable(action)}]" in shown, action.dest
    assert variable(next(a for a in serve._actions if a.dest == "max_sessions")) == (
        "WEIR_MAX_SESSIONS"
    )


def test_the_command_line_reference_lists_every_option_with_its_variable() -> None:
    """docs/cli.md promises every option: one added later must be documented there."""
    text = (Path(__file__).resolve().parents[2] / "docs" / "cli.md").read_text()
    serve = _serve_parser(_parser())
    missing = [
        f"{action.option_strings[0]} ({variable(action)})"
        for action in serve._actions
        if action.option_strings
        and action.dest != "help"
        and action.help is not argparse.SUPPRESS
        and (f"`{action.option_strings[0]}`" not in text or f"`{variable(action)}`" not in text)
    ]
    assert not missing, f"not in docs/cli.md: {missing}"


def test_command_line_then_environment_then_default() -> None:
    env = {"WEIR_MAX_SESSIONS": "7", "WEIR_PATH": "/env", "WEIR_APP": "conformance"}
    args = _parsed(["serve", "--max-sessions", "3"], env)
    assert (args.max_sessions, args.path, args.app) == (3, "/env", "conformance")
    assert args.max_batch == _parsed(["serve"], {}).max_batch  # the default
    assert _parsed(["serve", "demo"], env).app == "demo"
    # (an empty value is unset)
    assert _parsed(["serve"], {"WEIR_PATH": ""}).path == "/mcp"


@pytest.mark.parametrize(
    ("text", "on"), [("1", True), ("TRUE", True), ("yes", True), ("0", False), ("no", False)]
)
def test_flags(text: str, on: bool) -> None:
    assert _parsed(["serve"], {"WEIR_JSON_RESPONSE": text}).json_response is on
    # the command line's flag wins over the environment's "off"
    assert _parsed(["serve", "--json-response"], {"WEIR_JSON_RESPONSE": text}).json_response


def test_repeatable_options_take_a_list_and_the_command_line_replaces_it() -> None:
    env = {"WEIR_ALLOW_HOST": "a.test, b.test"}
    assert _parsed(["serve"], env).allow_host == ["a.test", "b.test"]
    assert _parsed(["serve", "--allow-host", "c.test"], env).allow_host == ["c.test"]


@pytest.mark.parametrize(
    ("name", "value", "said"),
    [
        ("WEIR_MAX_SESSIONS", "many", "weir: $WEIR_MAX_SESSIONS='many': not an integer"),
        ("WEIR_DRAIN_WINDOW", "soon", "weir: $WEIR_DRAIN_WINDOW='soon': not a number"),
        (
            "WEIR_RESUME",
            "always",
            "weir: $WEIR_RESUME='always': must be one of shared, pinned, off",
        ),
        (
            "WEIR_JSON_RESPONSE",
            "maybe",
            "weir: $WEIR_JSON_RESPONSE='maybe': expected 1/true/yes/on or 0/false/no/off",
        ),
        ("WEIR_PORT", "70000", "weir: --port must be 0..65535, got 70000 (set by $WEIR_PORT)"),
    ],
)
def test_a_bad_value_is_one_line_naming_the_variable(
    name: str, value: str, said: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(name, value)
    done = weir(tmp_path, "serve")
    assert one_line_failure(done) == said
    assert done.returncode == 1


def test_a_misspelt_variable_is_a_warning_naming_the_option() -> None:
    serve = _serve_parser(_parser())
    env = {"WEIR_MAX_SESION": "3", "WEIR_STATE_KEYS": "", "WEIR_CONFORMANCE_NODE": "x"}
    assert typos(serve, env) == {
        "WEIR_MAX_SESION": "weir: WARNING: $WEIR_MAX_SESION is not a weir setting (ignored); "
        "did you mean $WEIR_MAX_SESSIONS (--max-sessions)?"
    }


@RUNTIMES
async def test_a_server_serves_what_its_environment_says(
    runtime: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("WEIR_PATH", "/from-env")
    monkeypatch.setenv("WEIR_JSON_RESPONSE", "yes")
    monkeypatch.setenv("WEIR_MAX_SESSIO", "1")  # a typo: warned about, not applied
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        server = WeirProcess("demo", out, err, driver=runtime)
        try:
            assert server.url.endswith("/from-env"), server.url
            with trio.fail_after(30):
                c = await Client.connect(server.port)
                try:
                    sid = await initialize(c, "/from-env")
                    await initialize(c, "/from-env")  # (a second session: no limit of 1)
                    reply = await c.request(
                        "POST", "/from-env", call(1, "echo", {"text": "hi"}), session=sid
                    )
                    assert reply.headers["content-type"] == "application/json", reply
                finally:
                    await c.aclose()
            assert "did you mean $WEIR_MAX_SESSIONS (--max-sessions)?" in server.stderr()
        finally:
            server.stop()


@RUNTIMES
async def test_workers_serve_the_configuration_the_environment_gives_their_parent(
    runtime: str, valkey_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # --workers and --store from the environment; each child's own --workers 1 (on its
    # command line) wins over the WEIR_WORKERS it inherits, and its path is the parent's.
    monkeypatch.setenv("WEIR_WORKERS", "2")
    monkeypatch.setenv("WEIR_STORE", valkey_url)
    monkeypatch.setenv("WEIR_PATH", "/w")
    monkeypatch.setenv("WEIR_JSON_RESPONSE", "1")
    monkeypatch.setenv("WEIR_MAX_SESION", "1")  # a typo: warned about once, by the parent
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        server = WeirProcess("demo", out, err, driver=runtime)
        try:
            assert server.url.endswith("/w"), server.url
            with trio.fail_after(60):
                first = await Client.connect(server.port)
                try:
                    sid = await initialize(first, "/w")
                finally:
                    await first.aclose()
                for i in range(4):  # a connection each: both workers answer
                    c = await Client.connect(server.port)
                    try:
                        reply = await c.request(
                            "POST", "/w", call(i, "echo", {"text": "x"}), session=sid
                        )
                        assert reply.status == 200, reply
                        assert reply.headers["content-type"] == "application/json", reply
                    finally:
                        await c.aclose()
            assert server.stderr().count("$WEIR_MAX_SESION") == 1, server.stderr()
        finally:
            server.stop()
