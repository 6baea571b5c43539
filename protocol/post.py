"""The course of a session-era POST, for runtimes: :class:`PostCourse` decides the
order, the runtime performs each effect it asks for and delivers the answer.

See :mod:`weir.protocol._post` for the theory of operation and the effect list.
"""

from __future__ import annotations

from ._post import (
    ACCEPTED,
    ATTACH_WRITER,
    ENTER_REQUEST,
    MARK_BOUND,
    REBIND_METHOD,
    AdmitRequests,
    AllocateEpoch,
    AnswerJson,
    BatchEntries,
    ChannelRecord,
    CountIn,
    Effect,
    Finished,
    GiveBack,
    LoadSession,
    Mail,
    OpenRequestStream,
    PostCourse,
    PostRules,
    PostSession,
    Rebind,
    RunBatch,
    RunCalls,
    StartEntry,
)

__all__ = [
    "ACCEPTED",
    "ATTACH_WRITER",
    "ENTER_REQUEST",
    "MARK_BOUND",
    "REBIND_METHOD",
    "AdmitRequests",
    "AllocateEpoch",
    "AnswerJson",
    "BatchEntries",
    "ChannelRecord",
    "CountIn",
    "Effect",
    "Finished",
    "GiveBack",
    "LoadSession",
    "Mail",
    "OpenRequestStream",
    "PostCourse",
    "PostRules",
    "PostSession",
    "Rebind",
    "RunBatch",
    "RunCalls",
    "StartEntry",
]
