"""A :class:`~._session_store.SessionStore` on any Redis-protocol server (Redis, Valkey, Cluster).

Theory of operation
-------------------
Every process serving a session talks to the same server, so everything the
:class:`~weir.engine._session_store.SessionStore` docstrings promise has to hold across
processes: each multi-step update is **one Lua script** (one round trip, atomic
on the server), and the Python side only encodes arguments and decodes replies.

**Key layout.**  All keys of one session share one *hash tag*, so they live in
one cluster slot and every script touches a single slot::

    <prefix>:{<P>:<S>}:s           HASH    the session record: principal, session_id,
                                           protocol_version, created_at, generation,
                                           secret, salt (keys the epoch permutation),
                                           bound ("1" once the client presented its
                                           token), epochs (the epoch counter), born /
                                           seen (created / last served, ms, server
                                           clock), touched ("1" once served)
    <prefix>:{<P>:<S>}:c           HASH    the idempotency gate: "f:<call key>" -> request
                                           fingerprint, "p:<call key>" -> stored response
                                           (absent while the call runs)
    <prefix>:{<P>:<S>}:x           ZSET    <call key> -> expiry time (ms, server clock)
    <prefix>:{<P>:<S>}:e:<epoch>   STREAM  one event log; entry id "<seq+1>-0",
                                           fields d=data, f="1"/"0" (final),
                                           b=binding (channel generation, 0 = none)
    <prefix>:{<P>:<S>}:k           SET     names of the session's stream keys (for delete)

weir's own records (the sessionless gate's per-principal namespace, named by an
:class:`~._store_records.InternalId`) have the same layout under ``<prefix>:i:{<P>:<S>}``:
a key no client session's can equal, whatever id the client sends.

``<P>`` and ``<S>`` are the principal and the session id percent-encoded with
:func:`urllib.parse.quote` and no safe characters: only ``A-Z a-z 0-9 _ . - ~``
survive, so ``{``, ``}``, ``:`` and ``%`` never appear raw and the pair
``<P>:<S>`` is an injective encoding of ``(principal, session_id)`` -- no
principal or session id can move the hash tag, or name another session's keys.
The call key lives only inside hash fields and set members (binary-safe), the
epoch is percent-encoded like the ids.

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
:meth:`~RedisStore.begin_call`.  Reads (:meth:`~RedisStore.get_session`,
:meth:`~RedisStore.read_events`) do not extend a session's life;
:meth:`~RedisStore.touch_session` (a replica serving the session) does, and sets
its ``seen``.  Idleness is the server's to judge: :meth:`~RedisStore.expire_idle`
compares ``seen`` with the server's clock and deletes in the same script.

**Failures.**  Every operation runs under one deadline (``timeout``, default 2 s;
coredis' connect, read and pool timeouts are set to the same value), and
connection errors, timeouts, cluster-down and "server cannot serve now" replies
(``LOADING``, ``READONLY``, ``OOM``, ...) become :class:`StoreUnavailable` with the
cause chained: the engine fails closed (503), it never hangs on the store.
Malformed data fails closed the same way: an error reply (``WRONGTYPE`` for a
key of the wrong type, a script failing on a field it cannot read) or a reply of
the wrong type or shape is :class:`StoreUnavailable` too, never a traceback.
coredis' automatic retries are **off**: a script whose reply was lost may have run,
and running ``begin_call`` twice would report our own claim as RUNNING.  A timed-out
``begin_call`` may therefore leave a claim that nobody executes; it reads as RUNNING
until it expires -- at-most-once wins over liveness.

**Connections.**  coredis 6 clients hold an anyio task group and must be used as an
async context manager that is entered and exited by the same task.  So that
``await RedisStore.connect(...)`` can return a plain object (closed later, from any
task, by :meth:`~RedisStore.aclose`), a Trio *system task* owns the client: it
enters it, parks until :meth:`~RedisStore.aclose` cancels it, and exits it.  If that
task ever stops, every later operation raises :class:`StoreUnavailable`.
"""

from __future__ import annotations

import contextlib
import math
import re
import ssl
from collections.abc import Awaitable, Callable, Iterator, Sequence
from typing import Any, ClassVar, Literal, Protocol, TypeVar, cast
from urllib.parse import parse_qsl, quote, unquote, urlsplit

