"""The process-local session store: :class:`MemoryStore`, the embedded default.

Theory of operation
-------------------
One process serves every session, so the :class:`~._session_store.SessionStore`
promises hold by construction: each operation runs to completion between two
awaits, nothing survives a restart, and ``shared`` is False (no event logs: the
engine replays from its own in-process logs; no leases, no bus, no mailboxes
anyone else reads).

* **Tables.**  Client sessions and weir's own records (named by an
  :class:`~._store_records.InternalId`) live in two separate dicts, so no id a
  client sends reaches an internal record.  An internal record whose gate holds
  nothing is dropped (its user creates it again on ``SessionGone``).
* **The gate** is each session's :class:`~weir.protocol.gate.CallLedger`, bounded
  by :class:`~._store_records.Retention`; with a server's
  :class:`~weir.protocol.budget.RetentionBudget` installed, every byte it keeps is
  charged to it (shed from others first; a new key with no room is
  :class:`~._store_errors.RetentionFull`).
* **Epochs** are the session's counter under :class:`_KeyedMixer`, a keyed 32-bit
  bijection: unique within the session, unguessable without its salt.
"""

from __future__ import annotations

import hashlib
import heapq
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from functools import partial

from weir.protocol.binding import ChannelVerdict
from weir.protocol.budget import RetentionBudget
from weir.protocol.gate import CallLedger, CallOutcome, CallStart

from ._store_errors import ChannelRejected, RetentionFull, SessionGone
from ._store_records import (
    InternalId,
    Retention,
    SessionRecord,
    StoredEvent,
    StoredTask,
    StreamInfo,
    TaskWrite,
    check_channel,
)


class _KeyedMixer:
    """The memory store's epoch permutation: cheap, keyed, a bijection on 32 bits.

    The counter goes through a keyed integer mixer (xor a key, then the MurmurHash3
    finaliser's xorshift-multiply steps with per-session odd multipliers, then xor
    another key); every step is invertible, so epochs stay unique in the session,
    and without the keys (drawn from the session's secret salt) one epoch tells
    nothing useful about the next.  About a microsecond, against ~10 for the SHA-1
    Feistel network that shared stores use (:class:`weir.protocol._event_ids.EpochPermutation`):
    only this process ever allocates a memory store's epochs, so the two need not
    agree.
    """

    __slots__ = ("_k1", "_k2", "_m1", "_m2")

    def __init__(self, salt: str) -> None:
        d = hashlib.sha256(salt.encode("latin-1")).digest()
        self._k1, self._k2 = int.from_bytes(d[0:4], "big"), int.from_bytes(d[4:8], "big")
        self._m1 = int.from_bytes(d[8:12], "big") | 1
        self._m2 = int.from_bytes(d[12:16], "big") | 1

    def epoch(self, n: int) -> str:
        h = n ^ self._k1
        h ^= h >> 16
        h = (h * self._m1) & 0xFFFFFFFF
        h ^= h >> 13
        h = (h * self._m2) & 0xFFFFFFFF
        h ^= h >> 16
        return "%08x" % (h ^ self._k2)


@dataclass(slots=True)
class _MemSession:
    record: SessionRecord
    calls: CallLedger
    epochs: int = 0
    boxes: dict[str, list[bytes]] = field(default_factory=dict)
    #: The claim id of each running claim given one (see ``release_claim``).
    claim_ids: dict[str, str] = field(default_factory=dict)
    permutation: _KeyedMixer | None = None

    def next_epoch(self) -> str:
        """Allocate the session's next epoch (its counter under a keyed permutation)."""
        self.epochs += 1
        if self.permutation is None:
            self.permutation = _KeyedMixer(self.record.salt)
        return self.permutation.epoch(self.epochs)


@dataclass(slots=True)
class _MemTask:
    version: int
    data: bytes
    expires: float


def _task_owner(principal: str) -> str:
    """The retention budget's owner for a principal's tasks (no session id has a space)."""
    return f"tasks of {principal}"


