"""The 2024-11-05 HTTP+SSE transport: its two endpoints, and the course of its POST.
(Public; see :mod:`weir.protocol`.)

The effects a legacy POST shares with a session-era one (``LoadSession``, ``Mail``,
``AdmitRequests``, the gate's, ``Finished``, ``GiveBack``, ``ACCEPTED``) live in
:mod:`weir.protocol.post`.
"""

from __future__ import annotations

from ._legacy import (
    NEW_LEGACY_SESSION,
    AdmitLegacyBatch,
    LegacyMessages,
    LegacyOpen,
    LegacyPostCourse,
    LegacyStreamCourse,
    OpenLegacyStream,
    RunOnLegacy,
    route_legacy,
)

__all__ = [
    "NEW_LEGACY_SESSION",
    "AdmitLegacyBatch",
    "LegacyMessages",
    "LegacyOpen",
    "LegacyPostCourse",
    "LegacyStreamCourse",
    "OpenLegacyStream",
    "RunOnLegacy",
    "route_legacy",
]
