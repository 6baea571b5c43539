"""Background work with a shared store: call leases, and mail between replicas.

Theory of operation
-------------------
With a shared store (several replicas serving the same sessions) two tasks run for
as long as the server does:

* :meth:`Server._renew_leases` keeps the leases of the calls this replica runs
  alive.  If the process dies, the renewals stop and, within one lease, any replica
  answers retries and resumes of its calls with ``interrupted`` -- never an endless
  ``in_progress``, never a second run.
* :meth:`Server._relay_mail` delivers the answers (to server-to-client requests)
  and the cancellations that a client sent to another replica, forwarded through
  the session's mailboxes in the store (see :meth:`Server._mail`).  Which boxes
  to read, how often, and how mail is decoded are the core's rules
  (:mod:`weir.protocol.messages`).

Both skip, and never fail on, a store that is unavailable for a while.

**Idleness is the store's to decide.**  A replica sees only its own traffic, so a
session idle *here* may be busy on another replica.  Whichever replica serves a
session tells the store (:meth:`Server._touch_shared`: the first time it serves it,
then at most once a quarter of ``session_idle_timeout``, and while a handler runs
or a stream is attached); the store keeps the time, by its own clock.  When a
session has been idle here for the timeout, the sweep asks the store
(:meth:`Server._expire_shared`), which deletes the session only if it is idle by
its clock too (for ``session_idle_timeout`` plus that quarter, the touches'
slack), and otherwise keeps the deadline on the record's TTL; either way this
replica forgets its own copy.  An ``initialize`` never followed up is judged the
same way (no replica has served the session since).  A liveness teardown (this
replica's connection to the client stalled) ends only the local copy too.

The other local decisions that touch shared state, and why each stands: claims
expire by leases on the store's clock (:meth:`Server._renew_leases`); an
``initialize`` whose answer could not be written is undone at once (no client ever
learnt the id); a 2024-11-05 session is deleted when its SSE stream ends (it lives
exactly as long as that stream, which only this replica holds); ``DELETE`` is the
client's own decision; ``subscriptions/listen`` streams are local, and the change
bus they read is trimmed by length, not by any replica's view.  The sessionless
gate's records expire by their TTL in the store, refreshed by every write.
"""

from __future__ import annotations

import math

import trio

from weir.protocol.messages import (
    CANCEL_BOX,
    POLL_INTERVAL,
    boxes_due,
    read_answer,
    read_cancel,
    renew_interval,
)

from ._keyed import NAMESPACE
from ._metrics import redact
from ._server_base import _ServerBase, log
from ._session import Session
from ._store import SessionGone, StoreUnavailable


class _Replicas(_ServerBase):
    """Background work with a shared store (see the module docstring)."""

    async def _renew_leases(self) -> None:
        """Shared stores only: keep the leases of the calls this replica runs alive.

        Every third of ``claim_lease``, one store round trip per session with running
        calls.  If this process dies (SIGKILL, OOM, power), the renewals stop and,
        within one lease, any replica answers retries and resumes of its calls with
        ``interrupted`` -- never an endless ``in_progress``, never a second run.
        """
        lease = self.config.claim_lease
        while True:
            await trio.sleep(renew_interval(lease))
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
            for principal, key in list(self.keyed_calls):
                by_principal.setdefault(principal, []).append(key)
            for principal, keys in by_principal.items():
                try:
                    await self.store.renew_claims(
                        principal, NAMESPACE, keys, self.replica_id, lease
                    )
                except (StoreUnavailable, SessionGone):
                    continue

    async def _relay_mail(self) -> None:
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

    def _touch_every(self) -> float:
        """How often a replica serving a session tells the store (inf: only once)."""
        idle = self.config.session_idle_timeout
        return idle / 4 if idle is not None else math.inf

    async def _touch_shared(self, session: Session, now: float) -> None:
        """Shared stores: record in the store that this replica served ``session``
        now -- the first time here, then at most once per :meth:`_touch_every`.

        Raises:
            StoreUnavailable: the store did not answer (the next request tries again).
        """
        sid = session.session_id
        if now - self._last_touch.get(sid, -math.inf) < self._touch_every():
            return
        self._last_touch[sid] = now
        try:
            await self.store.touch_session(session.record.principal, sid)
        except StoreUnavailable:
            self._last_touch.pop(sid, None)
            raise

    async def _expire_shared(self, session: Session) -> None:
        """Shared stores: ``session`` is idle (or unconfirmed) here; the store decides
        whether it is everywhere.  Deleted there: it ends.  Otherwise only this
        replica's copy is forgotten (adopted again from the record if it comes back).

        Raises:
            StoreUnavailable: nothing was decided (the sweep tries again next time).
        """
        cfg = self.config
        idle = cfg.session_idle_timeout
        sid = session.session_id
        gone = await self.store.expire_idle(
            session.record.principal,
            sid,
            idle + self._touch_every() if idle is not None else None,
            cfg.initialize_timeout if session.provisional else None,
        )
        if gone:
            log.info("session %s idle on every replica: expired", redact(sid))
            self.metrics.sessions_expired += 1
        await self._end_session(session, forget=not gone)
