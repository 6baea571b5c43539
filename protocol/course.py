"""One request's course through the idempotency gate: claim, run, record.

:class:`CallCourse` orders the steps; the driver performs each one it asks for
(:class:`Claim`, :class:`ClaimAgain`, :class:`Run`, :class:`Answer`,
:class:`Record`, :class:`AppendRecords`) and reports back.

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

__all__ = [
    "INTERRUPTED_MESSAGE",
    "Answer",
    "AppendRecords",
    "CallCourse",
    "Claim",
    "ClaimAgain",
    "CoursePhase",
    "Record",
    "Run",
    "interrupted",
]
