"""The sessionless era's checks (2026-07-28), through the endpoint's ``route``.

Each refusal is checked for what a client relies on: the HTTP status, the JSON-RPC
code, ``data`` and the request's id echoed.  The order of the checks is pinned too
(missing ``_meta`` first, then a header that disagrees with it, then an unserved
version), because a client learns different things from each.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from weir.protocol import EndpointConfig, Reason, RemoteProtocolError, route
from weir.protocol._sessionless import (
    HEADER_MISMATCH,
    META_SERVER_INFO,
    UNSUPPORTED_VERSION,
    check_param_headers,
    decode_header_value,
    is_sessionless,
    param_headers,
)
from weir.protocol.jsonrpc import Notification, Request
from weir.protocol.lifecycle import ALL_VERSIONS
from weir.protocol.sessionless import SessionlessMessage, complete, discover_result

from .helpers import http_request

CONFIG = EndpointConfig()
V = "2026-07-28"
META = {
    "io.modelcontextprotocol/protocolVersion": V,
    "io.modelcontextprotocol/clientCapabilities": {},
}


def _post(
    body: Any, headers: Mapping[str, str | None] | None = None, *, method: str = "POST"
) -> SessionlessMessage:
    routed = route(_request(body, headers, method=method), CONFIG)
    assert isinstance(routed, SessionlessMessage)
    return routed


def _request(
    body: Any, headers: Mapping[str, str | None] | None = None, *, method: str = "POST"
) -> Any:
    msg = body if isinstance(body, dict) else {}
    base: dict[str, str | None] = {
        "host": "127.0.0.1",
        "content-type": "application/json",
        "accept": "application/json, text/event-stream",
        "mcp-protocol-version": V,
    }
    if "method" in msg:
        base["mcp-method"] = msg["method"]
    base.update(headers or {})
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    return http_request(method, raw if method == "POST" else b"", headers=base)


def _call(name: str, arguments: Any = None, **params: Any) -> dict[str, Any]:
    p: dict[str, Any] = {"name": name, "_meta": META, **params}
    if arguments is not None:
        p["arguments"] = arguments
    return {"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": p}


def _refused(
    body: Any, headers: Mapping[str, str | None] | None = None, **kw: Any
) -> RemoteProtocolError:
    with pytest.raises(RemoteProtocolError) as caught:
        route(_request(body, headers, **kw), CONFIG)
    return caught.value


def test_the_header_picks_the_era() -> None:
    assert is_sessionless(V) and is_sessionless(f" {V} ")
    assert not is_sessionless(None) and not is_sessionless("2025-11-25")


def test_a_well_formed_request_routes_with_its_meta() -> None:
    headers = {"mcp-name": "echo"}
    routed = _post(_call("echo", {"text": "x"}), headers)
    assert isinstance(routed.message, Request) and routed.message.id == 7
    assert routed.meta is not None and routed.meta.version == V
    assert routed.meta.capabilities == {} and routed.meta.log_level is None


def test_a_notification_routes_without_meta() -> None:
    routed = _post({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {}})
    assert isinstance(routed.message, Notification) and routed.meta is None


@pytest.mark.parametrize(
    "params",
    [
        {},
        {"_meta": {"io.modelcontextprotocol/clientCapabilities": {}}},
        {"_meta": {"io.modelcontextprotocol/protocolVersion": V}},
        {"_meta": {**META, "io.modelcontextprotocol/clientCapabilities": "all"}},
    ],
)
def test_missing_meta_fields_are_400_invalid_params_before_anything_else(params: Any) -> None:
    body = {"jsonrpc": "2.0", "id": 101, "method": "server/discover", "params": params}
    exc = _refused(body)
    assert (exc.http_status, exc.code, exc.request_id) == (400, -32602, 101)


def test_a_header_that_disagrees_with_meta_is_a_header_mismatch() -> None:
    meta = {**META, "io.modelcontextprotocol/protocolVersion": "v999.0.0"}
    body = {"jsonrpc": "2.0", "id": 302, "method": "server/discover", "params": {"_meta": meta}}
    exc = _refused(body)
    assert (exc.http_status, exc.code, exc.request_id) == (400, HEADER_MISMATCH, 302)
    assert exc.reason is Reason.HEADER_MISMATCH


def test_an_unserved_version_says_what_is_served_and_echoes_the_id() -> None:
    meta = {**META, "io.modelcontextprotocol/protocolVersion": "v999.0.0"}
    body = {"jsonrpc": "2.0", "id": 301, "method": "server/discover", "params": {"_meta": meta}}
    exc = _refused(body, {"mcp-protocol-version": "v999.0.0"})
    assert (exc.http_status, exc.code, exc.request_id) == (400, UNSUPPORTED_VERSION, 301)
    assert exc.error_data()["supported"] == list(ALL_VERSIONS)
    assert exc.error_data()["requested"] == "v999.0.0"


@pytest.mark.parametrize(
    ("headers", "ok"),
    [
        ({"mcp-method": "tools/call", "mcp-name": "echo"}, True),
        ({"mcp-method": "tools/call", "mcp-name": "  echo  "}, True),  # OWS is not the value
        ({"mcp-method": "tools/call", "mcp-name": "=?base64?ZWNobw==?="}, True),
        ({"mcp-method": "tools/call", "mcp-name": "wrong"}, False),
        ({"mcp-method": "tools/call"}, False),  # Mcp-Name is required for tools/call
        ({"mcp-method": "TOOLS/CALL", "mcp-name": "echo"}, False),  # values are case-sensitive
        ({"mcp-method": "prompts/list", "mcp-name": "echo"}, False),
        ({"mcp-name": "echo"}, False),  # Mcp-Method is required
    ],
)
def test_routing_headers_must_match_the_body(headers: dict[str, str | None], ok: bool) -> None:
    body = _call("echo", {})
    raw = _request(body, {"mcp-method": None, **headers})
    if ok:
        assert isinstance(route(raw, CONFIG), SessionlessMessage)
        return
    with pytest.raises(RemoteProtocolError) as caught:
        route(raw, CONFIG)
    assert (caught.value.http_status, caught.value.code) == (400, HEADER_MISMATCH)
    assert caught.value.request_id == 7


@pytest.mark.parametrize("task_id", ["", "t" * 257, "t" * 10_000])
@pytest.mark.parametrize("method", ["tasks/get", "tasks/cancel", "tasks/update"])
def test_a_task_id_that_can_be_no_tasks_is_refused_as_that_not_as_a_mismatch(
    method: str, task_id: str
) -> None:
    # Header and body agree; the id breaks the 1-256 rule: refused for the id, whatever
    # its length does to the header check.
    params = {"taskId": task_id, "_meta": META}
    body = {"jsonrpc": "2.0", "id": 9, "method": method, "params": params}
    exc = _refused(body, {"mcp-name": task_id})
    assert (exc.http_status, exc.code, exc.request_id) == (400, -32602, 9)
    assert exc.reason is Reason.INVALID_REQUEST and "taskId" in str(exc)


@pytest.mark.parametrize("method", ["GET", "DELETE"])
def test_get_and_delete_are_405_with_a_json_rpc_body(method: str) -> None:
    exc = _refused({}, method=method)
    assert exc.http_status == 405 and dict(exc.headers)["allow"] == "POST"


def test_a_batch_or_a_response_is_not_a_sessionless_message() -> None:
    batch = [_call("echo", {}), _call("echo", {})]
    assert _refused(batch, {"mcp-name": "echo"}).http_status == 400
    response = {"jsonrpc": "2.0", "id": 1, "result": {}}
    assert _refused(response).http_status == 400


@pytest.mark.parametrize(
    ("raw", "value"),
    [
        ("Hello", "Hello"),
        ("=?base64?SGVsbG8=?=", "Hello"),
        ("=?base64?SGVsbG8sIOS4lueVjA==?=", "Hello, 世界"),
        ("=?base64?SGVsbG8?=", None),  # bad padding
        ("=?base64?SGVs!!!bG8=?=", None),  # bad characters
        ("SGVsbG8=", "SGVsbG8="),  # no wrapper: literal
        ("=?base64?SGVsbG8=", "=?base64?SGVsbG8="),  # no suffix: literal
    ],
)
def test_header_values_decode_strictly_or_not_at_all(raw: str, value: str | None) -> None:
    assert decode_header_value(raw) == value


@given(st.text(max_size=40))
def test_any_text_survives_the_base64_wrapper(text: str) -> None:
    wrapped = "=?base64?" + base64.b64encode(text.encode()).decode() + "?="
    assert decode_header_value(wrapped) == text


def test_param_headers_follow_the_schema_annotations() -> None:
    schema = {
        "type": "object",
        "properties": {
            "region": {"type": "string", "x-mcp-header": "Region"},
            "count": {"type": "integer", "x-mcp-header": "Count"},
            "ratio": {"type": "number", "x-mcp-header": "Ratio"},  # numbers may not be
            "plain": {"type": "string"},
        },
    }
    annotated = param_headers(schema)
    assert annotated == {"region": "region", "count": "count"}
    ok = {"mcp-param-region": "=?base64?ZXUtd2VzdA==?=", "mcp-param-count": "42.0"}
    check_param_headers(_headers(ok), annotated, {"region": "eu-west", "count": 42}, 1)
    check_param_headers(_headers({}), annotated, {"region": None}, 1)  # absent: no header
    for headers, args in (
        ({}, {"region": "eu"}),  # missing
        ({"mcp-param-region": "us"}, {"region": "eu"}),  # mismatch
        ({"mcp-param-region": "=?base64?!!?="}, {"region": "eu"}),  # undecodable
        ({"mcp-param-count": "forty-two"}, {"count": 42}),
    ):
        with pytest.raises(RemoteProtocolError) as caught:
            check_param_headers(_headers(headers), annotated, args, 9)
        assert (caught.value.code, caught.value.request_id) == (HEADER_MISMATCH, 9)


def _headers(values: dict[str, str]) -> Any:
    return http_request("POST", headers={"host": "127.0.0.1", **values}).headers


def test_results_carry_their_type_identity_and_cache_hints() -> None:
    info = {"name": "s", "version": "1"}
    listed = complete("tools/list", {"tools": []}, info)
    assert listed["resultType"] == "complete" and listed["_meta"][META_SERVER_INFO] == info
    assert listed["ttlMs"] == 0 and listed["cacheScope"] == "private"
    called = complete("tools/call", {"content": []}, info)
    assert "ttlMs" not in called and called["resultType"] == "complete"
    asked = complete("resources/read", {"resultType": "input_required"}, info)
    assert "ttlMs" not in asked  # an input-required result is never cached
    found = discover_result(ALL_VERSIONS, {"tools": {}}, info, "hi")
    assert found["supportedVersions"] == list(ALL_VERSIONS) and found["instructions"] == "hi"
    assert found["cacheScope"] == "private" and found["resultType"] == "complete"
