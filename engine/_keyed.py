"""Exactly once on the sessionless revision: ``tools/call`` with an ``Idempotency-Key``.

Theory of operation
-------------------
2026-07-28 tells a client that lost a response stream to issue the request again
with a new id -- which runs a non-idempotent tool twice.  A client that sends an
``Idempotency-Key`` gets weir's gate instead, as on the session era: the key is
claimed in the store before the tool runs, a second delivery waits for the first
and then replays its stored answer (on any replica, with a shared store), and a
call that is still running past the wait is 409 ``in_progress``.  The key is
scoped to the principal: the gate's records live in a per-principal namespace of
the store (a record named :data:`NAMESPACE`, created on first use and again if the
store let it expire).  It is an :class:`~._store_records.InternalId`: stores keep it in a
keyspace no ``Mcp-Session-Id`` reaches.

The order of the steps is the core's :class:`~weir.protocol.course.CallCourse`, the
loop around its claims the core's :func:`~weir.protocol.post.gate`, both asked for
by the request's :class:`~weir.protocol.sessionless_post.SessionlessCourse`; this
module performs the store's side of them.  What
is recorded differs from the session era in one way: an ``input_required`` answer
is not an outcome (the call has not finished; its next round, with the same key,
must run it), so it gives the key back.  Without the header nothing is gated: with
no session, the same JSON-RPC id from two clients of one principal would be
indistinguishable from a retry.
"""

from __future__ import annotations

import contextlib
import secrets
from collections import OrderedDict
from typing import Final

import msgspec
import trio

from weir.protocol.course import Claim, ClaimCall, HoldCall, WaitForCall
from weir.protocol.gate import CallStart
from weir.protocol.jsonrpc import Request

from ._shared import Shared, log, retention_full, wait_for_claim
from ._store_errors import RetentionFull, SessionGone, StoreUnavailable
from ._store_records import SESSIONLESS_NAMESPACE, SessionRecord

#: The record under which a principal's sessionless gate records live.
NAMESPACE: Final = SESSIONLESS_NAMESPACE
#: Principals whose namespace this process knows exists (more are created again).
MAX_KNOWN_NAMESPACES: Final = 4096


class KeyedCalls:
    """The idempotency gate for sessionless ``tools/call`` (see the module docstring).

    Guarantees: a key is claimed in the store before its call runs; whoever waits
    here for a key is woken when its outcome is recorded (or the key given back).
    """

    def __init__(self, shared: Shared) -> None:
        self.unheard = shared.unheard
        self.config = shared.config
        self.store = shared.store
        self.replica_id = shared.replica_id
        #: Keyed calls running here ((principal, key) -> who waits for them).
        self.calls: dict[tuple[str, str], trio.Event | None] = {}
        #: The principals whose gate namespace is known to exist (least recent first).
        self._known_namespaces: OrderedDict[str, None] = OrderedDict()

    async def effect(self, principal: str, effect: ClaimCall | WaitForCall | HoldCall) -> object:
        """Perform one of the gate's steps in ``principal``'s namespace; its answer.

        Raises:
            RemoteProtocolError: 503 ``overloaded`` when the memory budget has no room
                for the key.
            StoreUnavailable: the store is down (nothing was claimed).
        """
        if isinstance(effect, HoldCall):
            self.calls[principal, effect.key] = None
            return None
        if isinstance(effect, WaitForCall):
            where = (principal, effect.key)
            await wait_for_claim(self.calls, where, effect.until, effect.local)
            return None
        start = await self._claim(principal, effect.request, effect.claim)
        return start, (principal, effect.claim.key) in self.calls

    async def _claim(self, principal: str, req: Request, claim: Claim) -> CallStart:
        """One claim in the principal's namespace (created first, if need be)."""
        for _ in range(2):
            await self._namespace(principal)
            mine = secrets.token_hex(8) if self.store.shared else ""
            try:
                with trio.CancelScope(shield=True) as shield:
                    shield.deadline = trio.current_time() + 5.0
                    return await self.store.begin_call(
                        principal,
                        NAMESPACE,
                        claim.key,
                        claim.fingerprint,
                        None,
                        request_id=msgspec.json.encode(req.id),
                        owner=self.replica_id,
                        lease=self.config.claim_lease if self.store.shared else None,
                        claim=mine,
                    )
                raise StoreUnavailable("the store did not answer a claim within 5 s")
            except StoreUnavailable:
                if mine:  # it may have applied: give back what this delivery was granted
                    self.unheard.note(principal, NAMESPACE, claim.key, mine)
                raise
            except SessionGone:
                self._known_namespaces.pop(principal, None)  # expired: create it again
            except RetentionFull:
                raise retention_full(self.config, req.id) from None
        raise StoreUnavailable("the gate's namespace could not be created")

    async def _namespace(self, principal: str) -> None:
        known = self._known_namespaces
        if principal in known:
            known.move_to_end(principal)
            return
        record = SessionRecord(
            session_id=NAMESPACE,
            principal=principal,
            protocol_version="2026-07-28",
            created_at=trio.current_time(),
            secret="",
            salt="",
        )
        with contextlib.suppress(ValueError):  # it exists (another replica, an earlier life)
            await self.store.create_session(record)
        known[principal] = None
        if len(known) > MAX_KNOWN_NAMESPACES:
            known.popitem(last=False)

    async def record(self, principal: str, key: str, payload: bytes | None) -> None:
        """Store ``payload`` as the outcome of ``key`` (None: give the key back),
        bounded and shielded on a shared store; whoever waits for it here is woken."""
        try:
            with trio.CancelScope(shield=True), trio.move_on_after(5):
                await self.store.finish_call(principal, NAMESPACE, key, payload)
        except (StoreUnavailable, SessionGone):
            log.warning("could not record the outcome of sessionless call %s", key)
        finally:
            done = self.calls.pop((principal, key), None)
            if done is not None:
                done.set()
