"""The HTTP/1.1 side of weir's client: a small pool of keep-alive h11 connections.

Theory of operation
-------------------
:class:`Pool` hands each request a connection of its own -- an idle one when there
is one, else a new TCP (or TLS) connection -- and takes it back once the response has
been read to its end (:meth:`Response.aclose`); a connection whose response was
abandoned midway is closed, never reused.  So concurrent requests use one connection
each, sequential requests share one, and at most ``max_idle`` wait idle.

A reused connection that fails before a single response byte arrives was most likely
closed by the server while idle; the request is sent once more on a fresh connection.
A *timeout* on a reused connection is not retried: the server may be busy with the
request, and sending it again would deliver it twice.  Nothing else is ever re-sent.

Every wait (connecting, the response head, each body read) is bounded by the pool's
``timeout``; a failure is reported as :class:`ConnectionDropped`, which the MCP layer
above turns into a resume or an error.  Nothing here knows about MCP.
"""

from __future__ import annotations

import ssl
from typing import Final
from urllib.parse import urlsplit

import h11
import trio

__all__ = ["ConnectionDropped", "Pool", "Response", "ResponseTooLarge"]

_RECV: Final = 65536
_USER_AGENT: Final = "weir-client/0.1"


class ConnectionDropped(Exception):
    """A connection broke, closed or went silent for the timeout."""


class ResponseTooLarge(Exception):
    """A response body exceeded the limit given to :meth:`Response.body`."""


class _Connection:
    """One HTTP/1.1 client connection: an h11 state machine over a Trio stream."""

    def __init__(self, stream: trio.abc.Stream) -> None:
        self.stream = stream
        self.h11 = h11.Connection(h11.CLIENT)
        self.reused = False
        self.received = False  # any byte received since the current request was sent

    async def send(self, event: h11.Event) -> None:
        data = self.h11.send(event)
        if data:
            await self.stream.send_all(data)

    async def next_event(self, timeout: float) -> h11.Event:
        while True:
            event = self.h11.next_event()
            if event is h11.NEED_DATA:
                with trio.fail_after(timeout):
                    data = await self.stream.receive_some(_RECV)
                self.received = self.received or bool(data)
                self.h11.receive_data(bytes(data))
                continue
            if event is h11.PAUSED or isinstance(event, h11.ConnectionClosed):
                raise ConnectionDropped("the server closed the connection")
            assert isinstance(event, h11.Event)
            return event

    async def aclose(self) -> None:
        await trio.aclose_forcefully(self.stream)


