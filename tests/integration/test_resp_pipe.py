"""The store's pipelined RESP connection, against a real Valkey."""

from __future__ import annotations

from urllib.parse import urlsplit

import coredis.exceptions as cx
import pytest
import trio

from weir.engine import RedisStore, StoreUnavailable
from weir.engine._resp import RespPipe, script_sha

from .conftest import ValkeyProcess


def _pipe(url: str, **kw: object) -> RespPipe:
    parts = urlsplit(url)
    assert parts.hostname is not None and parts.port is not None
    return RespPipe(parts.hostname, parts.port, timeout=1.0, **kw)  # type: ignore[arg-type]


async def test_concurrent_commands_share_one_connection_and_get_their_own_replies(
    valkey_url: str,
) -> None:
    pipe = _pipe(valkey_url)
    got: dict[int, object] = {}

    async def one(i: int) -> None:
        await pipe.call("SET", f"pipe:test:{i}", i)
        got[i] = await pipe.call("GET", f"pipe:test:{i}")

    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(pipe.run)
            await pipe.wait_up()
            async with trio.open_nursery() as calls:
                for i in range(300):
                    calls.start_soon(one, i)
            nursery.cancel_scope.cancel()
    assert got == {i: str(i).encode() for i in range(300)}
    assert pipe.commands == 600


async def test_a_caller_cancelled_mid_wait_does_not_shift_the_replies(valkey_url: str) -> None:
    pipe = _pipe(valkey_url)
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(pipe.run)
            await pipe.wait_up()
            with trio.move_on_after(0.05):  # BLPOP holds its reply for 0.3 s
                await pipe.call("BLPOP", "pipe:test:nothing", "0.3")
            # The next caller's reply is its own, not the abandoned BLPOP's.
            assert await pipe.call("ECHO", "mine") == b"mine"
            nursery.cancel_scope.cancel()


async def test_error_replies_raise_and_a_lost_script_is_loaded_again(valkey_url: str) -> None:
    pipe = _pipe(valkey_url)
    source = "return ARGV[1] .. '!'"
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(pipe.run)
            await pipe.wait_up()
            with pytest.raises(cx.ResponseError, match="unknown command"):
                await pipe.call("NO-SUCH-COMMAND")
            await pipe.call("SCRIPT", "FLUSH")
            assert await pipe.evalsha(source, script_sha(source), [], ["hi"]) == b"hi!"
            assert await pipe.call("EVALSHA", script_sha(source), 0, "again") == b"again!"
            nursery.cancel_scope.cancel()


async def test_a_frozen_server_fails_every_waiter_within_the_deadline(
    private_valkey: ValkeyProcess,
) -> None:
    pipe = _pipe(private_valkey.url)
    failures: list[BaseException] = []

    async def waiter() -> None:
        try:
            await pipe.call("PING")
        except cx.ConnectionError as exc:
            failures.append(exc)

    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(pipe.run)
            await pipe.wait_up()
            private_valkey.pause()
            try:
                start = trio.current_time()
                async with trio.open_nursery() as calls:
                    for _ in range(20):
                        calls.start_soon(waiter)
                waited = trio.current_time() - start
            finally:
                private_valkey.resume()
            assert len(failures) == 20 and waited < 3.0
            assert isinstance(pipe.failure, trio.TooSlowError)
            assert await pipe.call("PING") == b"PONG"  # reconnected on demand
            nursery.cancel_scope.cancel()


async def test_the_store_authenticates_the_pipe_from_the_url(
    private_valkey: ValkeyProcess,
) -> None:
    assert private_valkey.command("CONFIG", "SET", "requirepass", "s3cret") == b"+OK"
    base = private_valkey.url.removeprefix("redis://")
    good = f"redis://:s3cret@{base}"
    async with await RedisStore.connect(good, timeout=1.0) as store:
        assert store._pipe is not None and store._pipe.failure is None
        assert await store.get_session("p", "no-such-session") is None  # (read through it)
    with pytest.raises((StoreUnavailable, cx.AuthenticationError)):
        await RedisStore.connect(f"redis://:wrong@{base}", timeout=1.0)
