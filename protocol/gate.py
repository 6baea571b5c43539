"""Idempotency: the gate's rules, a call's course through it, its in-process records.

(Public; see :mod:`weir.protocol`.)
"""

from __future__ import annotations

from ._course import (
    INTERRUPTED_MESSAGE,
    Answer,
    AppendRecords,
    CallCourse,
    Claim,
    ClaimAgain,
    CoursePhase,
    Record,
    Run,
    interrupted,
)
from ._gate import (
    MAX_IDEMPOTENCY_KEY,
    CallOutcome,
    CallStart,
    Execute,
    GateDecision,
    GatePass,
    Refuse,
    Replay,
    Wait,
    WindowKey,
    call_key,
    fingerprint,
    gate_decision,
    replay_as,
)
from ._ledger import ENTRY_OVERHEAD, CallLedger

__all__ = [
    "ENTRY_OVERHEAD",
    "INTERRUPTED_MESSAGE",
    "MAX_IDEMPOTENCY_KEY",
    "Answer",
    "AppendRecords",
    "CallCourse",
    "CallLedger",
    "CallOutcome",
    "CallStart",
    "Claim",
    "ClaimAgain",
    "CoursePhase",
    "Execute",
    "GateDecision",
    "GatePass",
    "Record",
    "Refuse",
    "Replay",
    "Run",
    "Wait",
    "WindowKey",
    "call_key",
    "fingerprint",
    "gate_decision",
    "interrupted",
    "replay_as",
]
