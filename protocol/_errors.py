"""Errors raised by the sans-io core, split by blame.

Theory of operation
-------------------
Every refusal weir makes is an HTTP status plus a JSON-RPC error object whose
``error.data.reason`` is a stable, machine-readable string (see :class:`Reason`).
Clients branch on ``reason``, never on the status alone.

* :class:`RemoteProtocolError` -- the peer sent something we will not serve.  It
  carries everything needed to answer: ``http_status``, ``reason``, the JSON-RPC
  ``code``, the request ``id`` when known, and optionally ``retry_after_ms`` and
  extra response headers.  The core never lets any other exception escape from
  its receive path.
* :class:`LocalProtocolError` -- our caller (the driver or the application) used the
  API wrongly, e.g. wrote a body after ending a response.  It is a bug, not a peer
  problem.

After a ``LocalProtocolError`` from :class:`weir.protocol.HttpConnection` the connection
is in an error state and must be closed.
"""

from __future__ import annotations

import enum
from typing import Any


class Reason(enum.StrEnum):
    """Machine-readable refusal reasons carried in ``error.data.reason``."""

    PARSE_ERROR = "parse_error"
    INVALID_REQUEST = "invalid_request"
    BATCH_NOT_SUPPORTED = "batch_not_supported"
    NOT_FOUND = "not_found"
    METHOD_NOT_ALLOWED = "method_not_allowed"
    NOT_ACCEPTABLE = "not_acceptable"
    UNSUPPORTED_MEDIA_TYPE = "unsupported_media_type"
    FORBIDDEN_HOST = "forbidden_host"
    FORBIDDEN_ORIGIN = "forbidden_origin"
    UNSUPPORTED_PROTOCOL_VERSION = "unsupported_protocol_version"
    # The sessionless era (2026-07-28).
    HEADER_MISMATCH = "header_mismatch"
    MISSING_CAPABILITY = "missing_capability"
    METHOD_NOT_FOUND = "method_not_found"
    REQUEST_STATE_INVALID = "request_state_invalid"
    SESSION_REQUIRED = "session_required"
    SESSION_NOT_FOUND = "session_not_found"
    SESSION_INVALID = "session_invalid"
    STREAM_CONFLICT = "stream_conflict"
    PAYLOAD_TOO_LARGE = "payload_too_large"
    HEADERS_TOO_LARGE = "headers_too_large"
    MALFORMED_HTTP = "malformed_http"
    CURSOR_INVALID = "cursor_invalid"
    CURSOR_UNKNOWN = "cursor_unknown"
    CURSOR_STALE = "cursor_stale"
    CHANNEL_UNBOUND = "channel_unbound"
    STREAM_HALF_OPEN = "stream_half_open"
    IN_PROGRESS = "in_progress"
    IDEMPOTENCY_KEY_REUSED = "idempotency_key_reused"
    INTERRUPTED = "interrupted"
    CANCELLED = "cancelled"
    SHUTTING_DOWN = "shutting_down"
    STORE_UNAVAILABLE = "store_unavailable"
    # Limits (every one a configured bound; see the table in docs/limits.md).
    URI_TOO_LONG = "uri_too_long"
    TOO_MANY_HEADERS = "too_many_headers"
    AMBIGUOUS_FRAMING = "ambiguous_framing"
    EXPECTATION_FAILED = "expectation_failed"
    REQUEST_TIMEOUT = "request_timeout"
    BATCH_TOO_LARGE = "batch_too_large"
    SESSION_LIMIT = "session_limit"
    SUBSCRIPTION_LIMIT = "subscription_limit"
    RESULT_TOO_LARGE = "result_too_large"
    OUTCOME_EVICTED = "outcome_evicted"
    OVERLOADED = "overloaded"
    TASK_NOT_FOUND = "task_not_found"
    TASK_LIMIT = "task_limit"
    # Authorization.
    UNAUTHORIZED = "unauthorized"
    INSUFFICIENT_SCOPE = "insufficient_scope"
    VERIFIER_UNAVAILABLE = "verifier_unavailable"


#: JSON-RPC 2.0 error codes used by weir.
PARSE_ERROR = -32700
INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
INTERNAL_ERROR = -32603
#: Implementation-defined server error used for transport-level refusals.
SERVER_ERROR = -32000
#: MCP: resource not found.
RESOURCE_NOT_FOUND = -32002


class ProtocolError(Exception):
    """Base class of the core's errors.

    Attributes:
        message: human-readable text, also used as the JSON-RPC error message.
        http_status: the HTTP status to answer with.
        reason: the machine-readable refusal reason.
        code: the JSON-RPC error code for the error body.
        request_id: the JSON-RPC id of the offending request, when known.
        retry_after_ms: when set, the answer carries ``Retry-After`` and
            ``data.retryAfterMs``.
        headers: extra response headers (e.g. ``Allow`` for a 405).
        data: extra members merged into ``error.data``.
    """

    def __init__(
        self,
        message: str,
        *,
        http_status: int = 400,
        reason: Reason = Reason.INVALID_REQUEST,
        code: int = INVALID_REQUEST,
        request_id: int | str | None = None,
        retry_after_ms: int | None = None,
        headers: tuple[tuple[str, str], ...] = (),
        data: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.http_status = http_status
        self.reason = reason
        self.code = code
        self.request_id = request_id
        self.retry_after_ms = retry_after_ms
        self.headers = headers
        self.data = data

    def error_data(self) -> dict[str, Any]:
        """Return the ``error.data`` object: ``reason`` plus any extras."""
        out: dict[str, Any] = {"reason": str(self.reason)}
        if self.retry_after_ms is not None:
            out["retryAfterMs"] = self.retry_after_ms
        if self.data:
            out.update(self.data)
        return out


class LocalProtocolError(ProtocolError):
    """Our caller misused the core's API; a bug on this side of the wire."""


class RemoteProtocolError(ProtocolError):
    """The peer sent something we will not serve; answer with ``http_status``."""
