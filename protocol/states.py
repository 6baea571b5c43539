"""The transition tables of sessions, streams and credit.  (Public; see :mod:`weir.protocol`.)"""

from __future__ import annotations

from ._states import (
    CREDIT_TRANSITIONS,
    SESSION_TRANSITIONS,
    STREAM_TRANSITIONS,
    CreditInput,
    CreditState,
    SessionInput,
    SessionState,
    StreamInput,
    StreamState,
    credit_transition,
    session_transition,
    stream_transition,
)

__all__ = [
    "CREDIT_TRANSITIONS",
    "SESSION_TRANSITIONS",
    "STREAM_TRANSITIONS",
    "CreditInput",
    "CreditState",
    "SessionInput",
    "SessionState",
    "StreamInput",
    "StreamState",
    "credit_transition",
    "session_transition",
    "stream_transition",
]
