"""Tests for weir.protocol._endpoint: every rule of route() with its exact status and reason."""

from __future__ import annotations

from collections.abc import Callable

import msgspec
import pytest

from weir.protocol import (
    INVALID_REQUEST,
    DeleteSession,
    EndpointConfig,
    HttpRequest,
    OpenStream,
    PostMessages,
    Reason,
    RemoteProtocolError,
    check_host_and_origin,
    refusal,
    route,
    session_refusal,
)
from weir.protocol._endpoint import accepts, host_of
from weir.protocol._errors import PARSE_ERROR
from weir.protocol._event_ids import EventId
from weir.protocol._http_events import Headers
from weir.protocol._lifecycle import (
    DEFAULT_VERSION,
    LATEST_VERSION,
    NEGOTIABLE_VERSIONS,
    SUPPORTED_VERSIONS,
    negotiate_version,
    version_at_least,
)
from weir.protocol._sessionless import UNSUPPORTED_VERSION
from weir.protocol.jsonrpc import Notification, Request
from weir.protocol.lifecycle import ALL_VERSIONS

from .helpers import INIT, PING, SESSION, delete, get, http_request, post

CONFIG = EndpointConfig()
BATCH = b'[{"jsonrpc":"2.0","id":1,"method":"ping"},{"jsonrpc":"2.0","method":"n"}]'


def refuse(request: HttpRequest, config: EndpointConfig = CONFIG) -> RemoteProtocolError:
    with pytest.raises(RemoteProtocolError) as info:
        route(request, config)
    return info.value


def assert_refused(
    request: HttpRequest, status: int, reason: Reason, config: EndpointConfig = CONFIG
) -> RemoteProtocolError:
    exc = refuse(request, config)
    assert (exc.http_status, exc.reason) == (status, reason), exc.message
    return exc


def routed_post(request: HttpRequest, config: EndpointConfig = CONFIG) -> PostMessages:
    out = route(request, config)
    assert isinstance(out, PostMessages)
    return out


# -------------------------------------------------------------------- 1. path, host


def test_wrong_path_is_404() -> None:
    assert_refused(post(target="/other"), 404, Reason.NOT_FOUND)
    assert_refused(
        http_request("GET", target="/mcp/", defaults={"host": "localhost"}), 404, Reason.NOT_FOUND
    )
    assert_refused(
        http_request("GET", target="/", defaults={"host": "localhost"}), 404, Reason.NOT_FOUND
    )


def test_query_string_does_not_change_the_path() -> None:
    assert isinstance(route(post(target="/mcp?x=1"), CONFIG), PostMessages)


def test_custom_path() -> None:
    config = EndpointConfig(path="/api")
    assert isinstance(route(post(target="/api"), config), PostMessages)
    assert_refused(post(), 404, Reason.NOT_FOUND, config)


@pytest.mark.parametrize(
    "host",
    [
        "evil.example.com",
        "evil.example.com:8000",
        "localhost.evil.com",
        "127.0.0.2",
        "[::2]:80",
        "",
    ],
)
def test_host_not_allowed_is_403(host: str) -> None:
    for request in (
        post(headers={"host": host}),
        get(headers={"host": host}),
        delete(headers={"host": host}),
    ):
        assert_refused(request, 403, Reason.FORBIDDEN_HOST)


def test_missing_host_is_403() -> None:
    assert_refused(post(headers={"host": None}), 403, Reason.FORBIDDEN_HOST)


@pytest.mark.parametrize(
    "host",
    [
        "localhost",
        "localhost:1234",
        "LOCALHOST:1",
        "127.0.0.1",
        "127.0.0.1:8000",
        "[::1]",
        "[::1]:8000",
        "::1",
    ],
)
def test_loopback_hosts_are_allowed(host: str) -> None:
    assert isinstance(route(post(headers={"host": host}), CONFIG), PostMessages)


@pytest.mark.parametrize(
    "origin",
    [
        "http://evil.example.com",
        "https://evil.example.com:443",
        "null",
        "localhost:3000",
        "ftp://localhost",
        "http://localhost.evil.com",
    ],
)
def test_origin_not_allowed_is_403(origin: str) -> None:
    assert_refused(post(headers={"origin": origin}), 403, Reason.FORBIDDEN_ORIGIN)
    assert_refused(get(headers={"origin": origin}), 403, Reason.FORBIDDEN_ORIGIN)


