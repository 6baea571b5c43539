"""One way to serve an app on either runtime, in this process, for a runtime test.

weir has two runtimes interpreting the same sans-io core: Trio (:class:`weir.engine.Server`)
and asyncio (:class:`weir.asyncio.AsyncioDriver`).  A test that checks a runtime's
behaviour takes ``runtime`` (:data:`RUNTIMES`) and starts its server with
:func:`serving`, which runs it on 127.0.0.1 in a background thread with its own event
loop -- Trio's or asyncio's -- so the test itself is a plain sync test (or a Trio test:
the server's loop is not the test's) talking over real sockets
(:class:`~tests.integration.test_asyncio_driver.Client`, or raw ones).

What the test may look at, the same on both (each read runs on the server's own loop,
whose state is that loop's alone): :meth:`Served.credit_of` (a session's frames and
bytes of credit in use, and what waits for it), :meth:`Served.has_session`,
:meth:`Served.session_count` and :meth:`Served.logs` (a session's stream logs).
Tools that block on a test's :class:`threading.Event` use :func:`wait_in_thread`,
which works under either loop.

For a server in a subprocess (``weir serve [--runtime asyncio]``) see
:mod:`tests.integration.serverproc` (``driver=runtime``).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import math
import queue
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Protocol

import pytest
import sniffio
import trio

from tests.integration.tlspki import client_context, pki
from weir.asyncio import AsyncioDriver
from weir.asyncio._session import MAX_CLOSED_STREAMS
from weir.engine import App, Server, ServerConfig
from weir.protocol import (
    LOOPBACK_HOSTS,
    CreditLimits,
    EndpointConfig,
    HttpLimits,
    ReadTimeouts,
)
from weir.protocol.states import CreditState
from weir.protocol.streams import StreamLog

#: The runtimes a runtime test runs against.
RUNTIME_NAMES = ("trio", "asyncio")
#: ``@RUNTIMES`` parametrises a test over ``runtime``.
RUNTIMES = pytest.mark.parametrize("runtime", RUNTIME_NAMES)
#: Bound (seconds) on every wait for the server's thread: start, a probe, the stop.
TIMEOUT = 10.0


async def wait_in_thread(event: threading.Event, timeout: float = TIMEOUT) -> bool:
    """Wait for ``event`` in a worker thread, under whichever loop runs the caller
    (cancellable: a server's shutdown does not wait for the thread)."""
    if sniffio.current_async_library() == "trio":
        return await trio.to_thread.run_sync(event.wait, timeout, abandon_on_cancel=True)
    return await asyncio.to_thread(event.wait, timeout)


@dataclass(frozen=True)
class Options:
    """The limits a test sets, as each runtime spells them (``None``: its default)."""

    credit: CreditLimits | None = None
    max_sessions: int | None = None
    max_connections: int | None = None
    idle_timeout: float | None = None
    read_timeouts: ReadTimeouts | None = None
    #: Bytes of replay history and results one session keeps (``--session-retain-bytes``).
    retain_bytes: int | None = None
    #: Every request answered with one JSON body (``weir serve --json-response``).
    json_response: bool = False
    #: HTTP size limits (413, 431, 414).
    limits: HttpLimits | None = None
    #: Seconds a duplicate of a running call waits before 409 ``in_progress``.
    in_progress_wait: float | None = None
    #: The ``retryAfterMs`` hint of a 409 ``in_progress``.
    retry_ms: int | None = None
    #: Serve TLS with the test certificate (``tests.integration.tlspki``); the
    #: clients of :func:`client_socket` then speak TLS to the server.
    tls: bool = False
    #: With ``tls``: require client certificates signed by the test CA.
    client_certs: bool = False


#: The ports of the servers :func:`serving` runs with TLS.
_TLS_PORTS: set[int] = set()
#: The ``tls`` axis: a test so marked runs over plain TCP and over TLS.
TLS_AXIS = pytest.mark.parametrize("tls", [False, True], ids=["tcp", "tls"])


def client_socket(
    port: int, *, rcvbuf: int | None = None, timeout: float = TIMEOUT
) -> socket.socket:
    """A blocking client socket connected to 127.0.0.1:``port`` (``rcvbuf``: set before
    connecting); to a server :func:`serving` runs with TLS, an ``ssl.SSLSocket`` whose
    handshake is done."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    if rcvbuf is not None:  # before connect: it sets the advertised window
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    sock.settimeout(timeout)
    sock.connect(("127.0.0.1", port))
    if port in _TLS_PORTS:
        return client_context().wrap_socket(sock, server_hostname="127.0.0.1")
    return sock


class _Sessions(Protocol):
    """What both runtimes' session tables hold (their sessions' flow and streams)."""

    def __contains__(self, key: object) -> bool: ...
    def __len__(self) -> int: ...
    def __getitem__(self, key: str) -> Any: ...


@dataclass
class Served:
    """A server of ``runtime`` listening on 127.0.0.1:``port`` in a background thread."""

    runtime: str
    port: int
    sessions: _Sessions
    _probe: Callable[[Callable[[], Any]], Any]
    #: The :class:`~weir.engine.Server` or :class:`~weir.asyncio.AsyncioDriver`, for
    #: what only one runtime has (read it through :meth:`probe`).
    target: Any = None
    #: The server loop's clock (called on that loop).
    clock: Callable[[], float] = time.monotonic

    @property
    def url(self) -> str:
        """The MCP endpoint's URL."""
        scheme = "https" if self.port in _TLS_PORTS else "http"
        return f"{scheme}://127.0.0.1:{self.port}/mcp"

    @property
    def replica_id(self) -> str | None:
        """What the server names itself in ``: replica=`` comments (the Trio engine's;
        the asyncio runtime names no replica)."""
        return str(self.target.replica_id) if self.runtime == "trio" else None

    def probe(self, fn: Callable[[], Any]) -> Any:
        """Run ``fn`` on the server's loop and return what it returned."""
        return self._probe(fn)

    def credit_of(self, sid: str) -> tuple[int, int, int]:
        """Session ``sid``'s frames and bytes of credit in use, and frames waiting for it."""

        def read() -> tuple[int, int, int]:
            flow = self.sessions[sid].flow
            return flow.credit.frames_in_use, flow.credit.bytes_in_use, flow.waiting

        result: tuple[int, int, int] = self.probe(read)
        return result

    def of(self, sid: str, fn: Callable[[Any], Any]) -> Any:
        """``fn(session)`` for session ``sid``, run on the server's loop."""
        return self.probe(lambda: fn(self.sessions[sid]))

    def writers(self, sid: str) -> int:
        """How many connections are attached to session ``sid`` as stream writers."""
        if self.runtime == "trio":
            return int(
                self.of(sid, lambda s: sum(h.writer_scope is not None for h in s.handles.values()))
            )
        return int(self.of(sid, lambda s: len(s.writers)))

    def connections(self) -> int:
        """How many client connections the server is serving now."""
        if self.runtime == "trio":
            return int(self.probe(lambda: len(self.target.open_connections)))
        return int(self.probe(lambda: self.target.connections))

    def clock_shift(self, local: Callable[[], float]) -> float:
        """What to add to an instant of the server's clock to put it on ``local``'s,
        never later than it was: the server's clock is read between two instants of
        ``local``, and the shift is taken from the first."""
        before = local()
        server_now: float = self.probe(self.clock)
        return before - server_now

    def read_credit(self, holder: Any, shift: float) -> CreditReading:
        """One reading of ``holder``'s credit (a session, or a sessionless credit owner),
        its instants on the server's clock plus ``shift`` (see :meth:`clock_shift`): so
        the difference between two of them is exactly the server's."""

        def read() -> CreditReading:
            c = holder.flow.credit
            return CreditReading(
                at=self.clock() + shift,
                frames=c.frames_in_use,
                nbytes=c.bytes_in_use,
                peak_frames=c.peak_frames,
                peak_bytes=c.peak_bytes,
                undrained=sum(log.undrained()[1] for log in holder.streams),
                state=c.state,
                last_progress=c.last_progress + shift,
                closed=holder.closed,
                waiting=holder.flow.waiting,
            )

        reading: CreditReading = self.probe(read)
        return reading

    def has_session(self, sid: str) -> bool:
        return bool(self.probe(lambda: sid in self.sessions))

    def session_count(self) -> int:
        return int(self.probe(lambda: len(self.sessions)))

    def logs(self, sid: str) -> list[StreamLog]:
        """Session ``sid``'s stream logs (the live ones and the closed ones it remembers)."""
        return list(self.probe(lambda: list(self.sessions[sid].streams)))


