"""A client's ``DELETE`` ends its session here at once, on both runtimes.

Removing the asyncio runtime's local teardown after the store's delete failed no test:
the next request was still 404 (the lookup finds no record), so nothing noticed that
the session lived on in this process, its close hooks not run.  Real loopback sockets;
the hook signals a ``threading.Event``, so nothing sleeps.
"""

from __future__ import annotations

import threading

from weir.app import App

from .runtimes import RUNTIMES, TIMEOUT, serving
from .test_asyncio_driver import Client


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
