"""Session stores: what every process serving a session must agree on, behind one interface.

Theory of operation
-------------------
The server keeps *live* per-session machinery (open streams, running handlers,
drain credit) in process; a :class:`SessionStore` holds what must be agreed on by
every process that can serve a session:

* the session record -- that it exists, who owns it (``principal``), the
  negotiated revision, its **generation** (starts at 1, only grows) and the secret
  of its current channel token;
* **stream epochs**, allocated per session, never reused, so ``<epoch>:<seq>``
  cursors mean the same thing on every replica;
* the **idempotency gate**: a ``tools/call`` key is claimed atomically before the
  call runs (:meth:`SessionStore.begin_call`), and its response stored when it
  finishes, so a second delivery -- on any replica -- never executes again;
* **event logs** (shared stores only): every event of a stream is appended before
  it is written to the wire, so any replica can replay it after a cursor.

Every key is scoped by ``(principal, session_id)``.  Each multi-step update is one
atomic step (one Lua script on Redis): claim + epoch allocation + channel check in
:meth:`~SessionStore.begin_call`; generation check + append + storing the call's
result in :meth:`~SessionStore.append_event`; generation bump + token rotation in
:meth:`~SessionStore.rebind`.

**Two keyspaces.**  Client sessions are named by ids weir minted
(:func:`is_session_id`); weir's own records (the sessionless gate's per-principal
namespace) are named by :class:`InternalId` and kept apart -- a separate table in
:class:`MemoryStore`, a separate key prefix on Redis -- so no id a client sends,
well-formed or not, can name one of them.

Failures: :class:`SessionGone` (unknown or deleted: answer 404),
:class:`ChannelRejected` (409 ``cursor_stale`` / ``channel_unbound``),
:class:`StoreUnavailable` (fail closed: 503 ``store_unavailable``).

:class:`MemoryStore` is the embedded default: one process, nothing survives a
restart, ``shared`` is False.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any, Final, Protocol

import msgspec

from weir.protocol.binding import ChannelVerdict, channel_verdict
from weir.protocol.budget import RetentionBudget
from weir.protocol.gate import CallLedger, CallOutcome, CallStart
from weir.protocol.lifecycle import CLIENT_INFO_KEPT, MAX_CLIENT_CAPABILITIES, MAX_CLIENT_INFO_FIELD

#: The format of every session id weir mints: 22 to 128 characters of the base64url
#: alphabet (the default, ``secrets.token_urlsafe(32)``, gives 43).  An
#: ``Mcp-Session-Id`` outside it was never minted here: 404 before any store lookup.
SESSION_ID_FORMAT = re.compile(r"[A-Za-z0-9_-]{22,128}")


def is_session_id(session_id: str) -> bool:
    """Whether ``session_id`` has the format of the ids weir mints (:data:`SESSION_ID_FORMAT`)."""
    return SESSION_ID_FORMAT.fullmatch(session_id) is not None


class InternalId(str):
    """The name of a record weir keeps for itself, not for a client's session.

    Stores keep records named by an ``InternalId`` in their own keyspace (see the
    module docstring), so a plain ``str`` equal to it -- anything a client sends --
    never reaches them.  Its value is also outside :data:`SESSION_ID_FORMAT`.
    """

    __slots__ = ()

    def __new__(cls, name: str) -> InternalId:
        if is_session_id(name):
            raise ValueError(f"internal id {name!r} must lie outside the session id format")
        return super().__new__(cls, name)


#: The record under which a principal's sessionless gate records live, in every store
#: and for both runtimes (a keyspace of its own: no client-sent session id names it).
SESSIONLESS_NAMESPACE: Final = InternalId("~sessionless")


@dataclass(frozen=True, slots=True, kw_only=True)
class SessionRecord:
    """What the store knows about a session.

    Attributes:
        session_id: the ``Mcp-Session-Id``.
        principal: who owns it (``"anonymous"`` without authentication); every
            lookup is scoped by ``(principal, session_id)``.
        protocol_version: the revision negotiated at ``initialize``.
        created_at: engine clock time of creation.
        generation: starts at 1 and only grows (channel rebinds).
        secret: the secret half of the current channel token.
        salt: keys the session's epoch permutation
            (:func:`weir.protocol._event_ids.scramble_epoch`), so stream epochs cannot
            be guessed; never sent to the client.
        bound: the client has presented its channel token at least once: from then
            on a ``DELETE``, a rebind or a stream of the session needs the token
            (unless authorization is on, where the principal is the proof).
        client: what the client declared at ``initialize`` (its capabilities and
            ``clientInfo``, JSON; see :func:`client_record`), so that a replica that
            did not see the ``initialize`` knows it too; empty if it was too large.
    """

    session_id: str
    principal: str
    protocol_version: str
    created_at: float
    generation: int = 1
    secret: str = ""
    salt: str = ""
    bound: bool = False
    client: str = ""

    @property
    def channel_token(self) -> str:
        """The ``Mcp-Channel-Token`` value: ``<generation>.<secret>``."""
        return f"{self.generation}.{self.secret}"


#: The largest client declaration a session record keeps (bytes of JSON): what
#: ``initialize`` accepts (capabilities, and the ``clientInfo`` fields kept, each
#: character escaped at worst) always fits; anything larger is not kept.
MAX_CLIENT_RECORD = (
    MAX_CLIENT_CAPABILITIES + len(CLIENT_INFO_KEPT) * (6 * MAX_CLIENT_INFO_FIELD + 32) + 64
)


def client_record(capabilities: Mapping[str, Any], client_info: Mapping[str, Any]) -> str:
    """:attr:`SessionRecord.client` for what an ``initialize`` declared ("" past
    :data:`MAX_CLIENT_RECORD`: a session never costs the store more than that)."""
    text = msgspec.json.encode({"c": capabilities, "i": client_info}).decode()
    return text if len(text) <= MAX_CLIENT_RECORD else ""


def client_of(record: SessionRecord) -> tuple[dict[str, Any], dict[str, Any]]:
    """The capabilities and ``clientInfo`` a record keeps (empty when it keeps none
    or something unreadable)."""
    try:
        found = msgspec.json.decode(record.client) if record.client else {}
    except msgspec.DecodeError:
        found = {}
    caps = found.get("c") if isinstance(found, dict) else None
    info = found.get("i") if isinstance(found, dict) else None
    return (caps if isinstance(caps, dict) else {}), (info if isinstance(info, dict) else {})


class StoreUnavailable(Exception):
    """The store could not be reached; callers fail closed (503 ``store_unavailable``)."""


class RetentionFull(Exception):
    """A new gate key was refused: the memory budget is full of keys that must stay
    (tombstones, running claims) even after shedding, and forgetting one could run
    its call again.  Nothing was claimed; callers answer 503 ``overloaded``."""


class SessionGone(Exception):
    """The session is unknown or was deleted (404)."""


class ChannelRejected(Exception):
    """A channel token was refused; ``verdict`` is STALE or UNBOUND."""

    def __init__(self, verdict: ChannelVerdict) -> None:
        super().__init__(verdict.value)
        self.verdict = verdict


def check_channel(record: SessionRecord, token: tuple[int, str] | None) -> ChannelVerdict:
    """Compare a presented ``(generation, secret)`` with the record (None: no token, OK)."""
    return channel_verdict(record.generation, record.secret, token)


@dataclass(frozen=True, slots=True)
class StoredEvent:
    """One event of a stored stream log."""

    seq: int
    data: bytes
    final: bool = False
    #: The channel generation the stream was opened under (0: no channel token).
    binding: int = 0
    #: The replica that produced the event ("" if unknown).
    replica: str = ""


@dataclass(frozen=True, slots=True)
class StreamInfo:
    """What a shared store knows about one stream log."""

    #: The channel generation the stream was opened under (0: no channel token).
    binding: int
    #: The newest stored event's seq (-1: nothing stored yet).
    last_seq: int
    #: True if the newest stored event is the stream's final one.
    finished: bool


@dataclass(frozen=True, slots=True, kw_only=True)
class Retention:
    """How long and how much the store keeps.

    Attributes:
        events_per_stream: newest events kept per stream log.
        ttl: seconds a session's keys live after their last update.
        idempotency_ttl: seconds a finished call's stored response is kept.
        calls_per_session: finished calls the memory store remembers per session
            (it has no clock for ``idempotency_ttl``; beyond it the oldest finished
            ones are forgotten, running claims never).
        call_bytes_per_session: bytes the gate keeps per session: every key (its
            length plus ``ENTRY_OVERHEAD``) and every stored response.  Beyond it the
            oldest responses are dropped and leave a tombstone (a retry is told the
            outcome is gone, and nothing re-runs); only if the keys themselves hold
            the bytes are the oldest finished keys forgotten whole.  Across sessions
            the server's retention budget applies as well: it drops responses only,
            never a key; a new key it has no room for is refused
            (:class:`RetentionFull`).
    """

    events_per_stream: int = 4096
    ttl: float = 3600.0
    idempotency_ttl: float = 3600.0
    calls_per_session: int = 1024
    call_bytes_per_session: int = 1024 * 1024


class SessionStore(Protocol):
    """The interface every store implements (see the module docstring)."""

    #: True if other processes see the same data (a Redis-protocol server).
    shared: bool

    async def create_session(self, record: SessionRecord) -> None:
        """Persist a new session.  Raises ``ValueError`` if the id is taken."""

    async def get_session(self, principal: str, session_id: str) -> SessionRecord | None:
        """The record, or ``None`` if unknown or deleted."""

    async def delete_session(self, principal: str, session_id: str) -> bool:
        """Forget a session and everything stored for it; ``True`` if it existed."""

    async def touch_session(self, principal: str, session_id: str) -> bool:
        """Record, by the store's clock, that the session was served now (a shared
        store's idleness is decided from this; see :meth:`expire_idle`).  False if
        the session is gone."""

    async def expire_idle(
        self, principal: str, session_id: str, idle: float | None, untouched: float | None
    ) -> bool:
        """Delete the session if the store's clock says it is idle: last served (see
        :meth:`touch_session`) ``idle`` seconds ago or more, or -- with ``untouched``
        -- never served since it was created, ``untouched`` seconds ago or more.

        One atomic step, so a replica's sweep never deletes a session another
        replica has just served.  True if the session is gone (deleted now or
        before); False if it lives on (the caller may forget its local copy).
        """

    async def rebind(self, principal: str, session_id: str, secret: str) -> SessionRecord:
        """Bump the generation and install ``secret``, atomically.  Raises :class:`SessionGone`."""

    async def allocate_epoch(self, principal: str, session_id: str, binding: int = 0) -> str:
        """A fresh epoch never used before in this session, for a stream bound to
        channel generation ``binding`` (0: no token).  Raises :class:`SessionGone`."""

    async def mark_bound(self, principal: str, session_id: str) -> None:
        """Record that the session's client has presented its channel token (once is
        enough; see :attr:`SessionRecord.bound`).  Raises :class:`SessionGone`."""

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
    ) -> CallStart:
        """Check the channel token, claim ``key`` and allocate the response stream's epoch.

        A shared store records who runs the claim (``owner``, a replica id) under a
        lease of ``lease`` seconds, which the owner renews (:meth:`renew_claims`)
        while the call runs.  A delivery that finds the claim RUNNING with its lease
        run out finds the owner gone: the claim's outcome becomes the ``interrupted``
        error (for ``request_id``), stored and appended as its stream's final event,
        and the answer is DONE with it.  Nothing runs a second time.

        Raises:
            SessionGone: unknown session.
            ChannelRejected: the token is stale or unbound (nothing claimed).
        """

    async def renew_claims(
        self, principal: str, session_id: str, keys: Sequence[str], owner: str, lease: float
    ) -> int:
        """Extend by ``lease`` seconds the leases of ``owner``'s running claims ``keys``."""

    async def expire_claim(self, principal: str, session_id: str, epoch: str) -> bool:
        """If the call answered on stream ``epoch`` runs under an expired lease, make
        its outcome ``interrupted`` (as :meth:`begin_call` would); True if it did."""

    async def finish_call(
        self, principal: str, session_id: str, key: str, payload: bytes | None
    ) -> None:
        """Store the call's response (``None``: the call was cancelled; release the key)."""

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
        """Append one event if the session is still at ``generation``.

        ``binding`` (the channel generation the stream was opened under, 0 for none)
        is stored with the event and returned by :meth:`read_events`.  With
        ``call_key`` the data is also stored as that call's response, atomically
        (the final event of a call's stream and the gate's record in one step).

        Raises:
            SessionGone: unknown session.
            ChannelRejected: the session moved to a newer generation (STALE).
        """

    async def read_events(
        self, principal: str, session_id: str, epoch: str, after_seq: int
    ) -> list[StoredEvent] | None:
        """Events with ``seq > after_seq``; ``None`` if this session has no such stream
        or no longer holds ``after_seq + 1`` (the cursor cannot be honoured)."""

    async def stream_info(self, principal: str, session_id: str, epoch: str) -> StreamInfo | None:
        """The stream's binding and newest stored event; ``None`` if this session never
        allocated ``epoch`` (or the store keeps no event logs)."""

    async def post_message(self, principal: str, session_id: str, box: str, data: bytes) -> None:
        """Leave ``data`` in the session's mailbox ``box`` (cross-replica messages: a
        client's answer to another replica's request, a cancellation)."""

    async def take_messages(
        self, principal: str, session_id: str, box: str, *, keep: bool = False
    ) -> list[bytes]:
        """Everything in mailbox ``box``, oldest first; emptied unless ``keep``."""

    async def shared_value(self, name: str, candidate: bytes) -> bytes:
        """The value every process sharing this store uses for ``name``: the first
        ``candidate`` stored wins (e.g. the key that seals request state).  A
        process-local store answers ``candidate``."""
        return candidate

    async def publish_change(self, change: bytes) -> None:
        """Put ``change`` (an announced change, encoded) on the bus every replica reads."""

    async def read_changes(self, after: str | None) -> tuple[str, list[bytes]]:
        """The changes published after cursor ``after`` (``None``: from now on) and the
        cursor to read from next.  The bus keeps the newest 1,024 changes; a reader
        further behind misses the older ones (each is a notice to re-fetch a list, so
        a later one stands in for it)."""

    async def aclose(self) -> None:
        """Release connections."""


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


