"""The states of sessions, streams and credit, the inputs that move them, and the
session's transition function (the tables themselves are the core's).

(Public; see :mod:`weir.protocol`.)
"""

from __future__ import annotations

from ._states import (
    CreditState,
    SessionInput,
    SessionState,
    StreamInput,
    StreamState,
    session_transition,
)

__all__ = [
    "CreditState",
    "SessionInput",
    "SessionState",
    "StreamInput",
    "StreamState",
    "session_transition",
]
