"""JSON-RPC 2.0: error codes, decoding, generic encoding (messages: the top level).

(Public; see :mod:`weir.protocol`.)
"""

from __future__ import annotations

from ._errors import (
    INTERNAL_ERROR,
    INVALID_PARAMS,
    INVALID_REQUEST,
    METHOD_NOT_FOUND,
    PARSE_ERROR,
    RESOURCE_NOT_FOUND,
    SERVER_ERROR,
)
from ._jsonrpc import decode_body, decode_message, encode, error_body

__all__ = [
    "INTERNAL_ERROR",
    "INVALID_PARAMS",
    "INVALID_REQUEST",
    "METHOD_NOT_FOUND",
    "PARSE_ERROR",
    "RESOURCE_NOT_FOUND",
    "SERVER_ERROR",
    "decode_body",
    "decode_message",
    "encode",
    "error_body",
]
