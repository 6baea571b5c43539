"""The asyncio runtime's sessions and idempotency gate on a session store.

Theory of operation
-------------------
Session records and the gate's claims and outcomes live in a
:class:`~weir.engine._session_store.SessionStore` -- the Trio runtime's, with the same
records, the same keys and the same scripts -- so an asyncio replica and a Trio
replica on one shared store (:class:`~._redis_store.AsyncioRedisStore`) serve one
cluster: a session begun on either is served by both, a retry on either replays the
other's outcome.  With the default :class:`~weir.engine._memory_store.MemoryStore` nothing
is shared and everything below is one process's bookkeeping.

The rule: a local process never decides alone about shared state.

* **Records.**  ``initialize`` creates the record in the store before it answers;
  every request reads it again (a session deleted on another replica is 404 here at
  once); a session first seen here is *adopted* from its record (what its client
  declared comes with it) and is never refused for this process's session limit.
  ``DELETE`` deletes the record.  An idle session, or one that saw nothing after its
  ``initialize`` (the initialize timeout), is judged by the store
  (:meth:`~weir.engine._session_store.SessionStore.expire_idle`: by its clock, after every
  replica's touches); here only the local copy is forgotten otherwise.  The store
  is told a session was served the first time, then at most once a quarter of
  the idle timeout.
* **The gate.**  A ``tools/call`` claims its key with ``begin_call`` (the claim
  names this replica and carries a lease), which answers EXECUTE, DONE (replay) or
  RUNNING; a delivery that finds the call running elsewhere waits and claims again,
  so it sees the outcome as soon as the other replica stores it.  While calls run,
  one task renews their leases every third of the lease; if this process dies the
  renewals stop, and after one lease any replica answers a retry ``interrupted``.
  The outcome is stored with ``finish_call`` (shielded, bounded) before the waiters
  here are woken; a cancelled call gives its key back.
* **Channel tokens** (fencing): the record's ``<generation>.<secret>`` is issued at
  ``initialize`` and checked by the core's courses against the record as last read
  (re-read per request with a shared store), and inside the store's own steps: a
  claim checks the token, an append the generation.  A rebind (here or on any
  replica) starts a new generation: this process's older streams end as soon as it
  sees it, and their events are no longer stored.
* **Epochs** come from the store, so event ids are unique in the session everywhere.
* **Failures.**  No answer from the store is 503 ``store_unavailable`` (nothing runs).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import secrets
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Final

import msgspec

from weir.app import Caller
from weir.common._access import new_session
from weir.common._listen import TASK_NOTIFICATION, task_change_where
from weir.engine._memory_store import MemoryStore
from weir.engine._session_store import SessionStore
from weir.engine._store_errors import ChannelRejected, RetentionFull, SessionGone, StoreUnavailable
from weir.engine._store_records import (
    APPEND_PATIENCE,
    APPEND_RETRY_DELAY,
    SESSIONLESS_NAMESPACE,
    Retention,
    SessionRecord,
    client_of,
    client_record,
    is_session_id,
)
from weir.engine._unheard import UnheardClaims
from weir.protocol import SERVER_ERROR, Reason, RemoteProtocolError, session_refusal
from weir.protocol.binding import channel_refusal
from weir.protocol.course import ClaimCall
from weir.protocol.gate import CallOutcome, CallStart
from weir.protocol.jsonrpc import RequestId
from weir.protocol.messages import (
    encode_change,
)
from weir.protocol.states import SessionInput, StreamInput, StreamState, session_transition
from weir.protocol.streams import StreamLog

from ._replicas import relay_changes, relay_mail, renew_leases
from ._session import MAX_CALL_BYTES, MAX_CALLS, Gone, Session

if TYPE_CHECKING:
    from ._driver import AsyncioDriver

log = logging.getLogger("weir.asyncio")

#: The record under which a principal's sessionless gate records live (the Trio
#: runtime's too).
NAMESPACE: Final = SESSIONLESS_NAMESPACE
#: Seconds a running call's claim lives in a shared store unless renewed (the Trio
#: runtime's ``--claim-lease`` default).
CLAIM_LEASE = 15.0
#: The most a stored outcome may take to record before it is given up (logged).
FINISH_WAIT = 5.0


def memory_store() -> MemoryStore:
    """The default store: this process only, with the asyncio runtime's gate bounds."""
    return MemoryStore(
        Retention(calls_per_session=MAX_CALLS, call_bytes_per_session=MAX_CALL_BYTES)
    )


