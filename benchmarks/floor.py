"""The floor: the benchmark's requests answered by Trio with HTTP framed by hand.

weir's HTTP fast path does not go through h11 for usual requests, so an h11
server (:mod:`benchmarks.ceiling`) is not the least a server can spend.  This one
answers exactly what the ceiling answers (:mod:`benchmarks._answers`), but reads a
request by finding the end of its head, picking out ``Content-Length``,
``Mcp-Session-Id``, ``MCP-Protocol-Version`` and ``Connection``, and writes the
response's bytes directly: a ``Content-Length`` body, or one SSE event in one
chunk followed by the last chunk.  It is correct for what the benchmark sends
(HTTP/1.1 keep-alive POSTs with ``Content-Length``) and refuses anything else
with 400 and a close; it is not a general HTTP server, and does no MCP checks.

The floor is what weir is compared against for "what is left of the per-call cost
once the socket and the JSON are paid for".

``python -m benchmarks.floor [--port 0] [--json-response]`` prints
``floor: serving http://HOST:PORT/PATH`` first on stdout.
"""

from __future__ import annotations

import trio

from ._answers import REASONS, Answer, Answers, run_server

_RECV = 65536
_IDLE = 75.0
_MAX_HEAD = 16384
_MAX_BODY = 1 << 20
_BAD_REQUEST = b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"


class Floor:
    """The hand-framed minimal server (see the module docstring)."""

    def __init__(self, path: str, json_response: bool) -> None:
        self.answers = Answers(path.encode(), json_response)

    async def connection(self, stream: trio.SocketStream) -> None:
        """Serve one keep-alive connection until the peer closes it or errs."""
        buf = bytearray()
        try:
            while True:
                end = buf.find(b"\r\n\r\n")
                while end < 0:
                    if len(buf) > _MAX_HEAD:
                        await stream.send_all(_BAD_REQUEST)
                        return
                    with trio.move_on_after(_IDLE):
                        data = await stream.receive_some(_RECV)
                    if not data:
                        return
                    buf += data
                    end = buf.find(b"\r\n\r\n")
                parsed = _head(bytes(buf[:end]))
                if parsed is None:
                    await stream.send_all(_BAD_REQUEST)
                    return
                method, target, length, sid, version, close = parsed
                start = end + 4
                while len(buf) < start + length:
                    data = await stream.receive_some(_RECV)
                    if not data:
                        return
                    buf += data
                body = bytes(buf[start : start + length])
                del buf[: start + length]
                answer = self.answers.answer(method, target, sid, version, body)
                await stream.send_all(_frame(answer, close))
                if close:
                    return
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            return
        finally:
            await stream.aclose()


def _head(head: bytes) -> tuple[bytes, bytes, int, bytes, bytes, bool] | None:
    """Method, target, body length, session id, version and close-after of one head."""
    lines = head.split(b"\r\n")
    parts = lines[0].split(b" ")
    if len(parts) != 3 or parts[2] != b"HTTP/1.1":
        return None
    length, sid, version, close = 0, b"", b"", False
    for line in lines[1:]:
        name, sep, value = line.partition(b":")
        if not sep:
            return None
        name = name.lower()
        if name == b"content-length":
            try:
                length = int(value)
            except ValueError:
                return None
            if not 0 <= length <= _MAX_BODY:
                return None
        elif name == b"mcp-session-id":
            sid = value.strip()
        elif name == b"mcp-protocol-version":
            version = value.strip()
        elif name == b"connection":
            close = value.strip().lower() == b"close"
        elif name == b"transfer-encoding":
            return None  # the benchmark never sends a chunked body
    return parts[0], parts[1], length, sid, version, close


def _frame(a: Answer, close: bool) -> bytes:
    head = [b"HTTP/1.1 %d %s\r\n" % (a.status, REASONS[a.status])]
    if a.ctype:
        head.append(b"content-type: %s\r\n" % a.ctype)
    if a.sid:
        head.append(b"mcp-session-id: %s\r\n" % a.sid)
    if close:
        head.append(b"connection: close\r\n")
    if a.event:
        head.append(b"cache-control: no-cache\r\ntransfer-encoding: chunked\r\n\r\n")
        head.append(b"%x\r\n%s\r\n0\r\n\r\n" % (len(a.body), a.body))
    else:
        head.append(b"content-length: %d\r\n\r\n" % len(a.body))
        head.append(a.body)
    return b"".join(head)


def main(argv: list[str] | None = None) -> None:
    """``python -m benchmarks.floor``."""
    run_server(
        "floor",
        __doc__.split("\n")[0],
        lambda path, json_response: Floor(path, json_response).connection,
        argv,
    )


if __name__ == "__main__":
    main()
