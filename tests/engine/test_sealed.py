"""StateSealer: what a client holds between rounds, and every way it can fail to open."""

from __future__ import annotations

import base64

import pytest
from hypothesis import given
from hypothesis import strategies as st

from weir.common import MAX_STATE, StateSealer, new_key, parse_key

CLAIMS = {"b": "binding", "a": {"user_name": {"action": "accept", "content": {"name": "Ada"}}}}


def test_a_sealed_state_opens_to_its_claims_and_reveals_nothing() -> None:
    sealer = StateSealer([new_key()])
    token = sealer.seal(CLAIMS, now=1000.0)
    opened = sealer.open(token, now=1001.0)
    assert opened is not None and opened["a"] == CLAIMS["a"] and opened["b"] == "binding"
    assert "Ada" not in token and "binding" not in token
    assert sealer.seal(CLAIMS, now=1000.0) != token  # a fresh nonce every time


@given(st.integers(min_value=0, max_value=400), st.sampled_from("AZaz09-_"))
def test_any_changed_character_fails_to_open(position: int, replacement: str) -> None:
    sealer = StateSealer([bytes(32)])
    token = sealer.seal(CLAIMS, now=0.0)
    i = position % len(token)
    changed = token[:i] + replacement + token[i + 1 :]
    if changed != token:
        assert sealer.open(changed, now=1.0) is None


@pytest.mark.parametrize("suffix", ["-TAMPERED", "=", "!", " "])
def test_a_suffix_fails_to_open(suffix: str) -> None:
    sealer = StateSealer([new_key()])
    assert sealer.open(sealer.seal(CLAIMS, now=0.0) + suffix, now=1.0) is None


def test_expiry_another_key_and_garbage_fail_to_open() -> None:
    sealer = StateSealer([new_key()], ttl=60.0)
    token = sealer.seal(CLAIMS, now=0.0)
    assert sealer.open(token, now=59.0) is not None
    assert sealer.open(token, now=61.0) is None  # expired
    assert StateSealer([new_key()]).open(token, now=1.0) is None  # another server's
    for junk in ("", "w1.", "w1.deadbeef.", "w1.deadbeef.AAAA", "x" * 100, "w1." + "A" * MAX_STATE):
        assert sealer.open(junk, now=1.0) is None


def test_keys_rotate_the_first_seals_and_every_one_opens() -> None:
    old, new = new_key(), new_key()
    token = StateSealer([old]).seal(CLAIMS, now=0.0)
    rotated = StateSealer([new, old])
    assert rotated.open(token, now=1.0) is not None  # still opens with the old key
    assert StateSealer([new]).open(rotated.seal(CLAIMS, now=0.0), now=1.0) is not None
    assert StateSealer([old]).open(rotated.seal(CLAIMS, now=0.0), now=1.0) is None


def test_a_state_too_large_to_carry_is_refused_when_sealed() -> None:
    sealer = StateSealer([new_key()])
    with pytest.raises(ValueError, match="exceed"):
        sealer.seal({"a": {"k": "x" * MAX_STATE}}, now=0.0)


def test_keys_are_configured_as_base64_of_32_bytes() -> None:
    key = new_key()
    assert parse_key(base64.b64encode(key).decode()) == key
    assert parse_key(base64.urlsafe_b64encode(key).decode()) == key
    for bad in ("", "short", base64.b64encode(bytes(16)).decode(), "!!!!"):
        with pytest.raises(ValueError, match="32 bytes"):
            parse_key(bad)
    with pytest.raises(ValueError):
        StateSealer([])


def test_a_second_spelling_of_the_same_bytes_fails_to_open() -> None:
    """base64's unused low bits: another last character, the same decoded bytes."""
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
    sealer = StateSealer([new_key()])
    for pad in range(3):  # one of three lengths leaves unused bits in the last character
        token = sealer.seal({**CLAIMS, "p": "x" * pad}, now=0.0)
        body = token.rstrip("=")
        unused = {2: 4, 3: 2}.get(len(body.rpartition(".")[2]) % 4)
        if unused is None:
            continue
        last = alphabet.index(body[-1])
        twin = body[:-1] + alphabet[last ^ 1] + token[len(body) :]
        assert base64.urlsafe_b64decode(twin.rpartition(".")[2]) == base64.urlsafe_b64decode(
            token.rpartition(".")[2]
        )
        assert sealer.open(token, now=1.0) is not None
        assert sealer.open(twin, now=1.0) is None
        return
    raise AssertionError("no length with unused bits in three tries")
