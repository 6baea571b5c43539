"""HTTP/1.1 server connection: h11 plus limits, whole-body requests and SSE framing.

Theory of operation
-------------------
:class:`HttpConnection` wraps one :class:`h11.Connection` (server role) for one TCP
connection.  It is sans-io: the driver feeds received bytes with
:meth:`~HttpConnection.receive_data` (``b""`` means EOF), pulls events with
:meth:`~HttpConnection.next_event`, and writes the bytes returned by the ``send_*``
methods (plus :meth:`~HttpConnection.data_to_send`, for bytes the core produced on
its own, such as an automatic 400 or a ``100 Continue``) to the socket.

The driver's loop, and what it must guarantee:

* whenever :meth:`~HttpConnection.next_event` returns :data:`NEED_DATA`, first
  write :meth:`~HttpConnection.data_to_send` if
  :attr:`~HttpConnection.has_data_to_send` (a client that sent
  ``Expect: 100-continue`` waits for the ``100 Continue`` before it sends the
  body), then wait for bytes -- with the deadline that
  :attr:`~HttpConnection.inbound` calls for: :attr:`Inbound.IDLE` (nothing owed:
  keep-alive timeout), :attr:`Inbound.HEAD` (a head has started: whole-head
  deadline), :attr:`Inbound.BODY` (head complete: body deadline);
* after :class:`HttpError`, write :meth:`~HttpConnection.data_to_send` and close.

(A ``100 Continue`` still queued when the response starts is returned first by
``send_response`` / ``start_stream``, so the order on the wire is always right.)

Inbound, the core delivers a request only once its whole body has arrived
(MCP bodies are single JSON documents), as one :class:`HttpRequest`.  What it
refuses, and in which order, is each a configured bound of :class:`HttpLimits` or
a rule of RFC 9110/9112, listed where the checks live (:mod:`._http_head`): an
over-long target (414), a break of the line grammar (400 ``malformed_http``, as
soon as its bytes arrive: a smuggling vector), a head too large (431) or with too
many fields (431), ambiguous framing (400), an unknown expectation (417), a body
too large (413), and whatever else h11 rejects (400).

A request that passes and carries ``Expect: 100-continue`` (HTTP/1.1) gets
``HTTP/1.1 100 Continue`` queued in :meth:`data_to_send` as soon as its head is
complete.  Every refusal closes the connection: the core writes the error response
into :meth:`data_to_send` itself, emits :class:`HttpError`, and then
:class:`ConnectionClosed`.  Each answer depends on the bytes alone, never on how
they were split into chunks.  No exception other than
:class:`~weir.protocol._errors.LocalProtocolError` (API misuse) leaves this class.

Two paths
---------
Requests of the common shape -- ``GET``, ``POST`` or ``DELETE`` of an origin-form
target over HTTP/1.1, CRLF line ends, exactly one ``Host``, at most one
``Content-Length``, ``Connection`` at most ``keep-alive``/``close``, no transfer
coding, ``Expect`` or ``Upgrade``, within every limit -- are parsed here with the
RFC 9110/9112 grammar (the same expressions h11 uses), and responses to them are
framed here (status line, headers, ``Content-Length`` or chunked).  That is what
every MCP client sends, and it costs a fraction of h11's generic machinery, which
re-validates every header of every response.  Anything else -- chunked request
bodies, ``Expect``, HTTP/1.0, ``HEAD``, oversized or malformed heads (bare-LF
line ends and obs-fold included), too many header fields, an over-long target, a
request line that has grown past ``max_target_bytes`` without ending -- hands
the connection to h11 at that request's boundary, with every unread byte; h11
then serves it for the rest of its life, and every refusal above is made on that
path (the fast path's own check of an unfinished head is one search for the
faults listed above in the bytes new since the last look).  (The
fast path's own cost for the limits is a count of header lines and a length
check of the target per request.)  Both paths give the same events and the same
bytes for the same input (``tests/protocol/test_http_fastpath.py`` checks this
differentially); ``HttpConnection(fast_path=False)`` uses h11 alone.

Outbound, a response is either complete (:meth:`send_response`, with
``Content-Length``) or streamed (:meth:`start_stream` / :meth:`send_stream_data` or
:meth:`send_stream_parts` / :meth:`end_stream`, chunked -- used for
``text/event-stream``).  When a response
is finished and the request was fully read, the connection is reused (keep-alive)
unless either side asked to close.  If a write fails or is cancelled the driver
must call :meth:`send_failed`; the connection is then unusable.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Sequence

import h11

from ._chunked import ChunkedCheck
from ._errors import LocalProtocolError, Reason, RemoteProtocolError
from ._http_events import (
    NEED_DATA,
    ConnectionClosed,
    Headers,
    HttpError,
    HttpEvent,
    HttpLimits,
    HttpRequest,
    Inbound,
)
from ._http_head import (
    HeadWatch,
    ParsedHead,
    body_too_large,
    chunks_refusal,
    h11_refusal,
    head_fault,
    head_refusal,
    parse_head,
)
from ._http_response import (
    HeadCache,
    check_headers,
    check_status,
    encode_headers,
    raw_error_response,
    reason_phrase,
)
from ._jsonrpc import error_body


class _Phase(enum.Enum):
    """Where the fast path's connection is in its request/response cycle."""

    IDLE = "IDLE"  # waiting for (or parsing) the next request
    ANSWER = "ANSWER"  # a request was delivered; its response has not started
    STREAM = "STREAM"  # a chunked response is being sent


