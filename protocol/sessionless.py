"""The sessionless era (2026-07-28): per-request checks, header values, result fields.

(Public; see :mod:`weir.protocol`.)
"""

from __future__ import annotations

from ._sessionless import (
    CACHEABLE,
    HEADER_MISMATCH,
    META_CAPABILITIES,
    META_CLIENT_INFO,
    META_LOG_LEVEL,
    META_SERVER_INFO,
    META_SUBSCRIPTION_ID,
    META_VERSION,
    MISSING_CAPABILITY,
    NAMED_TARGET,
    SESSIONLESS_VERSIONS,
    UNSUPPORTED_VERSION,
    RequestMeta,
    SessionlessMessage,
    check_param_headers,
    check_sessionless,
    complete,
    decode_header_value,
    discover_result,
    is_sessionless,
    method_not_found,
    missing_capability,
    param_headers,
    request_meta,
    unsupported_version,
)

__all__ = [
    "CACHEABLE",
    "HEADER_MISMATCH",
    "META_CAPABILITIES",
    "META_CLIENT_INFO",
    "META_LOG_LEVEL",
    "META_SERVER_INFO",
    "META_SUBSCRIPTION_ID",
    "META_VERSION",
    "MISSING_CAPABILITY",
    "NAMED_TARGET",
    "SESSIONLESS_VERSIONS",
    "UNSUPPORTED_VERSION",
    "RequestMeta",
    "SessionlessMessage",
    "check_param_headers",
    "check_sessionless",
    "complete",
    "decode_header_value",
    "discover_result",
    "is_sessionless",
    "method_not_found",
    "missing_capability",
    "param_headers",
    "request_meta",
    "unsupported_version",
]
