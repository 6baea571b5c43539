"""The sessionless era (2026-07-28): per-request checks, header values, result fields.

(Public; see :mod:`weir.protocol`.)
"""

from __future__ import annotations

from ._sessionless import (
    META_SUBSCRIPTION_ID,
    MISSING_CAPABILITY,
    SESSIONLESS_VERSIONS,
    SessionlessMessage,
    complete,
    discover_result,
    method_not_found,
    missing_capability,
)

__all__ = [
    "META_SUBSCRIPTION_ID",
    "MISSING_CAPABILITY",
    "SESSIONLESS_VERSIONS",
    "SessionlessMessage",
    "complete",
    "discover_result",
    "method_not_found",
    "missing_capability",
]
