"""The asyncio runtime's pipelined RESP connection and store, against a real Valkey.

The twin of ``test_resp_pipe.py``: the same promises, kept on an asyncio loop.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar
from urllib.parse import urlsplit

import coredis.exceptions as cx
import pytest

from weir.asyncio._redis_store import AsyncioRedisStore
from weir.asyncio._resp import AsyncioRespPipe
from weir.engine import StoreUnavailable
from weir.engine._resp import script_sha
from weir.protocol.gate import CallOutcome

from .conftest import ValkeyProcess

T = TypeVar("T")


def _pipe(url: str) -> AsyncioRespPipe:
    parts = urlsplit(url)
    assert parts.hostname is not None and parts.port is not None
    return AsyncioRespPipe(parts.hostname, parts.port, timeout=1.0)


def _run(main: Coroutine[Any, Any, T]) -> T:
    async def bounded() -> T:
        async with asyncio.timeout(20):
            return await main

    return asyncio.run(bounded())


def test_concurrent_commands_share_one_connection_and_get_their_own_replies(
    valkey_url: str,
) -> None:
    pipe = _pipe(valkey_url)
    got: dict[int, object] = {}

    async def one(i: int) -> None:
        await pipe.call("SET", f"apipe:test:{i}", i)
        got[i] = await pipe.call("GET", f"apipe:test:{i}")

    async def main() -> None:
        runner = asyncio.create_task(pipe.run())
        await pipe.wait_up()
        await asyncio.gather(*(one(i) for i in range(300)))
        runner.cancel()
        await asyncio.gather(runner, return_exceptions=True)

    _run(main())
    assert got == {i: str(i).encode() for i in range(300)}
    assert pipe.commands == 600


def test_a_caller_cancelled_mid_wait_does_not_shift_the_replies(valkey_url: str) -> None:
    pipe = _pipe(valkey_url)

    async def main() -> None:
        runner = asyncio.create_task(pipe.run())
        await pipe.wait_up()
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.05):  # BLPOP holds its reply for 0.3 s
                await pipe.call("BLPOP", "apipe:test:nothing", "0.3")
        assert await pipe.call("ECHO", "mine") == b"mine"  # its own reply, not BLPOP's
        source = "return ARGV[1] .. '!'"
        with pytest.raises(cx.ResponseError, match="unknown command"):
            await pipe.call("NO-SUCH-COMMAND")
        await pipe.call("SCRIPT", "FLUSH")
        assert await pipe.evalsha(source, script_sha(source), [], ["hi"]) == b"hi!"
        runner.cancel()
        await asyncio.gather(runner, return_exceptions=True)

    _run(main())


def test_a_frozen_server_fails_every_waiter_within_the_deadline(
    private_valkey: ValkeyProcess,
) -> None:
    pipe = _pipe(private_valkey.url)

    async def main() -> tuple[list[BaseException | object], float]:
        runner = asyncio.create_task(pipe.run())
        await pipe.wait_up()
        loop = asyncio.get_running_loop()
        private_valkey.pause()
        try:
            start = loop.time()
            outcomes = await asyncio.gather(
                *(pipe.call("PING") for _ in range(20)), return_exceptions=True
            )
            waited = loop.time() - start
        finally:
            private_valkey.resume()
        assert await pipe.call("PING") == b"PONG"  # reconnected on demand
        runner.cancel()
        await asyncio.gather(runner, return_exceptions=True)
        return outcomes, waited

    outcomes, waited = _run(main())
    assert all(isinstance(o, cx.ConnectionError) for o in outcomes) and waited < 3.0


def test_the_store_runs_on_asyncio_through_its_pipe_and_fails_closed(
    private_valkey: ValkeyProcess,
) -> None:
    """The asyncio store answers through its pipe; a frozen server is
    StoreUnavailable within the deadline, and a wrong password refuses to connect."""
    assert private_valkey.command("CONFIG", "SET", "requirepass", "s3cret") == b"+OK"
    base = private_valkey.url.removeprefix("redis://")

    async def main() -> None:
        store = await AsyncioRedisStore.connect(f"redis://:s3cret@{base}", timeout=1.0)
        assert isinstance(store, AsyncioRedisStore)
        try:
            assert isinstance(store._pipe, AsyncioRespPipe) and store._pipe.failure is None
            assert await store.get_session("p", "no-such-session") is None
            private_valkey.pause()
            try:
                with pytest.raises(StoreUnavailable):
                    await store.begin_call("p", "no-such-session", "k", b"fp", None)
            finally:
                private_valkey.resume()
            start = await asyncio.wait_for(_retrying_begin(store), 5)
            assert start is None  # the session does not exist: SessionGone after recovery
        finally:
            await store.aclose()
        with pytest.raises((StoreUnavailable, cx.AuthenticationError)):
            await AsyncioRedisStore.connect(f"redis://:wrong@{base}", timeout=1.0)

    _run(main())


async def _retrying_begin(store: AsyncioRedisStore) -> CallOutcome | None:
    """begin_call until the store answers again (bounded by the caller)."""
    from weir.engine._store_errors import SessionGone

    for _ in range(100):
        try:
            return (await store.begin_call("p", "no-such-session", "k", b"fp", None)).outcome
        except SessionGone:
            return None
        except StoreUnavailable:
            await asyncio.sleep(0.05)
    raise AssertionError("the store never came back")