class HttpConnection:
    """Server side of one HTTP/1.1 connection (see the module docstring).

    Args:
        limits: size limits (defaults: :class:`HttpLimits`).
        fast_path: parse the common request shape and frame responses directly
            (see "Two paths" in the module docstring).  ``False`` hands every byte
            to h11 from the start; the two produce the same events and the same
            bytes, which the tests check byte for byte.
        heads: the cache of validated response heads to use (share one among a
            server's connections); default: a small one of this connection's own.
    """

    def __init__(
        self,
        limits: HttpLimits | None = None,
        *,
        fast_path: bool = True,
        heads: HeadCache | None = None,
    ) -> None:
        self.limits = limits or HttpLimits()
        self._heads = heads if heads is not None else HeadCache(64)
        self._h11: h11.Connection | None = None
        # Fast path state (unused once h11 has taken over).
        self._buf = bytearray()
        self._eof = False
        self._phase = _Phase.IDLE
        self._keep_alive = True
        self._head: ParsedHead | None = None  # parsed head of a request whose body is incomplete
        self._scanned = 0  # no head ends before this offset of _buf
        # The head so far keeps to the line grammar before this offset of _buf
        # (see ``_head_fault``).
        self._checked = 0
        # Shared state.
        self._pending: h11.Request | None = None
        self._body: list[bytes] = []
        self._body_size = 0
        self._out = bytearray()
        self._closed = False
        self._failed = False
        self._head_request = False  # the request being answered is a HEAD
        #: The status of the last response started (0: none yet), and its body if it
        #: was a complete error response (>= 400; ``b""`` otherwise): what an access
        #: log reports.
        self.status = 0
        self.error_body = b""
        # h11 path: the checks of the request head h11 is waiting for (None while
        # it is not waiting for one).
        self._watch: HeadWatch | None = None
        # The line grammar of the chunked body h11 is reading (None otherwise).
        self._chunks: ChunkedCheck | None = None
        if not fast_path:
            self._take_over()

    def _take_over(self) -> h11.Connection:
        # h11 takes the connection from here on, at a request boundary: it gets
        # every byte not consumed yet (and the EOF, if it came).
        limits = self.limits
        conn = self._h11 = h11.Connection(
            h11.SERVER, max_incomplete_event_size=limits.max_header_bytes
        )
        self._watch = HeadWatch(self._buf, limits)
        if self._buf:
            conn.receive_data(bytes(self._buf))
            self._buf.clear()
        if self._eof:
            conn.receive_data(b"")
        self._head = None
        return conn

    # ------------------------------------------------------------------ inbound
    def receive_data(self, data: bytes | bytearray) -> None:
        """Feed bytes received from the peer; ``b""`` signals EOF."""
        if self._closed:
            return
        if self._h11 is None:
            if self._eof:
                if data:
                    self._closed = True  # bytes after EOF: as h11, a closed connection
                return
            if data:
                self._buf += data
            else:
                self._eof = True
            return
        try:
            self._h11.receive_data(bytes(data))
        except RuntimeError:
            # h11 refuses data after EOF; treat extra bytes as a closed connection.
            self._closed = True
            return
        if self._chunks is not None:
            self._chunks.feed(data)
        if self._watch is not None:
            self._watch.feed(data)

    def next_event(self) -> HttpEvent:
        """Return the next complete event, or :data:`NEED_DATA`.

        Never raises for anything the peer sends: protocol violations become an
        :class:`HttpError` (with the error response queued in
        :meth:`data_to_send`) followed by :class:`ConnectionClosed`.
        """
        if self._h11 is None:
            event = self._fast_next_event()
            if event is not None:
                return event
        return self._h11_next_event()

    def _fast_next_event(self) -> HttpEvent | None:
        """The next event from the fast path, or None once h11 has taken over."""
        if self._closed:
            return ConnectionClosed()
        buf = self._buf
        if self._phase is not _Phase.IDLE:
            if self._eof and not buf:
                self._closed = True
                return ConnectionClosed()
            return NEED_DATA  # a pipelined request waits until our response is done
        head = self._head
        if head is None:
            limit = self.limits.max_header_bytes  # the whole head, blank line included
            end = buf.find(b"\r\n\r\n", self._scanned, limit)
            if end < 0:
                if not buf and self._eof:
                    self._closed = True
                    return ConnectionClosed()
                if not buf and not self._eof:
                    return NEED_DATA  # (idle between requests: nothing to look at)
                if len(buf) < limit and not self._eof:
                    line_max = self.limits.max_target_bytes + 2
                    # Bare LF or CR, obs-fold, a control byte: the h11 path refuses
                    # the head as soon as it sees one (``_malformed_head``).
                    fault, checked = head_fault(buf, self._checked, len(buf), complete=False)
                    odd = (
                        buf[0] < 0x21  # h11 refuses such a request line at once
                        or fault is not None
                        # A request line that may already hold a target over the
                        # limit: the h11 path refuses it before it ends (414).
                        or (len(buf) > line_max and buf.find(b"\n", 0, line_max + 1) < 0)
                    )
                    if not odd:
                        # Resume the searches where a terminator could still start
                        # and where the check could not decide yet (a byte-by-byte
                        # trickle stays linear).
                        self._scanned = max(0, len(buf) - 3)
                        self._checked = checked
                        return NEED_DATA
                # Too large, cut short, or malformed: the h11 path says what it is.
                self._take_over()
                return None
            self._scanned = self._checked = 0
            head = parse_head(buf, end, self.limits)
            if head is None or head.content_length > self.limits.max_body_bytes:
                self._take_over()  # not the common shape (or an error): h11 decides
                return None
            self._head = head
        total = head.size + head.content_length
        if len(buf) < total:
            if self._eof:
                self._take_over()  # the body was cut short
                return None
            return NEED_DATA
        body = bytes(buf[head.size : total])
        del buf[:total]
        self._head = None
        self._phase = _Phase.ANSWER
        self._keep_alive = head.keep_alive
        return HttpRequest(method=head.method, target=head.target, headers=head.headers, body=body)

    def _h11_next_event(self) -> HttpEvent:
        conn = self._h11
        assert conn is not None
        while True:
            if self._closed:
                return ConnectionClosed()
            if (
                conn.their_state is h11.MUST_CLOSE
                and conn.our_state in (h11.SEND_RESPONSE, h11.SEND_BODY)
                and self._pending is None
                and conn.trailing_data[0]
            ):
                # Bytes after a "Connection: close" request: ignored while we answer
                # it (the connection closes after the response), never an error
                # that would replace the response to the request delivered.
                return NEED_DATA
            refusal = self._watch.refusal() if self._watch is not None else None
            chunks = self._chunks
            if refusal is None and chunks is not None:
                refusal = chunks_refusal(chunks, self.limits)
            if refusal is not None:
                return self._fail(*refusal)
            try:
                event = conn.next_event()
            except h11.RemoteProtocolError as exc:
                return self._fail(*h11_refusal(exc))
            if event is h11.NEED_DATA:
                return NEED_DATA
            if event is h11.PAUSED:
                # A pipelined request waits until our response is done.
                return NEED_DATA
            if isinstance(event, h11.Request):
                self._pending = event
                self._body = []
                self._body_size = 0
                self._watch = None
                refused = self._check_head(conn, event)
                if refused is not None:
                    return refused
                continue
            if isinstance(event, h11.Data):
                self._body_size += len(event.data)
                if self._body_size > self.limits.max_body_bytes:
                    return self._fail(*body_too_large(self.limits))
                self._body.append(bytes(event.data))
                continue
            if isinstance(event, h11.EndOfMessage):
                return self._request_done()
            if isinstance(event, h11.ConnectionClosed):
                self._closed = True
                return ConnectionClosed()

    def _request_done(self) -> HttpRequest:
        """The request h11 has read whole (head and body), as the core delivers it."""
        req = self._pending
        assert req is not None
        self._pending = None
        self._chunks = None
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

    def _check_head(self, conn: h11.Connection, req: h11.Request) -> HttpError | None:
        """Apply the limits to a complete head (:func:`~._http_head.head_refusal`);
        watch a chunked body's lines; queue ``100 Continue`` if it is awaited."""
        refusal = head_refusal(req, self.limits)
        if refusal is not None:
            return self._fail(*refusal)
        if any(name == b"transfer-encoding" for name, _ in req.headers):
            # Its lines are checked before h11 reads them (``ChunkedCheck``): what
            # h11 holds of the body now, then every byte as it arrives.
            self._chunks = ChunkedCheck(self.limits.max_body_bytes)
            self._chunks.feed(conn.trailing_data[0])
        if conn.they_are_waiting_for_100_continue:
            # The peer holds the body back until it hears from us: invite it.
            self._out += self._send(
                h11.InformationalResponse(status_code=100, headers=[], reason=b"Continue")
            )
        return None

    def _fail(self, status: int, reason: Reason, message: str) -> HttpError:
        conn = self._h11
        if conn is not None and conn.our_state in (h11.IDLE, h11.SEND_RESPONSE):
            exc = RemoteProtocolError(message, http_status=status, reason=reason)
            body = error_body(exc)
            # Build the answer by hand: h11 may be in its ERROR state already.
            self._out += raw_error_response(status, body)
        self._closed = True
        return HttpError(status=status, reason=reason, message=message)

    # ----------------------------------------------------------------- outbound
    def data_to_send(self) -> bytes:
        """Bytes the core produced on its own, to write to the socket in order.

        An automatic error response (after :class:`HttpError`), or an interim
        ``100 Continue`` for a request sent with ``Expect: 100-continue`` (the peer
        waits for it before sending the body: send it whenever :meth:`next_event`
        returns :data:`NEED_DATA`).  Taking them empties the queue.
        """
        out = bytes(self._out)
        self._out.clear()
        return out

    @property
    def has_data_to_send(self) -> bool:
        """True while :meth:`data_to_send` would return some bytes."""
        return bool(self._out)

    @property
    def inbound(self) -> Inbound:
        """What the peer owes now, for the driver's deadlines (see :class:`Inbound`).

        Meaningful when :meth:`next_event` has just returned :data:`NEED_DATA`:
        ``HEAD`` once any byte of a request head has arrived until the head is
        complete, then ``BODY`` until the body is complete; ``IDLE`` before the
        first byte of a request, while a response is due or being sent (bytes of
        a pipelined request do not count until then), and once closed.
        """
        if self._closed:
            return Inbound.IDLE
        if self._h11 is None:
            if self._phase is not _Phase.IDLE:
                return Inbound.IDLE
            if self._head is not None:
                return Inbound.BODY
            return Inbound.HEAD if self._buf else Inbound.IDLE
        if self._pending is not None:
            return Inbound.BODY
        watch = self._watch
        return Inbound.HEAD if watch is not None and watch.line else Inbound.IDLE

    def send_response(
        self, status: int, headers: Iterable[tuple[str, str]], body: bytes = b""
    ) -> bytes:
        """Serialise a complete response with ``Content-Length``.

        Raises:
            LocalProtocolError: if a response is not expected now, or a header is
                malformed or one the connection sets itself (framing, ``connection``).
        """
        if not isinstance(headers, tuple):
            headers = tuple(headers)
        check_status(status, streamed=False, body=body)
        self.status, self.error_body = status, (body if status >= 400 else b"")
        if self._h11 is None:
            self._fast_check(_Phase.ANSWER, "Response")
            head = self._heads.head(status, headers)
            close = b"" if self._keep_alive else b"Connection: close\r\n"
            out = b"%scontent-length: %d\r\n%s\r\n%s" % (head, len(body), close, body)
            self._fast_done()
            return out
        self._h11_check_response()
        check_headers(headers)
        hdrs = encode_headers(headers)
        hdrs.append((b"content-length", str(len(body)).encode()))
        out = self._send(
            h11.Response(status_code=status, headers=hdrs, reason=reason_phrase(status))
        )
        if self._out:  # a 100 Continue the driver has not taken yet goes first
            out = self.data_to_send() + out
        if body and not self._head_request:
            # A HEAD response carries the headers of the full response, no body.
            out += self._send(h11.Data(data=body))
        out += self._send(h11.EndOfMessage())
        self._after_response()
        return out

    def start_stream(self, status: int, headers: Iterable[tuple[str, str]]) -> bytes:
        """Start a streamed (chunked) response, e.g. ``text/event-stream``.

        The encoded head (or, on the h11 path, the validated h11 event) is cached by
        ``(status, headers)``: an SSE server sends the same head again and again.

        Raises:
            LocalProtocolError: as :meth:`send_response`.
        """
        if not isinstance(headers, tuple):
            headers = tuple(headers)
        check_status(status, streamed=True, body=b"")
        self.status, self.error_body = status, b""
        if self._h11 is None:
            self._fast_check(_Phase.ANSWER, "Response")
            head = self._heads.head(status, headers)
            self._phase = _Phase.STREAM
            if self._keep_alive:
                return head + b"Transfer-Encoding: chunked\r\n\r\n"
            return head + b"Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
        self._h11_check_response()
        out = self._send(self._heads.event(status, headers))
        if self._out:  # a 100 Continue the driver has not taken yet goes first
            out = self.data_to_send() + out
        return out

    def send_stream_data(self, data: bytes) -> bytes:
        """Frame ``data`` as one chunk of the streamed response (``b""``: nothing to send)."""
        if not data:
            return b""
        if self._h11 is None:
            self._fast_check(_Phase.STREAM, "Data")
            return b"%x\r\n%s\r\n" % (len(data), data)
        return self._send(h11.Data(data=data))

    def send_stream_parts(self, parts: Sequence[bytes]) -> list[bytes]:
        """Frame the concatenation of ``parts`` as one chunk, without copying them.

        Returns the pieces to write in order; their concatenation equals
        ``send_stream_data(b"".join(parts))``.  On the fast path the pieces are a
        chunk-size line, ``parts`` themselves and the chunk's closing ``CRLF``, so a
        runtime with a gathered write (``writev``) sends a large frame without making
        a second copy of it while a slow peer takes it; otherwise one joined piece.
        """
        size = sum(map(len, parts))
        if not size:
            return []
        if self._h11 is None:
            self._fast_check(_Phase.STREAM, "Data")
            return [b"%x\r\n" % size, *parts, b"\r\n"]
        return [self._send(h11.Data(data=b"".join(parts)))]

    def end_stream(self) -> bytes:
        """Finish the streamed response (terminating chunk)."""
        if self._h11 is None:
            self._fast_check(_Phase.STREAM, "EndOfMessage")
            self._fast_done()
            return b"0\r\n\r\n"
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
        if self._h11 is None:
            return self._phase is _Phase.STREAM
        return self._h11.our_state is h11.SEND_BODY

    def _fast_check(self, phase: _Phase, what: str) -> None:
        if self._failed:
            raise LocalProtocolError("connection already failed; cannot send")
        if self._phase is not phase:
            if phase is _Phase.ANSWER:
                raise LocalProtocolError("no request is awaiting a response")
            raise LocalProtocolError(f"cannot send {what}: no streamed response in progress")

    def _fast_done(self) -> None:
        # (An EOF that came meanwhile shows at the next next_event(), as with h11.)
        self._phase = _Phase.IDLE
        if not self._keep_alive:
            self._closed = True

    def _h11_check_response(self) -> None:
        # Before any h11.Response: h11 lets a server answer in IDLE (for early
        # errors), but here that would answer a request the driver never saw,
        # desynchronising the peer.
        conn = self._h11
        assert conn is not None
        if self._failed:
            raise LocalProtocolError("connection already failed; cannot send")
        if conn.our_state is not h11.SEND_RESPONSE:
            raise LocalProtocolError("no request is awaiting a response")

    def _send(self, event: h11.Event) -> bytes:
        conn = self._h11
        assert conn is not None
        if self._failed:
            raise LocalProtocolError("connection already failed; cannot send")
        try:
            data = conn.send(event)
        except h11.LocalProtocolError as exc:
            raise LocalProtocolError(f"cannot send {type(event).__name__}: {exc}") from None
        return data or b""

    def _after_response(self) -> None:
        h = self._h11
        assert h is not None
        if h.our_state is h11.MUST_CLOSE or h.their_state is h11.MUST_CLOSE:
            self._closed = True
        elif h.our_state is h11.DONE and h.their_state is h11.DONE:
            h.start_next_cycle()
            self._watch = HeadWatch(h.trailing_data[0], self.limits)
        elif h.our_state is h11.DONE:
            # We answered before reading the whole request body (e.g. a 413):
            # the rest of the body cannot be skipped safely, so close.
            self._closed = True
