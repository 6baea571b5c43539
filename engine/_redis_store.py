"""A :class:`~._session_store.SessionStore` on any Redis-protocol server (Redis, Valkey, Cluster).

Theory of operation
-------------------
Every process serving a session talks to the same server, so everything the
:class:`~weir.engine._session_store.SessionStore` docstrings promise has to hold across
processes: each multi-step update is **one Lua script** (one round trip, atomic
on the server), and the Python side only encodes arguments and decodes replies.
:class:`RedisStore` is that Python side, one method per operation; the key layout,
the client's owner task, the deadline and the mapping of failures are its base's,
:class:`~._redis_connection.RedisConnection`.

**Stream ids.**  Event ``seq`` (0, 1, 2, ...) is stored under the explicit entry id
``<seq+1>-0`` (``0-0`` is not a valid id, hence the ``+1``), so ``XRANGE`` by id
*is* a range by sequence number and ``redis-cli XRANGE key - +`` reads naturally.
Appends must be contiguous (``seq == head + 1``; any ``seq`` starts a new log); a
re-append of an event already stored with identical contents is a no-op (a retry
after a lost reply).  Logs are trimmed with ``MAXLEN ~ events_per_stream`` (so at
least that many newest events are kept).  :meth:`RedisStore.read_events` returns
``None`` -- the cursor cannot be honoured -- when the log is missing, when its
oldest retained event is newer than ``after_seq + 1`` (trimmed), or when
``after_seq`` is beyond its newest event (a cursor this log never issued); an empty
list means the cursor is exactly at the head.

**Lifetimes.**  Every write refreshes the TTL (``retention.ttl``) of the session's
fixed keys (``s``, ``c``, ``x``, ``k``) and of the stream it writes, so no key of a
session outlives its record: when a session expires, all of it does.  A running
claim expires ``retention.ttl`` after its last lease renewal (a process that died
mid-call does not block the key forever; a call still running keeps its claim and
its record), a finished call's response after ``retention.idempotency_ttl``;
expired entries of the gate are pruned lazily, at most 64 per
:meth:`~RedisStore.begin_call`.  Within that hour a gate (a session's, or a
principal's sessionless one) holds at most ``retention.calls_per_session`` finished
calls and ``retention.call_bytes_per_session`` bytes of keys and responses, with the
memory store's rule: past the bytes the oldest responses become tombstones (a retry
is told ``outcome_evicted``; nothing runs twice), past the count the oldest finished
calls are forgotten whole; a running claim is never dropped.  Reads
(:meth:`~RedisStore.get_session`, :meth:`~RedisStore.read_events`) do not extend a
session's life;
:meth:`~RedisStore.touch_session` (a replica serving the session) does, and sets
its ``seen``.  Idleness is the server's to judge: :meth:`~RedisStore.expire_idle`
compares ``seen`` with the server's clock and deletes in the same script.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from typing import ClassVar, cast

from coredis.tokens import PureToken
from coredis.typing import ResponseType

from weir.protocol.binding import ChannelVerdict
from weir.protocol.course import INTERRUPTED_MESSAGE
from weir.protocol.gate import CallOutcome, CallStart

from ._redis_codec import _blob, _enc, _items, _ms, _pairs, _reading, _record, _text
from ._redis_connection import RedisConnection
from ._redis_url import _client_for, _pipe_for, _redact
from ._resp import Pipe, RespPipe
from ._resp_cluster import TrioClusterPipe
from ._store_errors import ChannelRejected, SessionGone, StoreUnavailable
from ._store_records import (
    DEFAULT_TIMEOUT,
    TASKS,
    Retention,
    SessionRecord,
    StoredEvent,
    StoredTask,
    StreamInfo,
    TaskWrite,
)

__all__ = ["RedisStore"]

#: About how many announced changes the bus keeps (``XADD ... MAXLEN ~``).
BUS_LENGTH = 1024

_MAX_SEQ = 2**52  # stream ids are parsed as Lua numbers (doubles): stay exact
_EPOCH = re.compile(r"[0-9a-f]{8}")


class RedisStore(RedisConnection):
    """The shared :class:`~weir.engine._session_store.SessionStore` (see the module docstring).

    Create it with :meth:`connect`; close it with :meth:`aclose` (or use it as an
    async context manager).
    """

    shared = True
    #: The pipelined connection this runtime uses (the asyncio runtime's store differs).
    _pipe_kind: ClassVar[Callable[..., Pipe]] = RespPipe
    _cluster_pipe_kind: ClassVar[Callable[..., Pipe]] = TrioClusterPipe

    @classmethod
    async def connect(
        cls,
        url: str,
        *,
        retention: Retention | None = None,
        prefix: str = "weir",
        timeout: float = DEFAULT_TIMEOUT,
        replicas: int = 0,
        replica_timeout: float = 0.5,
    ) -> RedisStore:
        """Connect to the server at ``url`` and check that it answers.

        Args:
            url: ``redis://[user:password@]host[:port][/db]``, ``rediss://...`` (TLS;
                coredis' ``ssl_*`` query options apply), or
                ``redis+cluster://[user:password@]host:port[,host:port...]`` /
                ``rediss+cluster://...`` for Redis Cluster (seed nodes).
            retention: how long and how much to keep (default :class:`Retention()`).
            prefix: the first component of every key (no ``{`` or ``}``).
            timeout: the deadline, in seconds, of every operation (connecting included).
            replicas: how many replicas must hold a claim, an outcome, an event or a
                task before weir acts on it or tells a client (``WAIT``; 0, the
                default: the primary's acknowledgement suffices, and a primary lost
                before replicating takes its latest writes with it).
            replica_timeout: seconds to wait for them (shorter than ``timeout``); past
                it the operation is refused as the store being unavailable (nothing
                runs on it).

        Raises:
            ValueError: a malformed or unsupported URL or prefix.
            StoreUnavailable: the server did not answer ``PING`` within ``timeout``.
        """
        if not prefix or "{" in prefix or "}" in prefix:
            raise ValueError(f"store key prefix {prefix!r} must be non-empty, without '{{' or '}}'")
        if not 0 <= replicas <= 16 or not (replica_timeout > 0 and math.isfinite(replica_timeout)):
            raise ValueError("store replicas must be 0 to 16, their timeout a positive number")
        if not (timeout > 0 and math.isfinite(timeout)):
            raise ValueError(f"store timeout must be a positive number of seconds, not {timeout!r}")
        if replicas and replica_timeout >= timeout:
            # WAIT holds the pipelined connection: past the store's deadline the
            # connection itself would be given up as dead.
            raise ValueError(
                f"store replica timeout ({replica_timeout}s) must be shorter than the store "
                f"timeout ({timeout}s)"
            )
        client = _client_for(url, timeout=timeout)
        store = cls(
            client,
            pipe=_pipe_for(
                url, timeout=timeout, kind=cls._pipe_kind, cluster_kind=cls._cluster_pipe_kind
            ),
            where=_redact(url),
            retention=retention or Retention(),
            prefix=prefix,
            timeout=timeout,
            replicas=replicas,
            replica_timeout=replica_timeout,
        )
        await store._start()
        return store

    async def __aenter__(self) -> RedisStore:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    # -- the SessionStore interface

    async def create_session(self, record: SessionRecord) -> None:
        """Persist a new session.  Raises ``ValueError`` if the id is taken."""
        fields: list[str | bytes | int] = [
            "principal", record.principal,
            "session_id", record.session_id,
            "protocol_version", record.protocol_version,
            "created_at", repr(record.created_at),
            "generation", record.generation,
            "secret", record.secret,
            "salt", record.salt,
            "bound", "1" if record.bound else "0",
            "client", record.client,
            "epochs", 0,
        ]  # fmt: skip
        created = await self._script(
            "create_session",
            self._create,
            record.principal,
            record.session_id,
            fields,
            durable=True,
        )
        if created != 1:
            raise ValueError(f"session {record.session_id!r} already exists")

    async def get_session(self, principal: str, session_id: str) -> SessionRecord | None:
        """The record, or ``None`` if unknown, deleted or expired."""
        key = self._keys(principal, session_id)[0]
        pipe = self._pipe

        async def op() -> dict[bytes, bytes]:
            if pipe is not None:  # RESP2: a flat list of field, value, field, value...
                flat = await pipe.call("HGETALL", key)
                return dict(zip(flat[::2], flat[1::2], strict=True))
            return await self._client.hgetall(key)

        with _reading("get_session"):
            fields = await self._run("get_session", op, piped=pipe is not None)
            if not fields:
                return None
            decoded = {_text(k): _blob(v) for k, v in fields.items()}
        return _record(principal, session_id, decoded)

    async def delete_session(self, principal: str, session_id: str) -> bool:
        """Delete every key of the session; ``True`` if it existed."""
        existed = await self._script("delete_session", self._delete, principal, session_id, [])
        return existed == 1

    async def touch_session(self, principal: str, session_id: str) -> bool:
        """Set the record's ``seen`` to the server's time and refresh its TTL."""
        reply = await self._script("touch_session", self._touch, principal, session_id, [])
        return reply == 1

    async def expire_idle(
        self, principal: str, session_id: str, idle: float | None, untouched: float | None
    ) -> bool:
        """Delete the session if idle by the server's clock (one script; see the Protocol)."""
        args = [_ms(idle) if idle else 0, _ms(untouched) if untouched else 0]
        reply = await self._script("expire_idle", self._expire_idle, principal, session_id, args)
        return reply == 1

    async def rebind(self, principal: str, session_id: str, secret: str) -> SessionRecord:
        """Bump the generation and install ``secret`` in one script.  Raises SessionGone."""
        reply = await self._script("rebind", self._rebind, principal, session_id, [secret])
        if reply is None:
            raise SessionGone(session_id)
        with _reading("rebind"):
            fields = _pairs(_items(reply))
        return _record(principal, session_id, fields)

    async def allocate_epoch(self, principal: str, session_id: str, binding: int = 0) -> str:
        """A fresh epoch (``HINCRBY`` on the record; held by ``replicas`` replicas
        before it is used, as an epoch issued twice would mix two streams' event
        ids).  Raises SessionGone."""
        reply = await self._script(
            "allocate_epoch", self._allocate, principal, session_id, [int(binding)], durable=True
        )
        if reply is None:
            raise SessionGone(session_id)
        return _text(reply)

    async def mark_bound(self, principal: str, session_id: str) -> None:
        """Set the record's ``bound`` flag.  Raises SessionGone."""
        reply = await self._script("mark_bound", self._mark_bound, principal, session_id, [])
        if reply is None:
            raise SessionGone(session_id)

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
        """Channel check, claim and epoch allocation in one script (see the Protocol)."""
        generation, secret = ("", "") if token is None else (str(int(token[0])), token[1])
        args: list[str | bytes | int] = [key, fingerprint, generation, secret, request_id, owner]
        args += [_ms(lease) if lease else 0, INTERRUPTED_MESSAGE, claim]
        reply = _items(
            await self._script("begin_call", self._begin, principal, session_id, args, durable=True)
        )
        with _reading("begin_call"):
            status = _text(reply[0])
            if status == "gone":
                raise SessionGone(session_id)
            if status == "stale":
                raise ChannelRejected(ChannelVerdict.STALE)
            if status == "unbound":
                raise ChannelRejected(ChannelVerdict.UNBOUND)
            epoch = _text(reply[1])
            if status == "evicted":
                return CallStart(CallOutcome.EVICTED, epoch)
            if status == "done":
                return CallStart(CallOutcome.DONE, epoch, _blob(reply[2]))
            return CallStart(CallOutcome(status), epoch)

    async def renew_claims(
        self, principal: str, session_id: str, keys: Sequence[str], owner: str, lease: float
    ) -> int:
        """Extend the leases of ``owner``'s running claims ``keys``; how many it extended."""
        if not keys:
            return 0
        reply = await self._script(
            "renew_claims", self._renew, principal, session_id, [owner, _ms(lease), *keys]
        )
        with _reading("renew_claims"):
            return int(cast(int, reply or 0))

    async def release_claim(self, principal: str, session_id: str, key: str, claim: str) -> bool:
        """Give back ``key`` if it is still claimed, unfinished, under ``claim`` (one script)."""
        reply = await self._script(
            "release_claim", self._release, principal, session_id, [key, claim]
        )
        return bool(reply)

    async def expire_claim(self, principal: str, session_id: str, epoch: str) -> bool:
        """Interrupt the call answered on stream ``epoch`` if its lease ran out (True)."""
        reply = await self._script(
            "expire_claim", self._expire, principal, session_id, [epoch, INTERRUPTED_MESSAGE]
        )
        return bool(reply)

    async def finish_call(
        self, principal: str, session_id: str, key: str, payload: bytes | None
    ) -> None:
        """Store the response for ``idempotency_ttl`` (``None``: release the claim),
        within the gate's bounds (see the module doc)."""
        args: list[str | bytes | int] = (
            [key, b"", "0", 0, 0, 0]
            if payload is None
            else [key, payload, "1", self._idempotency_ttl, *self._gate_bounds]
        )
        await self._script("finish_call", self._finish, principal, session_id, args, durable=True)

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
        """Append event ``seq`` to the epoch's log if the session is at ``generation``.

        ``binding`` (the channel generation the stream was opened under, 0 for none)
        is stored with the event (field ``b``) and returned by :meth:`read_events`.
        With ``call_key`` the event's data is also stored as that call's response
        (what :meth:`finish_call` does), in the same script.

        Raises:
            SessionGone: unknown session.
            ChannelRejected: STALE, the session is at another generation (older *or*
                newer: a newer one means it was deleted and re-created).
            ValueError: ``seq`` is not the next event of the log (a re-append of an
                identical event is accepted as a retry).
        """
        if not 0 <= seq < _MAX_SEQ:
            raise ValueError(f"event seq out of range: {seq}")
        args: list[str | bytes | int] = [generation, seq + 1, data, "1" if final else "0"]
        args += [int(binding), self._maxlen, call_key or "", self._idempotency_ttl, replica]
        args += self._gate_bounds
        status = _text(
            await self._script(
                "append_event",
                self._append,
                principal,
                session_id,
                args,
                stream=epoch,
                durable=True,
            )
        )
        if status in ("ok", "duplicate"):
            return
        if status == "gone":
            raise SessionGone(session_id)
        if status == "stale":
            raise ChannelRejected(ChannelVerdict.STALE)
        head = status.partition(":")[2]
        raise ValueError(f"event {epoch}:{seq} is out of order (the log's newest is {head})")

    async def stream_info(self, principal: str, session_id: str, epoch: str) -> StreamInfo | None:
        """The stream's binding and newest event, or ``None`` if the epoch was never
        allocated in this session."""
        if _EPOCH.fullmatch(epoch) is None:
            return None
        keys: list[str | bytes] = [
            self._stream_key(principal, session_id, epoch),
            self._keys(principal, session_id)[0],
        ]

        async def op() -> ResponseType:
            return await self._info(keys, [epoch, epoch])

        reply = await self._run("stream_info", op)
        if reply is None:
            return None
        with _reading("stream_info"):
            binding, last, final = _items(reply)
            return StreamInfo(int(_text(binding)), int(cast(int, last)), _text(final) == "1")

    async def shared_value(self, name: str, candidate: bytes) -> bytes:
        """``SET NX`` then ``GET``: every replica ends up with the first value stored."""
        key = f"{self.prefix}:shared:{_enc(name)}"

        async def op() -> bytes | str | None:
            await self._client.set(key, candidate, condition=PureToken.NX)
            return await self._client.get(key)

        value = await self._run("shared_value", op)
        if value is None:
            raise StoreUnavailable(f"shared_value: {name!r} vanished as it was set")
        return _blob(value)

    async def publish_change(self, change: bytes) -> None:
        """``XADD`` to the bus stream, trimmed to about the newest 1,024 entries."""
        key = f"{self.prefix}:bus"
        pipe = self._pipe

        async def op() -> object:
            if pipe is not None:  # (a task's every end goes on the bus: the cheap way)
                return await pipe.call("XADD", key, "MAXLEN", "~", BUS_LENGTH, "*", "c", change)
            return await self._client.xadd(
                key,
                {"c": change},
                trim_strategy=PureToken.MAXLEN,
                threshold=BUS_LENGTH,
                trim_operator=PureToken.APPROXIMATELY,
            )

        await self._run("publish_change", op, piped=pipe is not None)

    async def read_changes(self, after: str | None) -> tuple[str, list[bytes]]:
        """``XREAD`` after the cursor (at most 256 entries, no blocking); from the bus's
        newest entry when ``after`` is ``None``."""
        key = f"{self.prefix}:bus"

        async def op() -> tuple[str, list[bytes]]:
            if after is None:
                newest = await self._client.xrevrange(key, count=1)
                return (_text(newest[0].identifier) if newest else "0-0"), []
            got = await self._client.xread({key: after}, count=256)
            entries = next(iter(got.values()), ()) if got else ()
            if not entries:
                return after, []
            changes = [
                _blob(e.field_values.get(b"c") or e.field_values.get("c") or b"") for e in entries
            ]
            return _text(entries[-1].identifier), changes

        with _reading("read_changes"):
            return await self._run("read_changes", op)

    def _task_keys(self, principal: str, task_id: str) -> list[str | bytes]:
        # In the internal keyspace ("<prefix>:i:"), hash-tagged by principal: the task
        # and its principal's set are in one slot on a cluster.
        tag = self._tag(principal, TASKS)
        return [f"{tag}:t:{_enc(task_id)}", f"{tag}:all"]

    async def get_task(self, principal: str, task_id: str) -> StoredTask | None:
        """``HMGET v d`` of the task's hash (``None``: absent or expired)."""
        key = self._task_keys(principal, task_id)[0]
        pipe = self._pipe

        async def op() -> list[bytes | str | None]:
            if pipe is not None:
                return list(await pipe.call("HMGET", key, "v", "d"))
            return list(await self._client.hmget(key, ["v", "d"]))

        version, data = await self._run("get_task", op, piped=pipe is not None)
        if version is None or data is None:
            return None
        with _reading("get_task"):
            return StoredTask(int(_text(version)), _blob(data))

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
        """One script: compare the version, check the principal's cap, write, expire."""
        keys = self._task_keys(principal, task_id)
        args: list[str | bytes | int] = [version, data, _ms(ttl), cap, task_id]
        reply = await self._eval("put_task", self._put_task, keys, args, durable=True)
        with _reading("put_task"):
            return TaskWrite(_text(cast(bytes, reply)))

    def _box_key(self, principal: str, session_id: str, box: str) -> str:
        return f"{self._tag(principal, session_id)}:m:{_enc(box)}"

    async def post_message(self, principal: str, session_id: str, box: str, data: bytes) -> None:
        """Append ``data`` to the session's mailbox ``box`` (RPUSH + TTL, one script)."""
        key = self._box_key(principal, session_id, box)

        async def op() -> ResponseType:
            return await self._post([key], [self._ttl, data])

        await self._run("post_message", op)

    async def take_messages(
        self, principal: str, session_id: str, box: str, *, keep: bool = False
    ) -> list[bytes]:
        """Everything in mailbox ``box``, oldest first; emptied unless ``keep``."""
        key = self._box_key(principal, session_id, box)

        async def op() -> ResponseType:
            return await self._take([key], [1 if keep else 0])

        return [_blob(item) for item in _items(await self._run("take_messages", op))]

    async def read_events(
        self, principal: str, session_id: str, epoch: str, after_seq: int
    ) -> list[StoredEvent] | None:
        """Events with ``seq > after_seq`` (``[]`` at the head), or ``None`` when the
        cursor cannot be honoured: no such log, trimmed past it, or beyond its head."""
        if not -1 <= after_seq < _MAX_SEQ:
            return None
        stream = self._stream_key(principal, session_id, epoch)
        record = self._keys(principal, session_id)[0]
        if _EPOCH.fullmatch(epoch) is None:
            return None

        async def op() -> ResponseType:
            return await self._read([stream, record], [after_seq + 1, epoch])

        reply = await self._run("read_events", op)
        if reply is None:
            return None
        events: list[StoredEvent] = []
        with _reading("read_events"):
            for entry in _items(reply):
                entry_id, flat = _items(entry)
                fields = _pairs(_items(flat))
                seq = int(_text(entry_id).partition("-")[0]) - 1
                events.append(
                    StoredEvent(
                        seq,
                        fields.get("d", b""),
                        fields.get("f") == b"1",
                        int(fields.get("b", b"0")),
                        fields.get("r", b"").decode("utf-8", "replace"),
                    )
                )
        return events
