"""Byte budgets: retained history and results, and the frame-size estimate.

(Public; see :mod:`weir.protocol`.)
"""

from __future__ import annotations

from ._budget import RetentionBudget
from ._flow import INITIAL_FRAME_ESTIMATE

__all__ = [
    "INITIAL_FRAME_ESTIMATE",
    "RetentionBudget",
]
