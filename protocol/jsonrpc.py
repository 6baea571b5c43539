"""JSON-RPC 2.0 messages and their encoders: the typed messages a route yields,
encoders that write exact bytes, and the error body of a refusal.

(Public; see :mod:`weir.protocol`.)
"""

from __future__ import annotations

from ._jsonrpc import (
    ErrorResponse,
    Message,
    Notification,
    Request,
    RequestId,
    Response,
    encode_error,
    encode_notification,
    encode_request,
    encode_result,
    error_body,
)

__all__ = [
    "ErrorResponse",
    "Message",
    "Notification",
    "Request",
    "RequestId",
    "Response",
    "encode_error",
    "encode_notification",
    "encode_request",
    "encode_result",
    "error_body",
]
