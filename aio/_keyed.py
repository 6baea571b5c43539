"""The idempotency gate of sessionless ``tools/call`` on the asyncio runtime.

Theory of operation
-------------------
A call with an ``Idempotency-Key`` is claimed in the principal's namespace record of
the driver's session store (the Trio runtime's record too, so replicas of both runtimes
share it), created on first use and again if the store let it go; the claim names this
replica and carries a lease, renewed while the call runs here.  A delivery that finds
the call running here waits for its end; one that finds it running elsewhere claims
again until the outcome is there.  Outcomes are recorded in the store, and the waiters
here woken, once it has them.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import OrderedDict
from typing import Final

from weir.engine._store_errors import RetentionFull, SessionGone, StoreUnavailable
from weir.engine._store_records import SessionRecord
from weir.protocol.course import ClaimCall, HoldCall, WaitForCall
from weir.protocol.gate import CallStart

from ._shared import NAMESPACE, SharedState, overloaded, store_unavailable

#: Principals whose namespace this process knows exists (more are created again).
MAX_KNOWN_NAMESPACES: Final = 4096


class KeyedCalls:
    """The idempotency gate of sessionless ``tools/call``: claims and outcomes in the
    driver's store, in the principal's namespace record (:data:`NAMESPACE`, the Trio
    runtime's too, so replicas of both share it), created on first use and again if
    the store let it go.  A claim names this replica and carries a lease, renewed
    while the call runs here (``._shared``); a delivery running elsewhere is waited
    for by claiming again."""

    def __init__(self, shared: SharedState) -> None:
        self.shared = shared
        #: Keys whose calls run here, and the wake-ups of deliveries waiting for one.
        self.held: set[tuple[str, str]] = set()
        self.done: dict[tuple[str, str], asyncio.Event] = {}
        self._known: OrderedDict[str, None] = OrderedDict()

    async def step(self, principal: str, effect: ClaimCall | WaitForCall | HoldCall) -> object:
        """Perform one step of the core's gate loop; its answer.

        Raises:
            RemoteProtocolError: 503 ``store_unavailable`` or ``overloaded``.
        """
        if isinstance(effect, HoldCall):
            self.held.add((principal, effect.key))
            self.shared.renew_soon()
            return None
        if isinstance(effect, WaitForCall):
            wait = max(0.0, effect.until - asyncio.get_running_loop().time())
            if effect.local:
                finished = self.done.setdefault((principal, effect.key), asyncio.Event())
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(finished.wait(), wait)
            else:
                await asyncio.sleep(wait)
            return None
        start = await self._claim(principal, effect)
        return start, (principal, effect.claim.key) in self.held

    async def _claim(self, principal: str, effect: ClaimCall) -> CallStart:
        """One claim in the principal's namespace (created first, if need be)."""
        shared, claim = self.shared, effect.claim
        try:
            for _ in range(2):
                await self._namespace(principal)
                try:
                    return await shared.begin(
                        principal, NAMESPACE, claim.key, claim.fingerprint, effect.request.id
                    )
                except SessionGone:
                    self._known.pop(principal, None)  # let go: create it again
        except StoreUnavailable:
            raise store_unavailable(effect.request.id) from None
        except RetentionFull:
            raise overloaded(effect.request.id) from None
        raise store_unavailable(effect.request.id)

    async def _namespace(self, principal: str) -> None:
        if principal in self._known:
            self._known.move_to_end(principal)
            return
        record = SessionRecord(
            session_id=NAMESPACE,
            principal=principal,
            protocol_version="2026-07-28",
            created_at=asyncio.get_running_loop().time(),
        )
        with contextlib.suppress(ValueError):  # it exists (another replica, an earlier life)
            await self.shared.store.create_session(record)
        self._known[principal] = None
        if len(self._known) > MAX_KNOWN_NAMESPACES:
            self._known.popitem(last=False)

    async def record(self, principal: str, key: str, payload: bytes | None) -> None:
        """Store ``payload`` as the outcome of ``key`` (None: give the key back),
        shielded and bounded; whoever waits for it here is woken."""
        try:
            await self.shared.record(principal, NAMESPACE, key, payload)
        finally:
            self.held.discard((principal, key))
            finished = self.done.pop((principal, key), None)
            if finished is not None:
                finished.set()