import anyio
import coredis
import coredis.exceptions as cx
import trio
from coredis.client import Client
from coredis.commands.script import Script
from coredis.connection import TCPLocation
from coredis.retry import ConstantRetryPolicy, NoRetryPolicy
from coredis.tokens import PureToken
from coredis.typing import ResponseType

from weir.protocol.binding import ChannelVerdict
from weir.protocol.course import INTERRUPTED_MESSAGE
from weir.protocol.gate import CallOutcome, CallStart

from ._redis_lua import (
    _ALLOCATE,
    _APPEND,
    _BEGIN,
    _CREATE,
    _DELETE,
    _EXPIRE,
    _EXPIRE_IDLE,
    _FINISH,
    _INFO,
    _MARK_BOUND,
    _POST,
    _PRELUDE,
    _READ,
    _REBIND,
    _RENEW,
    _TAKE,
    _TOUCH,
)
from ._resp import Arg, RespPipe
from ._store_errors import ChannelRejected, SessionGone, StoreUnavailable
from ._store_records import InternalId, Retention, SessionRecord, StoredEvent, StreamInfo

__all__ = ["RedisStore"]

#: About how many announced changes the bus keeps (``XADD ... MAXLEN ~``).
BUS_LENGTH = 1024

T = TypeVar("T")

#: Default deadline (seconds) of one store operation, including connecting.
DEFAULT_TIMEOUT = 2.0

_SCHEMES: dict[str, tuple[bool, bool]] = {  # scheme -> (tls, cluster)
    "redis": (False, False),
    "rediss": (True, False),
    "redis+cluster": (False, True),
    "rediss+cluster": (True, True),
}
_CLUSTER_QUERY = frozenset({"ssl_ca_certs", "ssl_certfile", "ssl_keyfile", "ssl_cert_reqs"})
_MAX_SEQ = 2**52  # stream ids are parsed as Lua numbers (doubles): stay exact
_EPOCH = re.compile(r"[0-9a-f]{8}")

# Error replies that mean "the server cannot serve this now", not "your script is wrong".
_UNAVAILABLE_REPLIES = (
    "LOADING",
    "READONLY",
    "MASTERDOWN",
    "OOM",
    "BUSY",
    "NOREPLICAS",
    "CLUSTERDOWN",
    "TRYAGAIN",
    "MOVED",
    "ASK",
)
_UNAVAILABLE_TYPES: tuple[type[BaseException], ...] = (
    cx.ConnectionError,  # includes ProtocolError, BusyLoadingError
    cx.ClusterError,
    cx.ClusterDownError,
    cx.ClusterRoutingError,
    cx.TryAgainError,
    cx.ReadOnlyError,
    OSError,  # includes the builtin TimeoutError coredis raises on a read timeout
    anyio.BrokenResourceError,
    anyio.ClosedResourceError,
    anyio.EndOfStream,
)


# ------------------------------------------------------------------------ helpers


def _enc(text: str) -> str:
    """Percent-encode ``text`` so it holds no ``{ } : %`` (injective, see the module doc)."""
    return quote(text.encode("utf-8", "surrogatepass"), safe="")


def _ms(seconds: float) -> int:
    return max(1, math.ceil(seconds * 1000))


