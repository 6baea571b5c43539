"""GET streams and resumption: which stream a GET attaches to, policies, and the
steps of serving a cursor from a shared store (the GET course,
:class:`weir.protocol.get.GetCourse`, drives the store tail and asks for them).

(Public; see :mod:`weir.protocol`.)
"""

from __future__ import annotations

from ._resume import (
    KEEPALIVE,
    RESUME_POLICIES,
    TailPause,
    TailSend,
    displaces_writer,
)

__all__ = [
    "KEEPALIVE",
    "RESUME_POLICIES",
    "TailPause",
    "TailSend",
    "displaces_writer",
]
