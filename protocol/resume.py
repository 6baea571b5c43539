"""GET streams and resumption: which stream a GET attaches to, policies, cursor binding.

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

__all__ = [
    "RESUME_POLICIES",
    "check_cursor_channel",
    "check_resume_policy",
    "displaces_writer",
    "standalone_plan",
]
