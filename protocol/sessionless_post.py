"""The course of a sessionless (2026-07-28) POST, for runtimes: :class:`SessionlessCourse`
decides the order, the runtime performs each effect it asks for and delivers the
answer.  The run of the request's handler it hands over is
:mod:`weir.protocol.sessionless_run`'s.

The effects it shares with the session era's course (admission, the gate, the
reservation's end, the writer) are :mod:`weir.protocol.post`'s.  See
:mod:`weir.protocol._sessionless_post` for the theory of operation.
"""

from __future__ import annotations

from ._sessionless_post import (
    ANSWER_DISCOVER,
    CHOOSE_OWNER,
    AnswerReplay,
    Listen,
    OpenAnswerStream,
    OpenRequestState,
    RespondJson,
    RunOnStream,
    ServeTask,
    SessionlessCourse,
    SessionlessEffect,
    SessionlessRules,
    ToolSchema,
    ToolTasking,
)

__all__ = [
    "ANSWER_DISCOVER",
    "CHOOSE_OWNER",
    "AnswerReplay",
    "Listen",
    "OpenAnswerStream",
    "OpenRequestState",
    "RespondJson",
    "RunOnStream",
    "ServeTask",
    "SessionlessCourse",
    "SessionlessEffect",
    "SessionlessRules",
    "ToolSchema",
    "ToolTasking",
]