@pytest.mark.parametrize(
    "origin",
    ["http://localhost:3000", "https://localhost", "http://127.0.0.1:8000", "http://[::1]:5173"],
)
def test_loopback_origins_are_allowed(origin: str) -> None:
    assert isinstance(route(post(headers={"origin": origin}), CONFIG), PostMessages)


def test_explicit_allowed_origin() -> None:
    config = EndpointConfig(allowed_origins=frozenset({"https://app.example.com"}))
    assert isinstance(
        route(post(headers={"origin": "https://app.example.com"}), config), PostMessages
    )
    assert_refused(
        post(headers={"origin": "https://other.example.com"}), 403, Reason.FORBIDDEN_ORIGIN, config
    )


def test_allowed_hosts_configured() -> None:
    config = EndpointConfig(allowed_hosts=frozenset({"mcp.example.com"}))
    ok = post(headers={"host": "mcp.example.com:443", "origin": "https://mcp.example.com"})
    assert isinstance(route(ok, config), PostMessages)
    assert_refused(post(), 403, Reason.FORBIDDEN_HOST, config)  # localhost no longer allowed


def test_wildcard_allowed_hosts_disables_host_and_origin_checks() -> None:
    config = EndpointConfig(allowed_hosts=frozenset({"*"}))
    request = post(headers={"host": "evil.example.com", "origin": "http://evil.example.com"})
    assert isinstance(route(request, config), PostMessages)
    assert isinstance(route(post(headers={"host": None}), config), PostMessages)


@pytest.mark.parametrize(
    ("authority", "host"),
    [
        ("localhost:8000", "localhost"),
        ("LocalHost", "localhost"),
        ("[::1]:8000", "[::1]"),
        ("[::1]", "[::1]"),
        ("::1", "::1"),
        (" example.com:1 ", "example.com"),
        ("[broken", "[broken"),
    ],
)
def test_host_of(authority: str, host: str) -> None:
    assert host_of(authority) == host


def test_check_host_and_origin_directly() -> None:
    check_host_and_origin(Headers.of(host="localhost"), CONFIG)
    with pytest.raises(RemoteProtocolError) as info:
        check_host_and_origin(Headers.of(host="localhost", origin="http://evil"), CONFIG)
    assert info.value.reason is Reason.FORBIDDEN_ORIGIN


# --------------------------------------------------------------------- 2. method


@pytest.mark.parametrize("method", ["PUT", "PATCH", "HEAD", "OPTIONS", "get"])
def test_other_methods_are_405_with_allow(method: str) -> None:
    request = http_request(method, defaults={"host": "localhost"})
    exc = assert_refused(request, 405, Reason.METHOD_NOT_ALLOWED)
    assert exc.headers == (("allow", "GET, POST, DELETE"),)
    status, headers, _ = refusal(exc)
    assert status == 405
    assert ("allow", "GET, POST, DELETE") in headers


# -------------------------------------------------------------------- 3. version


def test_absent_version_is_the_default() -> None:
    assert routed_post(post()).ctx.protocol_version == DEFAULT_VERSION == "2025-03-26"


@pytest.mark.parametrize("version", SUPPORTED_VERSIONS)
def test_supported_versions_are_carried(version: str) -> None:
    assert routed_post(post(version=version)).ctx.protocol_version == version
    opened = route(get(headers={"mcp-protocol-version": f" {version}"}), CONFIG)
    assert isinstance(opened, OpenStream) and opened.ctx.protocol_version == version


@pytest.mark.parametrize("version", ["2024-11-05", "2099-01-01", "", "latest"])
def test_unsupported_version_is_400_with_the_supported_list(version: str) -> None:
    for request in (
        post(version=version),
        get(headers={"mcp-protocol-version": version}),
        delete(headers={"mcp-protocol-version": version}),
    ):
        exc = assert_refused(request, 400, Reason.UNSUPPORTED_PROTOCOL_VERSION)
        assert exc.code == UNSUPPORTED_VERSION  # -32022, as the sessionless era defines it
        assert exc.error_data()["supported"] == list(ALL_VERSIONS)
        assert exc.error_data()["requested"] == version.strip()


