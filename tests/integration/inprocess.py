"""In-process replicas: several :class:`Server` objects, and stopping them together."""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import trio

from weir.engine import App, Server, ServerConfig
from weir.engine._redis_store import RedisStore


@asynccontextmanager
async def valkey_replicas(
    url: str, count: int, app: App, config: ServerConfig, *, label: str
) -> AsyncIterator[tuple[list[Server], RedisStore]]:
    """``count`` servers of ``app`` on one fresh key prefix (``weir-<label>-<hex>``),
    each with its own store connection; yields them and a store that reaches their
    keys.  They are shut down, and their connections closed, on the way out."""
    prefix = f"weir-{label}-{secrets.token_hex(4)}"
    async with trio.open_nursery() as nursery:
        stores = [await RedisStore.connect(url, prefix=prefix) for _ in range(count)]
        servers = [Server(app, config, store=s) for s in stores]
        for server in servers:
            await nursery.start(server.run)
        try:
            yield servers, stores[0]
        finally:
            await stop_servers(servers)
            for store in stores:
                await store.aclose()


async def stop_servers(servers: list[Server], timeout: float = 30.0) -> None:
    """Shut every server down at once, then wait (at most ``timeout`` s) until all stopped."""
    for server in servers:
        server.shutdown()
    with trio.fail_after(timeout):
        for server in servers:
            await server.stopped.wait()
