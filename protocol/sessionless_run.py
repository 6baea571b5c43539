"""The run of a sessionless (2026-07-28) request's handler, for runtimes:
:class:`SessionlessRun` runs the handler, seals an ``input_required`` answer's request
state, encodes the result, records a keyed call's outcome and responds, in that order;
the runtime performs each effect and delivers the answer.  See
:mod:`weir.protocol._sessionless_run` for the theory of operation.
"""

from __future__ import annotations

from ._sessionless_run import (
    RUN_HANDLER,
    EncodeResult,
    InputAsked,
    RecordOutcome,
    Respond,
    SealState,
    SessionlessRun,
    Tasking,
)

__all__ = [
    "RUN_HANDLER",
    "EncodeResult",
    "InputAsked",
    "RecordOutcome",
    "Respond",
    "SealState",
    "SessionlessRun",
    "Tasking",
]
