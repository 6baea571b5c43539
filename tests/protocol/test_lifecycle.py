"""Tests for weir.protocol._lifecycle and ._binding: initialize, priming, channel tokens."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from weir.protocol import INVALID_PARAMS, Reason, RemoteProtocolError
from weir.protocol._binding import check_rebind, parse_channel_token, prove_channel
from weir.protocol._lifecycle import LATEST_VERSION, NEGOTIABLE_VERSIONS, primes_streams
from weir.protocol.binding import ChannelVerdict, channel_refusal, channel_verdict, fenced
from weir.protocol.jsonrpc import Request
from weir.protocol.lifecycle import (
    MAX_CLIENT_CAPABILITIES,
    MAX_CLIENT_INFO_FIELD,
    initialize_result,
    parse_initialize,
)


def _init(params: Any) -> Request:
    return Request(id=1, method="initialize", params=params)


# ------------------------------------------------------------------- initialize
@pytest.mark.parametrize("version", NEGOTIABLE_VERSIONS)
def test_a_served_revision_is_echoed(version: str) -> None:
    asked = parse_initialize(_init({"protocolVersion": version, "clientInfo": {"name": "c"}}))
    assert asked.version == version
    assert asked.client_info == {"name": "c"} and asked.capabilities == {}


@pytest.mark.parametrize("version", ["1999-01-01", "2026-07-28", "latest", ""])
def test_any_other_revision_gets_the_newest_served(version: str) -> None:
    assert parse_initialize(_init({"protocolVersion": version})).version == LATEST_VERSION


@pytest.mark.parametrize(
    "params",
    [
        None,
        {},
        {"protocolVersion": 20251125},
        {"protocolVersion": "2025-11-25", "capabilities": []},
        {"protocolVersion": "2025-11-25", "clientInfo": "me"},
    ],
)
def test_a_malformed_initialize_is_a_clear_400(params: Any) -> None:
    with pytest.raises(RemoteProtocolError) as info:
        parse_initialize(_init(params))
    err = info.value
    assert (err.http_status, err.code, err.reason) == (400, INVALID_PARAMS, Reason.INVALID_REQUEST)
    assert err.request_id == 1


def test_the_result_carries_instructions_only_when_there_are_some() -> None:
    caps = {"tools": {"listChanged": False}}
    plain = initialize_result("2025-06-18", caps, name="n", server_version="1")
    assert plain == {
        "protocolVersion": "2025-06-18",
        "capabilities": caps,
        "serverInfo": {"name": "n", "version": "1"},
    }
    told = initialize_result("2025-06-18", caps, name="n", server_version="1", instructions="hi")
    assert told["instructions"] == "hi"
    assert "instructions" not in initialize_result(
        "2025-06-18", caps, name="n", server_version="1", instructions=""
    )


@pytest.mark.parametrize(
    ("negotiated", "header", "primes"),
    [
        ("2025-11-25", "2025-03-26", True),
        ("2025-06-18", "2025-11-25", True),  # the request's own header is newer
        ("2025-06-18", "2025-06-18", False),
        ("2025-03-26", "2025-03-26", False),
        ("2024-11-05", "2025-03-26", False),
    ],
)
def test_only_2025_11_25_streams_open_with_a_priming_event(
    negotiated: str, header: str, primes: bool
) -> None:
    assert primes_streams(negotiated, header) is primes


# --------------------------------------------------------------- channel tokens
def test_a_channel_token_parses_to_generation_and_secret() -> None:
    assert parse_channel_token(None) is None
    assert parse_channel_token("3.s3cr.et") == (3, "s3cr.et")
    assert parse_channel_token(" 12.x ") == (12, "x")


@pytest.mark.parametrize("raw", ["", "3", "3.", ".x", "-1.x", "a.x", "1" * 19 + ".x", "3 .x"])
def test_a_malformed_channel_token_is_channel_unbound(raw: str) -> None:
    with pytest.raises(RemoteProtocolError) as info:
        parse_channel_token(raw, 9)
    err = info.value
    assert (err.http_status, err.reason, err.request_id) == (409, Reason.CHANNEL_UNBOUND, 9)


@given(
    st.integers(1, 10**6),
    st.text(min_size=1, max_size=8),
    st.none() | st.tuples(st.integers(0, 10**6 + 1), st.text(min_size=1, max_size=8)),
)
def test_the_verdict_fences_older_generations_and_wrong_secrets(
    generation: int, secret: str, token: tuple[int, str] | None
) -> None:
    verdict = channel_verdict(generation, secret, token)
    if token is None or token == (generation, secret):
        assert verdict is ChannelVerdict.OK
    elif token[0] < generation:
        assert verdict is ChannelVerdict.STALE
    else:
        assert verdict is ChannelVerdict.UNBOUND


def test_any_presented_secret_gets_a_verdict_not_an_error() -> None:
    # (The secrets are compared as bytes, in constant time: str compare_digest
    # would raise on anything but ASCII.)
    for guess in ("\xff\xfe", "\u0100", "\ud800", "s3cret\x00"):
        assert channel_verdict(1, "s3cret", (1, guess)) is ChannelVerdict.UNBOUND
    assert channel_verdict(1, "s\xe9cret", (1, "s\xe9cret")) is ChannelVerdict.OK


def test_each_refusal_names_its_reason() -> None:
    stale = channel_refusal(ChannelVerdict.STALE, 1)
    unbound = channel_refusal(ChannelVerdict.UNBOUND, None)
    assert (stale.http_status, stale.reason) == (409, Reason.CURSOR_STALE)
    assert (unbound.http_status, unbound.reason) == (409, Reason.CHANNEL_UNBOUND)


def test_capabilities_a_session_would_hold_for_life_are_bounded() -> None:
    big = {"experimental": {f"k{i}": i for i in range(2000)}}
    assert len(msgspec.json.encode(big)) > MAX_CLIENT_CAPABILITIES
    with pytest.raises(RemoteProtocolError) as refused:
        parse_initialize(_init({"protocolVersion": "2025-11-25", "capabilities": big}))
    exc = refused.value
    assert (exc.http_status, exc.code, exc.reason) == (400, INVALID_PARAMS, Reason.INVALID_REQUEST)
    assert exc.error_data()["limit"] == MAX_CLIENT_CAPABILITIES
    usual = {"roots": {"listChanged": True}, "sampling": {}, "elicitation": {"form": {}}}
    params = {"protocolVersion": "2025-11-25", "capabilities": usual}
    assert parse_initialize(_init(params)).capabilities == usual


def test_only_the_name_version_and_title_of_client_info_are_kept_and_cut() -> None:
    info = {
        "name": "n" * 1000,
        "version": "1.0",
        "title": 7,  # not a string: not kept
        "icons": [{"src": "data:image/png;base64," + "A" * 100_000}],
        "websiteUrl": "https://example.com",
    }
    kept = parse_initialize(_init({"protocolVersion": "2025-11-25", "clientInfo": info}))
    assert kept.client_info == {"name": "n" * MAX_CLIENT_INFO_FIELD, "version": "1.0"}


# --------------------------------------------------------------- rebind and proof
@pytest.mark.parametrize("authorized", [False, True])
def test_a_fenced_client_may_never_rebind(authorized: bool) -> None:
    with pytest.raises(RemoteProtocolError) as caught:
        check_rebind(ChannelVerdict.STALE, True, authorized=authorized, request_id=1)
    assert caught.value.reason is Reason.CURSOR_STALE and caught.value.request_id == 1


@pytest.mark.parametrize(
    ("verdict", "presented", "authorized", "allowed"),
    [
        (ChannelVerdict.OK, True, False, True),  # proves the channel
        (ChannelVerdict.OK, False, False, False),  # a session id alone
        (ChannelVerdict.UNBOUND, True, False, False),  # a wrong secret
        (ChannelVerdict.OK, False, True, True),  # the principal is the proof
        (ChannelVerdict.UNBOUND, True, True, True),
    ],
)
def test_who_may_rebind(
    verdict: ChannelVerdict, presented: bool, authorized: bool, allowed: bool
) -> None:
    if allowed:
        check_rebind(verdict, presented, authorized=authorized, request_id=None)
        return
    with pytest.raises(RemoteProtocolError) as caught:
        check_rebind(verdict, presented, authorized=authorized, request_id=None)
    assert caught.value.http_status == 409 and caught.value.reason is Reason.CHANNEL_UNBOUND


def test_a_bound_session_needs_its_token_unless_authorization_is_on() -> None:
    assert prove_channel(bound=False, presented=True, authorized=False, what="GET") is True
    assert prove_channel(bound=True, presented=True, authorized=False, what="GET") is False
    assert prove_channel(bound=False, presented=False, authorized=False, what="GET") is False
    assert prove_channel(bound=True, presented=False, authorized=True, what="GET") is False
    with pytest.raises(RemoteProtocolError, match="DELETE needs it") as caught:
        prove_channel(bound=True, presented=False, authorized=False, what="DELETE")
    assert caught.value.reason is Reason.CHANNEL_UNBOUND


def test_a_rebind_fences_older_generations_only() -> None:
    assert fenced(1, 2) and not fenced(2, 2) and not fenced(3, 2)