def _redact(url: str) -> str:
    """``url`` without its password, for messages."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "<malformed URL>"
    userinfo, at, hosts = parts.netloc.rpartition("@")
    if not at or ":" not in userinfo:
        return url
    user = userinfo.partition(":")[0]
    return parts._replace(netloc=f"{user}:***@{hosts}").geturl()


def _is_outage(exc: BaseException) -> bool:
    """Whether ``exc`` means "the store cannot answer now" (and not a bug)."""
    if isinstance(exc, BaseExceptionGroup):
        return all(_is_outage(e) for e in exc.exceptions)
    if isinstance(exc, _UNAVAILABLE_TYPES):
        return True
    if isinstance(exc, cx.ResponseError):
        return str(exc).lstrip("-").startswith(_UNAVAILABLE_REPLIES)
    return False


def _only_cancelled(exc: BaseException) -> bool:
    if isinstance(exc, BaseExceptionGroup):
        return all(_only_cancelled(e) for e in exc.exceptions)
    return isinstance(exc, trio.Cancelled)


def _text(value: ResponseType) -> str:
    if isinstance(value, bytes):
        return value.decode("utf-8", "surrogateescape")
    if isinstance(value, str):
        return value
    raise StoreUnavailable(f"unexpected reply from the store: {value!r}")


def _blob(value: ResponseType) -> bytes:
    if isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode()
    raise StoreUnavailable(f"unexpected reply from the store: {value!r}")


def _items(value: ResponseType) -> list[ResponseType]:
    if isinstance(value, list):
        return value
    if isinstance(value, tuple):
        return list(value)
    raise StoreUnavailable(f"unexpected reply from the store: {value!r}")


@contextlib.contextmanager
def _reading(what: str) -> Iterator[None]:
    """Decode a reply: one of the wrong type or shape is :class:`StoreUnavailable`."""
    try:
        yield
    except (ValueError, TypeError, IndexError, KeyError, AttributeError) as exc:
        raise StoreUnavailable(f"{what}: malformed reply from the store: {exc!r}") from exc


def _record(principal: str, session_id: str, fields: dict[str, bytes]) -> SessionRecord:
    try:
        return SessionRecord(
            session_id=session_id,
            principal=principal,
            protocol_version=fields["protocol_version"].decode(),
            created_at=float(fields["created_at"]),
            generation=int(fields["generation"]),
            secret=fields["secret"].decode(),
            salt=fields.get("salt", b"").decode(),
            bound=fields.get("bound", b"0") == b"1",
            client=fields.get("client", b"").decode(),
        )
    except (KeyError, ValueError, UnicodeDecodeError) as exc:
        # Never written by this module: fail closed rather than guess.
        raise StoreUnavailable(f"malformed session record for {session_id!r}") from exc


def _pairs(flat: Sequence[ResponseType]) -> dict[str, bytes]:
    return {_text(flat[i]): _blob(flat[i + 1]) for i in range(0, len(flat) - 1, 2)}


# ----------------------------------------------------------------------- the URL


def _cluster_client(url: str, *, tls: bool, timeout: float) -> coredis.RedisCluster[bytes]:
    parts = urlsplit(url)
    if parts.path not in ("", "/", "/0") or parts.fragment:
        raise ValueError(f"store URL {_redact(url)!r}: a cluster URL has no database or path")
    query = dict(parse_qsl(parts.query, keep_blank_values=True))
    unknown = set(query) - _CLUSTER_QUERY
    if unknown:
        raise ValueError(
            f"store URL {_redact(url)!r}: unsupported cluster option(s) {sorted(unknown)}; "
            f"supported: {sorted(_CLUSTER_QUERY)}"
        )
    userinfo, at, hosts = parts.netloc.rpartition("@")
    username: str | None = None
    password: str | None = None
    if at:
        user, colon, secret = userinfo.partition(":")
        username = unquote(user) or None
        password = unquote(secret) if colon else None
    nodes: list[TCPLocation] = []
    for seed in hosts.split(","):
        node = urlsplit(f"//{seed}")
        if not node.hostname:
            raise ValueError(f"store URL {_redact(url)!r}: a cluster seed node has no host")
        nodes.append(TCPLocation(node.hostname, node.port or 6379))  # port: ValueError if bad
    cert_reqs = query.get("ssl_cert_reqs")
    if cert_reqs not in (None, "optional", "required", "none"):
        raise ValueError(f"store URL {_redact(url)!r}: bad ssl_cert_reqs {cert_reqs!r}")
    return coredis.RedisCluster(
        startup_nodes=nodes,
        username=username,
        password=password,
        ssl=tls,
        ssl_ca_certs=query.get("ssl_ca_certs"),
        ssl_certfile=query.get("ssl_certfile"),
        ssl_keyfile=query.get("ssl_keyfile"),
        ssl_cert_reqs=cast(Literal["optional", "required", "none"] | None, cert_reqs),
        connect_timeout=timeout,
        stream_timeout=timeout,
        pool_timeout=timeout,
        decode_responses=False,
        verify_version=False,
        # CLUSTERDOWN means the command was refused, so retrying it is safe; a lost reply
        # is not (the script may have run): see the module docstring.
        retry_policy=ConstantRetryPolicy((cx.ClusterDownError,), retries=2, delay=0.1),
    )


def _client_for(url: str, *, timeout: float) -> Client[bytes]:
    """A coredis client for ``url`` (not entered yet).  Raises ValueError for a bad URL."""
    scheme, sep, _ = url.partition("://")
    if not sep or scheme.lower() not in _SCHEMES:
        raise ValueError(
            f"store URL {_redact(url)!r}: unsupported scheme {scheme + sep!r}; expected "
            "redis://host[:port][/db], rediss://... (TLS), "
            "redis+cluster://host:port[,host:port...] or rediss+cluster://..."
        )
    tls, cluster = _SCHEMES[scheme.lower()]
    try:
        if cluster:
            return _cluster_client(url, tls=tls, timeout=timeout)
        parts = urlsplit(url)
        if not parts.hostname:
            raise ValueError(f"store URL {_redact(url)!r} has no host")
        _ = parts.port  # raises ValueError for a malformed port
        return coredis.Redis.from_url(
            url,
            decode_responses=False,
            verify_version=False,
            retry_policy=NoRetryPolicy(),
            connect_timeout=timeout,
            stream_timeout=timeout,
            pool_timeout=timeout,
        )
    except ValueError as exc:  # urllib's and coredis' own complaints about the URL
        if str(exc).startswith("store URL"):
            raise
        raise ValueError(f"store URL {_redact(url)!r}: {exc}") from exc
    except (ssl.SSLError, OSError) as exc:  # e.g. an unreadable CA file
        raise ValueError(f"store URL {_redact(url)!r}: TLS setup failed: {exc}") from exc


class Pipe(Protocol):
    """What the store asks of its pipelined connection (:class:`~._resp.RespPipe` on
    Trio, :class:`weir.asyncio._resp.AsyncioRespPipe` on asyncio)."""

    failure: BaseException | None

    async def call(self, *args: Arg) -> Any: ...

    async def evalsha(
        self, source: str | bytes, sha: str | bytes, keys: Sequence[Arg], args: Sequence[Arg]
    ) -> Any: ...

    async def wait_up(self) -> None: ...

    async def run(self) -> None: ...


def _pipe_for(url: str, *, timeout: float, kind: Callable[..., Pipe] = RespPipe) -> Pipe | None:
    """The pipelined hot-path connection for a single-node ``redis://`` URL (else None)."""
    parts = urlsplit(url)
    if parts.scheme.lower() != "redis" or not parts.hostname:
        return None
    path = parts.path.strip("/")
    db = int(path) if path.isdigit() else 0
    return kind(
        parts.hostname,
        parts.port or 6379,
        username=unquote(parts.username) if parts.username else None,
        password=unquote(parts.password) if parts.password is not None else None,
        db=db,
        timeout=timeout,
    )


