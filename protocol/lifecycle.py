"""Protocol revisions and ``initialize``: the revisions served, its checks, its
result, and whether streams open with a priming event.

(Public; see :mod:`weir.protocol`.)
"""

from __future__ import annotations

from ._lifecycle import (
    ALL_VERSIONS,
    CLIENT_INFO_KEPT,
    MAX_CLIENT_CAPABILITIES,
    MAX_CLIENT_INFO_FIELD,
    AnswerInitialize,
    ForgetSession,
    InitializeCourse,
    OpenSession,
    initialize_result,
    parse_initialize,
)

__all__ = [
    "ALL_VERSIONS",
    "CLIENT_INFO_KEPT",
    "MAX_CLIENT_CAPABILITIES",
    "MAX_CLIENT_INFO_FIELD",
    "AnswerInitialize",
    "ForgetSession",
    "InitializeCourse",
    "OpenSession",
    "initialize_result",
    "parse_initialize",
]