class Response:
    """A response whose head has arrived; its body is read with :meth:`chunk`."""

    def __init__(
        self, pool: Pool, conn: _Connection, status: int, headers: dict[str, str], timeout: float
    ) -> None:
        self.pool = pool
        self.conn = conn
        self.status = status
        self.headers = headers
        self.timeout = timeout
        self.done = False
        self.closed = False

    @property
    def content_type(self) -> str:
        return self.headers.get("content-type", "").split(";", 1)[0].strip().lower()

    async def chunk(self, timeout: float | None = None) -> bytes:
        """The next piece of the body, or ``b""`` at its end.

        Raises:
            ConnectionDropped: the connection broke or stayed silent for ``timeout``.
        """
        if self.done:
            return b""
        try:
            event = await self.conn.next_event(self.timeout if timeout is None else timeout)
        except (trio.TooSlowError, trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            raise ConnectionDropped(f"{type(exc).__name__}: {exc}") from exc
        except (h11.RemoteProtocolError, OSError) as exc:
            raise ConnectionDropped(str(exc)) from exc
        if isinstance(event, h11.Data):
            return bytes(event.data) or await self.chunk(timeout)
        if isinstance(event, h11.EndOfMessage):
            self.done = True
            return b""
        raise ConnectionDropped(f"unexpected HTTP event {type(event).__name__}")

    async def body(self, limit: int) -> bytes:
        """The rest of the body.

        Raises:
            ConnectionDropped: the connection failed first.
            ResponseTooLarge: the body is longer than ``limit`` bytes.
        """
        out = bytearray()
        while chunk := await self.chunk():
            out += chunk
            if len(out) > limit:
                raise ResponseTooLarge(f"response body longer than {limit} bytes")
        return bytes(out)

    async def drain(self, seconds: float) -> None:
        """Read what is left of the body (for at most ``seconds`` per read), so the
        connection can be reused; a failure only means it will not be."""
        try:
            while await self.chunk(min(self.timeout, seconds)):
                pass
        except ConnectionDropped:
            pass

    async def aclose(self) -> None:
        """Give the connection back to the pool if the body was read to its end, else
        close it; idempotent."""
        if self.closed:
            return
        self.closed = True
        if self.done:
            await self.pool.release(self.conn)
        else:
            await self.conn.aclose()


class Pool:
    """Keep-alive connections to the origin of ``url``, one per concurrent request.

    Args:
        url: ``http://`` or ``https://`` URL; every request goes to its path and query.
        timeout: seconds for connecting and for each read.
        max_idle: most idle connections kept.

    Raises:
        ValueError: not an http(s) URL.
    """

    def __init__(self, url: str, timeout: float, max_idle: int = 8) -> None:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http(s) URL: {url!r}")
        self.tls = parts.scheme == "https"
        self.host = parts.hostname
        self.port = parts.port or (443 if self.tls else 80)
        self.authority = parts.netloc.rpartition("@")[2]
        self.target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        self.timeout = timeout
        self.max_idle = max_idle
        self.idle: list[_Connection] = []
        self.opened = 0  # connections ever opened (for tests and metrics)

    async def _connect(self) -> _Connection:
        with trio.fail_after(self.timeout):
            if self.tls:
                ctx = ssl.create_default_context()
                stream: trio.abc.Stream = await trio.open_ssl_over_tcp_stream(
                    self.host, self.port, ssl_context=ctx, https_compatible=True
                )
            else:
                stream = await trio.open_tcp_stream(self.host, self.port)
        self.opened += 1
        return _Connection(stream)

    async def release(self, conn: _Connection) -> None:
        """Keep ``conn`` for the next request if its exchange ended cleanly, else close it."""
        h = conn.h11
        if h.our_state is h11.DONE and h.their_state is h11.DONE and len(self.idle) < self.max_idle:
            h.start_next_cycle()
            conn.reused = True
            self.idle.append(conn)
        else:
            await conn.aclose()

    async def request(
        self, method: str, headers: list[tuple[str, str]], body: bytes | None = None
    ) -> Response:
        """Send one request and return once the response head has arrived.

        Raises:
            ConnectionDropped: connecting, sending or waiting for the head failed.
        """
        hdrs = [("host", self.authority), ("user-agent", _USER_AGENT), *headers]
        if body is not None:
            hdrs.append(("content-length", str(len(body))))
        for fresh in (False, True):
            conn = self.idle.pop() if self.idle and not fresh else None
            try:
                if conn is None:
                    conn = await self._connect()
                conn.received = False
                await conn.send(h11.Request(method=method, target=self.target, headers=hdrs))
                if body:
                    await conn.send(h11.Data(data=body))
                await conn.send(h11.EndOfMessage())
                while True:
                    event = await conn.next_event(self.timeout)
                    if isinstance(event, h11.Response):
                        break  # (1xx informational responses are skipped)
            except (
                trio.TooSlowError,
                trio.BrokenResourceError,
                trio.ClosedResourceError,
                h11.ProtocolError,
                OSError,
                ConnectionDropped,
            ) as exc:
                if conn is not None:
                    await conn.aclose()
                stale = conn is not None and conn.reused and not conn.received
                if stale and not fresh and not isinstance(exc, trio.TooSlowError):
                    continue  # the server closed it while idle: once more on a fresh one
                raise ConnectionDropped(f"{method} failed: {type(exc).__name__}: {exc}") from exc
            except BaseException:
                # Cancelled mid-request (the caller's own timeout): the connection is
                # in an unknown state, so it is closed, never kept or leaked.
                if conn is not None:
                    await conn.aclose()
                raise
            headers_out = {k.decode().lower(): v.decode("latin-1") for k, v in event.headers}
            return Response(self, conn, event.status_code, headers_out, self.timeout)
        raise AssertionError("unreachable")  # pragma: no cover

    async def aclose(self) -> None:
        """Close every idle connection (those in use are closed by their responses)."""
        idle, self.idle = self.idle, []
        for conn in idle:
            await conn.aclose()
