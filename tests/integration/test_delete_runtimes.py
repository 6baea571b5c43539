"""A client's ``DELETE`` on both runtimes: it ends its session here at once, and its
channel token binds the session even when the store fails to delete it.

Removing the asyncio runtime's local teardown after the store's delete failed no test:
the next request was still 404 (the lookup finds no record), so nothing noticed that
the session lived on in this process, its close hooks not run.  Real loopback sockets;
the hook signals a ``threading.Event``, so nothing sleeps.

A ``DELETE`` that is the first request to present the session's channel token binds
the session (from then on its ``DELETE`` and GET streams need the token) before the
session ends.  Normally the session ends in the same request, so the binding is never
seen again; it is when the store fails the delete (503): the session lives on, and
must be bound -- a ``DELETE`` without the token is refused 409 ``channel_unbound``,
not allowed to end a session whose client uses a token.  A real Valkey; the failed
delete is injected (the store subclass refuses one ``delete_session``).
"""

from __future__ import annotations

import secrets
import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import trio

from weir.app import App
from weir.asyncio._redis_store import AsyncioRedisStore
from weir.engine import Server, ServerConfig
from weir.engine._redis_store import RedisStore
from weir.engine._store_errors import StoreUnavailable

from .rawhttp import Client as RawClient
from .runtimes import RUNTIMES, TIMEOUT, serving
from .test_asyncio_driver import Client
from .test_asyncio_store import driver_on
from .test_channel_runtimes import HDR, INIT, NOTE, TOKEN, make_app, refused, send


@RUNTIMES
def test_delete_ends_the_session_here_and_runs_its_close_hooks(runtime: str) -> None:
    app = App("deletes")
    closed: list[str] = []
    ended = threading.Event()

    @app.on_session_close
    async def on_close(session_id: str) -> None:
        closed.append(session_id)
        ended.set()

    with serving(runtime, app) as served, Client(served.port) as c:
        c.initialize()
        sid = str(c.session_id)
        assert served.has_session(sid)
        headers = {"mcp-session-id": sid, "mcp-protocol-version": c.version}
        deleted = c.request("DELETE", b"", headers)
        assert deleted.status == 200
        # Gone from this process as the 200 is sent, not at the next request.
        assert not served.has_session(sid)
        assert ended.wait(TIMEOUT)
        assert closed == [sid]
        again = c.call("tools/list")
        assert again.status == 404


#: Armed: the next ``delete_session`` of either store below fails.
_FAIL_A_DELETE: list[str] = []


def _lose_a_delete() -> None:
    if _FAIL_A_DELETE:
        _FAIL_A_DELETE.clear()
        raise StoreUnavailable("injected: the delete did not reach the store")


class _TrioStoreLosingADelete(RedisStore):
    async def delete_session(self, principal: str, session_id: str) -> bool:
        _lose_a_delete()
        return await super().delete_session(principal, session_id)


class _AsyncioStoreLosingADelete(AsyncioRedisStore):
    async def delete_session(self, principal: str, session_id: str) -> bool:
        _lose_a_delete()
        return await super().delete_session(principal, session_id)


@asynccontextmanager
async def _on_valkey(runtime: str, app: App, url: str) -> AsyncIterator[int]:
    """``app`` served by ``runtime`` in this process on Valkey at ``url`` (through a
    store that fails the delete :data:`_FAIL_A_DELETE` arms); its port."""
    if runtime == "asyncio":
        with driver_on(url, app, store_class=_AsyncioStoreLosingADelete) as port:
            yield port
        return
    prefix = f"weir-delete-{secrets.token_hex(4)}"
    async with (
        await _TrioStoreLosingADelete.connect(url, prefix=prefix) as store,
        trio.open_nursery() as nursery,
    ):
        server = Server(app, ServerConfig(port=0), store=store)
        await nursery.start(server.run)
        try:
            yield server.port
        finally:
            server.shutdown()
            await server.stopped.wait()


@RUNTIMES
async def test_a_delete_the_store_failed_still_binds_the_session_to_its_token(
    runtime: str, valkey_url: str
) -> None:
    """The first request to present the session's channel token is a ``DELETE`` the
    store fails (503 ``store_unavailable``): the session lives on, bound to its token
    -- a ``DELETE`` without it is refused 409 ``channel_unbound`` -- and the token's
    ``DELETE`` ends it."""
    app, _ = make_app()
    with trio.fail_after(30):
        async with _on_valkey(runtime, app, valkey_url) as port:
            c = await RawClient.connect(port)
            init = await c.request("POST", "/mcp", INIT, headers=HDR)
            assert init.status == 200, init
            sid, token = init.headers["mcp-session-id"], init.headers[TOKEN]
            note = await c.request("POST", "/mcp", NOTE, session=sid, headers=HDR)
            assert note.status == 202, note
            await c.aclose()

            _FAIL_A_DELETE.append("armed")
            failed = await send(port, "DELETE", sid, token=token)
            assert not _FAIL_A_DELETE, "the DELETE never asked the store to delete"
            assert failed.status == 503 and failed.reason == "store_unavailable", failed

            refused(await send(port, "DELETE", sid), "channel_unbound")
            assert (await send(port, "DELETE", sid, token=token)).status == 200
            assert (await send(port, "DELETE", sid, token=token)).status == 404
