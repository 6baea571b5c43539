"""A pipelined RESP connection for the store's hot path, on hiredis' C parser.

Theory of operation
-------------------
Measured on Trio (400 concurrent tasks, one ``EVALSHA`` each at a time, loopback
Valkey), coredis spends about 400 µs of client CPU per command -- anyio cancel
scopes, a retry wrapper, telemetry hooks, a connection pool and typed response
callbacks around every call -- where the same command through hiredis' parser on
one plain Trio socket spends about 20 µs.  Each ``tools/call`` on a shared store
makes two such round trips (claim, then the final append), so for a single-node
``redis://`` store, :class:`RespPipe` carries the scripts and the
per-call reads; coredis keeps everything else (and TLS and Redis Cluster entirely).

One connection, pipelined:

* :meth:`RespPipe.call` encodes the command (``hiredis.pack_command``), queues a
  *slot* for its reply, and hands the bytes to the writer; commands from every
  task that call meanwhile go out in one ``send``.  Replies come back in order, so
  the reader fills slots first in, first out.
* **Deadline.**  Replies come in order, so one watchdog looking at the oldest
  waiting slot is every command's deadline: when it has waited ``timeout``, the
  server is not answering, the connection is dropped and every waiter fails
  (no cancel scope per command).  A caller cancelled while waiting leaves its
  slot in the queue: the reply still arrives, and is dropped.  Nothing is ever
  sent twice: a command whose reply was lost may have run (the same rule as the
  coredis path).
* The connection is opened by :meth:`RespPipe.run` (the store's owner task), with
  ``AUTH`` and ``SELECT`` from the URL; when it breaks, every waiting slot fails
  with :class:`coredis.exceptions.ConnectionError` (the store maps it to
  ``StoreUnavailable``: 503, never a hang), and ``run`` reconnects, backing off
  50 ms doubling to 1 s.  A call made while it is down cuts the back-off short
  and waits for the reconnection, at most ``timeout``, then fails.
* **Durable writes** (``--store-replicas``) share their ``WAIT``: the writer puts one
  ``WAIT`` behind all the durable writes queued since its last flush, in the same
  ``send``, and each of them reads its own reply and that ``WAIT``'s count (a
  ``WAIT`` covers everything its connection wrote before it): one round trip per
  durable write, and one ``WAIT`` per batch instead of one each.
* Error replies become :class:`coredis.exceptions.ResponseError`, so the store's
  reading of "cannot serve now" replies (``LOADING``, ``READONLY``, ...) is the same
  on both paths.  ``NOSCRIPT`` is answered by :meth:`evalsha` once with ``EVAL``
  (which also loads the script).

What it holds is bounded by its callers: one slot per operation in flight (each
under the store's deadline) and the bytes of commands not yet written.
"""

from __future__ import annotations

import hashlib
import ssl
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Protocol, cast

import coredis.exceptions as cx
import hiredis
import trio

_RECV = 65536
_BACKOFF_MIN = 0.05
_BACKOFF_MAX = 1.0
_ASKING = b"*1\r\n$6\r\nASKING\r\n"

Arg = str | bytes | int


#: Error-reply prefixes with their coredis exception, as coredis itself maps them, so
#: that both paths raise the same types (the store tells outages apart by them).
_ERRORS: dict[str, type[cx.ResponseError]] = {
    "READONLY": cx.ReadOnlyError,
    "NOSCRIPT": cx.NoScriptError,
    "TRYAGAIN": cx.TryAgainError,
    "CLUSTERDOWN": cx.ClusterDownError,
    "NOAUTH": cx.AuthenticationRequiredError,
    "WRONGPASS": cx.AuthenticationFailureError,
    "NOPERM": cx.AuthorizationError,
}


def _reply_error(message: str) -> Exception:
    prefix = message.split(" ", 1)[0]
    if prefix == "LOADING":
        return cx.BusyLoadingError(message)
    return _ERRORS.get(prefix, cx.ResponseError)(message)


class _Slot:
    __slots__ = ("done", "error", "reply", "sent_at")

    def __init__(self, sent_at: float) -> None:
        self.sent_at = sent_at
        self.done = trio.Event()
        self.reply: Any = None
        self.error: BaseException | None = None