# ----------------------------------------------------------------------- 4. POST


@pytest.mark.parametrize(
    "ctype", ["application/json", "Application/JSON", "application/json; charset=utf-8"]
)
def test_json_content_type_is_accepted(ctype: str) -> None:
    assert routed_post(post(headers={"content-type": ctype})).messages == [
        Request(id=7, method="ping")
    ]


@pytest.mark.parametrize("ctype", [None, "text/plain", "application/jsonx", "text/event-stream"])
def test_wrong_content_type_is_415(ctype: str | None) -> None:
    assert_refused(post(headers={"content-type": ctype}), 415, Reason.UNSUPPORTED_MEDIA_TYPE)


@pytest.mark.parametrize(
    "accept",
    [
        None,
        "application/json",
        "text/event-stream",
        "text/html",
        "application/json, text/event-stream;q=0",
        "application/json;q=0, text/event-stream",
        "application/json, text/event-stream; q=0.000",
    ],
)
def test_post_accept_must_list_both_types(accept: str | None) -> None:
    assert_refused(post(headers={"accept": accept}), 406, Reason.NOT_ACCEPTABLE)


@pytest.mark.parametrize(
    "accept",
    [
        "application/json, text/event-stream",
        "text/event-stream, application/json",
        "*/*",
        "application/*, text/*",
        "application/json;q=0.9, text/event-stream;q=0.1",
        "APPLICATION/JSON, TEXT/EVENT-STREAM",
    ],
)
def test_post_accept_variants_are_fine(accept: str) -> None:
    assert isinstance(route(post(headers={"accept": accept}), CONFIG), PostMessages)


def test_json_response_mode_needs_only_application_json() -> None:
    config = EndpointConfig(json_response=True)
    assert isinstance(route(post(headers={"accept": "application/json"}), config), PostMessages)
    assert_refused(
        post(headers={"accept": "text/event-stream"}), 406, Reason.NOT_ACCEPTABLE, config
    )


def test_accepts() -> None:
    assert accepts("*/*", "text/event-stream")
    assert accepts("text/*", "text/event-stream")
    assert not accepts("text/*", "application/json")
    assert not accepts(None, "application/json")
    assert not accepts("", "application/json")
    assert not accepts("*/*;q=0", "application/json")
    assert accepts("application/json;q=0.5", "application/json")


@pytest.mark.parametrize(
    ("body", "code", "reason"),
    [
        (b"{", PARSE_ERROR, Reason.PARSE_ERROR),
        (b"", PARSE_ERROR, Reason.PARSE_ERROR),
        (b'{"jsonrpc":"1.0","id":1,"method":"x"}', INVALID_REQUEST, Reason.INVALID_REQUEST),
        (b'{"jsonrpc":"2.0","id":null,"method":"x"}', INVALID_REQUEST, Reason.INVALID_REQUEST),
    ],
)
def test_bad_body_is_400(body: bytes, code: int, reason: Reason) -> None:
    exc = assert_refused(post(body), 400, reason)
    assert exc.code == code


def test_initialize_without_session_is_a_post_with_is_initialize() -> None:
    routed = routed_post(post(INIT, session=None))
    assert routed.is_initialize
    assert routed.ctx.session_id is None
    assert not routed.is_batch
    (req,) = routed.requests
    assert (req.id, req.method) == (1, "initialize")


def test_other_post_is_not_initialize() -> None:
    routed = routed_post(post())
    assert not routed.is_initialize
    assert routed.ctx.session_id == SESSION
    assert routed.requests == [Request(id=7, method="ping")]


@pytest.mark.parametrize(
    ("body", "request_id"),
    [
        (PING, 7),
        (b'{"jsonrpc":"2.0","id":"abc","method":"tools/list"}', "abc"),
        (b'{"jsonrpc":"2.0","method":"notifications/initialized"}', None),
        (b'{"jsonrpc":"2.0","id":3,"result":{}}', None),
    ],
)
def test_non_initialize_without_session_is_400_session_required(
    body: bytes, request_id: object
) -> None:
    exc = assert_refused(post(body, session=None), 400, Reason.SESSION_REQUIRED)
    assert exc.request_id == request_id
    assert msgspec.json.decode(refusal(exc)[2])["id"] == request_id


