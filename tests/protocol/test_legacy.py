"""Tests for weir.protocol._legacy: the 2024-11-05 HTTP+SSE endpoint rules."""

from __future__ import annotations

import pytest

from weir.protocol import EndpointConfig, HttpRequest, RemoteProtocolError
from weir.protocol.legacy import LegacyMessages, LegacyOpen, route_legacy

from .helpers import HOST, PING, http_request, refused

CONFIG = EndpointConfig(allowed_hosts=frozenset({HOST.split(":")[0]}))
_HOST = {"host": HOST}
BATCH = b'[{"jsonrpc":"2.0","id":1,"method":"ping"},{"jsonrpc":"2.0","id":2,"method":"ping"}]'


def _route(request: HttpRequest, sse_path: str | None = "/sse") -> LegacyOpen | LegacyMessages:
    return route_legacy(request, CONFIG, sse_path=sse_path, messages_path="/messages")


def _open(**headers: str | None) -> HttpRequest:
    defaults = {"host": HOST, "accept": "text/event-stream"}
    return http_request("GET", target="/sse", headers=headers, defaults=defaults)


def _messages(
    body: bytes = PING, target: str = "/messages?session_id=abc", **headers: str | None
) -> HttpRequest:
    defaults = {"host": HOST, "content-type": "application/json"}
    return http_request("POST", body, target=target, headers=headers, defaults=defaults)


def test_the_stream_and_the_messages_route() -> None:
    assert isinstance(_route(_open()), LegacyOpen)
    routed = _route(_messages(BATCH))
    assert isinstance(routed, LegacyMessages)
    assert routed.session_id == "abc" and routed.is_batch and len(routed.messages) == 2


@pytest.mark.parametrize(
    ("request_", "status", "reason"),
    [
        (_open(host="evil.example"), 403, "forbidden_host"),
        (http_request("POST", target="/sse", defaults={"host": HOST}), 405, "method_not_allowed"),
        (
            http_request("GET", target="/messages", defaults={"host": HOST}),
            405,
            "method_not_allowed",
        ),
        (_open(accept="application/json"), 406, "not_acceptable"),
        (
            _messages(PING, "/messages?session_id=abc", **{"content-type": "text/plain"}),
            415,
            "unsupported_media_type",
        ),
        (_messages(target="/messages"), 400, "session_required"),
        (_messages(b"{not json"), 400, "parse_error"),
        (http_request("GET", target="/elsewhere", defaults={"host": HOST}), 404, "not_found"),
    ],
)
def test_each_refusal_is_the_current_endpoints(
    request_: HttpRequest, status: int, reason: str
) -> None:
    with pytest.raises(RemoteProtocolError) as info:
        _route(request_)
    assert refused(info.value) == (status, reason)


def test_a_405_names_the_one_allowed_method() -> None:
    with pytest.raises(RemoteProtocolError) as info:
        _route(http_request("DELETE", target="/messages", defaults={"host": HOST}))
    assert dict(info.value.headers)["allow"] == "POST"


def test_without_a_stream_path_messages_still_route() -> None:
    assert isinstance(_route(_messages(), sse_path=None), LegacyMessages)
    with pytest.raises(RemoteProtocolError) as info:
        _route(_open(), sse_path=None)
    assert refused(info.value)[0] == 404
