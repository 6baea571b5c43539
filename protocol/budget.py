"""Byte budgets: retained history and results, and what a result too large for a
session's credit becomes.

(Public; see :mod:`weir.protocol`.)
"""

from __future__ import annotations

from ._budget import HEAD_ALLOWANCE, RetentionBudget, fit_result

__all__ = [
    "HEAD_ALLOWANCE",
    "RetentionBudget",
    "fit_result",
]