async def open_store(url: str, replicas: int = 0, replica_timeout: float = 0.5) -> SessionStore:
    """The store ``url`` names: ``"memory"``, or a Redis-protocol URL (see
    :meth:`weir.engine._redis_store.RedisStore.connect`, which takes ``replicas`` and
    ``replica_timeout`` too).

    Raises:
        ValueError: a malformed URL.
        StoreUnavailable: the server did not answer.
    """
    if url == "memory":
        return memory_store()
    from ._redis_store import AsyncioRedisStore  # (the Redis client only when asked for)

    return await AsyncioRedisStore.connect(url, replicas=replicas, replica_timeout=replica_timeout)


def store_unavailable(request_id: RequestId | None = None) -> RemoteProtocolError:
    """503 ``store_unavailable``: the store did not answer; nothing was executed."""
    return RemoteProtocolError(
        "the session store is unavailable; nothing was executed",
        http_status=503,
        reason=Reason.STORE_UNAVAILABLE,
        code=SERVER_ERROR,
        request_id=request_id,
        retry_after_ms=1000,
    )


def overloaded(request_id: RequestId | None) -> RemoteProtocolError:
    """503 ``overloaded``: the memory budget has no room for a new key (see
    :class:`~weir.engine._store_errors.RetentionFull`); nothing was executed (as on Trio)."""
    return RemoteProtocolError(
        "the server's memory budget is full of finished calls' keys; nothing was executed",
        http_status=503,
        reason=Reason.OVERLOADED,
        code=SERVER_ERROR,
        request_id=request_id,
        retry_after_ms=1000,
    )


