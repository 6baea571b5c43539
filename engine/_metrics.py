"""The server's counters and their Prometheus text: :mod:`weir.common`'s
(``common/_metrics.py``, shared with the asyncio runtime), re-exported."""

from __future__ import annotations

from weir.common._metrics import Metrics, redact

__all__ = ["Metrics", "redact"]
