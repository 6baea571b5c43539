"""One request's course through the idempotency gate: claim, run, record.

:class:`CallCourse` orders the steps of one delivery; the loop around its claims
is :func:`weir.protocol.post.gate`'s, and the runtime performs what the course
asks for after the gate (:class:`Record`, :class:`AppendRecords`) and reports back.

(Public; see :mod:`weir.protocol`.)
"""

from __future__ import annotations

from ._course import (
    GATE_STEPS,
    INTERRUPTED_MESSAGE,
    AppendRecords,
    CallCourse,
    Claim,
    ClaimCall,
    CoursePhase,
    HoldCall,
    Record,
    WaitForCall,
    interrupted,
)

__all__ = [
    "GATE_STEPS",
    "INTERRUPTED_MESSAGE",
    "AppendRecords",
    "CallCourse",
    "Claim",
    "ClaimCall",
    "CoursePhase",
    "HoldCall",
    "Record",
    "WaitForCall",
    "interrupted",
]
