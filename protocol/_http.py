"""HTTP/1.1 server connection: h11 plus limits, whole-body requests and SSE framing.

Theory of operation
-------------------
:class:`HttpConnection` wraps one :class:`h11.Connection` (server role) for one TCP
connection.  It is sans-io: the driver feeds received bytes with
:meth:`~HttpConnection.receive_data` (``b""`` means EOF), pulls events with
:meth:`~HttpConnection.next_event`, and writes the bytes returned by the ``send_*``
methods (plus :meth:`~HttpConnection.data_to_send`, for bytes the core produced on
its own, such as an automatic 400) to the socket.

Inbound, the core delivers a request only once its whole body has arrived
(MCP bodies are single JSON documents), as one :class:`HttpRequest`.  Limits:

* header block larger than ``max_header_bytes`` -> 431, connection closed;
* body larger than ``max_body_bytes`` -> 413, connection closed (refused from the
  ``Content-Length`` header alone when it is declared);
* anything h11 rejects -> 400 (or the status h11 suggests), connection closed.

In each case the core writes the error response into :meth:`data_to_send` itself,
emits :class:`HttpError`, and then :class:`ConnectionClosed`.  No exception other
than :class:`~protocol.LocalProtocolError` (API misuse) leaves this class.

Outbound, a response is either complete (:meth:`send_response`, with
``Content-Length``) or streamed (:meth:`start_stream` / :meth:`send_stream_data` /
:meth:`end_stream`, chunked -- used for ``text/event-stream``).  When a response
is finished and the request was fully read, the connection is reused (keep-alive)
unless either side asked to close.  If a write fails or is cancelled the driver
must call :meth:`send_failed`; the connection is then unusable.
"""

from __future__ import annotations

import enum
import http
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Final

import h11

from ._errors import LocalProtocolError, Reason, RemoteProtocolError
from ._jsonrpc import error_body


class _Need(enum.Enum):
    NEED_DATA = "NEED_DATA"


#: Returned by :meth:`HttpConnection.next_event` when more bytes are needed.
NEED_DATA: Final = _Need.NEED_DATA

_SERVER_HEADER: Final = b"weir"


@dataclass(frozen=True, slots=True)
class Headers:
    """Request headers, names lower-cased, values decoded as latin-1.

    Repeated headers are kept in order; :meth:`get` joins them with ``", "``
    as RFC 9110 allows for list-valued fields.
    """

    items: tuple[tuple[str, str], ...]
    _map: Mapping[str, str] = field(repr=False, compare=False)

    @classmethod
    def from_raw(cls, raw: Iterable[tuple[bytes, bytes]]) -> Headers:
        """Build from h11's ``(name, value)`` byte pairs (names already lower-case)."""
        items = tuple((n.decode("latin-1"), v.decode("latin-1")) for n, v in raw)
        merged: dict[str, str] = {}
        for name, value in items:
            merged[name] = f"{merged[name]}, {value}" if name in merged else value
        return cls(items, merged)

    @classmethod
    def of(cls, **named: str) -> Headers:
        """Convenience for tests: ``Headers.of(accept="...", mcp_session_id="...")``."""
        return cls.from_raw(
            (k.replace("_", "-").lower().encode(), v.encode("latin-1")) for k, v in named.items()
        )

    def get(self, name: str, default: str | None = None) -> str | None:
        """The value of header ``name`` (lower-case), or ``default``."""
        return self._map.get(name, default)

    def __contains__(self, name: object) -> bool:
        return name in self._map


@dataclass(frozen=True, slots=True, kw_only=True)
class HttpRequest:
    """A complete HTTP request: request line, headers and the whole body."""

    method: str
    target: str
    headers: Headers
    body: bytes = b""
    http_version: str = "1.1"

    @property
    def path(self) -> str:
        """The target without its query string."""
        return self.target.split("?", 1)[0]

    @property
    def query(self) -> str:
        """The raw query string (without ``?``), or ``""``."""
        parts = self.target.split("?", 1)
        return parts[1] if len(parts) == 2 else ""


@dataclass(frozen=True, slots=True, kw_only=True)
class HttpError:
    """The peer broke HTTP; the core has queued an error response and will close."""

    status: int
    reason: Reason
    message: str


@dataclass(frozen=True, slots=True)
class ConnectionClosed:
    """The connection is finished: the peer closed it, or it must be closed now."""


HttpEvent = HttpRequest | HttpError | ConnectionClosed | _Need


