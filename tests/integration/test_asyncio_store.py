"""The asyncio runtime on a shared store (a real Valkey): it fails closed.

A local process never decides alone about shared state: when the store does not
answer, a request is 503 ``store_unavailable`` and nothing runs -- no new session, no
call -- and once the store is back the same requests are served.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

from weir.app import App
from weir.asyncio import AsyncioDriver
from weir.asyncio._redis_store import AsyncioRedisStore
from weir.engine._store_errors import StoreUnavailable
from weir.protocol import LOOPBACK_HOSTS, EndpointConfig

from .conftest import ValkeyProcess
from .test_asyncio_driver import TIMEOUT, Client

T = TypeVar("T")


@contextmanager
def driver_on(
    url: str, app: App, store_class: type[AsyncioRedisStore] = AsyncioRedisStore, **options: Any
) -> Iterator[int]:
    """An :class:`AsyncioDriver` (``options`` passed on) on an AsyncioRedisStore at
    ``url`` (store deadline 0.5 s), in a background loop; yields its port."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="asyncio-store", daemon=True)
    thread.start()

    def on_loop(work: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(work, loop).result(TIMEOUT)

    try:
        store = on_loop(store_class.connect(url, timeout=0.5, prefix="weir-aio-store"))
        endpoint = EndpointConfig(allowed_hosts=LOOPBACK_HOSTS, json_response=True)
        driver = AsyncioDriver(app, endpoint, store=store, **options)
        server = on_loop(asyncio.start_server(driver.connection, "127.0.0.1", 0))
        try:
            yield int(server.sockets[0].getsockname()[1])
        finally:

            async def stop() -> None:
                server.close()
                await driver.close_all()
                await store.aclose()

            on_loop(stop())
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(TIMEOUT)
        loop.close()


def test_with_the_store_down_nothing_runs_and_the_answer_is_503(
    private_valkey: ValkeyProcess,
) -> None:
    app = App("counting")
    runs: list[str] = []

    @app.tool()
    async def bump(key: str) -> str:
        """Count a run."""
        runs.append(key)
        return f"ran {len(runs)}"

    def refused_503(reply: Any) -> None:
        assert reply.status == 503, reply
        assert reply.json()["error"]["data"]["reason"] == "store_unavailable", reply.body
        assert "retry-after" in reply.headers

    with driver_on(private_valkey.url, app) as port, Client(port) as c:
        c.initialize()
        private_valkey.pause()
        try:
            refused_503(c.call("tools/call", {"name": "bump", "arguments": {"key": "a"}}))
            refused_503(c.call("ping"))
            with Client(port) as fresh:
                params = {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {}}
                refused_503(fresh.call("initialize", params))  # no session half-made
        finally:
            private_valkey.resume()
        assert runs == []
        reply = c.call("tools/call", {"name": "bump", "arguments": {"key": "a"}})
        assert reply.status == 200 and reply.message()["result"]["content"][0]["text"] == "ran 1"


class LosesAClaimReply(AsyncioRedisStore):
    """Grants the first claim in Valkey, then answers as a timed-out script would."""

    lost = False

    async def begin_call(self, *args: Any, **kwargs: Any) -> Any:
        start = await super().begin_call(*args, **kwargs)
        if not LosesAClaimReply.lost:
            LosesAClaimReply.lost = True
            raise StoreUnavailable("the reply was lost")
        return start


def test_a_claim_whose_reply_was_lost_is_given_back_and_the_retry_runs(
    private_valkey: ValkeyProcess,
) -> None:
    """As on Trio (tests/engine/test_channels.py): the 503 says nothing ran, the claim
    is given back on the next lease tick, and the retry runs the call once."""
    app = App("lost-reply")
    runs: list[str] = []

    @app.tool()
    async def bump(key: str) -> str:
        """Count a run."""
        runs.append(key)
        return f"ran {len(runs)}"

    call = {"jsonrpc": "2.0", "id": 7, "method": "tools/call"}
    call["params"] = {"name": "bump", "arguments": {"key": "a"}}
    with (
        driver_on(private_valkey.url, app, LosesAClaimReply, claim_lease=0.6) as port,
        Client(port) as c,
    ):
        c.initialize()
        headers = {
            "content-type": "application/json",
            "accept": "application/json, text/event-stream",
            "mcp-session-id": c.session_id or "",
            "mcp-protocol-version": c.version,
            "idempotency-key": "lost-1",
        }
        body = json.dumps(call).encode()
        first = c.request("POST", body, headers)
        assert first.status == 503, first
        assert first.json()["error"]["data"]["reason"] == "store_unavailable"
        for _ in range(100):  # given back within a few ticks of 0.2 s; bounded
            reply = c.request("POST", body, headers)
            if reply.status == 200:
                break
            assert reply.status == 409, reply  # in_progress until it is given back
            time.sleep(0.1)
        assert reply.status == 200 and reply.message()["result"]["content"][0]["text"] == "ran 1"
        again = c.request("POST", body, headers)
        assert again.message() == reply.message() and runs == ["a"]


def test_an_idle_session_is_expired_by_the_store_and_a_busy_one_is_not(
    private_valkey: ValkeyProcess,
) -> None:
    """The sweep asks the store (``expire_idle``, by its clock) about a session idle
    here: an idle one is deleted everywhere; one running a call past the idle
    timeout is touched while it runs, so it lives (no replica's sweep expires it)."""
    app = App("idle")
    release = threading.Event()

    @app.tool()
    async def hold() -> str:
        """Run until the test lets go."""
        while not release.is_set():
            await asyncio.sleep(0.02)
        return "held"

    probe = asyncio.new_event_loop()

    def on_store(op: Callable[[AsyncioRedisStore], Awaitable[Any]]) -> Any:
        async def run() -> Any:
            url = private_valkey.url
            async with await AsyncioRedisStore.connect(url, prefix="weir-aio-store") as store:
                assert isinstance(store, AsyncioRedisStore)
                return await op(store)

        return probe.run_until_complete(run())

    def record_of(sid: str) -> Any:
        return on_store(lambda store: store.get_session("anonymous", sid))

    try:
        with (
            driver_on(private_valkey.url, app, idle_timeout=0.4) as port,
            Client(port) as idle,
            Client(port) as busy,
        ):
            idle.initialize()
            busy.initialize()
            assert idle.session_id is not None and busy.session_id is not None
            assert record_of(idle.session_id) is not None
            outcome: list[Any] = []
            caller = threading.Thread(
                target=lambda: outcome.append(busy.call("tools/call", {"name": "hold"}))
            )
            caller.start()
            for _ in range(100):  # bounded: 10 s
                if record_of(idle.session_id) is None:
                    break
                threading.Event().wait(0.1)
            assert record_of(idle.session_id) is None  # idle everywhere: deleted
            assert record_of(busy.session_id) is not None  # running here: alive
            # Well past the idle timeout, another replica's sweep asks the store:
            # the busy session was touched while its call ran, so it lives.
            threading.Event().wait(1.5)  # (the store's clock: real time must pass)
            sid = busy.session_id
            gone = on_store(lambda store: store.expire_idle("anonymous", sid, 1.0, None))
            assert gone is False and record_of(sid) is not None
            release.set()
            caller.join(TIMEOUT)
            assert outcome and outcome[0].status == 200
    finally:
        release.set()
        probe.close()
