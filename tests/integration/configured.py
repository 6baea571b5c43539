"""Serving one app, in-process, on either runtime, configured by a ``ServerConfig``,
from a Trio test.

(:mod:`tests.integration.runtimes` serves from any test, sync ones included, and
reads the server's state on its own loop; this one configures both runtimes the way
``weir serve`` does, authorization and the drain included.)

:func:`serve_configured` starts ``app`` with a :class:`~weir.engine.ServerConfig` on a
loopback port and yields the port: on ``"trio"`` a :class:`~weir.engine.Server`
in the test's own nursery; on ``"asyncio"`` the asyncio runtime, configured from
that same ``ServerConfig`` as ``weir serve --runtime asyncio`` configures it
(:func:`~weir.engine._cli_asyncio.asyncio_config`), with its own event loop in a
thread of its own.  The two loops only meet over loopback sockets, so a test
talks to either with the same raw client.  Tests parametrised with
:data:`~tests.integration.runtimes.RUNTIMES` run once per runtime.
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import threading
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass

import trio

from weir.app import App
from weir.asyncio import AsyncioConfig
from weir.asyncio._drain import drain
from weir.asyncio._run import with_declared_auth
from weir.engine import Server, ServerConfig
from weir.engine._cli_asyncio import asyncio_config
from weir.engine._memory_store import MemoryStore

from .runtimes import RUNTIMES

__all__ = ["RUNTIMES", "Running", "run_configured", "serve_configured"]


@dataclass
class Running:
    """A server started by :func:`run_configured`: its port, and how to stop it."""

    port: int
    #: Begin a graceful shutdown (returns at once; the server drains, then stops).
    shutdown: Callable[[], None]
    #: Wait until it has stopped.
    stopped: Callable[[], Awaitable[object]]


@asynccontextmanager
async def serve_configured(
    runtime: str, app: App, config: ServerConfig, store: MemoryStore | None = None
) -> AsyncIterator[int]:
    """``app`` served with ``config`` (its port: 0, a free one) on ``runtime``; the port.
    Stopped on the way out (within 30 s)."""
    async with run_configured(runtime, app, config, store) as server:
        yield server.port


@asynccontextmanager
async def run_configured(
    runtime: str, app: App, config: ServerConfig, store: MemoryStore | None = None
) -> AsyncIterator[Running]:
    """``app`` served with ``config`` on ``runtime`` (on ``store``, which the test may
    then look into; default: the runtime's own); stopped (if the test did not) on
    the way out, within 30 s."""
    if runtime == "trio":
        async with trio.open_nursery() as nursery:
            server = await nursery.start(Server(app, config, store=store).run)
            try:
                yield Running(server.port, server.shutdown, server.stopped.wait)
            finally:
                server.shutdown()
                with trio.fail_after(30):
                    await server.stopped.wait()
                nursery.cancel_scope.cancel()
        return
    assert runtime == "asyncio", runtime
    served = with_declared_auth(app, asyncio_config(config, 30.0))
    async with _asyncio_thread(app, served, store) as run:
        yield run


@asynccontextmanager
async def _asyncio_thread(
    app: App, config: AsyncioConfig, store: MemoryStore | None
) -> AsyncIterator[Running]:
    """As :func:`weir.asyncio.run` serves (its lifespan, its drain at shutdown), in a
    thread of its own (so without its signal handlers)."""
    ready: queue.Queue[int | BaseException] = queue.Queue()
    control: list[tuple[asyncio.AbstractEventLoop, asyncio.Event]] = []

    async def main() -> None:
        stop = asyncio.Event()
        control.append((asyncio.get_running_loop(), stop))
        async with contextlib.AsyncExitStack() as stack:
            state = await stack.enter_async_context(app.lifespan_context())
            driver = config.driver(app, state, store)
            server = await asyncio.start_server(driver.connection, config.host, config.port)
            ready.put(server.sockets[0].getsockname()[1])
            try:
                await stop.wait()
            finally:
                server.close()
                await drain(driver, config.shutdown_grace)
                await driver.close_all()

    def thread() -> None:
        try:
            asyncio.run(main())
        except BaseException as exc:
            ready.put(exc)

    worker = threading.Thread(target=thread, name="asyncio-runtime", daemon=True)
    worker.start()
    got = await trio.to_thread.run_sync(lambda: ready.get(timeout=30))
    if isinstance(got, BaseException):
        raise got

    def shutdown() -> None:
        loop, stop = control[0]
        with contextlib.suppress(RuntimeError):  # (already stopped: its loop is closed)
            loop.call_soon_threadsafe(stop.set)

    async def stopped() -> None:
        await trio.to_thread.run_sync(lambda: worker.join(30))
        assert not worker.is_alive(), "the asyncio runtime did not stop within 30 s"

    try:
        yield Running(got, shutdown, stopped)
    finally:
        shutdown()
        await stopped()