@dataclass(frozen=True, slots=True, kw_only=True)
class HttpLimits:
    """Size limits for one connection.

    Attributes:
        max_header_bytes: largest request line plus header block (431 beyond).
        max_body_bytes: largest request body (413 beyond).
    """

    max_header_bytes: int = 64 * 1024
    max_body_bytes: int = 4 * 1024 * 1024


class HttpConnection:
    """Server side of one HTTP/1.1 connection (see the module docstring)."""

    def __init__(self, limits: HttpLimits | None = None) -> None:
        self.limits = limits or HttpLimits()
        self._h11 = h11.Connection(
            h11.SERVER, max_incomplete_event_size=self.limits.max_header_bytes
        )
        self._pending: h11.Request | None = None
        self._body: list[bytes] = []
        self._body_size = 0
        self._out = bytearray()
        self._closed = False
        self._failed = False
        self._head_request = False  # the request being answered is a HEAD

    # ------------------------------------------------------------------ inbound
    def receive_data(self, data: bytes | bytearray) -> None:
        """Feed bytes received from the peer; ``b""`` signals EOF."""
        if self._closed:
            return
        try:
            self._h11.receive_data(bytes(data))
        except RuntimeError:
            # h11 refuses data after EOF; treat extra bytes as a closed connection.
            self._closed = True

    def next_event(self) -> HttpEvent:
        """Return the next complete event, or :data:`NEED_DATA`.

        Never raises for anything the peer sends: protocol violations become an
        :class:`HttpError` (with the error response queued in
        :meth:`data_to_send`) followed by :class:`ConnectionClosed`.
        """
        while True:
            if self._closed:
                return ConnectionClosed()
            try:
                event = self._h11.next_event()
            except h11.RemoteProtocolError as exc:
                status = exc.error_status_hint
                if status == 431 or "exceeds" in str(exc).lower() or "too long" in str(exc).lower():
                    return self._fail(
                        431, Reason.HEADERS_TOO_LARGE, "request header block too large"
                    )
                return self._fail(status, Reason.MALFORMED_HTTP, f"malformed HTTP request: {exc}")
            if event is h11.NEED_DATA:
                return NEED_DATA
            if event is h11.PAUSED:
                # A pipelined request waits until our response is done.
                return NEED_DATA
            if isinstance(event, h11.Request):
                self._pending = event
                self._body = []
                self._body_size = 0
                # h11 enforces max_incomplete_event_size only while the head is
                # still incomplete, so a head that arrives in one chunk would slip
                # through; check the complete head too (same answer however split).
                if _head_size(event) > self.limits.max_header_bytes:
                    return self._fail(
                        431, Reason.HEADERS_TOO_LARGE, "request header block too large"
                    )
                declared = _content_length(event.headers)
                if declared is not None and declared > self.limits.max_body_bytes:
                    return self._too_large()
                continue
            if isinstance(event, h11.Data):
                self._body_size += len(event.data)
                if self._body_size > self.limits.max_body_bytes:
                    return self._too_large()
                self._body.append(bytes(event.data))
                continue
            if isinstance(event, h11.EndOfMessage):
                req = self._pending
                assert req is not None
                self._pending = None
                self._head_request = req.method == b"HEAD"
                body = b"".join(self._body)
                self._body = []
                return HttpRequest(
                    method=req.method.decode("ascii", "replace"),
                    target=req.target.decode("latin-1"),
                    headers=Headers.from_raw(req.headers),
                    body=body,
                    http_version=req.http_version.decode("ascii", "replace"),
                )
            if isinstance(event, h11.ConnectionClosed):
                self._closed = True
                return ConnectionClosed()

    def _too_large(self) -> HttpError:
        return self._fail(
            413,
            Reason.PAYLOAD_TOO_LARGE,
            f"request body larger than {self.limits.max_body_bytes} bytes",
        )

    def _fail(self, status: int, reason: Reason, message: str) -> HttpError:
        if self._h11.our_state in (h11.IDLE, h11.SEND_RESPONSE):
            exc = RemoteProtocolError(message, http_status=status, reason=reason)
            body = error_body(exc)
            # Build the answer by hand: h11 may be in its ERROR state already.
            self._out += _raw_response(status, body)
        self._closed = True
        return HttpError(status=status, reason=reason, message=message)

    # ----------------------------------------------------------------- outbound
    def data_to_send(self) -> bytes:
        """Bytes the core produced on its own (automatic error responses)."""
        out = bytes(self._out)
        self._out.clear()
        return out

    def send_response(
        self, status: int, headers: Iterable[tuple[str, str]], body: bytes = b""
    ) -> bytes:
        """Serialise a complete response with ``Content-Length``.

        Raises:
            LocalProtocolError: if a response is not expected now.
        """
        hdrs = _headers(headers)
        hdrs.append((b"content-length", str(len(body)).encode()))
        out = self._send(h11.Response(status_code=status, headers=hdrs, reason=_phrase(status)))
        if body and not self._head_request:
            # A HEAD response carries the headers of the full response, no body.
            out += self._send(h11.Data(data=body))
        out += self._send(h11.EndOfMessage())
        self._after_response()
        return out

    def start_stream(self, status: int, headers: Iterable[tuple[str, str]]) -> bytes:
        """Start a streamed (chunked) response, e.g. ``text/event-stream``.

        The validated h11 event is cached by ``(status, headers)``: an SSE server
        sends the same head (per session) again and again, and h11 validates every
        header each time it builds one.
        """
        if not isinstance(headers, tuple):
            headers = tuple(headers)
        key = (status, headers)
        event = _STREAM_HEADS.get(key)
        if event is None:
            event = h11.Response(
                status_code=status, headers=_headers(headers), reason=_phrase(status)
            )
            if len(_STREAM_HEADS) >= _STREAM_HEADS_MAX:
                _STREAM_HEADS.pop(next(iter(_STREAM_HEADS)))
            _STREAM_HEADS[key] = event
        return self._send(event)

    def send_stream_data(self, data: bytes) -> bytes:
        """Frame ``data`` as one chunk of the streamed response."""
        if not data:
            return b""
        return self._send(h11.Data(data=data))

    def end_stream(self) -> bytes:
        """Finish the streamed response (terminating chunk)."""
        out = self._send(h11.EndOfMessage())
        self._after_response()
        return out

    def send_failed(self) -> None:
        """A write to the socket failed or was cancelled: the connection is dead."""
        self._failed = True
        self._closed = True

    @property
    def should_close(self) -> bool:
        """True once the connection cannot carry another request/response."""
        return self._closed or self._failed

    @property
    def response_in_progress(self) -> bool:
        """True between the start of a response and its end."""
        return self._h11.our_state is h11.SEND_BODY

    def _send(self, event: h11.Event) -> bytes:
        if self._failed:
            raise LocalProtocolError("connection already failed; cannot send")
        if isinstance(event, h11.Response) and self._h11.our_state is not h11.SEND_RESPONSE:
            # h11 lets a server answer in IDLE (for early errors), but here that
            # would answer a request the driver never saw, desynchronising the peer.
            raise LocalProtocolError("no request is awaiting a response")
        try:
            data = self._h11.send(event)
        except h11.LocalProtocolError as exc:
            raise LocalProtocolError(f"cannot send {type(event).__name__}: {exc}") from None
        return data or b""

    def _after_response(self) -> None:
        h = self._h11
        if h.our_state is h11.MUST_CLOSE or h.their_state is h11.MUST_CLOSE:
            self._closed = True
        elif h.our_state is h11.DONE and h.their_state is h11.DONE:
            h.start_next_cycle()
        elif h.our_state is h11.DONE:
            # We answered before reading the whole request body (e.g. a 413):
            # the rest of the body cannot be skipped safely, so close.
            self._closed = True