@dataclass(frozen=True)
class CreditReading:
    """A credit holder's state at one instant ``at`` (see :meth:`Served.read_credit`)."""

    at: float
    frames: int
    nbytes: int
    peak_frames: int
    peak_bytes: int
    undrained: int  # bytes appended to its stream logs and not acknowledged
    state: CreditState
    last_progress: float
    closed: bool
    waiting: int  # frames waiting for credit

    @property
    def half_open(self) -> bool:
        return self.state in (CreditState.HALF_OPEN, CreditState.DEAD)


@dataclass
class CreditWatch:
    """What polling one credit holder saw (:meth:`run`), its instants on the test's
    Trio clock (shifted once: never later than they were, their differences exact)."""

    served: Served
    holder: Any
    max_frames: int = 0
    max_bytes: int = 0
    max_undrained: int = 0
    half_open_at: float | None = None
    last_open_at: float = -math.inf
    last_progress: float = 0.0
    closed_at: float | None = None
    samples: int = 0

    def __post_init__(self) -> None:
        #: One shift for every reading: their differences are the server's own.
        self.shift = self.served.clock_shift(trio.current_time)

    def take(self) -> CreditReading:
        r = self.served.read_credit(self.holder, self.shift)
        self.samples += 1
        self.max_frames = max(self.max_frames, r.frames)
        self.max_bytes = max(self.max_bytes, r.nbytes)
        self.max_undrained = max(self.max_undrained, r.undrained)
        if r.state is not CreditState.DEAD:
            self.last_progress = r.last_progress
        if r.state is CreditState.OPEN:
            self.last_open_at = r.at
        if r.half_open and self.half_open_at is None:
            self.half_open_at = r.at
        if r.closed and self.closed_at is None:
            self.closed_at = r.at
        return r

    def stall_floor(self) -> float:
        """Take a reading; an instant no later than the one the drain window started
        at (``max(exhausted since, last progress)``: it became exhausted after the
        last reading that saw it OPEN)."""
        r = self.take()
        return max(self.last_open_at, r.last_progress)

    async def run(self, every: float = 0.005) -> None:
        """Read every ``every`` seconds until the holder is closed (or cancelled)."""
        for _ in range(10_000_000):
            if self.take().closed:
                return
            await trio.sleep(every)


