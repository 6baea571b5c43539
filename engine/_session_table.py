"""The session table: creating, adopting, looking up, sweeping and ending sessions.

Theory of operation
-------------------
:class:`SessionTable` owns the live :class:`~weir.engine._session.Session` of every
session this process serves (the dict itself is :attr:`Shared.sessions`, read by
others, written only here), and the limits on them: the process's
``max_sessions`` and each principal's ``principal_session_limit`` (503 / 429
``session_limit``, existing sessions unaffected).  A session is made by
``initialize`` (:meth:`SessionTable.new_session`) or, with a shared store, adopted
from its record when a request for it first reaches this replica
(:meth:`SessionTable.adopt`; never refused for the limit).  A session id weir never
mints is refused before anything is looked up; another principal's session is
answered exactly like one that does not exist.

**Teardown.**  Every session's credit deadline sits in one heap
(:attr:`SessionTable.deadlines`, ``engine._timers``) served by one task; when a
session's credit reports DEAD (frames pending, no progress for the liveness
timeout) the session's streams are closed, its handlers cancelled, its credit
released and the session forgotten -- later requests get 404.  Ending a session
runs the app's session-close hooks; a session that held much memory is followed by
a ``malloc_trim``.

**Idleness is the store's to decide.**  A replica sees only its own traffic, so a
session idle *here* may be busy on another replica.  Whichever replica serves a
session tells the store (:meth:`SessionTable.touch_shared`: the first time it
serves it, then at most once a quarter of ``session_idle_timeout``, and while a
handler runs or a stream is attached); the store keeps the time, by its own clock.
When a session has been idle here for the timeout, the sweep asks the store
(:meth:`SessionTable.expire_shared`), which deletes the session only if it is idle
by its clock too (for ``session_idle_timeout`` plus that quarter, the touches'
slack), and otherwise keeps the deadline on the record's TTL; either way this
replica forgets its own copy.  An ``initialize`` never followed up is judged the
same way (no replica has served the session since).  A liveness teardown (this
replica's connection to the client stalled) ends only the local copy too.
"""

from __future__ import annotations

import math
import secrets
from collections.abc import Awaitable, Callable
from functools import partial

import trio

from weir.app import SESSION_CLOSE_WAIT, Caller
from weir.common._access import new_session
from weir.common._memory import ReclaimPacing, reclaim
from weir.protocol import SERVER_ERROR, Reason, RemoteProtocolError, session_refusal
from weir.protocol.jsonrpc import RequestId
from weir.protocol.states import CreditState, SessionInput

from ._memory_store import MemoryStore
from ._metrics import redact
from ._session import Session
from ._shared import Shared, log, store_unavailable
from ._store_errors import StoreUnavailable
from ._store_records import SessionRecord, client_of, is_session_id
from ._timers import Deadlines, Timed


