"""Byte budgets: retained history and results, and what a result too large for a
session's credit becomes.

(Public; see :mod:`weir.protocol`.)
"""

from __future__ import annotations

from ._budget import RetentionBudget, fit_response

__all__ = ["RetentionBudget", "fit_response"]