@contextmanager
def serving(runtime: str, app: App, **options: Any) -> Iterator[Served]:
    """Serve ``app`` on ``runtime`` (``trio`` or ``asyncio``) with :class:`Options`.

    Everything still open at the end (a stream nobody reads) ends with the server.
    """
    opts = Options(**options)
    if runtime not in RUNTIME_NAMES:
        raise ValueError(f"no runtime {runtime!r}")
    with (_trio if runtime == "trio" else _asyncio)(app, opts) as served:
        if opts.tls:
            _TLS_PORTS.add(served.port)
        try:
            yield served
        finally:
            _TLS_PORTS.discard(served.port)


@contextmanager
def _asyncio(app: App, opts: Options) -> Iterator[Served]:
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="asyncio-weir", daemon=True)
    thread.start()
    endpoint = EndpointConfig(allowed_hosts=LOOPBACK_HOSTS, json_response=True)
    kwargs: dict[str, Any] = {
        k: v
        for k, v in (
            ("max_sessions", opts.max_sessions),
            ("max_connections", opts.max_connections),
            ("idle_timeout", opts.idle_timeout),
            ("read_timeouts", opts.read_timeouts),
            ("in_progress_wait", opts.in_progress_wait),
            ("limits", opts.limits),
            ("session_retain_bytes", opts.retain_bytes),
        )
        if v is not None
    }
    if opts.tls:
        kwargs["ssl_context"] = pki().server_context(require_client_cert=opts.client_certs)
    driver = AsyncioDriver(app, endpoint, opts.credit, always_json=opts.json_response, **kwargs)
    if opts.retry_ms is not None:  # (no option of its own: the core's rule, set here)
        driver.post_rules = dataclasses.replace(driver.post_rules, retry_ms=opts.retry_ms)

    def probe(fn: Callable[[], Any]) -> Any:
        async def call() -> Any:
            return fn()

        return asyncio.run_coroutine_threadsafe(call(), loop).result(TIMEOUT)

    try:
        start = asyncio.start_server(driver.connection, "127.0.0.1", 0)
        server = asyncio.run_coroutine_threadsafe(start, loop).result(TIMEOUT)
        try:
            port = int(server.sockets[0].getsockname()[1])
            yield Served("asyncio", port, driver.sessions, probe, driver, loop.time)
        finally:

            async def stop() -> None:
                server.close()
                await asyncio.wait_for(server.wait_closed(), TIMEOUT)
                others = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
                for task in others:
                    task.cancel()
                await asyncio.wait_for(asyncio.gather(*others, return_exceptions=True), TIMEOUT)

            asyncio.run_coroutine_threadsafe(stop(), loop).result(TIMEOUT)
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(TIMEOUT)
        assert not thread.is_alive(), "the server's event loop did not stop"
        loop.close()


