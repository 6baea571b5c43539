"""``weir serve``'s request-state keys: from a file or the environment, never argv."""

from __future__ import annotations

import base64
from pathlib import Path

import pytest

from weir.common import new_key
from weir.engine.cli import _parser, config_from_args


def _config(*argv: str) -> tuple[bytes, ...]:
    return config_from_args(_parser().parse_args(["serve", "demo", *argv])).state_keys


def test_keys_come_from_a_file_first_seals(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    first, second = new_key(), new_key()
    path = tmp_path / "keys"
    path.write_text(f"{base64.b64encode(first).decode()}\n\n{base64.b64encode(second).decode()}\n")
    monkeypatch.setenv("WEIR_STATE_KEYS", base64.b64encode(new_key()).decode())
    assert _config("--state-key-file", str(path)) == (first, second)  # the file wins


def test_keys_come_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    key = new_key()
    monkeypatch.setenv("WEIR_STATE_KEYS", f" {base64.b64encode(key).decode()} ,")
    assert _config() == (key,)
    monkeypatch.delenv("WEIR_STATE_KEYS")
    assert _config() == ()  # none: the server draws a random one


def test_a_bad_key_or_file_is_a_clear_exit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WEIR_STATE_KEYS", "not-a-key")
    with pytest.raises(SystemExit, match=r"request-state keys: .*32 bytes"):
        _config()
    with pytest.raises(SystemExit, match="--state-key-file"):
        _config("--state-key-file", str(tmp_path / "missing"))
