"""A session's SSE streams: the per-stream log (frames, replay, retention), the
session's table of streams, and the writer's next move.

(Public; see :mod:`weir.protocol`.)
"""

from __future__ import annotations

from ._streams import StreamKind, StreamLog, StreamTable, WriterStep, completes, writer_step

__all__ = [
    "StreamKind",
    "StreamLog",
    "StreamTable",
    "WriterStep",
    "completes",
    "writer_step",
]