# ---------------------------------------------------------------------- the store


class RedisStore:
    """The shared :class:`~weir.engine._session_store.SessionStore` (see the module docstring).

    Create it with :meth:`connect`; close it with :meth:`aclose` (or use it as an
    async context manager).
    """

    shared = True
    #: The pipelined connection this runtime uses (the asyncio runtime's store differs).
    _pipe_kind: ClassVar[Callable[..., Pipe]] = RespPipe

    def __init__(
        self,
        client: Client[bytes],
        *,
        pipe: Pipe | None = None,
        where: str,
        retention: Retention,
        prefix: str,
        timeout: float,
    ) -> None:
        """Use :meth:`connect`; this only wires the parts together."""
        self.retention = retention
        self.prefix = prefix
        self.timeout = timeout
        self._client = client
        #: The hot path's pipelined connection (single-node ``redis://`` only).
        self._pipe = pipe
        self._where = where
        self._ttl = _ms(retention.ttl)
        self._idempotency_ttl = _ms(retention.idempotency_ttl)
        self._maxlen = max(1, retention.events_per_stream)
        self._owner_scope = trio.CancelScope()
        self._owner_done = trio.Event()
        self._entered = False
        self._closed = False
        self._failure: BaseException | None = None
        register = client.register_script
        self._create: Script[bytes] = register(_PRELUDE + _CREATE)
        self._delete: Script[bytes] = register(_PRELUDE + _DELETE)
        self._touch: Script[bytes] = register(_PRELUDE + _TOUCH)
        self._expire_idle: Script[bytes] = register(_PRELUDE + _EXPIRE_IDLE)
        self._rebind: Script[bytes] = register(_PRELUDE + _REBIND)
        self._allocate: Script[bytes] = register(_PRELUDE + _ALLOCATE)
        self._mark_bound: Script[bytes] = register(_PRELUDE + _MARK_BOUND)
        self._begin: Script[bytes] = register(_PRELUDE + _BEGIN)
        self._renew: Script[bytes] = register(_PRELUDE + _RENEW)
        self._expire: Script[bytes] = register(_PRELUDE + _EXPIRE)
        self._finish: Script[bytes] = register(_PRELUDE + _FINISH)
        self._append: Script[bytes] = register(_PRELUDE + _APPEND)
        self._read: Script[bytes] = register(_READ)
        self._post: Script[bytes] = register(_POST)
        self._info: Script[bytes] = register(_INFO)
        self._take: Script[bytes] = register(_TAKE)

    @classmethod
    async def connect(
        cls,
        url: str,
        *,
        retention: Retention | None = None,
        prefix: str = "weir",
        timeout: float = DEFAULT_TIMEOUT,
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

        Raises:
            ValueError: a malformed or unsupported URL or prefix.
            StoreUnavailable: the server did not answer ``PING`` within ``timeout``.
        """
        if not prefix or "{" in prefix or "}" in prefix:
            raise ValueError(f"store key prefix {prefix!r} must be non-empty, without '{{' or '}}'")
        if not (timeout > 0 and math.isfinite(timeout)):
            raise ValueError(f"store timeout must be a positive number of seconds, not {timeout!r}")
        client = _client_for(url, timeout=timeout)
        store = cls(
            client,
            pipe=_pipe_for(url, timeout=timeout, kind=cls._pipe_kind),
            where=_redact(url),
            retention=retention or Retention(),
            prefix=prefix,
            timeout=timeout,
        )
        await store._start()
        return store

    async def _start(self) -> None:
        ready = trio.Event()
        trio.lowlevel.spawn_system_task(self._own, ready, name=f"RedisStore({self._where})")
        with trio.move_on_after(self.timeout):
            await ready.wait()
        try:
            if not self._entered:
                raise StoreUnavailable(
                    f"store {self._where}: could not open a client within {self.timeout}s"
                ) from self._failure
            await self._run("connect", self._client.ping)
            if self._pipe is not None:
                with trio.move_on_after(self.timeout):
                    await self._pipe.wait_up()
                if self._pipe.failure is not None or not self._entered:
                    raise StoreUnavailable(
                        f"store {self._where}: no pipelined connection within {self.timeout}s"
                    ) from self._pipe.failure
        except BaseException:
            await self.aclose()
            raise

    async def _own(self, ready: trio.Event) -> None:
        """The system task that owns the coredis client (see the module docstring)."""
        try:
            with self._owner_scope:
                async with self._client, trio.open_nursery() as nursery:
                    if self._pipe is not None:
                        nursery.start_soon(self._pipe.run)
                    self._entered = True
                    ready.set()
                    await trio.sleep_forever()
        except BaseException as exc:  # a system task must not raise: keep it for _run
            if not _only_cancelled(exc):
                self._failure = exc
        finally:
            self._entered = False
            ready.set()
            self._owner_done.set()

    async def aclose(self) -> None:
        """Close the client (idempotent; waits at most ``timeout`` for it to wind down)."""
        self._closed = True
        self._owner_scope.cancel()
        with trio.move_on_after(self.timeout):
            await self._owner_done.wait()

    async def __aenter__(self) -> RedisStore:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def _run(self, what: str, op: Callable[[], Awaitable[T]], *, piped: bool = False) -> T:
        """Run one store operation under the deadline, mapping outages to StoreUnavailable.

        ``piped``: ``op`` goes through the pipelined connection, whose watchdog is
        the deadline (see ``engine._resp``), so no cancel scope is needed here.
        """
        if self._closed:
            raise StoreUnavailable(f"{what}: the store {self._where} is closed")
        if not self._entered:
            raise StoreUnavailable(
                f"{what}: the client of {self._where} stopped: {self._failure!r}"
            ) from self._failure
        try:
            if piped:
                return await op()
            with trio.fail_after(self.timeout):
                return await op()
        except trio.TooSlowError as exc:
            raise StoreUnavailable(
                f"{what}: no answer from {self._where} within {self.timeout}s"
            ) from exc
        except Exception as exc:
            if isinstance(exc, StoreUnavailable):
                raise
            if _is_outage(exc) or not self._entered:
                raise StoreUnavailable(f"{what}: {self._where} unavailable: {exc}") from exc
            if isinstance(exc, cx.ResponseError):  # WRONGTYPE, a script failing on bad data
                raise StoreUnavailable(f"{what}: {self._where} refused: {exc}") from exc
            raise

    async def _script(
        self,
        what: str,
        script: Script[bytes],
        principal: str,
        session_id: str,
        args: Sequence[str | bytes | int],
        *,
        stream: str | None = None,
    ) -> ResponseType:
        keys = self._keys(principal, session_id)
        if stream is not None:
            keys.append(self._stream_key(principal, session_id, stream))

        pipe = self._pipe
        if pipe is not None:

            async def piped() -> ResponseType:
                reply = await pipe.evalsha(script.script, script.sha, keys, [self._ttl, *args])
                return cast("ResponseType", reply)

            return await self._run(what, piped, piped=True)

        async def op() -> ResponseType:
            return await script(keys, [self._ttl, *args])

        return await self._run(what, op)

    # -- keys

    def _tag(self, principal: str, session_id: str) -> str:
        # weir's own records (an InternalId) live under "<prefix>:i:", which no client
        # session's keys ("<prefix>:{...") can ever equal.
        space = "i:" if isinstance(session_id, InternalId) else ""
        return f"{self.prefix}:{space}{{{_enc(principal)}:{_enc(session_id)}}}"

    def _keys(self, principal: str, session_id: str) -> list[str | bytes]:
        tag = self._tag(principal, session_id)
        return [f"{tag}:s", f"{tag}:k", f"{tag}:c", f"{tag}:x"]

    def _stream_key(self, principal: str, session_id: str, epoch: str) -> str:
        return f"{self._tag(principal, session_id)}:e:{_enc(epoch)}"

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
            "create_session", self._create, record.principal, record.session_id, fields
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
        """A fresh epoch (``HINCRBY`` on the record).  Raises SessionGone."""
        reply = await self._script(
            "allocate_epoch", self._allocate, principal, session_id, [int(binding)]
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
    ) -> CallStart:
        """Channel check, claim and epoch allocation in one script (see the Protocol)."""
        generation, secret = ("", "") if token is None else (str(int(token[0])), token[1])
        args: list[str | bytes | int] = [key, fingerprint, generation, secret, request_id, owner]
        args += [_ms(lease) if lease else 0, INTERRUPTED_MESSAGE]
        reply = _items(await self._script("begin_call", self._begin, principal, session_id, args))
        with _reading("begin_call"):
            status = _text(reply[0])
            if status == "gone":
                raise SessionGone(session_id)
            if status == "stale":
                raise ChannelRejected(ChannelVerdict.STALE)
            if status == "unbound":
                raise ChannelRejected(ChannelVerdict.UNBOUND)
            epoch = _text(reply[1])
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

    async def expire_claim(self, principal: str, session_id: str, epoch: str) -> bool:
        """Interrupt the call answered on stream ``epoch`` if its lease ran out (True)."""
        reply = await self._script(
            "expire_claim", self._expire, principal, session_id, [epoch, INTERRUPTED_MESSAGE]
        )
        return bool(reply)

    async def finish_call(
        self, principal: str, session_id: str, key: str, payload: bytes | None
    ) -> None:
        """Store the response for ``idempotency_ttl`` (``None``: release the claim)."""
        args: list[str | bytes | int] = (
            [key, b"", "0", 0] if payload is None else [key, payload, "1", self._idempotency_ttl]
        )
        await self._script("finish_call", self._finish, principal, session_id, args)

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
        args: list[str | bytes | int] = [
            generation,
            seq + 1,
            data,
            "1" if final else "0",
            int(binding),
            self._maxlen,
            call_key or "",
            self._idempotency_ttl,
            replica,
        ]
        status = _text(
            await self._script(
                "append_event", self._append, principal, session_id, args, stream=epoch
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

        async def op() -> object:
            return await self._client.xadd(
                key,
                {"c": change},
                trim_strategy=PureToken.MAXLEN,
                threshold=BUS_LENGTH,
                trim_operator=PureToken.APPROXIMATELY,
            )

        await self._run("publish_change", op)

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
