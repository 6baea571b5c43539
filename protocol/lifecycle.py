"""``initialize`` and protocol revisions: checks, negotiation, the result, priming.

(Public; see :mod:`weir.protocol`.)
"""

from __future__ import annotations

from ._endpoint import (
    ALL_VERSIONS,
    DEFAULT_VERSION,
    LATEST_VERSION,
    NEGOTIABLE_VERSIONS,
    SUPPORTED_VERSIONS,
    negotiate_version,
    version_at_least,
)
from ._lifecycle import (
    CLIENT_INFO_KEPT,
    MAX_CLIENT_CAPABILITIES,
    MAX_CLIENT_INFO_FIELD,
    InitializeParams,
    initialize_result,
    parse_initialize,
    primes_streams,
)

__all__ = [
    "ALL_VERSIONS",
    "CLIENT_INFO_KEPT",
    "DEFAULT_VERSION",
    "LATEST_VERSION",
    "MAX_CLIENT_CAPABILITIES",
    "MAX_CLIENT_INFO_FIELD",
    "NEGOTIABLE_VERSIONS",
    "SUPPORTED_VERSIONS",
    "InitializeParams",
    "initialize_result",
    "negotiate_version",
    "parse_initialize",
    "primes_streams",
    "version_at_least",
]