class SessionTable:
    """The live sessions of this process (see the module docstring).

    Guarantees: a session is in :attr:`Shared.sessions` exactly from its creation or
    adoption until it ends; the per-principal counts match the table; every
    session's credit timer is served by :attr:`deadlines`.

    Args:
        shared: the server's shared state.
        new_id: makes session ids (each must match ``SESSION_ID_FORMAT``).
        on_change: where a session's handlers announce changes (the change bus).
    """

    def __init__(
        self,
        shared: Shared,
        *,
        new_id: Callable[[], str],
        on_change: Callable[[str, str | None], None],
    ) -> None:
        self.shared = shared
        self.config = shared.config
        self.store = shared.store
        self.metrics = shared.metrics
        self.sessions = shared.sessions
        self._new_id = new_id
        self._on_change = on_change
        #: Every session's credit deadline, in one heap served by one task.
        self.deadlines = Deadlines(self._deadline_due)
        self._per_principal: dict[str, int] = {}
        self._last_seen: dict[str, float] = {}
        #: When this replica last told a shared store it served each session.
        self._last_touch: dict[str, float] = {}
        self._reclaims = ReclaimPacing()

    def equip(self, session: Session) -> None:
        """Connect ``session`` to this server: its replica id, credit timers, activity
        signal and change bus (also done for the sessionless era's credit owners)."""
        session.replica = self.shared.replica_id
        session.schedule = self.deadlines.schedule
        session.on_activity = self.shared.note_activity
        session.on_change = self._on_change

    # ---------------------------------------------------------------- lookup
    async def session(
        self,
        principal: str,
        session_id: str | None,
        request_id: RequestId | None = None,
        *,
        verify: bool = True,
    ) -> Session:
        """``principal``'s live session ``session_id``, or the 404 refusal (503
        ``store_unavailable`` when a shared store does not answer; both answer
        ``request_id``).

        An id weir never mints (:func:`~._store_records.is_session_id`) is refused before
        anything is looked up.  A session of another principal is answered exactly
        like one that does not exist (and is left alone).  With a shared store the
        record is re-read (``verify``) so a session deleted or rebound on another
        replica is seen here; a session first seen on this replica is adopted from
        its record.
        """
        sid = session_id or ""
        if not is_session_id(sid):
            raise session_refusal(sid, request_id)  # not minted here: no store lookup
        session = self.sessions.get(sid)
        if session is not None and session.closed:
            session = None
        if session is not None and session.record.principal != principal:
            raise session_refusal(sid, request_id)  # as if it did not exist; left alone
        shared = self.store.shared
        if shared and (session is None or verify):
            try:
                record = await self.store.get_session(principal, sid)
            except StoreUnavailable as exc:
                raise self._unavailable(exc, request_id) from None
            if record is None:
                if session is not None:
                    await self.end_session(session)
                raise session_refusal(sid, request_id)
            if session is None:
                session = self.adopt(record)
            else:
                session.record = record
        if session is None:
            raise session_refusal(sid, request_id)
        now = trio.current_time()
        self._last_seen[session.session_id] = now
        session.provisional = False
        if shared:
            try:
                await self.touch_shared(session, now)
            except StoreUnavailable as exc:
                raise self._unavailable(exc, request_id) from None
        return session

    def _unavailable(
        self, exc: StoreUnavailable, request_id: RequestId | None
    ) -> RemoteProtocolError:
        """The 503 refusal of a request whose session the store could not answer for
        (its JSON-RPC error answers ``request_id``, as the 404 would)."""
        log.warning("store unavailable: %s", exc)
        return store_unavailable(self.config, request_id)

    def adopt(self, record: SessionRecord) -> Session:
        """The live session of ``record`` (made on another replica), registered here.

        Never refused for the limit: that would lock out a client the limit exists
        to protect.  At most every replica's limit's worth can be adopted.
        """
        now = trio.current_time()
        session = self._make(record, now)
        capabilities, client_info = client_of(record)  # what its initialize declared
        session.caller = Caller(capabilities, client_info)
        session.handle(SessionInput.INITIALIZED)
        self._register(session, now)
        return session

    # ---------------------------------------------------------------- creation
    async def new_session(
        self,
        version: str,
        principal: str,
        request_id: RequestId | None = None,
        *,
        client: str = "",
    ) -> Session:
        """A new (provisional) session of ``principal``, recorded in the store.

        Raises:
            RemoteProtocolError: 503 / 429 ``session_limit`` (see
                :meth:`check_room`).
            ValueError: the id factory made an id outside ``SESSION_ID_FORMAT``.
        """
        now = trio.current_time()
        self.check_room(principal, request_id)
        sid = self._new_id()
        if not is_session_id(sid):
            raise ValueError(f"session_id_factory made {sid!r}, outside SESSION_ID_FORMAT")
        record = SessionRecord(
            session_id=sid,
            principal=principal,
            protocol_version=version,
            created_at=now,
            secret=secrets.token_urlsafe(16),
            salt=secrets.token_hex(8),
            client=client,
        )
        await self.store.create_session(record)
        new_session(record.session_id)  # (the access log's line)
        self._last_touch[sid] = now  # the store's record was just born: as good as a touch
        session = self._make(record, now)
        session.provisional = True
        self._register(session, now)
        return session

    def _make(self, record: SessionRecord, now: float) -> Session:
        cfg = self.config
        return Session(
            record,
            max_closed_streams=cfg.max_closed_streams,
            credit=cfg.credit,
            now=now,
            budget=self.shared.budget,
            pool=self.shared.credit_pool,
        )

    def check_room(self, principal: str, request_id: RequestId | None) -> None:
        """Refuse a new session past the global or the principal's limit.

        Raises:
            RemoteProtocolError: 503 ``session_limit`` (the process is full) or 429
                ``session_limit`` (this principal holds its share), with
                ``Retry-After``; existing sessions are unaffected.
        """
        cfg = self.config
        if len(self.sessions) >= cfg.max_sessions:
            full = (503, "server", cfg.max_sessions, "this server holds its limit", "retry later")
        elif self._per_principal.get(principal, 0) >= cfg.principal_session_limit:
            full = (
                429,
                "principal",
                cfg.principal_session_limit,
                "this principal holds its limit",
                "end one or retry later",
            )
        else:
            return
        status, scope, limit, who, then = full
        raise RemoteProtocolError(
            f"{who} of {limit} sessions; {then}",
            http_status=status,
            reason=Reason.SESSION_LIMIT,
            code=SERVER_ERROR,
            request_id=request_id,
            retry_after_ms=int(min(cfg.initialize_timeout, 30.0) * 1000),
            data={"limit": limit, "scope": scope},
        )

    def _register(self, session: Session, now: float) -> None:
        sid = session.session_id
        self.sessions[sid] = session
        principal = session.record.principal
        self._per_principal[principal] = self._per_principal.get(principal, 0) + 1
        self._last_seen[sid] = now
        self.equip(session)
        store = self.store
        if isinstance(store, MemoryStore):
            session.results_kept_by = store

    # ---------------------------------------------------------------- ending
    async def end_session(self, session: Session, *, forget: bool = False) -> None:
        """End ``session`` here and delete it from the store (``forget``: only this
        process's copy ends; a shared store's record lives on)."""
        sid = session.session_id
        held = self.shared.budget.owner_held(sid) + session.credit.bytes_in_use
        session.close()
        self.metrics.session_ended(session)
        if self._reclaims.after_end(held, trio.current_time()):
            self.shared.start(self._reclaim)
        if self.sessions.pop(sid, None) is not None:
            handlers = self.shared.handlers
            if self.shared.app.session_close_fns and handlers is not None:
                handlers.start_soon(self.close_hooks, [sid])
            principal = session.record.principal
            left = self._per_principal[principal] - 1
            if left > 0:
                self._per_principal[principal] = left
            else:
                self._per_principal.pop(principal, None)
        self._last_seen.pop(sid, None)
        self._last_touch.pop(sid, None)
        if not forget:
            await self.store.delete_session(session.record.principal, sid)

    async def close_hooks(self, session_ids: list[str]) -> None:
        """Run the app's session-close hooks for ``session_ids``, together, for at
        most :data:`SESSION_CLOSE_WAIT` seconds; a hook's failure is logged."""
        hooks = self.shared.app.session_close_fns
        if not hooks or not session_ids:
            return

        async def one(hook: Callable[[str], Awaitable[None]], sid: str) -> None:
            try:
                await hook(sid)
            except Exception:
                log.exception("session-close hook %s failed", getattr(hook, "__qualname__", hook))

        # Shielded (a shutdown's cancellation must not skip them), ended by its own deadline.
        with trio.CancelScope(shield=True) as scope:
            scope.deadline = trio.current_time() + SESSION_CLOSE_WAIT
            async with trio.open_nursery() as nursery:
                for sid in session_ids:
                    for hook in hooks:
                        nursery.start_soon(one, hook, sid)

    async def _reclaim(self) -> None:
        """After a heavy session ended: collect the cycles that may still hold its
        buffers (tracebacks of its cancelled tasks), then return free pages to the OS.

        Runs once the cancelled tasks have unwound (a second later), at most once a
        second, only after sessions that held at least ``RECLAIM_AFTER`` bytes.
        """
        await trio.sleep(1.0)
        reclaim()
        self.metrics.reclaims += 1

    def _deadline_due(self, timed: Timed, now: float) -> None:
        """The heap's handler: apply a session's credit timers at ``now``.

        Never blocks (one heap serves every session): a dead session's teardown
        runs in a handler task; a live one is scheduled again at its next deadline.
        """
        session = timed
        assert isinstance(session, Session)
        credit = session.credit
        if credit.handle_timer(now) is CreditState.DEAD:
            log.warning(
                "session %s: no progress for %.1f s with %d frames pending: torn down",
                redact(session.session_id),
                credit.limits.liveness_timeout,
                credit.frames_in_use,
            )
            self.metrics.teardowns += 1
            # A stalled connection here says nothing of the session elsewhere: with a
            # shared store only this copy ends (the record expires by the store's clock).
            self.shared.start(partial(self.end_session, forget=self.store.shared), session)
            return
        self.deadlines.schedule(session, credit.deadline())

    # ---------------------------------------------------------------- sweeps
    async def sweep(self) -> None:
        """Forget idle sessions, and sessions whose ``initialize`` was never followed up.

        A session counts as busy (never idle) while a handler runs for it or a
        writer is attached to one of its streams.  With a shared store, idle here
        is not idle everywhere: the store decides (:meth:`expire_shared`).
        """
        cfg = self.config
        idle = cfg.session_idle_timeout
        every = max(0.5, min(cfg.initialize_timeout / 4, (idle or 240.0) / 4, 60.0))
        while True:
            await trio.sleep(every)
            now = trio.current_time()
            try:
                await self._sweep_pass(now)
            except StoreUnavailable as exc:  # the rest waits for the next pass
                log.warning("session sweep: store unavailable: %s", exc)

    async def _sweep_pass(self, now: float) -> None:
        """One pass of :meth:`sweep`.  Raises StoreUnavailable (shared store)."""
        cfg = self.config
        idle = cfg.session_idle_timeout
        for sid, session in list(self.sessions.items()):
            busy = session.running or any(
                h.writer_scope is not None for h in session.handles.values()
            )
            seen = self._last_seen.get(sid, now)
            if busy:
                self._last_seen[sid] = now
                if self.store.shared:
                    await self.touch_shared(session, now)
            elif self.store.shared:
                due = cfg.initialize_timeout if session.provisional else idle
                if due is not None and now - seen >= due:
                    await self.expire_shared(session)
            elif session.provisional and now - seen >= cfg.initialize_timeout:
                log.info(
                    "session %s: nothing followed its initialize for %.0f s: forgotten",
                    redact(sid),
                    cfg.initialize_timeout,
                )
                self.metrics.sessions_expired += 1
                await self.end_session(session)
            elif idle is not None and now - seen >= idle:
                log.info("session %s idle for %.0f s: forgotten", redact(sid), idle)
                self.metrics.sessions_expired += 1
                await self.end_session(session)

    def _touch_every(self) -> float:
        """How often a replica serving a session tells the store (inf: only once)."""
        idle = self.config.session_idle_timeout
        return idle / 4 if idle is not None else math.inf

    async def touch_shared(self, session: Session, now: float) -> None:
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

    async def expire_shared(self, session: Session) -> None:
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
        await self.end_session(session, forget=not gone)
