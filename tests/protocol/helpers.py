"""Shared helpers for the pure-core tests (no trio here, ever).

* Request builders: canonical HTTP/1.1 request bytes, and ready-made
  :class:`weir.protocol.HttpRequest` objects for :func:`weir.protocol.route`.
* Feeding: drive an :class:`weir.protocol.HttpConnection` with the input whole, byte by
  byte or in arbitrary chunks, answering every request as it arrives, and collect
  the events and every byte the connection wrote (h11's ``t_body_reader`` pattern).
* Reading back: :func:`parse_responses` parses what the server wrote with a real
  ``h11.Connection(h11.CLIENT)``, so "valid HTTP" means "h11 accepts it".
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import h11
import msgspec

from weir.protocol import (
    NEED_DATA,
    ConnectionClosed,
    HttpConnection,
    HttpError,
    HttpRequest,
    RemoteProtocolError,
)
from weir.protocol._http_events import Headers

Event = HttpRequest | HttpError | ConnectionClosed
Answer = Callable[[HttpConnection, HttpRequest], bytes]

# ----------------------------------------------------------------------------- bytes


def request_bytes(
    method: str,
    target: str = "/mcp",
    headers: Sequence[tuple[str, str]] = (("Host", "localhost"),),
    body: bytes = b"",
    *,
    chunked: bool = False,
    chunk_size: int = 3,
) -> bytes:
    """A canonical HTTP/1.1 request (``Name: value`` lines, CRLF endings).

    With ``chunked`` the body is sent with ``Transfer-Encoding: chunked`` in
    chunks of ``chunk_size`` bytes; otherwise a ``Content-Length`` is added when
    there is a body (or the method is POST).
    """
    head = f"{method} {target} HTTP/1.1\r\n".encode()
    for name, value in headers:
        head += f"{name}: {value}\r\n".encode("latin-1")
    if chunked:
        head += b"Transfer-Encoding: chunked\r\n\r\n"
        out = head
        for i in range(0, len(body), chunk_size):
            piece = body[i : i + chunk_size]
            out += b"%x\r\n%s\r\n" % (len(piece), piece)
        return out + b"0\r\n\r\n"
    has_length = any(n.lower() == "content-length" for n, _ in headers)
    if (body or method == "POST") and not has_length:
        head += b"Content-Length: %d\r\n" % len(body)
    return head + b"\r\n" + body


def bytewise(data: bytes) -> list[bytes]:
    """``data`` as one-byte chunks."""
    return [data[i : i + 1] for i in range(len(data))]


def split_at(data: bytes, cuts: Iterable[int]) -> list[bytes]:
    """``data`` cut at the given offsets (duplicates and out-of-range ignored)."""
    bounds = [0, *sorted({c for c in cuts if 0 < c < len(data)}), len(data)]
    return [data[a:b] for a, b in itertools.pairwise(bounds)]


# ----------------------------------------------------------------------------- feeding


@dataclass
class Transcript:
    """What one connection did: its events (NEED_DATA dropped) and bytes written."""

    events: list[Event]
    output: bytes

    @property
    def requests(self) -> list[HttpRequest]:
        return [e for e in self.events if isinstance(e, HttpRequest)]


def default_answer(conn: HttpConnection, request: HttpRequest) -> bytes:
    """Answer every request with a small JSON response."""
    return conn.send_response(200, [("content-type", "application/json")], b'{"ok":true}')


def feed(
    chunks: Iterable[bytes],
    *,
    conn: HttpConnection | None = None,
    eof: bool = True,
    answer: Answer | None = default_answer,
) -> Transcript:
    """Feed ``chunks`` one at a time, pulling events after each.

    Every :class:`HttpRequest` is answered at once with ``answer(conn, request)``
    (pass ``answer=None`` to leave requests unanswered).  With ``eof`` an EOF is
    fed at the end.  Pulling stops at :class:`ConnectionClosed`.
    """
    conn = conn if conn is not None else HttpConnection()
    events: list[Event] = []
    out = bytearray()

    def pull() -> bool:
        while True:
            ev = conn.next_event()
            out.extend(conn.data_to_send())
            if ev is NEED_DATA:
                return False
            assert not isinstance(ev, type(NEED_DATA))
            events.append(ev)
            if isinstance(ev, ConnectionClosed):
                return True
            if isinstance(ev, HttpRequest) and answer is not None:
                out.extend(answer(conn, ev))

    for chunk in chunks:
        conn.receive_data(chunk)
        if pull():
            return Transcript(events, bytes(out))
    if eof:
        conn.receive_data(b"")
        pull()
    return Transcript(events, bytes(out))


def feed_whole(data: bytes, **kw: Any) -> Transcript:
    return feed([data], **kw)


def feed_bytewise(data: bytes, **kw: Any) -> Transcript:
    return feed(bytewise(data), **kw)


def feed_both(data: bytes, **kw: Any) -> Transcript:
    """Feed ``data`` whole and byte by byte (fresh connections built from ``kw``).

    Asserts that both give the same events and the same output; returns one.
    ``kw`` may hold ``limits`` (an :class:`weir.protocol.HttpLimits`), ``eof`` and
    ``answer``.
    """
    limits = kw.pop("limits", None)
    whole = feed_whole(data, conn=HttpConnection(limits), **kw)
    trickled = feed_bytewise(data, conn=HttpConnection(limits), **kw)
    assert trickled.events == whole.events
    assert trickled.output == whole.output
    return whole


# ----------------------------------------------------------------------------- parsing


@dataclass
class ParsedResponse:
    """One response as an h11 client saw it."""

    status: int
    headers: list[tuple[str, str]]
    body: bytes
    keep_alive: bool

    def header(self, name: str) -> str | None:
        values = [v for n, v in self.headers if n == name]
        return ", ".join(values) if values else None

    def json(self) -> Any:
        return msgspec.json.decode(self.body)


def parse_responses(data: bytes) -> list[ParsedResponse]:
    """Parse every response in ``data`` with an h11 client; no bytes may be left over.

    Raises:
        h11.RemoteProtocolError: if ``data`` is not valid HTTP/1.1 responses.
    """
    client = h11.Connection(h11.CLIENT)
    client.receive_data(data)
    out: list[ParsedResponse] = []
    while client.trailing_data[0]:
        client.send(h11.Request(method="GET", target="/", headers=[("host", "x")]))
        client.send(h11.EndOfMessage())
        ev = client.next_event()
        assert isinstance(ev, h11.Response), ev
        body = b""
        while True:
            part = client.next_event()
            if isinstance(part, h11.Data):
                body += part.data
                continue
            assert isinstance(part, h11.EndOfMessage), part
            break
        keep_alive = client.their_state is h11.DONE
        out.append(
            ParsedResponse(
                status=ev.status_code,
                headers=[(n.decode(), v.decode("latin-1")) for n, v in ev.headers],
                body=body,
                keep_alive=keep_alive,
            )
        )
        if not keep_alive:
            # The server said it closes after this response: nothing may follow.
            assert client.trailing_data[0] == b"", client.trailing_data
            return out
        client.start_next_cycle()
    return out


def parse_response(data: bytes) -> ParsedResponse:
    """Parse exactly one response."""
    responses = parse_responses(data)
    assert len(responses) == 1, responses
    return responses[0]


def error_reason(resp: ParsedResponse) -> str:
    """``error.data.reason`` of a JSON-RPC error body."""
    body = resp.json()
    assert body["jsonrpc"] == "2.0"
    reason = body["error"]["data"]["reason"]
    assert isinstance(reason, str)
    return reason


# ----------------------------------------------------------------------------- routing

HOST = "localhost:8000"
ACCEPT_BOTH = "application/json, text/event-stream"
SESSION = "sess-1"
INIT = (
    b'{"jsonrpc":"2.0","id":1,"method":"initialize","params":'
    b'{"protocolVersion":"2025-06-18","capabilities":{},'
    b'"clientInfo":{"name":"t","version":"0"}}}'
)
PING = b'{"jsonrpc":"2.0","id":7,"method":"ping"}'


def http_request(
    method: str,
    body: bytes = b"",
    *,
    target: str = "/mcp",
    headers: Mapping[str, str | None] | None = None,
    defaults: Mapping[str, str] | None = None,
) -> HttpRequest:
    """An :class:`HttpRequest`; ``headers`` override ``defaults`` (None removes one)."""
    merged: dict[str, str | None] = dict(defaults or {})
    merged.update(headers or {})
    raw = [(k.lower().encode(), v.encode("latin-1")) for k, v in merged.items() if v is not None]
    return HttpRequest(method=method, target=target, headers=Headers.from_raw(raw), body=body)


def post(
    body: bytes = PING,
    *,
    session: str | None = SESSION,
    version: str | None = None,
    headers: Mapping[str, str | None] | None = None,
    target: str = "/mcp",
) -> HttpRequest:
    """A POST that :func:`weir.protocol.route` accepts unless overridden."""
    defaults = {"host": HOST, "accept": ACCEPT_BOTH, "content-type": "application/json"}
    if session is not None:
        defaults["mcp-session-id"] = session
    if version is not None:
        defaults["mcp-protocol-version"] = version
    return http_request("POST", body, target=target, headers=headers, defaults=defaults)


def get(
    *,
    session: str | None = SESSION,
    last_event_id: str | None = None,
    headers: Mapping[str, str | None] | None = None,
) -> HttpRequest:
    """A GET (open or resume the standalone stream)."""
    defaults = {"host": HOST, "accept": "text/event-stream"}
    if session is not None:
        defaults["mcp-session-id"] = session
    if last_event_id is not None:
        defaults["last-event-id"] = last_event_id
    return http_request("GET", headers=headers, defaults=defaults)


def delete(
    *, session: str | None = SESSION, headers: Mapping[str, str | None] | None = None
) -> HttpRequest:
    defaults = {"host": HOST}
    if session is not None:
        defaults["mcp-session-id"] = session
    return http_request("DELETE", headers=headers, defaults=defaults)


def refused(exc: RemoteProtocolError) -> tuple[int, str]:
    """``(http_status, reason)`` of a refusal."""
    return exc.http_status, str(exc.reason)