class Pipe(Protocol):
    """What the store asks of its pipelined connection (:class:`RespPipe` on
    Trio, :class:`weir.asyncio._resp.AsyncioRespPipe` on asyncio, or either runtime's
    cluster pipe, :class:`~._slots.ClusterPipe`)."""

    @property
    def failure(self) -> BaseException | None: ...

    async def call(self, *args: Arg, asking: bool = False) -> Any: ...

    async def evalsha(
        self,
        source: str | bytes,
        sha: str | bytes,
        keys: Sequence[Arg],
        args: Sequence[Arg],
        *,
        asking: bool = False,
    ) -> Any: ...

    async def evalsha_durable(
        self,
        source: str | bytes,
        sha: str | bytes,
        keys: Sequence[Arg],
        args: Sequence[Arg],
        replicas: int,
        wait_ms: int,
        *,
        asking: bool = False,
    ) -> tuple[Any, int]: ...

    async def wait_up(self) -> None: ...

    async def run(self) -> None: ...


class PipeCalls:
    """What both runtimes' pipes (and the cluster pipe) build on :meth:`call`: the
    script calls.  A subclass supplies ``call(*args, asking=False)``."""

    async def call(self, *args: Arg, asking: bool = False) -> Any:
        """Send one command and return its reply (``asking``: right after an
        ``ASKING``, on the same connection, for a slot being imported)."""
        raise NotImplementedError

    async def evalsha(
        self,
        source: str | bytes,
        sha: str | bytes,
        keys: Sequence[Arg],
        args: Sequence[Arg],
        *,
        asking: bool = False,
    ) -> Any:
        """``EVALSHA`` of ``source`` (whose SHA-1 is ``sha``), loading it if the server lost it."""
        try:
            return await self.call("EVALSHA", sha, len(keys), *keys, *args, asking=asking)
        except cx.NoScriptError:
            pass
        return await self.call("EVAL", source, len(keys), *keys, *args, asking=asking)

    async def call_durable(
        self, args: tuple[Arg, ...], replicas: int, wait_ms: int, *, asking: bool = False
    ) -> tuple[Any, int]:
        """A write, then -- in the same write to the server, shared with every durable
        write queued meanwhile -- ``WAIT replicas wait_ms``: its reply, and how many
        replicas hold everything this connection wrote up to the ``WAIT``."""
        raise NotImplementedError

    async def evalsha_durable(
        self,
        source: str | bytes,
        sha: str | bytes,
        keys: Sequence[Arg],
        args: Sequence[Arg],
        replicas: int,
        wait_ms: int,
        *,
        asking: bool = False,
    ) -> tuple[Any, int]:
        """:meth:`evalsha`, with the ``WAIT`` of :meth:`call_durable` behind it: the
        reply and how many replicas hold the script's writes."""
        try:
            return await self.call_durable(
                ("EVALSHA", sha, len(keys), *keys, *args), replicas, wait_ms, asking=asking
            )
        except cx.NoScriptError:
            return await self.call_durable(
                ("EVAL", source, len(keys), *keys, *args), replicas, wait_ms, asking=asking
            )


