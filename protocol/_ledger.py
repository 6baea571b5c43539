"""The idempotency gate's records for one session, in memory and bounded.

Theory of operation
-------------------
The gate (:mod:`._gate`) needs somewhere to remember, per call key, what the call
was (its fingerprint) and how it ended (its response).  A shared store keeps that in
Redis; a single process keeps it here.  :class:`CallLedger` is that record, with the
one atomic step the gate relies on -- :meth:`CallLedger.begin`: "claim the key unless
someone has; else say what is known" -- and :meth:`CallLedger.finish` to record an
outcome.  Both drivers' in-process gates are this one object.

Everything a client can make it hold is bounded, and eviction is never silent:

* at most ``max_calls`` finished calls: the oldest is forgotten whole (its key too,
  so a retry of it *could* run again -- which is why the limit is on count, large,
  and reached only by a client that makes very many distinct calls);
* at most ``max_bytes`` of keys (each charged ``len(key) + ENTRY_OVERHEAD``) and
  stored responses: first the oldest responses are dropped, leaving a *tombstone*
  (the call is known to have run; a retry is told ``outcome_evicted`` and does not
  run it again), and only if the keys alone are over, the oldest finished calls are
  forgotten whole;
* a running claim is never dropped.

A wider budget's :meth:`CallLedger.shed` (memory pressure from other owners) only
ever turns stored responses into tombstones: it never forgets a key, so what is
left of an evicted outcome is its key and fingerprint, charged at
``len(key) + ENTRY_OVERHEAD``.  Only the two bounds above, this ledger's own
client's volume, forget keys.

:attr:`CallLedger.held` is exact after every operation, so an owner can charge the
difference to a wider budget.  No clock, no I/O: a claim lives until its owner
finishes it (a single process's claims die with it, so they need no lease).
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Final

from ._gate import CallOutcome

#: Bytes charged for each remembered key, besides the key itself.
ENTRY_OVERHEAD: Final = 128

#: A stored response that was dropped: the call ran, its result is gone.
_EVICTED: Final = b""


def _entry_size(key: str) -> int:
    return len(key) + ENTRY_OVERHEAD


class CallLedger:
    """One session's gate records: key -> (fingerprint, response or running)."""

    __slots__ = ("_calls", "held", "max_bytes", "max_calls")

    def __init__(self, *, max_calls: int = 1024, max_bytes: int = 1024 * 1024) -> None:
        self.max_calls = max(1, max_calls)
        self.max_bytes = max_bytes
        #: Bytes held: every key (with its overhead) and every stored response.
        self.held = 0
        self._calls: OrderedDict[str, tuple[bytes, bytes | None]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._calls)

    def begin(self, key: str, fingerprint: bytes) -> tuple[CallOutcome, bytes | None]:
        """Claim ``key`` for a call with ``fingerprint`` unless it is known already.

        Returns ``(EXECUTE, None)`` when the key is now claimed (run the call, then
        :meth:`finish`); ``(RUNNING, None)``, ``(DONE, response)``, ``(EVICTED,
        None)`` or ``(MISMATCH, None)`` otherwise.
        """
        found = self._calls.get(key)
        if found is None:
            self._calls[key] = (fingerprint, None)
            self.held += _entry_size(key)
            return CallOutcome.EXECUTE, None
        fp, payload = found
        if fp != fingerprint:
            return CallOutcome.MISMATCH, None
        if payload is None:
            return CallOutcome.RUNNING, None
        if payload is _EVICTED:
            return CallOutcome.EVICTED, None
        return CallOutcome.DONE, payload

    def finish(self, key: str, payload: bytes | None) -> None:
        """Record claim ``key``'s response, or release the claim (``None``: nothing ran
        to completion, so a retry may run it).  Then enforce the bounds; the call just
        recorded is the last to go.  A key not claimed is ignored."""
        if not self._set(key, payload):
            return
        if payload is not None:
            self._calls.move_to_end(key)
        while len(self._calls) > self.max_calls and self._forget_oldest_finished():
            pass  # (running claims are skipped, never forgotten)
        if self.held > self.max_bytes:
            for oldest, (_, stored) in list(self._calls.items()):
                if self.held <= self.max_bytes or oldest == key:
                    break
                if stored:
                    self._tombstone(oldest)
            self._forget_for(self.held - self.max_bytes)

    def shed(self, nbytes: int) -> int:
        """Free about ``nbytes`` (a wider budget asks): stored responses, oldest first,
        each leaving a tombstone.  Returns the bytes freed, which may be less than
        asked: keys -- running claims and tombstones alike -- are never forgotten
        here, so memory pressure never lets a retry run a finished call again."""
        before = self.held
        for key, (_, stored) in list(self._calls.items()):
            if before - self.held >= nbytes:
                break
            if stored:
                self._tombstone(key)
        return before - self.held

    def recent(self, n: int) -> list[bytes]:
        """The stored responses of the ``n`` most recently finished calls, oldest first."""
        out = [p for _, p in reversed(self._calls.values()) if p]
        return out[:n][::-1]

    # ---------------------------------------------------------------- internals
    def _set(self, key: str, payload: bytes | None) -> bool:
        found = self._calls.get(key)
        if found is None:
            return False
        if found[1] is not None:
            self.held -= len(found[1])  # finished twice: the newer outcome replaces it
        if payload is None:
            del self._calls[key]
            self.held -= _entry_size(key)
        else:
            self._calls[key] = (found[0], payload)
            self.held += len(payload)
        return True

    def _tombstone(self, key: str) -> None:
        found = self._calls.get(key)
        if found is not None and found[1]:
            self.held -= len(found[1])
            self._calls[key] = (found[0], _EVICTED)

    def _forget_for(self, wanted: int) -> None:
        # Forgetting keys weakens the gate; do it only if the finished keys can cover
        # what is wanted (when running claims hold the bytes, it would free nothing).
        if wanted <= 0:
            return
        finished = sum(_entry_size(k) for k, (_, p) in self._calls.items() if p is not None)
        if finished < wanted:
            return
        target = self.held - wanted
        while self.held > target and self._forget_oldest_finished():
            pass

    def _forget_oldest_finished(self) -> bool:
        for key, (_, stored) in self._calls.items():
            if stored is not None:
                self._set(key, None)
                return True
        return False
