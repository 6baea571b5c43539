"""GET streams and resumption: which stream a GET attaches to, policies, cursor
binding, and serving a cursor from a shared store.

(Public; see :mod:`weir.protocol`.)
"""

from __future__ import annotations

from ._resume import (
    RESUME_POLICIES,
    check_cursor_channel,
    check_resume_policy,
    displaces_writer,
    standalone_plan,
)
from ._tail import KEEPALIVE, StoredFrame, StoreTail, TailExpire, TailPause, TailSend, TailStep

__all__ = [
    "KEEPALIVE",
    "RESUME_POLICIES",
    "StoreTail",
    "StoredFrame",
    "TailExpire",
    "TailPause",
    "TailSend",
    "TailStep",
    "check_cursor_channel",
    "check_resume_policy",
    "displaces_writer",
    "standalone_plan",
]
