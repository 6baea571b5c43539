"""The simulated cluster's shared store: a model of the Redis store's scripts, with faults.

Theory of operation
-------------------
:class:`SimStore` is one process-local store that behaves, operation by operation,
as :class:`~weir.engine._redis_store.RedisStore`'s Lua scripts do -- each method one
atomic step between two awaits, ``shared`` True -- on a clock it is given (the
simulation's virtual one):

* sessions, the gate (``CallLedger`` per session, retention as the memory store
  keeps it), mailboxes, the change bus and ``shared_value`` come from
  :class:`~weir.engine._memory_store.MemoryStore` and the shared-store semantics on
  top of it;
* **epochs** are the session's counter under the same keyed permutation the Redis
  scripts use (:func:`~weir.protocol._event_ids.scramble_epoch`), so a cursor names the
  same stream however it is checked;
* **event logs**: appends are contiguous per stream and idempotent for an identical
  event; with ``call_key`` the event is also the call's stored response; reads
  return ``[]`` at the head and at the priming cursor of an allocated, still empty
  stream, and ``None`` for a cursor that cannot be honoured;
* **claims carry an owner and a lease**: a delivery that finds a claim running
  under an expired lease makes its outcome the ``interrupted`` error, stores it and
  appends it as the stream's final event (never runs it again); ``renew_claims``
  extends the owner's leases, ``expire_claim`` interrupts from a stream's side;
* **idleness** is the store's clock: ``touch_session`` records it, ``expire_idle``
  deletes only a session idle by that clock.

:class:`StoreHandle` is what one replica holds: the same interface, with faults
drawn from a seeded source (latency, a timeout *after* the write applied, a lost
reply, outages) and :meth:`StoreHandle.fence` for a hard-killed replica, after
which nothing it does reaches the store.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import trio

from weir.engine._memory_store import MemoryStore, _MemSession
from weir.engine._store_errors import ChannelRejected, StoreUnavailable
from weir.engine._store_records import StoredEvent, StreamInfo
from weir.protocol import Reason
from weir.protocol._event_ids import epoch_number, scramble_epoch
from weir.protocol.binding import ChannelVerdict
from weir.protocol.course import INTERRUPTED_MESSAGE
from weir.protocol.gate import CallOutcome, CallStart
from weir.protocol.jsonrpc import encode_error

_EPOCH = re.compile(r"[0-9a-f]{8}")


class _Scrambled:
    """The Redis scripts' epoch permutation, in the memory store's slot for one."""

    def __init__(self, salt: str) -> None:
        self.salt = salt

    def epoch(self, n: int) -> str:
        return scramble_epoch(n, self.salt)


@dataclass
class _Claim:
    owner: str
    lease_until: float  # inf: no lease
    epoch: str
    request_id: bytes
    claim: str = ""


class SimStore(MemoryStore):
    """The Redis store's semantics in one process (see the module docstring)."""

    shared = True

    def __init__(self, clock: Callable[[], float] = trio.current_time) -> None:
        super().__init__()
        self.clock = clock
        self.events: dict[tuple[str, str, str], list[StoredEvent]] = {}
        self.bindings: dict[tuple[str, str, str], int] = {}
        self.claims: dict[tuple[str, str, str], _Claim] = {}
        self.touched: dict[tuple[str, str], float] = {}
        self.created: dict[tuple[str, str], float] = {}
        self.bus: list[bytes] = []
        self.values: dict[str, bytes] = {}
        #: The store refuses every operation until this time (an outage).
        self.down_until = 0.0

    def outage(self, until: float) -> None:
        """Refuse every operation (through every handle) until ``until``; nothing
        held is lost (a restart that keeps its data)."""
        self.down_until = until

    # ------------------------------------------------------------ sessions
    def _get(self, principal: str, session_id: str) -> _MemSession:
        s = super()._get(principal, session_id)
        if not isinstance(s.permutation, _Scrambled):
            s.permutation = _Scrambled(s.record.salt)  # type: ignore[assignment]
        return s

    async def create_session(self, record: Any) -> None:
        await super().create_session(record)
        self.created[record.principal, record.session_id] = self.clock()

    async def delete_session(self, principal: str, session_id: str) -> bool:
        gone = await super().delete_session(principal, session_id)
        for table in (self.events, self.bindings, self.claims):
            for k in [k for k in table if k[:2] == (principal, session_id)]:
                del table[k]
        self.touched.pop((principal, session_id), None)
        self.created.pop((principal, session_id), None)
        return gone

    async def touch_session(self, principal: str, session_id: str) -> bool:
        if (principal, session_id) not in self._table(session_id):
            return False
        self.touched[principal, session_id] = self.clock()
        return True

    async def expire_idle(
        self, principal: str, session_id: str, idle: float | None, untouched: float | None
    ) -> bool:
        key = (principal, session_id)
        if key not in self._table(session_id):
            return True
        now = self.clock()
        seen = self.touched.get(key)
        if seen is None:
            if untouched is not None and now - self.created.get(key, now) >= untouched:
                return await self.delete_session(principal, session_id)
            if idle is not None and now - self.created.get(key, now) >= idle:
                return await self.delete_session(principal, session_id)
            return False
        if idle is not None and now - seen >= idle:
            return await self.delete_session(principal, session_id)
        return False

    async def allocate_epoch(self, principal: str, session_id: str, binding: int = 0) -> str:
        epoch = self._get(principal, session_id).next_epoch()
        self.bindings[principal, session_id, epoch] = binding
        return epoch

    # ------------------------------------------------------------ the gate
    async def begin_call(
        self,
        principal: str,
        session_id: str,
        key: str,
        fingerprint: bytes,
        token: tuple[int, str] | None,
        *,
        request_id: bytes = b"null",
        owner: str = "",
        lease: float | None = None,
        claim: str = "",
    ) -> CallStart:
        self._get(principal, session_id)  # (the right permutation first)
        start = await super().begin_call(
            principal, session_id, key, fingerprint, token, claim=claim
        )
        where = (principal, session_id, key)
        self.bindings[principal, session_id, start.epoch] = token[0] if token else 0
        if start.outcome is CallOutcome.EXECUTE:
            until = self.clock() + lease if lease else float("inf")
            self.claims[where] = _Claim(owner, until, start.epoch, request_id, claim)
        elif start.outcome is CallOutcome.RUNNING:
            held = self.claims.get(where)
            if held is not None and self.lease_ran_out(held):
                payload = self._interrupt(principal, session_id, key, held)
                return CallStart(CallOutcome.DONE, start.epoch, payload)
        return start

    def lease_ran_out(self, claim: _Claim, now: float | None = None) -> bool:
        """Whether ``claim``'s owner is presumed gone (its lease is in the past) --
        the gate's rule, by the store's clock (or at ``now``)."""
        return claim.lease_until < (self.clock() if now is None else now)

    def _interrupt(self, principal: str, session_id: str, key: str, claim: _Claim) -> bytes:
        payload = encode_error(
            _decode_id(claim.request_id),
            -32000,
            INTERRUPTED_MESSAGE,
            {"reason": str(Reason.INTERRUPTED)},
        )
        del self.claims[principal, session_id, key]
        s = self._table(session_id).get((principal, session_id))
        if s is not None:
            self._record(s, principal, session_id, key, payload)
        log = self.events.setdefault((principal, session_id, claim.epoch), [])
        seq = log[-1].seq + 1 if log else 1
        binding = self.bindings.get((principal, session_id, claim.epoch), 0)
        log.append(StoredEvent(seq, payload, True, binding, ""))
        return payload

    async def release_claim(self, principal: str, session_id: str, key: str, claim: str) -> bool:
        released = await super().release_claim(principal, session_id, key, claim)
        if released:
            self.claims.pop((principal, session_id, key), None)
        return released

    async def renew_claims(
        self, principal: str, session_id: str, keys: Sequence[str], owner: str, lease: float
    ) -> int:
        renewed = 0
        for key in keys:
            claim = self.claims.get((principal, session_id, key))
            if claim is not None and claim.owner == owner and claim.lease_until != float("inf"):
                claim.lease_until = self.clock() + lease
                renewed += 1
        return renewed

    async def expire_claim(self, principal: str, session_id: str, epoch: str) -> bool:
        for (p, sid, key), claim in list(self.claims.items()):
            mine = (p, sid) == (principal, session_id) and claim.epoch == epoch
            if mine and self.lease_ran_out(claim):
                self._interrupt(principal, session_id, key, claim)
                return True
        return False

    async def finish_call(
        self, principal: str, session_id: str, key: str, payload: bytes | None
    ) -> None:
        self.claims.pop((principal, session_id, key), None)
        await super().finish_call(principal, session_id, key, payload)

    def running_claims(self, now: float) -> list[str]:
        """Keys claimed, unfinished, and under a lease that has not run out (or none):
        long after every call should have ended, a key nobody could ever take over."""
        return [key for (_, _, key), c in self.claims.items() if not self.lease_ran_out(c, now)]

    # ------------------------------------------------------------ streams
    async def append_event(
        self,
        principal: str,
        session_id: str,
        epoch: str,
        seq: int,
        data: bytes,
        *,
        final: bool,
        generation: int,
        binding: int = 0,
        call_key: str | None = None,
        replica: str = "",
    ) -> None:
        s = self._get(principal, session_id)
        if generation != s.record.generation:
            raise ChannelRejected(ChannelVerdict.STALE)
        if seq < 0:
            raise ValueError(f"event {epoch}:{seq}: no such seq")
        log = self.events.setdefault((principal, session_id, epoch), [])
        if log and seq <= log[-1].seq:
            same = [e for e in log if e.seq == seq]
            if same and (same[0].data, same[0].final, same[0].binding) == (data, final, binding):
                return  # the same event again (its reply was lost): already stored
            raise ValueError(f"event {epoch}:{seq} is out of order")
        if log and seq != log[-1].seq + 1:
            raise ValueError(f"event {epoch}:{seq} is out of order")
        log.append(StoredEvent(seq, data, final, binding, replica))
        if call_key is not None:
            self.claims.pop((principal, session_id, call_key), None)
            self._record(s, principal, session_id, call_key, data)

    async def read_events(
        self, principal: str, session_id: str, epoch: str, after_seq: int
    ) -> list[StoredEvent] | None:
        s = self._table(session_id).get((principal, session_id))
        if s is None or _EPOCH.fullmatch(epoch) is None or not -1 <= after_seq < 2**52:
            return None
        log = self.events.get((principal, session_id, epoch), [])
        if not log:
            n = epoch_number(epoch, s.record.salt)
            return [] if after_seq == 0 and 1 <= n <= s.epochs else None
        want = after_seq + 1
        if want < log[0].seq or want > log[-1].seq + 1:
            return None
        return [e for e in log if e.seq > after_seq]

    async def stream_info(self, principal: str, session_id: str, epoch: str) -> StreamInfo | None:
        s = self._table(session_id).get((principal, session_id))
        if s is None or _EPOCH.fullmatch(epoch) is None:
            return None
        n = epoch_number(epoch, s.record.salt)
        if not 1 <= n <= s.epochs:
            return None
        log = self.events.get((principal, session_id, epoch), [])
        last = log[-1] if log else None
        binding = self.bindings.get((principal, session_id, epoch), 0)
        return StreamInfo(binding, last.seq if last else -1, bool(last and last.final))

    # ------------------------------------------------------------ shared by all
    async def publish_change(self, change: bytes) -> None:
        self.bus = [*self.bus, change][-1024:]
        self._bus_count = getattr(self, "_bus_count", 0) + 1

    async def read_changes(self, after: str | None) -> tuple[str, list[bytes]]:
        count = getattr(self, "_bus_count", 0)
        if after is None or not after.isdigit():
            return str(count), []
        behind = count - int(after)
        return str(count), self.bus[-behind:] if 0 < behind <= len(self.bus) else (
            list(self.bus) if behind > len(self.bus) else []
        )

    async def shared_value(self, name: str, candidate: bytes) -> bytes:
        return self.values.setdefault(name, candidate)


