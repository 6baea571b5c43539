"""The 2024-11-05 HTTP+SSE transport's two endpoints.  (Public; see :mod:`weir.protocol`.)"""

from __future__ import annotations

from ._legacy import LegacyMessages, LegacyOpen, route_legacy

__all__ = [
    "LegacyMessages",
    "LegacyOpen",
    "route_legacy",
]
