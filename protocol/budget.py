"""Byte budgets: retained history and results, the frame-size estimate, and what a
result too large for a session's credit becomes.

(Public; see :mod:`weir.protocol`.)
"""

from __future__ import annotations

from ._budget import RetentionBudget
from ._flow import HEAD_ALLOWANCE, INITIAL_FRAME_ESTIMATE, fit_result

__all__ = [
    "HEAD_ALLOWANCE",
    "INITIAL_FRAME_ESTIMATE",
    "RetentionBudget",
    "fit_result",
]