def test_batch_at_2025_03_26() -> None:
    routed = routed_post(post(BATCH, version="2025-03-26"))
    assert routed.is_batch
    assert routed.messages == [Request(id=1, method="ping"), Notification(method="n")]
    assert routed.requests == [Request(id=1, method="ping")]
    assert not routed.is_initialize
    # Absent version means 2025-03-26, so batches are allowed too.
    assert routed_post(post(BATCH)).is_batch


@pytest.mark.parametrize("version", ["2025-06-18", "2025-11-25"])
def test_batch_refused_at_later_versions(version: str) -> None:
    exc = assert_refused(post(BATCH, version=version), 400, Reason.BATCH_NOT_SUPPORTED)
    assert exc.code == INVALID_REQUEST


def test_batch_without_session_is_session_required_with_null_id() -> None:
    exc = assert_refused(post(BATCH, session=None), 400, Reason.SESSION_REQUIRED)
    assert exc.request_id is None


def test_initialize_inside_a_batch_is_refused() -> None:
    body = b"[" + INIT + b',{"jsonrpc":"2.0","method":"n"}]'
    for session in (None, SESSION):
        exc = assert_refused(post(body, session=session), 400, Reason.INVALID_REQUEST)
        assert exc.code == INVALID_REQUEST
    assert_refused(post(b"[" + INIT + b"]", session=None), 400, Reason.INVALID_REQUEST)


# ------------------------------------------------------------------------ 5. GET


def test_get_opens_the_standalone_stream() -> None:
    routed = route(get(), CONFIG)
    assert isinstance(routed, OpenStream)
    assert routed.last_event_id is None
    assert routed.ctx.session_id == SESSION
    assert routed.ctx.protocol_version == DEFAULT_VERSION


@pytest.mark.parametrize("accept", [None, "application/json", "text/event-stream;q=0", "text/html"])
def test_get_without_accept_sse_is_406(accept: str | None) -> None:
    assert_refused(get(headers={"accept": accept}), 406, Reason.NOT_ACCEPTABLE)


@pytest.mark.parametrize("accept", ["*/*", "text/*", "application/json, text/event-stream"])
def test_get_accept_wildcards(accept: str) -> None:
    assert isinstance(route(get(headers={"accept": accept}), CONFIG), OpenStream)


def test_get_without_session_is_400() -> None:
    assert_refused(get(session=None), 400, Reason.SESSION_REQUIRED)


def test_get_with_last_event_id_is_parsed() -> None:
    routed = route(get(last_event_id="0000abcd:17"), CONFIG)
    assert isinstance(routed, OpenStream)
    assert routed.last_event_id == EventId("0000abcd", 17)


@pytest.mark.parametrize("cursor", ["42", "", "0000ABCD:1", "abcd:1", "0000abcd:-1", "0000abcd:01"])
def test_get_with_malformed_last_event_id_is_400_cursor_invalid(cursor: str) -> None:
    assert_refused(get(last_event_id=cursor), 400, Reason.CURSOR_INVALID)


# --------------------------------------------------------------------- 6. DELETE


def test_delete() -> None:
    routed = route(delete(), CONFIG)
    assert isinstance(routed, DeleteSession)
    assert routed.ctx.session_id == SESSION


def test_delete_without_session_is_400() -> None:
    assert_refused(delete(session=None), 400, Reason.SESSION_REQUIRED)


# ------------------------------------------------------------------- session ids


@pytest.mark.parametrize("sid", ["a b", "", "x" * 257, "caf\u00e9", "a\tb"])
@pytest.mark.parametrize("make", [post, get, delete])
def test_invalid_session_id_is_400_session_invalid(
    sid: str, make: Callable[..., HttpRequest]
) -> None:
    assert_refused(make(session=sid), 400, Reason.SESSION_INVALID)