# Streamed-response heads already validated by h11, oldest first (bounded).
_STREAM_HEADS: dict[tuple[int, tuple[tuple[str, str], ...]], h11.Response] = {}
_STREAM_HEADS_MAX = 4096


def _headers(headers: Iterable[tuple[str, str]]) -> list[tuple[bytes, bytes]]:
    out = [(b"server", _SERVER_HEADER)]
    out.extend((k.encode("latin-1"), v.encode("latin-1")) for k, v in headers)
    return out


def _head_size(req: h11.Request) -> int:
    # The size of the request line plus header block in canonical form
    # ("name: value" lines, CRLF endings): exact for what clients send, and what
    # h11's incremental limit measures on the raw bytes.
    line = len(req.method) + len(req.target) + len(req.http_version) + len(b"  HTTP/\r\n")
    return line + sum(len(n) + len(v) + 4 for n, v in req.headers) + 2


def _content_length(headers: Iterable[tuple[bytes, bytes]]) -> int | None:
    for name, value in headers:
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


def _phrase(status: int) -> bytes:
    try:
        return http.HTTPStatus(status).phrase.encode("ascii")
    except ValueError:
        return b""


def _raw_response(status: int, body: bytes) -> bytes:
    phrase = _phrase(status)
    head = b"HTTP/1.1 %d %s\r\n" % (status, phrase)
    head += b"server: weir\r\ncontent-type: application/json\r\nconnection: close\r\n"
    head += b"content-length: %d\r\n\r\n" % len(body)
    return head + body
