"""The session store interface: what every process serving a session must agree on.

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
(:func:`~._store_records.is_session_id`); weir's own records (the sessionless gate's
per-principal namespace) are named by :class:`~._store_records.InternalId` and kept
apart -- a separate table in :class:`~._memory_store.MemoryStore`, a separate key
prefix on Redis -- so no id a client sends, well-formed or not, can name one of
them.

**Tasks** (the tasks extension) are versioned records in the principal's own
internal keyspace: :meth:`~SessionStore.put_task` writes only over the version the
writer read (compare-and-set), with the per-principal cap checked in the same step, and
:meth:`~SessionStore.get_task` reads.  A task id a client sends is looked up under
the principal of its request, so another principal's task is "not found" exactly
as an unknown one is.

The values a store keeps and returns are :mod:`._store_records`'; its failures,
:mod:`._store_errors`' -- :class:`~._store_errors.SessionGone` (unknown or deleted:
answer 404), :class:`~._store_errors.ChannelRejected` (409 ``cursor_stale`` /
``channel_unbound``), :class:`~._store_errors.StoreUnavailable` (fail closed: 503
``store_unavailable``).

:class:`~._memory_store.MemoryStore` is the embedded default: one process, nothing
survives a restart, ``shared`` is False.  :class:`~._redis_store.RedisStore` is the
shared one.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final, Protocol

from weir.common import StateSealer, new_key
from weir.protocol.gate import CallStart

from ._store_records import SessionRecord, StoredEvent, StoredTask, StreamInfo, TaskWrite

#: The :meth:`SessionStore.shared_value` under which replicas agree on the key that
#: seals sessionless request state (when none is configured), on either runtime.
REQUEST_STATE_KEY: Final = "request-state-key"


async def replicas_sealer(store: SessionStore) -> StateSealer:
    """The sealer of sessionless request state that every replica on ``store`` uses
    when none is given a key: the first key stored wins, so a round begun on one
    replica, of either runtime, continues on any other.

    Raises:
        StoreUnavailable: the store did not answer.
    """
    return StateSealer([await store.shared_value(REQUEST_STATE_KEY, new_key())])


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
        claim: str = "",
    ) -> CallStart:
        """Check the channel token, claim ``key`` and allocate the response stream's epoch.

        A shared store records who runs the claim (``owner``, a replica id) under a
        lease of ``lease`` seconds, which the owner renews (:meth:`renew_claims`)
        while the call runs.  A delivery that finds the claim RUNNING with its lease
        run out finds the owner gone: the claim's outcome becomes the ``interrupted``
        error (for ``request_id``), stored and appended as its stream's final event,
        and the answer is DONE with it.  Nothing runs a second time.

        ``claim`` is the delivery's own random id, recorded with a claim it is
        granted, so that a delivery that never heard the answer can give back
        exactly its own claim (:meth:`release_claim`) and nobody else's.

        Raises:
            SessionGone: unknown session.
            ChannelRejected: the token is stale or unbound (nothing claimed).
        """

    async def renew_claims(
        self, principal: str, session_id: str, keys: Sequence[str], owner: str, lease: float
    ) -> int:
        """Extend by ``lease`` seconds the leases of ``owner``'s running claims ``keys``."""

    async def release_claim(self, principal: str, session_id: str, key: str, claim: str) -> bool:
        """Give back ``key`` if it is still claimed under ``claim`` with nothing stored
        for it: the delivery holding that claim id asked for it, lost the answer, and
        never ran the call.  Another delivery's claim, or a call that finished, is
        left alone (so no call can run twice).  True if it was given back."""

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

    async def get_task(self, principal: str, task_id: str) -> StoredTask | None:
        """Task ``task_id`` of ``principal`` as last written, or ``None`` (never created,
        expired, or another principal's: the three are indistinguishable)."""

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
        """Write task ``task_id`` of ``principal`` if its stored version is ``version``
        (0: create it; it must not exist), to expire ``ttl`` seconds from now.

        A principal holds at most ``cap`` unexpired tasks: a creation past it is
        :attr:`TaskWrite.FULL`, nothing written (and a process-local store whose
        retention budget is full answers :attr:`TaskWrite.NO_ROOM`).  The check
        and the write are one atomic step on a shared store, so replicas creating
        tasks at the same moment never pass the cap together, and of two writers
        that read one
        version exactly one writes."""

    async def publish_change(self, change: bytes) -> None:
        """Put ``change`` (an announced change, encoded) on the bus every replica reads."""

    async def read_changes(self, after: str | None) -> tuple[str, list[bytes]]:
        """The changes published after cursor ``after`` (``None``: from now on) and the
        cursor to read from next.  The bus keeps the newest 1,024 changes; a reader
        further behind misses the older ones (each is a notice to re-fetch a list, so
        a later one stands in for it)."""

    async def aclose(self) -> None:
        """Release connections."""