@pytest.mark.parametrize("sid", ["a", "x" * 256, "0f3c-AB_9.~!", "!~"])
def test_valid_session_ids(sid: str) -> None:
    routed = route(delete(session=sid), CONFIG)
    assert isinstance(routed, DeleteSession) and routed.ctx.session_id == sid


# ------------------------------------------------------------------------ order


@pytest.mark.parametrize(
    ("request_", "status", "reason"),
    [
        (post(target="/x", headers={"host": "evil"}), 404, Reason.NOT_FOUND),
        (http_request("PUT", defaults={"host": "evil"}), 403, Reason.FORBIDDEN_HOST),
        (
            http_request("PUT", defaults={"host": "localhost", "mcp-protocol-version": "x"}),
            405,
            Reason.METHOD_NOT_ALLOWED,
        ),
        (
            post(version="x", headers={"content-type": "text/plain"}),
            400,
            Reason.UNSUPPORTED_PROTOCOL_VERSION,
        ),
        (
            post(b"{", headers={"content-type": "text/plain", "accept": None}),
            415,
            Reason.UNSUPPORTED_MEDIA_TYPE,
        ),
        (post(b"{", headers={"accept": None}), 406, Reason.NOT_ACCEPTABLE),
        (post(b"{", session=None), 400, Reason.PARSE_ERROR),
        (get(session=None, headers={"accept": None}), 400, Reason.SESSION_REQUIRED),
        (get(headers={"accept": None}, last_event_id="42"), 406, Reason.NOT_ACCEPTABLE),
    ],
)
def test_first_failure_wins(request_: HttpRequest, status: int, reason: Reason) -> None:
    assert_refused(request_, status, reason)


# ---------------------------------------------------------------------- refusal


def test_refusal_renders_status_headers_and_body() -> None:
    exc = refuse(post(session=None))
    status, headers, body = refusal(exc)
    assert status == 400
    assert headers == [("content-type", "application/json")]
    assert msgspec.json.decode(body) == {
        "jsonrpc": "2.0",
        "id": 7,
        "error": {
            "code": INVALID_REQUEST,
            "message": "Mcp-Session-Id header is required",
            "data": {"reason": "session_required"},
        },
    }


@pytest.mark.parametrize(
    ("ms", "seconds"),
    [(0, "1"), (1, "1"), (999, "1"), (1000, "1"), (1001, "2"), (2500, "3"), (60000, "60")],
)
def test_refusal_retry_after_is_ceil_seconds_at_least_one(ms: int, seconds: str) -> None:
    exc = RemoteProtocolError(
        "busy", http_status=429, reason=Reason.STREAM_HALF_OPEN, retry_after_ms=ms
    )
    status, headers, body = refusal(exc)
    assert status == 429
    assert ("retry-after", seconds) in headers
    assert msgspec.json.decode(body)["error"]["data"] == {
        "reason": "stream_half_open",
        "retryAfterMs": ms,
    }


def test_refusal_without_retry_has_no_retry_after() -> None:
    _, headers, _ = refusal(RemoteProtocolError("x"))
    assert [n for n, _ in headers] == ["content-type"]


def test_session_refusal_is_404_session_not_found() -> None:
    exc = session_refusal("abc", 9)
    assert (exc.http_status, exc.reason, exc.request_id) == (404, Reason.SESSION_NOT_FOUND, 9)
    assert msgspec.json.decode(refusal(exc)[2])["error"]["data"]["reason"] == "session_not_found"


# -------------------------------------------------------------------- versions


@pytest.mark.parametrize("version", NEGOTIABLE_VERSIONS)
def test_negotiate_version_echoes_supported_and_legacy(version: str) -> None:
    assert negotiate_version(version) == version
    assert "2024-11-05" in NEGOTIABLE_VERSIONS


@pytest.mark.parametrize("requested", ["2099-01-01", "", None, 20250618, ["2025-06-18"]])
def test_negotiate_version_falls_back_to_latest(requested: object) -> None:
    assert negotiate_version(requested) == LATEST_VERSION == "2025-11-25"


def test_version_at_least() -> None:
    assert version_at_least("2025-06-18", "2025-06-18")
    assert version_at_least("2025-11-25", "2025-06-18")
    assert not version_at_least("2025-03-26", "2025-06-18")
