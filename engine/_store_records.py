"""What a session store keeps and returns: session ids, records, events, retention.

Theory of operation
-------------------
These are the values every :class:`~._session_store.SessionStore` speaks, the
contract a store implementer reads first (its errors are
:mod:`._store_errors`'):

* **Session ids.**  Client sessions are named by ids weir minted
  (:data:`SESSION_ID_FORMAT`, :func:`is_session_id`); an ``Mcp-Session-Id``
  outside the format never reaches a store.
* **Two keyspaces.**  weir's own records (the sessionless gate's per-principal
  namespace, :data:`SESSIONLESS_NAMESPACE`) are named by :class:`InternalId` and
  kept apart -- a separate table in the memory store, a separate key prefix on
  Redis -- so no id a client sends, well-formed or not, can name one of them.
* **The session record** (:class:`SessionRecord`): owner, revision, channel
  generation and secret, epoch salt, and what the client declared at
  ``initialize`` (bounded by :data:`MAX_CLIENT_RECORD`, so a session never costs
  the store more than that).
* **Stream logs** (:class:`StoredEvent`, :class:`StreamInfo`) as a shared store
  returns them, and **how long and how much** a store keeps (:class:`Retention`).

Everything here is an immutable value or a pure function: no I/O, no clock.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

import msgspec

from weir.protocol.binding import ChannelVerdict, channel_verdict
from weir.protocol.lifecycle import CLIENT_INFO_KEPT, MAX_CLIENT_CAPABILITIES, MAX_CLIENT_INFO_FIELD

#: Default deadline (seconds) of one shared-store operation, including connecting.
DEFAULT_TIMEOUT: Final = 2.0
#: Seconds an event's append is retried through a store outage (a failover) before its
#: stream is given up.  The append is idempotent (the same event re-sent is answered
#: ``duplicate``), so a retry after a lost reply never writes it twice; meanwhile the
#: stream's later frames wait behind it, in order.
APPEND_PATIENCE: Final = 10.0
#: The first wait between two such retries (doubling, at most a second).
APPEND_RETRY_DELAY: Final = 0.05

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
#: The internal record name a principal's tasks are kept under.
TASKS: Final = InternalId("~tasks")


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


@dataclass(frozen=True, slots=True)
class StoredTask:
    """A task's record as a store keeps it: its bytes and their version.

    ``version`` counts the writes (1 after the creation); a write names the version
    it read, so of two replicas updating one task at the same moment exactly one
    succeeds and the other reads again (see :meth:`SessionStore.put_task`)."""

    version: int
    data: bytes


class TaskWrite(enum.Enum):
    """The answer of :meth:`~._session_store.SessionStore.put_task`."""

    WRITTEN = "written"
    #: Another write came first (or the task expired): read it again.
    CONFLICT = "conflict"
    #: A creation refused: the principal already holds its cap of tasks.
    FULL = "full"
    #: A creation refused: the process-local store's retention budget is full.
    NO_ROOM = "no_room"


@dataclass(frozen=True, slots=True, kw_only=True)
class Retention:
    """How long and how much the store keeps.

    Attributes:
        events_per_stream: newest events kept per stream log.
        ttl: seconds a session's keys live after their last update.
        idempotency_ttl: seconds a finished call's stored response is kept.
        calls_per_session: finished calls a gate (a session's, or a principal's
            sessionless one) remembers; beyond it the oldest finished ones are
            forgotten, running claims never.  Every store keeps it (a shared store
            within ``idempotency_ttl`` as well; the memory store has no clock for it).
        call_bytes_per_session: bytes the gate keeps per session: every key (its
            length plus ``ENTRY_OVERHEAD``) and every stored response.  Beyond it the
            oldest responses are dropped and leave a tombstone (a retry is told the
            outcome is gone, and nothing re-runs); only if the keys themselves hold
            the bytes are the oldest finished keys forgotten whole.  Across sessions
            the server's retention budget applies as well: it drops responses only,
            never a key; a new key it has no room for is refused
            (:class:`~._store_errors.RetentionFull`).
    """

    events_per_stream: int = 4096
    ttl: float = 3600.0
    idempotency_ttl: float = 3600.0
    calls_per_session: int = 1024
    call_bytes_per_session: int = 1024 * 1024