@dataclass
class _MemSession:
    record: SessionRecord
    calls: CallLedger
    epochs: int = 0
    boxes: dict[str, list[bytes]] = field(default_factory=dict)
    permutation: _KeyedMixer | None = None

    def next_epoch(self) -> str:
        """Allocate the session's next epoch (its counter under a keyed permutation)."""
        self.epochs += 1
        if self.permutation is None:
            self.permutation = _KeyedMixer(self.record.salt)
        return self.permutation.epoch(self.epochs)


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
        self, retention: Retention | None = None, *, budget: RetentionBudget | None = None
    ) -> None:
        self.retention = retention or Retention()
        #: Where stored responses are charged (the server installs its own, so the
        #: gate's results count against the process-wide budget; the owner is the
        #: session id, or for an internal record :func:`_budget_owner`'s name).
        self.budget = budget
        self._sessions: dict[tuple[str, str], _MemSession] = {}
        #: Records named by an :class:`InternalId`: a table no client id reaches.
        self._internal: dict[tuple[str, str], _MemSession] = {}

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
    ) -> CallStart:
        # One process: a claim lives exactly as long as the process running it, so
        # leases have nothing to guard.
        s = self._get(principal, session_id)
        verdict = check_channel(s.record, token)
        if verdict is not ChannelVerdict.OK:
            raise ChannelRejected(verdict)
        epoch = s.next_epoch()
        before = s.calls.held
        outcome, payload = s.calls.begin(key, fingerprint)
        budget = self.budget
        if budget is not None and s.calls.held != before:
            owner = _budget_owner(principal, session_id)
            budget.charge(owner, s.calls.held - before)  # sheds others' results first
            if outcome is CallOutcome.EXECUTE and budget.held > budget.total:
                # No room even after shedding: what is left is keys that must stay.
                # Give this claim back rather than keep it over the budget.
                claimed = s.calls.held
                s.calls.finish(key, None)
                budget.charge(owner, s.calls.held - claimed)
                self._drop_if_empty(principal, session_id)
                raise RetentionFull(key)
        return CallStart(outcome, epoch, payload)

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

    async def aclose(self) -> None:
        return None

    def __len__(self) -> int:
        """How many client sessions it holds (internal records not counted)."""
        return len(self._sessions)
