"""What every Redis store operation runs on: the client, its owner task, the scripts, the keys.

Theory of operation
-------------------
:class:`RedisConnection` is the base of :class:`~._redis_store.RedisStore`: it
holds the coredis client and the optional pipelined connection (both built by
:mod:`._redis_url`), registers the Lua scripts (:mod:`._redis_lua`) on them, names
every key, and runs each operation under the store's deadline, mapping what goes
wrong to :class:`~._store_errors.StoreUnavailable`.  What each operation means is
:mod:`._redis_store`'s.

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
                                           (absent while the call runs; "" once
                                           evicted), n / b -> finished calls and
                                           their bytes (for the gate's bounds)
    <prefix>:{<P>:<S>}:x           ZSET    <call key> -> expiry time (ms, server clock)
    <prefix>:{<P>:<S>}:e:<epoch>   STREAM  one event log; entry id "<seq+1>-0",
                                           fields d=data, f="1"/"0" (final),
                                           b=binding (channel generation, 0 = none)
    <prefix>:{<P>:<S>}:k           SET     names of the session's stream keys (for delete)

weir's own records (the sessionless gate's per-principal namespace, named by an
:class:`~._store_records.InternalId`) have the same layout under
``<prefix>:i:{<P>:<S>}``: a key no client session's can equal, whatever id the client
sends.

``<P>`` and ``<S>`` are the principal and the session id percent-encoded with
:func:`urllib.parse.quote` and no safe characters: only ``A-Z a-z 0-9 _ . - ~``
survive, so ``{``, ``}``, ``:`` and ``%`` never appear raw and the pair
``<P>:<S>`` is an injective encoding of ``(principal, session_id)`` -- no
principal or session id can move the hash tag, or name another session's keys.
The call key lives only inside hash fields and set members (binary-safe), the
epoch is percent-encoded like the ids.

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
``begin_call`` may therefore leave a claim that nobody executes; so every claim
carries the delivery's random claim id, and the replica gives back exactly that claim
once the store answers again (``release_claim``, see ``engine._unheard``): at-most-once
holds, and the retry runs the call instead of being told ``interrupted``.

**Connections.**  coredis 6 clients hold an anyio task group and must be used as an
async context manager that is entered and exited by the same task.  So that
``await RedisStore.connect(...)`` can return a plain object (closed later, from any
task, by :meth:`~RedisConnection.aclose`), a Trio *system task* owns the client: it
enters it, parks until :meth:`~RedisConnection.aclose` cancels it, and exits it.  If
that task ever stops, every later operation raises :class:`StoreUnavailable`.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar, cast

import anyio
import coredis.exceptions as cx
import trio
from coredis.client import Client
from coredis.commands.script import Script
from coredis.typing import ResponseType

from weir.common._logs import StoreHealth

from ._redis_codec import _enc, _ms
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
    _PUT_TASK,
    _READ,
    _REBIND,
    _RELEASE,
    _RENEW,
    _TAKE,
    _TOUCH,
)
from ._resp import Pipe
from ._store_errors import ReplicasBehind, StoreUnavailable
from ._store_records import InternalId, Retention

T = TypeVar("T")
log = logging.getLogger("weir.engine._redis_store")


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


class RedisConnection:
    """The client, scripts and keys every :class:`~._redis_store.RedisStore` operation
    runs on (see the module docstring).

    Not used on its own: :meth:`~._redis_store.RedisStore.connect` builds the store.
    """

    def __init__(
        self,
        client: Client[bytes],
        *,
        pipe: Pipe | None = None,
        where: str,
        retention: Retention,
        prefix: str,
        timeout: float,
        replicas: int = 0,
        replica_timeout: float = 0.5,
    ) -> None:
        """Use :meth:`connect`; this only wires the parts together."""
        #: Replicas that must hold a claim, an outcome, an event or a task before
        #: the write counts (``WAIT``; 0: the primary's word is enough).
        self.replicas = replicas
        self._replica_wait_ms = _ms(replica_timeout)
        self.retention = retention
        self.prefix = prefix
        self.timeout = timeout
        self._client = client
        #: The hot path's pipelined connection (plain ``redis://`` and ``redis+cluster://``).
        self._pipe = pipe
        self._where = where
        #: The store's lifecycle lines (connected, lost, recovered).
        self.health = StoreHealth(where)
        self._ttl = _ms(retention.ttl)
        self._idempotency_ttl = _ms(retention.idempotency_ttl)
        #: What each gate may hold: finished calls, bytes of keys and responses.
        self._gate_bounds = (max(1, retention.calls_per_session), retention.call_bytes_per_session)
        self._maxlen = max(1, retention.events_per_stream)
        self._owner_scope = trio.CancelScope()
        self._owner_done = trio.Event()
        self._entered = False
        self._closed = False
        self._failure: BaseException | None = None
        #: A cluster layout refresh is under way (see :meth:`_refresh_layout`).
        self._refreshing = False
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
        self._release: Script[bytes] = register(_PRELUDE + _RELEASE)
        self._finish: Script[bytes] = register(_PRELUDE + _FINISH)
        self._append: Script[bytes] = register(_PRELUDE + _APPEND)
        self._read: Script[bytes] = register(_READ)
        self._post: Script[bytes] = register(_POST)
        self._info: Script[bytes] = register(_INFO)
        self._take: Script[bytes] = register(_TAKE)
        self._put_task: Script[bytes] = register(_PUT_TASK)

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
        self.health.connected()

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

    async def _run(self, what: str, op: Callable[[], Awaitable[T]], *, piped: bool = False) -> T:
        """Run one store operation under the deadline, mapping outages to StoreUnavailable.

        ``piped``: ``op`` goes through the pipelined connection, whose watchdog is
        the deadline (see ``engine._resp``), so no cancel scope is needed here.
        """
        self._refuse_if_down(what)
        lost = self.health.lost
        try:
            if piped:
                out = await op()
            else:
                with trio.fail_after(self.timeout):
                    out = await op()
        except trio.TooSlowError as exc:
            raise lost(
                StoreUnavailable(f"{what}: no answer from {self._where} within {self.timeout}s")
            ) from exc
        except Exception as exc:
            if trio.current_effective_deadline() == -math.inf:
                # This task is being cancelled (the shutdown, a request's scope), and
                # the client library, cancelled while connecting, made a connection
                # error of it: no outage to report; the cancellation goes on.
                await trio.lowlevel.checkpoint()
            failure = self._store_failure(what, exc)
            if failure is exc:
                raise
            if _is_outage(exc) and self._layout() is not None:
                with trio.move_on_after(self.timeout):
                    await self._refresh_layout()
            raise failure from exc
        if self.health.down:
            self.health.up()
        return out

    def _layout(self) -> Any:
        """A cluster client's slot layout (None for a single node)."""
        pool = getattr(self._client, "connection_pool", None)
        return getattr(pool, "cluster_layout", None)

    async def _refresh_layout(self) -> None:
        """A cluster node did not answer: ask the cluster for its layout again now, so
        slots a promoted replica took over are served from it at once (the client
        alone re-reads the layout only after many reported errors, and an error
        while connecting is not reported).  One refresh at a time; its failure is
        the next request's to find."""
        layout = self._layout()
        if layout is None or self._refreshing:
            return
        self._refreshing = True
        try:
            await layout.initialize()
        except Exception as exc:  # the cluster may still be electing: next time
            log.debug("cluster layout refresh failed: %r", exc)
        finally:
            self._refreshing = False

    def _refuse_if_down(self, what: str) -> None:
        """Raise StoreUnavailable for ``what`` if this client is closed or stopped."""
        if self._closed:
            raise StoreUnavailable(f"{what}: the store {self._where} is closed")
        if not self._entered:
            raise self.health.lost(
                StoreUnavailable(f"{what}: the client of {self._where} stopped: {self._failure!r}")
            ) from self._failure

    def _store_failure(self, what: str, exc: Exception) -> Exception:
        """What an operation's failure ``exc`` is raised as: an outage (noted on
        the store's health) or a refusal as StoreUnavailable; anything else as is
        (``exc`` itself).  Both runtimes' ``_run`` share it."""
        lost = self.health.lost
        if isinstance(exc, ReplicasBehind):
            return exc  # the store answered: its replicas are behind, not it down
        if isinstance(exc, StoreUnavailable):
            return lost(exc)
        if _is_outage(exc) or not self._entered:
            return lost(StoreUnavailable(f"{what}: {self._where} unavailable: {exc}"))
        if isinstance(exc, cx.ResponseError):  # WRONGTYPE, a script failing on bad data
            return StoreUnavailable(f"{what}: {self._where} refused: {exc}")
        return exc

    async def _script(
        self,
        what: str,
        script: Script[bytes],
        principal: str,
        session_id: str,
        args: Sequence[str | bytes | int],
        *,
        stream: str | None = None,
        durable: bool = False,
    ) -> ResponseType:
        keys = self._keys(principal, session_id)
        if stream is not None:
            keys.append(self._stream_key(principal, session_id, stream))
        return await self._eval(what, script, keys, [self._ttl, *args], durable=durable)

    async def _eval(
        self,
        what: str,
        script: Script[bytes],
        keys: Sequence[str | bytes],
        args: Sequence[str | bytes | int],
        *,
        durable: bool = False,
    ) -> ResponseType:
        """Run ``script``; ``durable``: then make sure :attr:`replicas` replicas hold
        what it wrote (``WAIT`` on the same connection), else raise
        :class:`ReplicasBehind` -- the write may stand on the primary alone."""
        pipe = self._pipe
        wait = durable and self.replicas > 0
        if pipe is not None:
            sha = script.sha

            async def piped() -> ResponseType:
                if not wait:
                    return cast("ResponseType", await pipe.evalsha(script.script, sha, keys, args))
                reply, held = await pipe.evalsha_durable(
                    script.script, sha, keys, args, self.replicas, self._replica_wait_ms
                )
                self._check_replicas(what, held)
                return cast("ResponseType", reply)

            return await self._run(what, piped, piped=True)

        async def op() -> ResponseType:
            if not wait:
                return await script(keys, args)
            try:
                with self._client.ensure_replication(self.replicas, self._replica_wait_ms):
                    return await script(keys, args)
            except cx.ReplicationError:
                self._check_replicas(what, 0)
                raise  # (unreachable: the check raised)

        return await self._run(what, op)

    def _check_replicas(self, what: str, held: int) -> None:
        if held < self.replicas:
            raise ReplicasBehind(
                f"{what}: {held} of the {self.replicas} replica(s) required confirmed the "
                f"write within {self._replica_wait_ms} ms"
            )

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