class SharedState:
    """The driver's side of its store (see the module docstring)."""

    def __init__(
        self,
        driver: AsyncioDriver,
        store: SessionStore,
        *,
        replica_id: str | None = None,
        claim_lease: float = CLAIM_LEASE,
        resume: str = "pinned",
    ) -> None:
        self.driver, self.store = driver, store
        self.replica_id = replica_id or secrets.token_hex(4)
        self.claim_lease = claim_lease
        #: Events go to the store before the wire (any replica replays them).
        self.logs = store.shared and resume == "shared"
        self._touched: dict[str, float] = {}
        self._renewer: asyncio.Task[None] | None = None
        #: Shared-store claims whose answer was lost, to give back (``engine._unheard``).
        self.unheard = UnheardClaims()
        self._relay: asyncio.Task[None] | None = None
        self._changes: asyncio.Task[None] | None = None

    @property
    def shared(self) -> bool:
        return self.store.shared

    # ------------------------------------------------------------------ records
    async def create(
        self,
        principal: str,
        version: str,
        capabilities: dict[str, Any],
        client_info: dict[str, Any],
        request_id: RequestId | None,
    ) -> Session:
        """A new session owned by ``principal``, its record stored first (503 if the
        store cannot; ``request_id``: the request the refusal answers, if any)."""
        driver = self.driver
        driver.check_room(request_id, principal)
        loop = asyncio.get_running_loop()
        record = SessionRecord(
            session_id=secrets.token_urlsafe(32),
            principal=principal,
            protocol_version=version,
            created_at=loop.time(),
            secret=secrets.token_urlsafe(16),
            salt=secrets.token_hex(8),
            client=client_record(capabilities, client_info),
        )
        try:
            await self.store.create_session(record)
            new_session(record.session_id)  # (the access log's line)
        except StoreUnavailable:
            raise store_unavailable(request_id) from None
        self._touched[record.session_id] = loop.time()
        caller = Caller(capabilities, client_info)
        session = Session(record.session_id, version, driver.credit, driver, caller)
        session.principal = principal  # (it owns the session)
        session.logged = self.logs
        session.take_record(record)  # (its channel token is answered with the session)
        session.provisional = True  # (until a request names it: ``initialize_timeout``)
        driver.add_session(session)
        self._relay_mail()
        return session

    async def load(self, principal: str, sid: str, request_id: RequestId | None) -> Session:
        """``principal``'s live session ``sid`` (adopted from its record if first seen
        here), or the 404 refusal -- another principal's session is indistinguishable
        from none, and nothing it asks touches that session; a shared store's record
        is read again every time."""
        if not is_session_id(sid):
            raise session_refusal(sid, request_id)  # never minted: no store lookup
        driver = self.driver
        session = driver.sessions.get(sid)
        if session is not None and (session.closed or session.principal != principal):
            session = None
        if self.store.shared:
            try:
                record = await self.store.get_session(principal, sid)
            except StoreUnavailable:
                raise store_unavailable(request_id) from None
            if record is None:
                if session is not None:
                    driver.end(session)  # deleted elsewhere (or expired): gone here too
                raise session_refusal(sid, request_id)
            if session is None:
                session = self._adopt(record)
            session.take_record(record)  # (a rebind elsewhere fences our streams)
            if session.provisional:  # its first use: the store hears of it at once, so
                self._touched.pop(sid, None)  # its initialize_timeout never ends it
            await self._touch(session)
        if session is None:
            raise session_refusal(sid, request_id)
        session.last_seen = session.clock()
        session.provisional = False
        return session

    def _adopt(self, record: SessionRecord) -> Session:
        capabilities, client_info = client_of(record)
        session = Session(
            record.session_id,
            record.protocol_version,
            self.driver.credit,
            self.driver,
            Caller(capabilities, client_info),
        )
        session.state = session_transition(session.state, SessionInput.INITIALIZED)
        session.principal = record.principal
        session.logged = self.logs
        session.take_record(record)
        self.driver.add_session(session)
        self._relay_mail()
        return session

    async def _touch(self, session: Session) -> None:
        idle = self.driver.idle_timeout
        every = idle / 4 if idle is not None else math.inf
        now = session.clock()
        if now - self._touched.get(session.sid, -math.inf) < every:
            return
        self._touched[session.sid] = now
        try:
            await self.store.touch_session(session.principal, session.sid)
        except StoreUnavailable:
            self._touched.pop(session.sid, None)
            raise store_unavailable() from None

    async def touch_busy(self, session: Session) -> None:
        """A session running or writing something here is not idle: tell the store
        (so another replica's sweep does not expire it); a failure waits for the
        next sweep."""
        with contextlib.suppress(RemoteProtocolError):
            await self._touch(session)

    async def delete(self, session: Session) -> int:
        """The client's ``DELETE``: the record goes (503 if the store cannot say so),
        with what the session kept (history, results); returns how much that was."""
        kept = self.driver.budget.owner_held(session.sid)
        try:
            await self.store.delete_session(session.principal, session.sid)
        except StoreUnavailable:
            raise store_unavailable() from None
        self.forget(session.sid)
        return kept

    def forget(self, sid: str) -> None:
        """This process's bookkeeping of ``sid`` (the local copy ended)."""
        self._touched.pop(sid, None)

    async def discard(self, session: Session) -> None:
        """The local copy of ``session`` ended: with a store of this process only,
        nothing can reach its record again (nothing adopts it), so the record goes,
        and with it the outcomes its gate kept -- a torn-down session holds no memory.
        A shared store's record lives on, for the store's clock to expire: a
        connection that stalled here says nothing of the session elsewhere."""
        if not self.store.shared:
            with contextlib.suppress(StoreUnavailable):
                await self.store.delete_session(session.principal, session.sid)

    async def expire(self, session: Session) -> None:
        """``session`` is idle here (or, provisional, saw nothing after its
        ``initialize``): the store decides whether it is everywhere (and deletes it
        then); this process's copy ends either way."""
        driver, gone = self.driver, True
        idle = driver.idle_timeout
        untouched: float | None = driver.initialize_timeout
        kept = driver.budget.owner_held(session.sid)  # (before the record takes it along)
        if self.store.shared:
            idle = idle * 1.25 if idle is not None else None  # (slack: a quarter)
            untouched = untouched if session.provisional else None
            try:
                gone = await self.store.expire_idle(session.principal, session.sid, idle, untouched)
            except StoreUnavailable as exc:
                log.warning("session sweep: store unavailable: %s", exc)
                return  # nothing decided: the next sweep asks again
        else:
            await self.store.delete_session(session.principal, session.sid)
        if session.closed:
            return  # (ended meanwhile: counted by whoever ended it, if anyone)
        if gone:
            driver.metrics.sessions_expired += 1
        driver.end(session, kept)

    async def post(self, session: Session, box: str, data: bytes) -> None:
        """Leave mail for another replica (an answer or a cancellation it waits for)."""
        try:
            await self.store.post_message(session.principal, session.sid, box, data)
        except SessionGone:
            pass  # the session is gone: nobody waits for it
        except StoreUnavailable:
            raise store_unavailable() from None

    async def append_event(
        self,
        session: Session,
        stream: StreamLog,
        seq: int,
        payload: str,
        final: bool,
        call_key: str | None,
    ) -> None:
        """Append event ``seq`` of ``stream`` to the store (with ``call_key``: recording
        the call's outcome in the same step).  Not stored means not sent: on any
        failure the stream is aborted and :class:`Gone` raised."""
        data = payload.encode()
        loop = asyncio.get_running_loop()
        deadline, delay = loop.time() + APPEND_PATIENCE, APPEND_RETRY_DELAY
        try:
            while True:
                try:
                    await self.store.append_event(
                        session.principal,
                        session.sid,
                        stream.epoch,
                        seq,
                        data,
                        final=final,
                        generation=session.generation,
                        binding=stream.binding,
                        call_key=call_key,
                        replica=self.replica_id,
                    )
                    break
                except StoreUnavailable:
                    # A failover takes seconds: wait it out, bounded (see the Trio sink).
                    if loop.time() + delay > deadline:
                        raise
                await asyncio.sleep(delay)
                delay = min(delay * 2, 1.0)
        except (SessionGone, ChannelRejected, StoreUnavailable, ValueError) as exc:
            log.warning("event %s:%d not stored (%r): the stream ends", stream.epoch, seq, exc)
            if stream.state is not StreamState.CLOSED:
                stream.handle(StreamInput.ABORT)
                session.wake(stream)
            raise Gone from exc
        if call_key is not None:
            session.keep_result(call_key, data)  # (its outcome: for a rebind here)

    async def append_interrupted(
        self, session: Session, stream: StreamLog, payload: bytes, key: str
    ) -> None:
        """At shutdown, a call this process abandons: its ``interrupted`` outcome as
        its shared stream's final event (a resume elsewhere gets it), best effort."""
        try:
            await asyncio.wait_for(
                self.store.append_event(
                    session.principal,
                    session.sid,
                    stream.epoch,
                    stream.next_seq,
                    payload,
                    final=True,
                    generation=session.generation,
                    binding=stream.binding,
                    call_key=key,
                    replica=self.replica_id,
                ),
                FINISH_WAIT,
            )
        except Exception as exc:
            log.warning("the interrupted outcome of %s was not appended: %r", key, exc)

    async def mark_bound(self, session: Session) -> None:
        """The session's client has presented its channel token: from now on a
        ``DELETE``, a rebind or a stream of the session needs it (in the store, for
        every replica; 404 if the session is gone, 503 if the store does not answer)."""
        try:
            await self.store.mark_bound(session.principal, session.sid)
        except SessionGone:
            self.driver.end(session)
            raise session_refusal(session.sid) from None
        except StoreUnavailable:
            raise store_unavailable() from None
        if session.record is not None:
            session.take_record(replace(session.record, bound=True))

    async def rebind(self, session: Session, request_id: RequestId) -> SessionRecord:
        """The rebind handshake's store step: a new generation with a new secret,
        atomically (the old token is fenced on every replica); this process's streams
        of older generations end at once."""
        try:
            record = await self.store.rebind(
                session.principal, session.sid, secrets.token_urlsafe(16)
            )
        except SessionGone:
            self.driver.end(session)
            raise session_refusal(session.sid, request_id) from None
        except StoreUnavailable:
            raise store_unavailable(request_id) from None
        session.take_record(record)
        return record

    async def epoch(self, session: Session, binding: int = 0) -> str:
        """A fresh stream epoch, from the store (unique in the session everywhere)."""
        try:
            return await self.store.allocate_epoch(session.principal, session.sid, binding)
        except SessionGone:
            self.driver.end(session)
            raise session_refusal(session.sid) from None
        except StoreUnavailable:
            raise store_unavailable() from None

    # ------------------------------------------------------------------ the gate
    async def claim(self, session: Session, effect: ClaimCall) -> tuple[CallStart, bool]:
        """Claim a call's key: the store's answer, and whether the delivery running
        it (if one does) is in this process."""
        claim, req = effect.claim, effect.request
        store = self.store
        try:
            if store.shared:
                start = await self._claim_shielded(session, effect)
            else:
                start = await store.begin_call(
                    session.principal, session.sid, claim.key, claim.fingerprint, effect.token
                )
        except SessionGone:
            self.driver.end(session)
            raise session_refusal(session.sid, req.id) from None
        except StoreUnavailable:
            raise store_unavailable(req.id) from None
        except RetentionFull:
            raise overloaded(req.id) from None
        except ChannelRejected as exc:  # (checked in the claim's own round trip)
            raise channel_refusal(exc.verdict, req.id) from None
        return start, claim.key in session.holding

    async def _claim_shielded(self, session: Session, effect: ClaimCall) -> CallStart:
        claim = effect.claim
        return await self.begin(
            session.principal,
            session.sid,
            claim.key,
            claim.fingerprint,
            effect.request.id,
            effect.token,
        )

    async def begin(
        self,
        principal: str,
        sid: str,
        key: str,
        fingerprint: bytes,
        request_id: RequestId,
        token: tuple[int, str] | None = None,
    ) -> CallStart:
        """``begin_call`` on a shared store under this replica's lease, finished even
        if the caller is cancelled: a claim granted to a delivery that then never
        starts is given back at once, not left to block every retry until its lease
        runs out."""
        store = self.store
        mine = secrets.token_hex(8) if store.shared else ""
        granting = asyncio.ensure_future(
            store.begin_call(
                principal,
                sid,
                key,
                fingerprint,
                token,
                request_id=msgspec.json.encode(request_id),
                owner=self.replica_id,
                lease=self.claim_lease if store.shared else None,
                claim=mine,
            )
        )
        try:
            return await asyncio.shield(granting)
        except StoreUnavailable:
            if mine:  # it may have applied: give back what this delivery was granted
                self.unheard.note(principal, sid, key, mine)
                self.renew_soon()
            raise
        except asyncio.CancelledError:
            try:
                start = await asyncio.wait_for(asyncio.shield(granting), FINISH_WAIT)
                if start.outcome is CallOutcome.EXECUTE:
                    await asyncio.wait_for(
                        store.finish_call(principal, sid, key, None), FINISH_WAIT
                    )
            except Exception:
                log.warning("a cancelled claim of %s could not be given back", key)
            raise

    def hold(self, session: Session, key: str) -> None:
        """A claimed call runs here from now on: its lease is renewed until it ends."""
        session.holding.add(key)
        self.renew_soon()

    def renew_soon(self) -> None:
        """Calls run here: make sure their leases are renewed (shared stores)."""
        if self.store.shared and (self._renewer is None or self._renewer.done()):
            self._renewer = self.driver.spawn(renew_leases(self), loop=True)

    async def finish(self, session: Session, key: str, payload: bytes | None) -> None:
        """Store a call's outcome (None: give the key back), then wake the deliveries
        here that wait for it."""
        try:
            await self.record(session.principal, session.sid, key, payload)
            if payload is not None and self.store.shared:
                session.keep_result(key, payload)  # (for a rebind here)
        finally:
            session.finish_call(key)

    async def record(self, principal: str, sid: str, key: str, payload: bytes | None) -> None:
        """Store a call's outcome (None: give the key back).  Shielded and bounded: an
        outcome is never dropped because the task storing it was cancelled; a store
        that does not take it is logged."""
        store = self.store
        try:
            if not store.shared:  # (a process-local store never suspends: nothing to guard)
                await store.finish_call(principal, sid, key, payload)
            else:
                await asyncio.wait_for(
                    asyncio.shield(store.finish_call(principal, sid, key, payload)),
                    FINISH_WAIT,
                )
        except (StoreUnavailable, SessionGone, TimeoutError):
            log.warning("could not record the outcome of call %s in the store", key)

    def start(self) -> None:
        """With a shared store, make sure the relays of mail and of announced changes
        run (they end with the driver)."""
        self._relay_mail()
        if self.store.shared and (self._changes is None or self._changes.done()):
            self._changes = self.driver.spawn(relay_changes(self), loop=True)

    def _relay_mail(self) -> None:
        if self.store.shared and (self._relay is None or self._relay.done()):
            self._relay = self.driver.spawn(relay_mail(self), loop=True)

    def publish_change(self, method: str, uri: str | None) -> None:
        """With a shared store, put an announced change on its bus (in a task)."""
        if self.store.shared:
            change = encode_change(method, uri, self.replica_id)
            self.driver.spawn(self._publish(change))

    def publish_task_change(self, principal: str, task_id: str) -> None:
        """With a shared store, tell the bus ``principal``'s task ``task_id`` changed."""
        if self.store.shared:
            where = task_change_where(principal, task_id)
            change = encode_change(TASK_NOTIFICATION, where, self.replica_id)
            self.driver.spawn(self._publish(change))

    async def _publish(self, change: bytes) -> None:
        try:
            await self.store.publish_change(change)
        except StoreUnavailable:
            log.warning("could not put an announced change on the store's bus")
