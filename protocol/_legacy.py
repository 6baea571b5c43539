"""The endpoint rules of the 2024-11-05 HTTP+SSE transport.

Theory of operation
-------------------
The legacy transport has two URLs: ``GET <sse path>`` opens a session whose one
stream carries every response (its first event names the URL to POST to), and
``POST <messages path>?session_id=<id>`` delivers the client's messages, answered
202.  :func:`route_legacy` checks everything about such a request that needs no
state, with the same refusals as the current endpoint -- Host/Origin (403),
the method for the path (405 with ``Allow``), ``Accept: text/event-stream`` for
the stream (406), ``Content-Type: application/json`` for messages (415), the
``session_id`` parameter (400 ``session_required``) and the JSON-RPC body (400,
batches allowed: 2024-11-05 has them) -- and returns :class:`LegacyOpen` or
:class:`LegacyMessages`.  Whether the session exists is the driver's question.
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import parse_qs

from ._endpoint import (
    EndpointConfig,
    _refuse,
    accepts,
    check_host_and_origin,
    check_json_body,
    check_method,
)
from ._errors import Reason
from ._http import Headers, HttpRequest
from ._jsonrpc import Message, decode_body


@dataclass(frozen=True, slots=True)
class LegacyOpen:
    """``GET <sse path>``: open a legacy session and its stream."""

    headers: Headers


@dataclass(frozen=True, slots=True)
class LegacyMessages:
    """``POST <messages path>?session_id=``: messages for an open legacy session."""

    session_id: str
    messages: list[Message]
    is_batch: bool
    headers: Headers


def route_legacy(
    request: HttpRequest,
    config: EndpointConfig,
    *,
    sse_path: str | None,
    messages_path: str,
) -> LegacyOpen | LegacyMessages:
    """Classify and validate one request for the legacy transport's two paths.

    ``sse_path`` None: no new legacy sessions are opened (messages still route).

    Raises:
        RemoteProtocolError: the refusal to send (see the module docstring);
            404 for any other path.
    """
    headers = request.headers
    if request.path != messages_path and (sse_path is None or request.path != sse_path):
        raise _refuse(404, Reason.NOT_FOUND, f"no legacy endpoint at {request.path!r}")
    check_host_and_origin(headers, config)
    if request.path == sse_path:
        check_method(request.method, "GET")
        if not accepts(headers.get("accept"), "text/event-stream"):
            raise _refuse(406, Reason.NOT_ACCEPTABLE, "GET must accept text/event-stream")
        return LegacyOpen(headers)
    check_method(request.method, "POST")
    check_json_body(headers)
    sid = parse_qs(request.query).get("session_id", [None])[0]
    if sid is None:
        raise _refuse(400, Reason.SESSION_REQUIRED, "session_id query parameter is required")
    messages, is_batch = decode_body(request.body, allow_batch=True, max_batch=config.max_batch)
    return LegacyMessages(sid, messages, is_batch, headers)
