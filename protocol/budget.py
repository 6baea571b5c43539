"""Byte budgets: retained history and results, and what a result too large for a
session's credit becomes.

(Public; see :mod:`weir.protocol`.)
"""

from __future__ import annotations

from ._budget import (
    FRAMING_ALLOWANCE,
    HEAD_ALLOWANCE,
    RetentionBudget,
    fit_response,
    fit_result,
)

__all__ = [
    "FRAMING_ALLOWANCE",
    "HEAD_ALLOWANCE",
    "RetentionBudget",
    "fit_response",
    "fit_result",
]
