"""The ceiling: the least a Trio + h11 server must do to answer the benchmark's requests.

It answers exactly what :mod:`benchmarks.fanout` sends -- ``initialize``,
``notifications/initialized`` and ``tools/call`` of ``echo`` -- in the same wire
format as weir's SSE mode:

* ``initialize`` -> ``200 application/json`` with a new ``Mcp-Session-Id``;
* a notification -> ``202``;
* ``tools/call`` -> ``200 text/event-stream`` (chunked), one ``id:``/``data:`` event
  carrying the JSON-RPC result, then the end of the stream; with ``--json-response``
  one ``application/json`` body instead.

With ``MCP-Protocol-Version: 2026-07-28`` (``fanout --sessionless``) there is no
session: ``server/discover`` gets a fixed result, and ``tools/call`` the same stream
without an event id, its result carrying ``resultType``.

A request naming an unknown session gets 404.  There is nothing else: no Host or
Origin checks, no version negotiation, no idempotency gate, no drain credit, no
event log, no separate handler tasks.  It is what weir is compared against: the
difference in server CPU per call is the price of weir's MCP machinery.  What it
answers is shared with :mod:`benchmarks.floor` (:mod:`benchmarks._answers`), which
frames HTTP by hand: the difference between those two is h11's price.

``python -m benchmarks.ceiling [--port 0] [--json-response]`` prints
``ceiling: serving http://HOST:PORT/PATH`` first on stdout.
"""

from __future__ import annotations

import h11
import trio

from ._answers import REASONS, Answer, Answers, run_server

_RECV = 65536
_IDLE = 75.0


class Ceiling:
    """The minimal server (see the module docstring)."""

    def __init__(self, path: str, json_response: bool) -> None:
        self.answers = Answers(path.encode(), json_response)

    async def connection(self, stream: trio.SocketStream) -> None:
        """Serve one keep-alive connection until the peer closes it."""
        conn = h11.Connection(h11.SERVER)
        body = bytearray()
        request: h11.Request | None = None
        try:
            while True:
                event = conn.next_event()
                if event is h11.NEED_DATA:
                    with trio.move_on_after(_IDLE):
                        conn.receive_data(await stream.receive_some(_RECV))
                        continue
                    return
                if isinstance(event, h11.Request):
                    request = event
                    body.clear()
                elif isinstance(event, h11.Data):
                    body += event.data
                elif isinstance(event, h11.EndOfMessage) and request is not None:
                    await stream.send_all(self.respond(conn, request, bytes(body)))
                    if conn.our_state is not h11.DONE:
                        return
                    conn.start_next_cycle()
                else:  # ConnectionClosed, or PAUSED after a bad cycle
                    return
        except (h11.RemoteProtocolError, trio.BrokenResourceError, trio.ClosedResourceError):
            return
        finally:
            await stream.aclose()

    def respond(self, conn: h11.Connection, request: h11.Request, body: bytes) -> bytes:
        """The complete response to one request, as bytes."""
        sid = version = b""
        for name, value in request.headers:
            if name == b"mcp-session-id":
                sid = value
            elif name == b"mcp-protocol-version":
                version = value
        return _frame(conn, self.answers.answer(request.method, request.target, sid, version, body))


def _frame(conn: h11.Connection, a: Answer) -> bytes:
    headers: list[tuple[bytes, bytes]] = []
    if a.ctype:
        headers.append((b"content-type", a.ctype))
    if a.event:
        headers.append((b"cache-control", b"no-cache"))
    else:
        headers.append((b"content-length", b"%d" % len(a.body)))
    if a.sid:
        headers.append((b"mcp-session-id", a.sid))
    head = conn.send(h11.Response(status_code=a.status, headers=headers, reason=REASONS[a.status]))
    data = conn.send(h11.Data(data=a.body)) if a.body else b""
    return (head or b"") + (data or b"") + (conn.send(h11.EndOfMessage()) or b"")


def main(argv: list[str] | None = None) -> None:
    """``python -m benchmarks.ceiling``."""
    run_server(
        "ceiling",
        __doc__.split("\n")[0],
        lambda path, json_response: Ceiling(path, json_response).connection,
        argv,
    )


if __name__ == "__main__":
    main()
