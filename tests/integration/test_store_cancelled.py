"""A store operation cancelled while the store client reconnects is cancelled -- not
an outage.

Cancelled in the middle of a reconnection (its handshake waiting for a frozen
Valkey), the store client library raises a connection error instead of Trio's
cancellation, and logs an ERROR.  CI once caught it at shutdown: the change bus's
reader, cancelled with the server, reported ``store lost`` after the drain.  The
Trio runtime's store wrapper now lets the cancellation go on (and ``weir serve``
drops the library's report of it: ``tests/engine/test_library_logs.py``).  On
asyncio the library raised the cancellation already; the same scenario checks it.

A real Valkey of the test's own: stopped (the client's connection breaks), started
again frozen (``SIGSTOP``: the reconnection's handshake waits), then the operation
is cancelled by the caller's own deadline, well before the store's.
"""

from __future__ import annotations

import asyncio

import pytest
import trio

from weir.asyncio import AsyncioRedisStore
from weir.engine._redis_store import RedisStore
from weir.engine._store_errors import StoreUnavailable

from .conftest import ValkeyProcess

#: The store's own deadline, and the caller's (shorter: the caller cancels first).
STORE_TIMEOUT, CALLER_TIMEOUT = 5.0, 0.5


async def test_trio_a_cancelled_operation_is_cancelled_while_the_client_reconnects(
    private_valkey: ValkeyProcess,
) -> None:
    store = await RedisStore.connect(private_valkey.url, prefix="cancel", timeout=STORE_TIMEOUT)
    try:
        await store.read_changes(None)
        private_valkey.stop()
        with pytest.raises(StoreUnavailable):  # (the broken connection: an outage)
            await store.read_changes(None)
        private_valkey.start()
        private_valkey.pause()
        with trio.move_on_after(CALLER_TIMEOUT) as caller:
            await store.read_changes(None)  # reconnects: its handshake waits
        assert caller.cancelled_caught  # cancelled, not StoreUnavailable
        private_valkey.resume()
        with trio.fail_after(STORE_TIMEOUT):
            await store.read_changes(None)  # and the client still works
        assert not store.health.down
    finally:
        private_valkey.resume()
        await store.aclose()


def test_asyncio_a_cancelled_operation_is_cancelled_while_the_client_reconnects(
    private_valkey: ValkeyProcess,
) -> None:
    async def scenario() -> None:
        store = await AsyncioRedisStore.connect(
            private_valkey.url, prefix="cancel", timeout=STORE_TIMEOUT
        )
        try:
            await store.read_changes(None)
            private_valkey.stop()
            with pytest.raises(StoreUnavailable):
                await store.read_changes(None)
            private_valkey.start()
            private_valkey.pause()
            with pytest.raises(TimeoutError):  # the caller's deadline, not StoreUnavailable
                async with asyncio.timeout(CALLER_TIMEOUT):
                    await store.read_changes(None)
            private_valkey.resume()
            async with asyncio.timeout(STORE_TIMEOUT):
                await store.read_changes(None)
            assert not store.health.down
        finally:
            private_valkey.resume()
            await store.aclose()

    asyncio.run(scenario())
