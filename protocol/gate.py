"""Idempotency: the gate's records, what a store answers about a call key, and the
in-process ledger that both drivers use when there is no shared store.

A store implementer needs these: :class:`CallStart` (what a claim found),
:class:`CallOutcome` (how a recorded call ended), :class:`CallLedger` (the bounded
in-memory records), ``ENTRY_OVERHEAD`` (the bytes a key is charged beyond its length,
so that a shared store's gate is bounded as the ledger is).

(Public; see :mod:`weir.protocol`.)
"""

from __future__ import annotations

from ._gate import ENTRY_OVERHEAD, CallLedger, CallOutcome, CallStart

__all__ = [
    "ENTRY_OVERHEAD",
    "CallLedger",
    "CallOutcome",
    "CallStart",
]