#: What an internal record (a principal's sessionless gate) costs beyond its keys and
#: results -- the record, its ledger, its table entries -- charged to the budget while
#: it holds a key (measured: about 1.7 KB each on the Trio engine, 2.2 KB on asyncio).
INTERNAL_RECORD_BYTES = 2048


def _budget_owner(principal: str, session_id: str) -> str:
    """Whose bytes a record's stored responses are in the retention budget: a client
    session's own id; an internal record's, one name per principal (a space is
    never in a minted id, so the two never meet)."""
    if isinstance(session_id, InternalId):
        return f"{session_id} {principal}"
    return session_id


class MemoryStore:
    """Process-local store: the embedded default (see the module docstring).

    It keeps no event logs (``shared`` is False: the engine replays from its own
    in-process logs).
    """

    shared = False

    def __init__(
        self,
        retention: Retention | None = None,
        *,
        budget: RetentionBudget | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.retention = retention or Retention()
        #: Where stored responses are charged (the server installs its own, so the
        #: gate's results count against the process-wide budget; the owner is the
        #: session id, or for an internal record :func:`_budget_owner`'s name).
        self.budget = budget
        self._sessions: dict[tuple[str, str], _MemSession] = {}
        #: Records named by an :class:`InternalId`: a table no client id reaches.
        self._internal: dict[tuple[str, str], _MemSession] = {}
        #: The clock tasks expire by (seconds; this process's own).
        self.clock = clock
        #: Tasks by (principal, task id), and each principal's (id -> expiry).
        self._tasks: dict[tuple[str, str], _MemTask] = {}
        self._held: dict[str, dict[str, float]] = {}
        #: (expiry, principal, task id) of every write, soonest first (see _sweep_tasks).
        self._expiries: list[tuple[float, str, str]] = []

    def _table(self, session_id: str) -> dict[tuple[str, str], _MemSession]:
        return self._internal if isinstance(session_id, InternalId) else self._sessions

    def _get(self, principal: str, session_id: str) -> _MemSession:
        s = self._table(session_id).get((principal, session_id))
        if s is None:
            raise SessionGone(session_id)
        return s

    async def create_session(self, record: SessionRecord) -> None:
        key = (record.principal, record.session_id)
        table = self._table(record.session_id)
        if key in table:
            raise ValueError(f"session {record.session_id!r} already exists")
        retention = self.retention
        ledger = CallLedger(
            max_calls=retention.calls_per_session, max_bytes=retention.call_bytes_per_session
        )
        table[key] = _MemSession(record, ledger)
        if isinstance(record.session_id, InternalId) and self.budget is not None:
            # No session sheds for an internal record: the budget asks it directly,
            # and a record that holds no key at all is dropped (its user creates it again).
            shed = partial(self._shed_internal, record.principal, record.session_id)
            self.budget.register(_budget_owner(record.principal, record.session_id), shed)

    async def get_session(self, principal: str, session_id: str) -> SessionRecord | None:
        s = self._table(session_id).get((principal, session_id))
        return s.record if s is not None else None

    async def delete_session(self, principal: str, session_id: str) -> bool:
        s = self._table(session_id).pop((principal, session_id), None)
        if s is not None and self.budget is not None:
            self.budget.release_owner(_budget_owner(principal, session_id))
        return s is not None

    async def touch_session(self, principal: str, session_id: str) -> bool:
        return (principal, session_id) in self._table(session_id)

    async def expire_idle(
        self, principal: str, session_id: str, idle: float | None, untouched: float | None
    ) -> bool:
        # One process: the server's own clock and bookkeeping decided already.
        await self.delete_session(principal, session_id)
        return True

    async def rebind(self, principal: str, session_id: str, secret: str) -> SessionRecord:
        s = self._get(principal, session_id)
        s.record = replace(s.record, generation=s.record.generation + 1, secret=secret)
        return s.record

    async def allocate_epoch(self, principal: str, session_id: str, binding: int = 0) -> str:
        return self._get(principal, session_id).next_epoch()

    async def mark_bound(self, principal: str, session_id: str) -> None:
        s = self._get(principal, session_id)
        s.record = replace(s.record, bound=True)

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
        # One process: a claim lives exactly as long as the process running it, so
        # leases have nothing to guard.
        s = self._get(principal, session_id)
        verdict = check_channel(s.record, token)
        if verdict is not ChannelVerdict.OK:
            raise ChannelRejected(verdict)
        epoch = s.next_epoch()
        before = s.calls.held
        # An internal record (a principal's gate) is kept while it holds a key, with
        # no clock to end it: with its first key the record itself is charged too.
        first = isinstance(session_id, InternalId) and not len(s.calls)
        outcome, payload = s.calls.begin(key, fingerprint)
        budget = self.budget
        if budget is not None and s.calls.held != before:
            owner = _budget_owner(principal, session_id)
            record = INTERNAL_RECORD_BYTES if first else 0
            budget.charge(owner, s.calls.held - before + record)  # sheds others' results
            if outcome is CallOutcome.EXECUTE and budget.held > budget.total:
                # No room even after shedding: what is left is keys that must stay.
                # Give this claim back rather than keep it over the budget.
                claimed = s.calls.held
                s.calls.finish(key, None)
                budget.charge(owner, s.calls.held - claimed)
                self._drop_if_empty(principal, session_id)
                raise RetentionFull(key)
        if outcome is CallOutcome.EXECUTE and claim:
            s.claim_ids[key] = claim
        return CallStart(outcome, epoch, payload)

    async def release_claim(self, principal: str, session_id: str, key: str, claim: str) -> bool:
        # (Nothing here can lose a reply; the contract is kept all the same.)
        s = self._table(session_id).get((principal, session_id))
        if s is None or not claim or s.claim_ids.get(key) != claim:
            return False
        self._record(s, principal, session_id, key, None)
        return True

    async def renew_claims(
        self, principal: str, session_id: str, keys: Sequence[str], owner: str, lease: float
    ) -> int:
        return 0

    async def expire_claim(self, principal: str, session_id: str, epoch: str) -> bool:
        return False

    def recent_results(self, principal: str, session_id: str, n: int) -> list[bytes]:
        """The stored responses of the session's ``n`` most recently finished calls."""
        s = self._table(session_id).get((principal, session_id))
        if s is None:
            return []
        return s.calls.recent(n)

    async def finish_call(
        self, principal: str, session_id: str, key: str, payload: bytes | None
    ) -> None:
        s = self._table(session_id).get((principal, session_id))
        if s is None:
            return
        self._record(s, principal, session_id, key, payload)

    def _record(
        self, s: _MemSession, principal: str, session_id: str, key: str, payload: bytes | None
    ) -> None:
        s.claim_ids.pop(key, None)
        before = s.calls.held
        s.calls.finish(key, payload)
        if self.budget is not None:
            self.budget.charge(_budget_owner(principal, session_id), s.calls.held - before)
        self._drop_if_empty(principal, session_id)

    def shed_results(self, principal: str, session_id: str, nbytes: int) -> None:
        """Drop stored responses, oldest first, until ``nbytes`` are freed (the budget
        asks).  Each leaves a tombstone: a retry is told the outcome is gone.  Keys --
        tombstones and running claims -- always stay, so this may free less than
        asked (see :class:`~weir.protocol.gate.CallLedger`)."""
        s = self._table(session_id).get((principal, session_id))
        if s is None:
            return
        freed = s.calls.shed(nbytes)
        if self.budget is not None and freed:
            self.budget.charge(_budget_owner(principal, session_id), -freed)

    def _shed_internal(self, principal: str, session_id: InternalId, nbytes: int) -> None:
        """The budget asks an internal record to shed; one left empty is dropped."""
        self.shed_results(principal, session_id, nbytes)
        self._drop_if_empty(principal, session_id)

    def _drop_if_empty(self, principal: str, session_id: str) -> None:
        """An internal record whose gate holds nothing (no claim, no outcome) is not
        kept: however many principals used one, only those with records cost memory
        (the user creates it again on ``SessionGone``)."""
        if not isinstance(session_id, InternalId):
            return
        s = self._internal.get((principal, session_id))
        if s is not None and not len(s.calls):
            del self._internal[principal, session_id]
            if self.budget is not None:
                self.budget.release_owner(_budget_owner(principal, session_id))

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
        if call_key is not None:
            self._record(s, principal, session_id, call_key, data)

    async def read_events(
        self, principal: str, session_id: str, epoch: str, after_seq: int
    ) -> list[StoredEvent] | None:
        return None

    async def stream_info(self, principal: str, session_id: str, epoch: str) -> StreamInfo | None:
        return None

    async def post_message(self, principal: str, session_id: str, box: str, data: bytes) -> None:
        self._get(principal, session_id).boxes.setdefault(box, []).append(data)

    async def take_messages(
        self, principal: str, session_id: str, box: str, *, keep: bool = False
    ) -> list[bytes]:
        s = self._table(session_id).get((principal, session_id))
        if s is None:
            return []
        items = s.boxes.get(box, [])
        if not keep:
            s.boxes.pop(box, None)
        return list(items)

    async def publish_change(self, change: bytes) -> None:
        return None  # one process: the local listeners already heard it

    async def read_changes(self, after: str | None) -> tuple[str, list[bytes]]:
        return after or "", []

    async def shared_value(self, name: str, candidate: bytes) -> bytes:
        return candidate  # one process: nobody to agree with

    # -- tasks: versioned records, expired by this process's clock

    def _sweep_tasks(self, now: float) -> None:
        """Drop every task whose ttl ran out, whoever holds it (so expired tasks of
        principals that never return do not keep their bytes): amortized O(log n)
        per write, from a heap of expiries (an entry superseded by a later write is
        skipped)."""
        heap = self._expiries
        while heap and heap[0][0] <= now:
            expires, principal, task_id = heapq.heappop(heap)
            entry = self._tasks.get((principal, task_id))
            if entry is not None and entry.expires == expires:
                self._drop_task(principal, task_id)

    async def get_task(self, principal: str, task_id: str) -> StoredTask | None:
        self._sweep_tasks(self.clock())
        entry = self._tasks.get((principal, task_id))
        if entry is None:
            return None
        if entry.expires <= self.clock():
            self._drop_task(principal, task_id)
            return None
        return StoredTask(entry.version, entry.data)

    async def put_task(
        self,
        principal: str,
        task_id: str,
        data: bytes,
        *,
        version: int,
        ttl: float,
        cap: int,
    ) -> TaskWrite:
        now = self.clock()
        self._sweep_tasks(now)
        key = (principal, task_id)
        entry = self._tasks.get(key)
        if (entry.version if entry is not None else 0) != version:
            return TaskWrite.CONFLICT
        held = self._held.get(principal, {})
        if entry is None and len(held) >= cap:
            return TaskWrite.FULL
        budget = self.budget
        if entry is None and budget is not None and budget.held + len(data) > budget.total:
            return TaskWrite.NO_ROOM  # (results, once written, are never shed)
        before = len(entry.data) if entry is not None else 0
        expires = now + ttl
        self._tasks[key] = _MemTask(version + 1, data, expires)
        self._held.setdefault(principal, held)[task_id] = expires
        heapq.heappush(self._expiries, (expires, principal, task_id))
        if self.budget is not None:
            self.budget.charge(_task_owner(principal), len(data) - before)
        return TaskWrite.WRITTEN

    def _drop_task(self, principal: str, task_id: str) -> None:
        entry = self._tasks.pop((principal, task_id), None)
        held = self._held.get(principal)
        if held is not None:
            held.pop(task_id, None)
            if not held:
                del self._held[principal]
        if entry is not None and self.budget is not None:
            self.budget.charge(_task_owner(principal), -len(entry.data))

    async def aclose(self) -> None:
        return None

    def __len__(self) -> int:
        """How many client sessions it holds (internal records not counted)."""
        return len(self._sessions)
