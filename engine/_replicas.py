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
  the session's mailboxes in the store (see :meth:`Server._absorb`).

Both skip, and never fail on, a store that is unavailable for a while.
"""

from __future__ import annotations

import msgspec
import trio

from weir.protocol import ErrorResponse, RemoteProtocolError, Response
from weir.protocol.jsonrpc import decode_message

from ._server_base import _ServerBase
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
            await trio.sleep(lease / 3)
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

    async def _relay_mail(self) -> None:
        """Shared stores only: deliver answers and cancellations other replicas received.

        Polls (every 100 ms) only sessions that wait for a client's answer, or run a
        request for more than a second, so idle or fast traffic costs nothing.
        """
        box = f"answers:{self.replica_id}"
        while True:
            await trio.sleep(0.1)
            now = trio.current_time()
            for session in list(self.sessions.values()):
                if session.closed:
                    continue
                principal, sid = session.record.principal, session.session_id
                try:
                    if session.pending:
                        for raw in await self.store.take_messages(principal, sid, box):
                            msg = decode_message(raw)
                            if isinstance(msg, Response | ErrorResponse) and msg.id is not None:
                                pending = session.pending.get(msg.id)
                                if pending is not None:
                                    pending.answer = msg
                                    pending.done.set()
                    if any(now - t > 1.0 for t in session.started.values()):
                        wanted = await self.store.take_messages(principal, sid, "cancel", keep=True)
                        for raw in wanted:
                            scope = session.running.get(msgspec.json.decode(raw))
                            if scope is not None:
                                scope.cancel()
                except (StoreUnavailable, RemoteProtocolError, msgspec.DecodeError):
                    continue
