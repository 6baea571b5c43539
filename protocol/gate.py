"""Idempotency: the gate's rules and its in-process records.  (Public; see :mod:`weir.protocol`.)"""

from __future__ import annotations

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
    call_key,
    fingerprint,
    gate_decision,
    replay_as,
)
from ._ledger import ENTRY_OVERHEAD, CallLedger

__all__ = [
    "ENTRY_OVERHEAD",
    "MAX_IDEMPOTENCY_KEY",
    "CallLedger",
    "CallOutcome",
    "CallStart",
    "Execute",
    "GateDecision",
    "GatePass",
    "Refuse",
    "Replay",
    "Wait",
    "call_key",
    "fingerprint",
    "gate_decision",
    "replay_as",
]
