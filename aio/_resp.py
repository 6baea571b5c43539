"""The store's pipelined RESP connection on asyncio: the twin of ``weir.engine._resp``.

Theory of operation
-------------------
The same connection, the same rules as the Trio runtime's
:class:`~weir.engine._resp.RespPipe` (whose docstring explains why the hot path
does not go through coredis), built on an :class:`asyncio.Protocol` so no task sits
between the socket and the callers:

* :meth:`AsyncioRespPipe.call` packs the command (hiredis), queues a future for its
  reply and the bytes for the next flush; one ``loop.call_soon`` writes everything
  queued meanwhile in one ``transport.write``.  ``data_received`` feeds hiredis'
  parser and resolves the futures first in, first out (replies come in order).
* **Deadline.**  One timer (``loop.call_at``) watches the oldest waiting reply: when it
  has waited ``timeout``, the connection is dropped and every waiter fails with
  :class:`coredis.exceptions.ConnectionError` (the store maps it to 503).  A caller
  cancelled while waiting leaves its slot; the reply still arrives and is dropped.
  Nothing is ever sent twice.
* :meth:`AsyncioRespPipe.run` (the store's owner task) connects, sends ``AUTH`` /
  ``SELECT`` / ``PING``, and when the connection breaks reconnects with the same
  back-off (50 ms doubling to 1 s, cut short by a caller who waits, at most
  ``timeout``).
* **Durable writes** share one ``WAIT`` per flush, sent behind them in the same write
  (group commit, as on Trio).
* Error replies are the same coredis exception types as on Trio (``_reply_error``).

It keeps the Trio pipe's interface (``call``, ``evalsha``, ``wait_up``, ``run``,
``failure``, ``commands``), so :class:`weir.engine._redis_store.RedisStore` drives
either.  What it holds is bounded by its callers: one future per operation in flight
and the bytes not yet written.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections import deque
from typing import Any

import coredis.exceptions as cx
import hiredis

from weir.engine._resp import _BACKOFF_MAX, _BACKOFF_MIN, Arg, PipeCalls, _pack, _reply_error

__all__ = ["AsyncioRespPipe"]


class _Wire(asyncio.Protocol):
    """The socket's callbacks, handed to the pipe."""

    def __init__(self, pipe: AsyncioRespPipe) -> None:
        self.pipe = pipe
        self.lost: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def data_received(self, data: bytes) -> None:
        self.pipe._received(self, data)

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.lost.done():
            self.lost.set_result(None)
        self.pipe._lost(self, exc)


