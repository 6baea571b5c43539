"""The SDK bridge's contract with the official SDK: what it uses is there, at the tested
versions, and the ways it refuses are clear.

:func:`weir.app.sdk.check_sdk` runs at every :func:`~weir.app.sdk.from_sdk`; these
tests fail loudly when an SDK release moves an entry point the bridge calls (the
message names it), when the ``sdk`` extra's pin drifts from the tested range, or when
an object that is not an SDK server is offered.
"""

from __future__ import annotations

import importlib
import os
import tomllib
from pathlib import Path
from typing import Any

import pytest

if os.environ.get("WEIR_REQUIRE_SDK") != "1":
    pytest.importorskip("mcp")

from mcp.server.lowlevel.server import Server
from mcp.server.mcpserver import MCPServer

from weir.app import App, load_app
from weir.app.sdk import CONTRACT, TESTED_SDK, check_sdk, from_sdk, is_sdk_server

ROOT = Path(__file__).resolve().parents[1]


def _version_tuple(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in text.split(".")[:3] if p.isdigit())


def test_the_installed_sdk_fits_and_is_in_the_tested_range() -> None:
    version = _version_tuple(check_sdk())
    low, high = (_version_tuple(b.lstrip("<>=")) for b in TESTED_SDK)
    assert low <= version < high


def test_the_sdk_extra_pins_the_tested_range() -> None:
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    [pin] = extras["optional-dependencies"]["sdk"]
    assert pin.replace(" ", "") == "mcp" + ",".join(TESTED_SDK)


@pytest.mark.parametrize(("module", "attr", "params"), CONTRACT, ids=[c[1] for c in CONTRACT])
def test_every_entry_point_the_bridge_uses_exists(
    module: str, attr: str, params: tuple[str, ...]
) -> None:
    try:
        owner: Any = importlib.import_module(module)
    except ImportError:
        mod, _, cls = module.rpartition(".")
        owner = getattr(importlib.import_module(mod), cls)
    assert getattr(owner, attr, None) is not None, f"{module}.{attr}"


def test_a_moved_entry_point_is_named_in_the_refusal(monkeypatch: pytest.MonkeyPatch) -> None:
    import mcp.server.runner as runner

    monkeypatch.delattr(runner, "serve_one")
    with pytest.raises(
        RuntimeError, match=r"mcp\.server\.runner\.serve_one is gone.*tested: mcp>="
    ):
        from_sdk(MCPServer("x"))


def test_a_changed_signature_is_named_in_the_refusal(monkeypatch: pytest.MonkeyPatch) -> None:
    import mcp.server.runner as runner

    async def serve_one(server: Any, method: str) -> None:  # lost dctx, params, connection
        del server, method

    monkeypatch.setattr(runner, "serve_one", serve_one)
    with pytest.raises(RuntimeError, match="no longer takes dctx, params, connection"):
        from_sdk(MCPServer("x"))


def test_both_kinds_of_sdk_server_are_wrapped_and_others_refused() -> None:
    high = from_sdk(MCPServer("high", version="2"))
    assert isinstance(high, App) and (high.name, high.version) == ("high", "2")
    assert high.fallback_every_method and high.describe_fn is not None
    low = from_sdk(Server("low"))
    assert low.name == "low"
    with pytest.raises(TypeError, match="expected an mcp MCPServer or low-level Server"):
        from_sdk(object())

    class OldFastMCP:  # what a FastMCP on the 1.x SDK holds: another class entirely
        def __init__(self) -> None:
            self._mcp_server = object()

    with pytest.raises(TypeError, match=r"not an mcp 2\.x low-level Server"):
        from_sdk(OldFastMCP())
    assert is_sdk_server(OldFastMCP()) and not is_sdk_server(App("native"))


def test_weir_serve_finds_an_sdk_server_by_module_and_attribute() -> None:
    app = load_app("tests.integration.sdk_bridge_app:server")
    assert isinstance(app, App) and app.name == "sdk-bridge-test"
    described = app.describe_fn("2025-11-25") if app.describe_fn else {}
    assert described["serverInfo"]["version"] == "1.2.3"
    assert "tools" in described["capabilities"]
