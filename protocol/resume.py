"""GET streams and resumption: which stream a GET attaches to, policies, cursor
binding, and serving a cursor from a shared store (:class:`StoreTail` and the steps
it asks for).

(Public; see :mod:`weir.protocol`.)
"""

from __future__ import annotations

from ._resume import (
    KEEPALIVE,
    RESUME_POLICIES,
    StoreTail,
    TailPause,
    TailSend,
    TailStep,
    check_cursor_channel,
    check_resume_policy,
    displaces_writer,
    standalone_plan,
)

__all__ = [
    "KEEPALIVE",
    "RESUME_POLICIES",
    "StoreTail",
    "TailPause",
    "TailSend",
    "TailStep",
    "check_cursor_channel",
    "check_resume_policy",
    "displaces_writer",
    "standalone_plan",
]