class RespPipe(PipeCalls):
    """A pipelined connection to one Redis-protocol server (see the module docstring).

    Args:
        host, port: the server.
        username, password: for ``AUTH`` (None: no ``AUTH``).
        db: the database to ``SELECT`` (0: none).
        tls: an SSL context for ``rediss://`` (None: plain TCP).
        timeout: seconds to connect and authenticate, and the most any reply may
            take before the connection is given up as dead.
    """

    def __init__(
        self,
        host: str,
        port: int,
        *,
        username: str | None = None,
        password: str | None = None,
        db: int = 0,
        tls: ssl.SSLContext | None = None,
        timeout: float = 2.0,
    ) -> None:
        self.host, self.port = host, port
        self.username, self.password, self.db = username, password, db
        self.tls = tls
        self.timeout = timeout
        self._stream: trio.abc.Stream | None = None
        self._slots: deque[_Slot] = deque()
        self._out: list[bytes] = []
        self._wake = trio.Event()
        self._busy = trio.Event()
        self._connected = trio.Event()  # set while the connection is up
        self._demand = trio.Event()  # a caller waits for a reconnection
        self._reader_state = hiredis.Reader(replyError=_reply_error)
        # The WAIT the next flush sends behind the durable writes queued since the last
        # one (group commit: one WAIT covers them all), and its (replicas, timeout).
        self._group: _Slot | None = None
        self._group_wait: tuple[int, int] = (0, 0)
        #: Why the connection is down (None while it is up or before the first try).
        self.failure: BaseException | None = None
        #: Commands sent (a round trip each, though pipelined).
        self.commands = 0

    # ------------------------------------------------------------------ calls
    async def call(self, *args: Arg, asking: bool = False) -> Any:
        """Send one command and return its reply (raises ``ResponseError`` for an error
        reply, ``ConnectionError`` if the connection is or goes down).  ``asking``:
        an ``ASKING`` goes right before it (its reply is dropped)."""
        if self._stream is None:
            await self._reconnected()
        slot = self._queue(args, asking)
        await slot.done.wait()
        if slot.error is not None:
            raise slot.error
        return slot.reply

    async def call_durable(
        self, args: tuple[Arg, ...], replicas: int, wait_ms: int, *, asking: bool = False
    ) -> tuple[Any, int]:
        """The write, then the group's ``WAIT`` (see :class:`PipeCalls`)."""
        if self._stream is None:
            await self._reconnected()
        slot = self._queue(args, asking)
        group = self._group
        if group is None:
            group = self._group = _Slot(0.0)  # (sent, and timed, by the next flush)
        self._group_wait = max(self._group_wait, (replicas, wait_ms))
        await group.done.wait()  # (replies come in order: ``slot`` is settled too)
        for settled in (slot, group):
            if settled.error is not None:
                raise settled.error
        return slot.reply, int(group.reply)

    def _queue(self, args: tuple[Arg, ...], asking: bool) -> _Slot:
        # A slot for the reply and the bytes for the writer (ASKING first if asked).
        slots = self._slots
        idle = not slots
        now = trio.current_time()
        if asking:
            slots.append(_Slot(now))
            self._out.append(_ASKING)
        slot = _Slot(now)
        slots.append(slot)
        if idle:
            self._busy.set()  # the watchdog starts timing
        self._out.append(_pack(args))
        self.commands += 1
        self._wake.set()
        return slot

    @property
    def up(self) -> bool:
        """Whether the connection is up now."""
        return self._stream is not None

    async def _reconnected(self) -> None:
        # Down: cut the reconnect back-off short and wait (within the deadline) for it.
        self._demand.set()
        with trio.move_on_after(self.timeout):
            await self._connected.wait()
        if self._stream is None:
            raise cx.ConnectionError(
                f"store connection to {self.host}:{self.port} is down"
            ) from self.failure

    # ------------------------------------------------------------------ connection
    async def wait_up(self) -> None:
        """Until the connection is up."""
        await self._connected.wait()

    async def run(self) -> None:
        """Keep the connection up forever (run it in a task that owns the store)."""
        backoff = _BACKOFF_MIN
        while True:
            try:
                stream = await self._connect()
            except (OSError, cx.RedisError, trio.TooSlowError, trio.BrokenResourceError) as exc:
                self.failure = exc
                with trio.move_on_after(backoff):
                    await self._demand.wait()
                self._demand = trio.Event()
                backoff = min(backoff * 2, _BACKOFF_MAX)
                continue
            backoff = _BACKOFF_MIN
            self.failure = None
            self._stream = stream
            self._connected.set()
            try:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(self._guard, self._writer, stream, nursery.cancel_scope)
                    nursery.start_soon(self._watchdog, nursery.cancel_scope)
                    await self._guard(self._reader, stream, nursery.cancel_scope)
            finally:
                self._stream = None
                self._connected = trio.Event()
                self._fail_all()
                with trio.CancelScope(shield=True):
                    await stream.aclose()

    async def _guard(
        self,
        part: Callable[[trio.abc.Stream], Awaitable[None]],
        stream: trio.abc.Stream,
        scope: trio.CancelScope,
    ) -> None:
        # The reader or the writer ending (the connection broke) ends both.
        try:
            await part(stream)
        except (OSError, trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            self.failure = exc
        except hiredis.ProtocolError as exc:
            self.failure = exc
        scope.cancel()

    async def _connect(self) -> trio.abc.Stream:
        with trio.fail_after(self.timeout):
            tcp = await trio.open_tcp_stream(self.host, self.port)
            stream: trio.abc.Stream = tcp
            if self.tls is not None:
                stream = trio.SSLStream(tcp, self.tls, server_hostname=self.host)
            reader = hiredis.Reader(replyError=_reply_error)
            hello: list[tuple[Arg, ...]] = []
            if self.password is not None:
                auth: tuple[Arg, ...] = ("AUTH", self.password)
                if self.username:
                    auth = ("AUTH", self.username, self.password)
                hello.append(auth)
            if self.db:
                hello.append(("SELECT", self.db))
            hello.append(("PING",))
            await stream.send_all(b"".join(_pack(c) for c in hello))
            replies: list[Any] = []
            while len(replies) < len(hello):
                data = await stream.receive_some(_RECV)
                if not data:
                    raise cx.ConnectionError("the store closed the connection while connecting")
                reader.feed(bytes(data))
                while (reply := reader.gets()) is not False:
                    replies.append(reply)
            for reply in replies:
                if isinstance(reply, Exception):
                    await stream.aclose()
                    raise reply
            self._reader_state = reader
            return stream

    async def _watchdog(self, scope: trio.CancelScope) -> None:
        # Replies come in order, so the oldest waiting slot says whether the server
        # still answers: one older than ``timeout`` means it does not, and the
        # connection is dropped (every waiter fails, ``run`` reconnects).  This is
        # every operation's deadline, at the cost of a timestamp per command.
        slots = self._slots
        while True:
            if not slots:
                self._busy = trio.Event()
                await self._busy.wait()
                continue
            due = slots[0].sent_at + self.timeout
            if trio.current_time() >= due:
                self.failure = trio.TooSlowError(
                    f"no reply from {self.host}:{self.port} within {self.timeout}s"
                )
                scope.cancel()
                return
            await trio.sleep_until(due)

    async def _writer(self, stream: trio.abc.Stream) -> None:
        while True:
            if not self._out:
                self._wake = trio.Event()
                await self._wake.wait()
                continue
            out = self._out
            group = self._group
            if group is not None:  # one WAIT behind every durable write queued so far
                self._group = None
                group.sent_at = trio.current_time()
                self._slots.append(group)
                out.append(_pack(("WAIT", *self._group_wait)))
                self._group_wait = (0, 0)
                self.commands += 1
            data = b"".join(out)
            out.clear()
            await stream.send_all(data)

    async def _reader(self, stream: trio.abc.Stream) -> None:
        reader = self._reader_state
        slots = self._slots
        while True:
            data = await stream.receive_some(_RECV)
            if not data:
                raise trio.BrokenResourceError("the store closed the connection")
            reader.feed(bytes(data))
            while (reply := reader.gets()) is not False:
                if not slots:
                    raise hiredis.ProtocolError("a reply nobody asked for")
                slot = slots.popleft()
                if isinstance(reply, Exception):
                    slot.error = reply
                else:
                    slot.reply = reply
                slot.done.set()

    def _fail_all(self) -> None:
        error = cx.ConnectionError(f"store connection to {self.host}:{self.port} was lost")
        error.__cause__ = self.failure
        while self._slots:
            slot = self._slots.popleft()
            slot.error = error
            slot.done.set()
        if self._group is not None:  # queued writes that were never sent, nor their WAIT
            self._group.error = error
            self._group.done.set()
            self._group = None
        self._out.clear()


def _pack(args: tuple[Arg, ...]) -> bytes:
    # (hiredis' stub types the command as a 1-tuple; it takes any tuple of arguments)
    return cast("bytes", hiredis.pack_command(cast("Any", args)))


def script_sha(source: str) -> str:
    """The SHA-1 the server names ``source`` by (``EVALSHA``)."""
    return hashlib.sha1(source.encode(), usedforsecurity=False).hexdigest()


__all__ = ["Pipe", "PipeCalls", "RespPipe", "script_sha"]
