"""The course of a sessionless (2026-07-28) POST, for runtimes: :class:`SessionlessCourse`
decides the order, the runtime performs each effect it asks for and delivers the
answer; :class:`SessionlessRun` is one run of the request's handler.

The effects it shares with the session era's course (admission, the gate, the
reservation's end, the writer) are :mod:`weir.protocol.post`'s.  See
:mod:`weir.protocol._sessionless_post` for the theory of operation.
"""

from __future__ import annotations

from ._sessionless_post import (
    ANSWER_DISCOVER,
    CHOOSE_OWNER,
    RUN_HANDLER,
    AnswerReplay,
    EncodeResult,
    InputAsked,
    Listen,
    OpenAnswerStream,
    OpenRequestState,
    RecordOutcome,
    Respond,
    RespondJson,
    RunOnStream,
    SealState,
    ServeTask,
    SessionlessCourse,
    SessionlessEffect,
    SessionlessRules,
    SessionlessRun,
    Tasking,
    ToolSchema,
    ToolTasking,
)

__all__ = [
    "ANSWER_DISCOVER",
    "CHOOSE_OWNER",
    "RUN_HANDLER",
    "AnswerReplay",
    "EncodeResult",
    "InputAsked",
    "Listen",
    "OpenAnswerStream",
    "OpenRequestState",
    "RecordOutcome",
    "Respond",
    "RespondJson",
    "RunOnStream",
    "SealState",
    "ServeTask",
    "SessionlessCourse",
    "SessionlessEffect",
    "SessionlessRules",
    "SessionlessRun",
    "Tasking",
    "ToolSchema",
    "ToolTasking",
]