@contextmanager
def _trio(app: App, opts: Options) -> Iterator[Served]:
    settings: dict[str, Any] = {
        "port": 0,
        "shutdown_grace": 0,
        "json_response": opts.json_response,
        # The asyncio runtime's fixed number, so that both remember as many streams.
        "max_closed_streams": MAX_CLOSED_STREAMS,
    }
    for name, value in (
        ("credit", opts.credit),
        ("max_sessions", opts.max_sessions),
        ("max_connections", opts.max_connections),
        ("session_idle_timeout", opts.idle_timeout),
        ("session_retain_bytes", opts.retain_bytes),
        ("in_progress_wait", opts.in_progress_wait),
        ("retry_ms", opts.retry_ms),
        ("limits", opts.limits),
    ):
        if value is not None:
            settings[name] = value
    if opts.read_timeouts is not None:
        t = opts.read_timeouts
        settings.update(keepalive_timeout=t.keepalive, head_timeout=t.head, body_timeout=t.body)
    if opts.tls:
        settings["ssl_context"] = pki().server_context(require_client_cert=opts.client_certs)
    config = ServerConfig(**settings)
    started: queue.Queue[tuple[Server, trio.lowlevel.TrioToken] | BaseException] = queue.Queue()

    async def main() -> None:
        try:
            server = Server(app, config)
            async with trio.open_nursery() as nursery:
                await nursery.start(server.run)
                started.put((server, trio.lowlevel.current_trio_token()))
                await server.stopped.wait()
        except BaseException as exc:
            started.put(exc)
            raise

    thread = threading.Thread(target=trio.run, args=(main,), name="trio-weir", daemon=True)
    thread.start()
    first = started.get(timeout=TIMEOUT)
    if isinstance(first, BaseException):
        thread.join(TIMEOUT)
        raise first
    server, token = first

    def probe(fn: Callable[[], Any]) -> Any:
        # run_sync_soon, not trio.from_thread: the caller may itself be a Trio test.
        done: concurrent.futures.Future[Any] = concurrent.futures.Future()

        def run() -> None:
            try:
                done.set_result(fn())
            except Exception as exc:
                done.set_exception(exc)

        token.run_sync_soon(run)
        return done.result(TIMEOUT)

    try:
        yield Served("trio", server.port, server.sessions, probe, server, trio.current_time)
    finally:
        token.run_sync_soon(server.shutdown)
        thread.join(TIMEOUT)
        assert not thread.is_alive(), "the Trio server did not stop"
