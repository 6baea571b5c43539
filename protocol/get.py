"""The courses of a GET (a stream) and a DELETE, for runtimes: :class:`GetCourse` and
:class:`DeleteCourse` decide the order, the runtime performs each effect they ask
for and delivers the answer.

The effects they share with a POST (``LoadSession``, ``MARK_BOUND``,
``AllocateEpoch``) live in :mod:`weir.protocol.post`; a replay's tail steps
(``TailSend``, ``TailPause``) in :mod:`weir.protocol.resume`.
See :mod:`weir.protocol._get` for the theory of operation and the effect list
(and for what a course reads of a session, ``StreamSession``, and of a stored
stream, ``StoredStream``).
"""

from __future__ import annotations

from ._get import (
    DELETED,
    END_REPLAY,
    END_SESSION,
    KEEP_TAILING,
    ClaimReader,
    DeleteCourse,
    DeleteEffect,
    DetachStream,
    ExpireClaim,
    GetCourse,
    GetEffect,
    LookUpStream,
    OpenStandalone,
    PrimeStream,
    ReadEvents,
    StartReplay,
    StreamRules,
    TailCut,
    WriteStream,
)

__all__ = [
    "DELETED",
    "END_REPLAY",
    "END_SESSION",
    "KEEP_TAILING",
    "ClaimReader",
    "DeleteCourse",
    "DeleteEffect",
    "DetachStream",
    "ExpireClaim",
    "GetCourse",
    "GetEffect",
    "LookUpStream",
    "OpenStandalone",
    "PrimeStream",
    "ReadEvents",
    "StartReplay",
    "StreamRules",
    "TailCut",
    "WriteStream",
]