class AsyncioRespPipe(PipeCalls):
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
        self._wire: _Wire | None = None
        self._transport: asyncio.Transport | None = None
        self._up = False  # the handshake is done: callers may send
        self._slots: deque[tuple[asyncio.Future[Any], float]] = deque()
        self._out: list[bytes] = []
        self._flush_due = False
        self._timer: asyncio.TimerHandle | None = None
        # The WAIT the next flush sends behind the durable writes queued since the last
        # one, and its (replicas, timeout) (as on Trio).
        self._group: asyncio.Future[Any] | None = None
        self._group_wait: tuple[int, int] = (0, 0)
        self._parser = hiredis.Reader(replyError=_reply_error)
        self._connected = asyncio.Event()
        self._demand = asyncio.Event()
        #: Why the connection is down (None while it is up or before the first try).
        self.failure: BaseException | None = None
        #: Commands sent (a round trip each, though pipelined).
        self.commands = 0

    # ------------------------------------------------------------------ calls
    async def call(self, *args: Arg, asking: bool = False) -> Any:
        """Send one command and return its reply (raises ``ResponseError`` for an error
        reply, ``ConnectionError`` if the connection is or goes down).  ``asking``:
        an ``ASKING`` goes right before it (its reply is dropped)."""
        if not self._up:
            await self._reconnected()
        self.commands += 1
        if asking:
            self._send(("ASKING",)).add_done_callback(_dropped)
        return await self._send(args)

    async def call_durable(
        self, args: tuple[Arg, ...], replicas: int, wait_ms: int, *, asking: bool = False
    ) -> tuple[Any, int]:
        """The write, then the group's ``WAIT`` (see
        :class:`~weir.engine._resp.PipeCalls`; the Trio pipe's docstring)."""
        if not self._up:
            await self._reconnected()
        self.commands += 1
        if asking:
            self._send(("ASKING",)).add_done_callback(_dropped)
        reply = self._send(args)
        group = self._group
        if group is None:  # (sent by the next flush, behind every durable write till then)
            group = self._group = asyncio.get_running_loop().create_future()
            group.add_done_callback(_dropped)
        self._group_wait = max(self._group_wait, (replicas, wait_ms))
        answer = await reply
        held = await asyncio.shield(group)  # (shared: one caller's cancellation is its own)
        return answer, int(held)

    @property
    def up(self) -> bool:
        """Whether the connection is up now."""
        return self._up

    def _send(self, args: tuple[Arg, ...]) -> asyncio.Future[Any]:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()
        self._slots.append((future, loop.time()))
        if self._timer is None:
            self._timer = loop.call_at(loop.time() + self.timeout, self._watch)
        self._out.append(_pack(args))
        if not self._flush_due:
            self._flush_due = True
            loop.call_soon(self._flush)
        return future

    def _flush(self) -> None:
        self._flush_due = False
        group = self._group
        if group is not None:  # one WAIT behind every durable write queued so far
            self._group = None
            if self._transport is not None:
                self._slots.append((group, asyncio.get_running_loop().time()))
                self._out.append(_pack(("WAIT", *self._group_wait)))
                self.commands += 1
            elif not group.done():
                group.set_exception(
                    cx.ConnectionError(f"store connection to {self.host}:{self.port} is down")
                )
            self._group_wait = (0, 0)
        if self._out and self._transport is not None:
            self._transport.write(b"".join(self._out))
        self._out.clear()

    async def _reconnected(self) -> None:
        self._demand.set()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(self.timeout):
                await self._connected.wait()
        if not self._up:
            raise cx.ConnectionError(
                f"store connection to {self.host}:{self.port} is down"
            ) from self.failure

    # ------------------------------------------------------------------ the wire
    def _received(self, wire: _Wire, data: bytes) -> None:
        if wire is not self._wire:
            return
        parser, slots = self._parser, self._slots
        parser.feed(data)
        try:
            while (reply := parser.gets()) is not False:
                if not slots:
                    raise hiredis.ProtocolError("a reply nobody asked for")
                future = slots.popleft()[0]
                if future.done():
                    continue  # its caller was cancelled: the reply is dropped
                if isinstance(reply, Exception):
                    future.set_exception(reply)
                else:
                    future.set_result(reply)
        except hiredis.ProtocolError as exc:
            self._drop(exc)

    def _lost(self, wire: _Wire, exc: Exception | None) -> None:
        if wire is self._wire:
            self._drop(exc or ConnectionResetError("the store closed the connection"))

    def _watch(self) -> None:
        # Replies come in order: the oldest waiting one is every command's deadline.
        self._timer = None
        if not self._slots:
            return
        loop = asyncio.get_running_loop()
        due = self._slots[0][1] + self.timeout
        if loop.time() >= due:
            self._drop(
                TimeoutError(f"no reply from {self.host}:{self.port} within {self.timeout}s")
            )
            return
        self._timer = loop.call_at(due, self._watch)

    def _drop(self, why: BaseException) -> None:
        """The connection is given up: every waiter fails, ``run`` reconnects."""
        if self._wire is None:
            return
        self.failure = why
        transport, self._transport, self._wire = self._transport, None, None
        self._up = False
        self._connected.clear()
        if transport is not None:
            transport.abort()
        self._fail_all()

    def _fail_all(self) -> None:
        error = cx.ConnectionError(f"store connection to {self.host}:{self.port} was lost")
        error.__cause__ = self.failure
        while self._slots:
            future = self._slots.popleft()[0]
            if not future.done():
                future.set_exception(error)
        if self._group is not None and not self._group.done():  # never sent
            self._group.set_exception(error)
        self._group = None
        self._out.clear()
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    # ------------------------------------------------------------------ connection
    async def wait_up(self) -> None:
        """Until the connection is up."""
        await self._connected.wait()

    async def run(self) -> None:
        """Keep the connection up until cancelled (run it in the task that owns the store)."""
        backoff = _BACKOFF_MIN
        try:
            while True:
                try:
                    wire = await self._connect()
                except (OSError, cx.RedisError, hiredis.ProtocolError) as exc:
                    self._drop(exc)
                    self.failure = exc
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(backoff):
                            await self._demand.wait()
                    self._demand.clear()
                    backoff = min(backoff * 2, _BACKOFF_MAX)
                    continue
                backoff = _BACKOFF_MIN
                self.failure = None
                self._up = True
                self._connected.set()
                await wire.lost
        finally:
            self._drop(ConnectionAbortedError("the store connection was closed"))

    async def _connect(self) -> _Wire:
        loop = asyncio.get_running_loop()
        async with asyncio.timeout(self.timeout):
            transport, wire = await loop.create_connection(
                lambda: _Wire(self),
                self.host,
                self.port,
                ssl=self.tls,
                server_hostname=self.host if self.tls is not None else None,
            )
            self._wire, self._transport = wire, transport
            self._parser = hiredis.Reader(replyError=_reply_error)
            hello: list[tuple[Arg, ...]] = []
            if self.password is not None:
                auth: tuple[Arg, ...] = ("AUTH", self.password)
                if self.username:
                    auth = ("AUTH", self.username, self.password)
                hello.append(auth)
            if self.db:
                hello.append(("SELECT", self.db))
            hello.append(("PING",))
            replies = [self._send(c) for c in hello]
            try:
                outcomes = await asyncio.gather(*replies, return_exceptions=True)
            except BaseException:
                self._drop(ConnectionAbortedError("the handshake was cut short"))
                raise
            for outcome in outcomes:
                if isinstance(outcome, BaseException):
                    self._drop(outcome)
                    raise outcome
            return wire


def _dropped(future: asyncio.Future[Any]) -> None:
    # A reply nobody reads (ASKING's): retrieve its failure so asyncio does not log it.
    if not future.cancelled():
        future.exception()
