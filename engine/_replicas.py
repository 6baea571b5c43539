"""Background work with a shared store: call leases, and mail between replicas.

Theory of operation
-------------------
With a shared store (several replicas serving the same sessions) two tasks of
:class:`Replicas` run for as long as the server does:

* :meth:`Replicas.renew_leases` keeps the leases of the calls this replica runs
  alive.  If the process dies, the renewals stop and, within one lease, any replica
  answers retries and resumes of its calls with ``interrupted`` -- never an endless
  ``in_progress``, never a second run.  On the same tick it gives back the claims
  whose answer the store lost (``engine._unheard``), so their retries run.
* :meth:`Replicas.relay_mail` delivers the answers (to server-to-client requests)
  and the cancellations that a client sent to another replica, forwarded through
  the session's mailboxes in the store (see ``engine._calls``).  Which boxes
  to read, how often, and how mail is decoded are the core's rules
  (:mod:`weir.protocol.messages`).

Both skip, and never fail on, a store that is unavailable for a while.

Idleness of shared sessions is the session table's (``engine._session_table``):
the store decides it.

The other local decisions that touch shared state, and why each stands: claims
expire by leases on the store's clock (:meth:`Replicas.renew_leases`); an
``initialize`` whose answer could not be written is undone at once (no client ever
learnt the id); a 2024-11-05 session is deleted when its SSE stream ends (it lives
exactly as long as that stream, which only this replica holds); ``DELETE`` is the
client's own decision; ``subscriptions/listen`` streams are local, and the change
bus they read is trimmed by length, not by any replica's view.  The sessionless
gate's records expire by their TTL in the store, refreshed by every write.
"""

from __future__ import annotations

import trio

from weir.protocol.messages import (
    CANCEL_BOX,
    POLL_INTERVAL,
    boxes_due,
    read_answer,
    read_cancel,
    renew_interval,
)

from ._keyed import NAMESPACE, KeyedCalls
from ._session import Session
from ._shared import Shared
from ._store_errors import SessionGone, StoreUnavailable


class Replicas:
    """Background work with a shared store (see the module docstring).

    Guarantees: while the server runs, every call this replica runs (session-era or
    keyed) has its lease renewed every third of ``claim_lease``; a store that is
    unavailable for a while is skipped, never fatal.
    """

    def __init__(self, shared: Shared, keyed: KeyedCalls) -> None:
        self.config = shared.config
        self.store = shared.store
        self.sessions = shared.sessions
        self.replica_id = shared.replica_id
        self.keyed = keyed
        self.unheard = shared.unheard

    async def renew_leases(self) -> None:
        """Shared stores only: keep the leases of the calls this replica runs alive.

        Every third of ``claim_lease``, one store round trip per session with running
        calls.  If this process dies (SIGKILL, OOM, power), the renewals stop and,
        within one lease, any replica answers retries and resumes of its calls with
        ``interrupted`` -- never an endless ``in_progress``, never a second run.
        """
        lease = self.config.claim_lease
        while True:
            await trio.sleep(renew_interval(lease))
            if len(self.unheard):  # claims whose answer was lost (engine._unheard)
                await self.unheard.give_back(self.store)
            for session in list(self.sessions.values()):
                if session.closed or not session.calls:
                    continue
                try:
                    await self.store.renew_claims(
                        session.record.principal,
                        session.session_id,
                        list(session.calls),
                        self.replica_id,
                        lease,
                    )
                except (StoreUnavailable, SessionGone):
                    continue
            by_principal: dict[str, list[str]] = {}
            for principal, key in list(self.keyed.calls):
                by_principal.setdefault(principal, []).append(key)
            for principal, keys in by_principal.items():
                try:
                    await self.store.renew_claims(
                        principal, NAMESPACE, keys, self.replica_id, lease
                    )
                except (StoreUnavailable, SessionGone):
                    continue

    async def relay_mail(self) -> None:
        """Shared stores only: deliver answers and cancellations other replicas received.

        Polls (every 100 ms) only sessions that wait for a client's answer, or run a
        request for more than a second, so idle or fast traffic costs nothing.
        """
        while True:
            await trio.sleep(POLL_INTERVAL)
            now = trio.current_time()
            for session in list(self.sessions.values()):
                if session.closed:
                    continue
                boxes = boxes_due(
                    self.replica_id,
                    awaiting_answers=bool(session.pending),
                    started=session.started.values(),
                    now=now,
                )
                for box in boxes:
                    try:
                        await self._take_mail(session, box)
                    except StoreUnavailable:
                        break

    async def _take_mail(self, session: Session, box: str) -> None:
        principal, sid = session.record.principal, session.session_id
        if box == CANCEL_BOX:
            for raw in await self.store.take_messages(principal, sid, box, keep=True):
                rid = read_cancel(raw)
                scope = session.running.get(rid) if rid is not None else None
                if scope is not None:
                    scope.cancel()
            return
        for raw in await self.store.take_messages(principal, sid, box):
            answer = read_answer(raw)
            if answer is None or answer.id is None:
                continue
            pending = session.pending.get(answer.id)
            if pending is not None:
                pending.answer = answer
                pending.done.set()