def _decode_id(raw: bytes) -> Any:
    import json

    return json.loads(raw)


@dataclass(frozen=True)
class StoreFaults:
    """How often the store misbehaves toward a replica (all zero: never).

    Attributes:
        latency: most delay per operation (seconds); each draws in [0, latency].
        timeout_after_apply: chance that an operation applies, then times out
            (``StoreUnavailable``): the caller cannot know it happened.
        lost_reply: chance that an operation applies and its reply never comes: the
            caller waits ``reply_timeout``, then ``StoreUnavailable``.
        reply_timeout: the replica's store timeout (seconds).
    """

    latency: float = 0.0
    timeout_after_apply: float = 0.0
    lost_reply: float = 0.0
    reply_timeout: float = 2.0


class StoreHandle:
    """One replica's way to the store (see the module docstring)."""

    shared = True

    def __init__(
        self, store: SimStore, rng: random.Random, faults: StoreFaults, name: str = ""
    ) -> None:
        self._store, self._rng, self._faults, self.name = store, rng, faults, name
        self.fenced = False
        #: What happened to each faulty operation: (op, fault).
        self.faults_seen: list[tuple[str, str]] = []

    def fence(self) -> None:
        """This replica was hard-killed: nothing it does reaches the store again."""
        self.fenced = True

    async def aclose(self) -> None:
        await trio.lowlevel.checkpoint()

    def __getattr__(self, op: str) -> Any:
        target = getattr(self._store, op)
        if op.startswith("_") or not callable(target):
            return target
        return lambda *a, **k: self._call(op, target, a, k)

    async def _call(self, op: str, target: Any, args: Any, kwargs: Any) -> Any:
        f, rng = self._faults, self._rng
        if f.latency:
            await trio.sleep(rng.uniform(0.0, f.latency))
        if self.fenced:
            raise StoreUnavailable("this replica is dead")
        if self._store.down_until > trio.current_time():
            raise StoreUnavailable("the store is down")
        result = await target(*args, **kwargs)
        if f.timeout_after_apply and rng.random() < f.timeout_after_apply:
            self.faults_seen.append((op, "timeout after apply"))
            raise StoreUnavailable(f"{op}: timed out (it applied)")
        if f.lost_reply and rng.random() < f.lost_reply:
            self.faults_seen.append((op, "lost reply"))
            await trio.sleep(f.reply_timeout)
            raise StoreUnavailable(f"{op}: no reply (it applied)")
        return result
