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
(MCP bodies are single JSON documents), as one :class:`HttpRequest`.  Refusals,
each a configured bound of :class:`HttpLimits` or a rule of RFC 9110/9112:

* a request target longer than ``max_target_bytes`` -> 414 ``uri_too_long``.
  When the method is at most 16 bytes this is decided from the start of the
  request line alone, as soon as the target has passed the limit, before the
  line (let alone the head) is complete, and before any other check, h11's
  included: an endless request line is cut there, not at ``max_header_bytes``.
* a bare LF line end, a CR not followed by LF, obs-fold (a header line starting
  with SP or HTAB) or any other control byte but HTAB (0x00-0x08, 0x0B, 0x0C,
  0x0E-0x1F, 0x7F) anywhere in the head -> 400 ``malformed_http``, as soon as
  the bytes that show it have arrived (after the check above; a fault past the
  first ``max_header_bytes + 1`` bytes is not looked for: that head is too large).
  h11 would accept the first three and most control bytes in field values; a
  front end that reads them otherwise would see another request (smuggling).
  HTAB stays allowed between and around the words of a field value, and bytes
  0x80-0xFF (obs-text) in it, as RFC 9110 section 5.5 says.

Then, once a head is complete, in this order (the first that applies answers):

* request line plus header block larger than ``max_header_bytes`` -> 431
  ``headers_too_large`` (also while the head is still arriving; as received,
  or with its fields in canonical ``name: value`` form);
* request target longer than ``max_target_bytes`` (a longer method) -> 414;
* more than ``max_header_fields`` header fields -> 431 ``too_many_headers``;
* both ``Content-Length`` and ``Transfer-Encoding`` -> 400 ``ambiguous_framing``
  (RFC 9112 section 6.1: a smuggling vector; the request, and anything pipelined
  behind it, is never delivered); so does ``Transfer-Encoding`` on an HTTP/1.0
  request (section 6.1: its framing is faulty);
* a chunked body whose chunk-size lines or trailer fields break the line
  grammar above (bare LF or CR, obs-fold, a control byte: h11 would end the
  body at ``0\\r\\n\\n``) -> 400 ``malformed_http``, checked before h11 reads
  those bytes (``_chunked.ChunkedCheck``; its declared sizes past
  ``max_body_bytes`` are the 413 below, in the order the lines come);
* an ``Expect`` member other than ``100-continue`` (case-insensitive) -> 417
  ``expectation_failed``;
* body larger than ``max_body_bytes`` -> 413 ``payload_too_large`` (refused from
  the ``Content-Length`` header alone when it is declared -- before any
  ``100 Continue``, so such a client never sends the body);
* anything h11 rejects -> 400 ``malformed_http`` (or the status h11 suggests).

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
``Content-Length``) or streamed (:meth:`start_stream` / :meth:`send_stream_data` /
:meth:`end_stream`, chunked -- used for ``text/event-stream``).  When a response
is finished and the request was fully read, the connection is reused (keep-alive)
unless either side asked to close.  If a write fails or is cancelled the driver
must call :meth:`send_failed`; the connection is then unusable.
"""

from __future__ import annotations

import enum
import http
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Final, TypeVar

import h11

from ._chunked import ChunkedCheck
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
        max_body_bytes: largest request body (413 beyond); ``0`` allows no body.
        max_header_fields: most header fields in one request (431 beyond).
        max_target_bytes: longest request target (414 beyond).

    Raises:
        ValueError: if a limit is not an ``int``, or not positive
            (``max_body_bytes`` may be ``0``).
    """

    max_header_bytes: int = 64 * 1024
    max_body_bytes: int = 4 * 1024 * 1024
    max_header_fields: int = 100
    max_target_bytes: int = 8192

    def __post_init__(self) -> None:
        for name in ("max_header_bytes", "max_body_bytes", "max_header_fields", "max_target_bytes"):
            value = getattr(self, name)
            least = 0 if name == "max_body_bytes" else 1
            if not isinstance(value, int) or isinstance(value, bool) or value < least:
                what = "a non-negative" if least == 0 else "a positive"
                raise ValueError(f"HttpLimits.{name} must be {what} int, got {value!r}")


class Inbound(enum.Enum):
    """What the peer owes the connection now (:attr:`HttpConnection.inbound`).

    The driver uses it to choose a deadline while it waits for bytes: a whole-head
    deadline in ``HEAD``, a body deadline in ``BODY``, the idle (keep-alive)
    timeout in ``IDLE``.
    """

    IDLE = "IDLE"  # nothing owed: no byte of the next request yet, or we are answering
    HEAD = "HEAD"  # part of a request head has arrived; the head is incomplete
    BODY = "BODY"  # the head is complete; the body is not


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
        self._head: _Head | None = None  # parsed head of a request whose body is incomplete
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
        # h11 path: while h11 waits for a request head, ``_line`` mirrors the first
        # ``_line_cap`` bytes of it (None otherwise), so that the request line can
        # be checked before the head is complete (``_target_too_long``) and
        # ``inbound`` can tell HEAD from IDLE; ``_line_open`` until that check has
        # a final answer.  ``_tail`` holds the head's bytes not checked yet by
        # ``_malformed_head`` (from ``_tail_check`` on; with the three before, where
        # a blank line may start), of its first ``max_header_bytes + 1``
        # (``_seen`` so far); ``_found`` once its blank line has been.
        self._line: bytearray | None = None
        self._line_open = False
        self._line_cap = 0
        self._tail = bytearray()
        self._tail_check = 0
        self._seen = 0
        self._found = False
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
        self._line_cap = min(limits.max_header_bytes, _EARLY_METHOD + limits.max_target_bytes + 2)
        self._await_head(self._buf)
        if self._buf:
            conn.receive_data(bytes(self._buf))
            self._buf.clear()
        if self._eof:
            conn.receive_data(b"")
        self._head = None
        return conn

    def _await_head(self, data: bytes | bytearray) -> None:
        # h11 waits for a request head; ``data`` is what it holds of it already.
        self._line = bytearray(data[: self._line_cap])
        self._line_open = True
        self._tail = bytearray(data[: self.limits.max_header_bytes + 1])
        self._tail_check = 0
        self._seen = len(self._tail)
        self._found = False

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
        line = self._line
        if line is not None:
            if len(line) < self._line_cap:
                line += data[: self._line_cap - len(line)]
            room = self.limits.max_header_bytes + 1 - self._seen
            if room > 0 and not self._found:
                piece = data[:room]
                self._tail += piece
                self._seen += len(piece)

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
                    fault, checked = _head_fault(buf, self._checked, len(buf), complete=False)
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
            head = _parse_head(buf, end, self.limits)
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
            if self._line_open and self._target_too_long():
                return self._uri_too_long()
            if self._line is not None and not self._found:
                fault = self._malformed_head()
                if fault is not None:
                    return self._fail(
                        400, Reason.MALFORMED_HTTP, f"malformed HTTP request: {fault}"
                    )
                line = self._line
                if not self._found and self._seen > self.limits.max_header_bytes and line[0] > 0x20:
                    # No blank line in the first max_header_bytes + 1 bytes: what h11
                    # says of a head still arriving, said before h11 parses one that
                    # came whole (it might refuse it otherwise, or let it pass).  (h11
                    # refuses a head starting below 0x21 at its first byte.)
                    return self._fail(
                        431, Reason.HEADERS_TOO_LARGE, "request header block too large"
                    )
            chunks = self._chunks
            if chunks is not None and chunks.fault is not None:
                return self._fail(
                    400, Reason.MALFORMED_HTTP, f"malformed HTTP request: {chunks.fault}"
                )
            if chunks is not None and chunks.too_large:
                return self._too_large()
            try:
                event = conn.next_event()
            except h11.RemoteProtocolError as exc:
                status = exc.error_status_hint
                if status == 431 or "exceeds" in str(exc).lower() or "too long" in str(exc).lower():
                    return self._fail(
                        431, Reason.HEADERS_TOO_LARGE, "request header block too large"
                    )
                # Only h11's verdict, never the bytes it quotes after it (a refusal
                # does not echo the client, and the text is the same however split).
                verdict = str(exc).split(":", 1)[0].strip() or "unparseable head"
                return self._fail(
                    status, Reason.MALFORMED_HTTP, f"malformed HTTP request: {verdict}"
                )
            if event is h11.NEED_DATA:
                return NEED_DATA
            if event is h11.PAUSED:
                # A pipelined request waits until our response is done.
                return NEED_DATA
            if isinstance(event, h11.Request):
                self._pending = event
                self._body = []
                self._body_size = 0
                self._line = None
                self._line_open = False
                refused = self._check_head(conn, event)
                if refused is not None:
                    return refused
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
            if isinstance(event, h11.ConnectionClosed):
                self._closed = True
                return ConnectionClosed()

    def _check_head(self, conn: h11.Connection, req: h11.Request) -> HttpError | None:
        """Apply the limits to a complete head; queue ``100 Continue`` if it is awaited.

        The order (the first that applies answers): 431 head size, 414 target,
        431 header count, 400 ``Content-Length`` with ``Transfer-Encoding``, 417
        unknown expectation, 413 declared body size.  Every answer depends on the
        head alone, so it is the same however the bytes were split.
        """
        limits = self.limits
        # h11 enforces max_incomplete_event_size only while the head is still
        # incomplete, so a head that arrives in one chunk would slip through;
        # check the complete head too (same answer however split): as received
        # that is done before h11 parses it (``_h11_next_event``), here in its
        # canonical form (which can be the longer).
        if _head_size(req) > limits.max_header_bytes:
            return self._fail(431, Reason.HEADERS_TOO_LARGE, "request header block too large")
        if len(req.target) > limits.max_target_bytes:
            # (A short method's over-long target is refused before the head ends.)
            return self._uri_too_long()
        if len(req.headers) > limits.max_header_fields:
            return self._fail(
                431,
                Reason.TOO_MANY_HEADERS,
                f"more than {limits.max_header_fields} request header fields",
            )
        declared: int | None = None
        chunked = False
        expect: list[bytes] = []
        for name, value in req.headers:
            if name == b"content-length":
                declared = int(value)  # h11 has checked it: digits, one value
            elif name == b"transfer-encoding":
                chunked = True  # h11 accepts "chunked" alone
            elif name == b"expect":
                expect.append(value)
        if chunked and declared is not None:
            # RFC 9112 section 6.1: such a message is a request smuggling attempt
            # or a broken intermediary; never guess which framing the peer meant.
            return self._fail(
                400,
                Reason.AMBIGUOUS_FRAMING,
                "request has both Content-Length and Transfer-Encoding",
            )
        if chunked and req.http_version == b"1.0":
            # RFC 9112 section 6.1: an HTTP/1.0 message with Transfer-Encoding has
            # faulty framing (a 1.0 front end would not read it as chunked).
            return self._fail(
                400,
                Reason.AMBIGUOUS_FRAMING,
                "an HTTP/1.0 request may not have Transfer-Encoding",
            )
        if expect and any(
            m.strip() and m.strip().lower() != b"100-continue"
            for m in b",".join(expect).split(b",")
        ):
            return self._fail(
                417,
                Reason.EXPECTATION_FAILED,
                "unsupported expectation (only 100-continue is supported)",
            )
        if declared is not None and declared > limits.max_body_bytes:
            return self._too_large()
        if chunked:
            # Its lines are checked before h11 reads them (``ChunkedCheck``): what
            # h11 holds of the body now, then every byte as it arrives.
            self._chunks = ChunkedCheck(limits.max_body_bytes)
            self._chunks.feed(conn.trailing_data[0])
        if conn.they_are_waiting_for_100_continue:
            # The peer holds the body back until it hears from us: invite it.
            self._out += self._send(
                h11.InformationalResponse(status_code=100, headers=[], reason=b"Continue")
            )
        return None

    def _target_too_long(self) -> bool:
        """True when the request line arriving on the h11 path has an over-long target.

        Looks only at the start of the head (``_line``, its first ``_line_cap``
        bytes), before h11 parses it: a method token of at most ``_EARLY_METHOD``
        bytes, a space, then more than ``max_target_bytes`` bytes without a space
        or a control byte other than HTAB (CR and LF included: a control byte is
        refused as soon as it is seen, see ``_malformed_head``).  The answer only
        ever turns from False to True as bytes arrive, and is checked before every
        h11 parse, so it is the same however the bytes are split; once it can no
        longer turn True, ``_line_open`` is cleared (a long method's long target is
        refused when its head is complete).
        """
        line = self._line
        assert line is not None
        max_target = self.limits.max_target_bytes
        if len(line) < max_target + 3:
            return False  # cannot hold a method, a space and max_target + 1 bytes yet
        sp = line.find(b" ", 0, _EARLY_METHOD + 1)
        if sp < 0 or _TOKEN_BYTES.fullmatch(line, 0, sp) is None:
            if sp >= 0 or len(line) > _EARLY_METHOD:
                self._line_open = False  # no (short) method: not for this check
            return False
        stop = sp + 2 + max_target  # the target would end at or past this offset
        if _TARGET_END.search(line, sp + 1, stop) is not None:
            self._line_open = False  # the target ends in time
            return False
        if len(line) >= stop:
            return True
        if len(line) >= self._line_cap:
            self._line_open = False  # the rest is past the head limit: h11 says 431
        return False

    def _malformed_head(self) -> str | None:
        """What breaks the line grammar in the head arriving on the h11 path, or None.

        Checks the first ``max_header_bytes + 1`` bytes of the head, up to its
        blank line, with ``_head_fault``, a piece at a time (``_tail``: what came
        since the last check, and the few bytes that one could not decide), so the
        head is not kept twice (h11 holds it).  h11 would accept bare LF line ends
        and obs-fold, and control bytes in field values; RFC 9112 lets a server
        refuse them, and a front end that reads them differently could be made to
        see another request than this server does (request smuggling).  Called
        before every h11 parse, after ``_target_too_long``: a fault is refused as
        soon as its bytes are here, so the answer is the same however the bytes
        are split (a fault past the first ``max_header_bytes + 1`` bytes is never
        seen: such a head is refused 431 whatever it holds).
        """
        tail = self._tail
        end = tail.find(b"\r\n\r\n")  # (none starts before _tail_check)
        if end >= 0:
            fault, _ = _head_fault(tail, self._tail_check, end, complete=True)
            self._found = True
            tail.clear()
            return fault
        fault, at = _head_fault(tail, self._tail_check, len(tail), complete=False)
        # Keep what is undecided, and the last three bytes: a blank line may start there.
        keep = min(at, max(0, len(tail) - 3))
        del tail[:keep]
        self._tail_check = at - keep
        return fault

    def _uri_too_long(self) -> HttpError:
        return self._fail(
            414,
            Reason.URI_TOO_LONG,
            f"request target longer than {self.limits.max_target_bytes} bytes",
        )

    def _too_large(self) -> HttpError:
        return self._fail(
            413,
            Reason.PAYLOAD_TOO_LARGE,
            f"request body larger than {self.limits.max_body_bytes} bytes",
        )

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
        return Inbound.HEAD if self._line else Inbound.IDLE

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
        _check_status(status, streamed=False, body=body)
        if self._h11 is None:
            self._fast_check(_Phase.ANSWER, "Response")
            head = self._heads.head(status, headers)
            close = b"" if self._keep_alive else b"Connection: close\r\n"
            out = b"%scontent-length: %d\r\n%s\r\n%s" % (head, len(body), close, body)
            self._fast_done()
            return out
        self._h11_check_response()
        _check_headers(headers)
        hdrs = _headers(headers)
        hdrs.append((b"content-length", str(len(body)).encode()))
        out = self._send(h11.Response(status_code=status, headers=hdrs, reason=_phrase(status)))
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
        _check_status(status, streamed=True, body=b"")
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
            self._await_head(h.trailing_data[0])
        elif h.our_state is h11.DONE:
            # We answered before reading the whole request body (e.g. a 413):
            # the rest of the body cannot be skipped safely, so close.
            self._closed = True


# ------------------------------------------------------------------ the fast path
@dataclass(frozen=True, slots=True)
class _Head:
    """A request head in the fast path's shape."""

    method: str
    target: str
    headers: Headers
    size: int  # bytes up to and including the blank line
    content_length: int
    keep_alive: bool


# RFC 9110/9112 grammar, as h11 applies it (h11/_abnf.py), on the latin-1 text.
_REQUEST_LINE = re.compile(r"(GET|POST|DELETE) (/[\x21-\x7e]*) HTTP/1\.1")
_TOKEN = r"[-!#$%&'*+.^_`|~0-9A-Za-z]+"
_FIELD_VALUE = r"(?:[\x21-\x7e\x80-\xff]+(?:[ \t]+[\x21-\x7e\x80-\xff]+)*)?"
_HEADER_LINE = re.compile(rf"({_TOKEN}):[ \t]*({_FIELD_VALUE})[ \t]*")
_TOKEN_RE = re.compile(_TOKEN)
_TOKEN_BYTES = re.compile(_TOKEN.encode())
_TARGET_END = re.compile(rb"[\x00-\x08\x0a-\x1f\x7f ]")
# The line grammar of a request head (RFC 9112 sections 2.2 and 5.2, RFC 9110
# section 5.5): lines of SP, HTAB, visible bytes and obs-text (0x80-0xFF), each
# ended by CRLF, none after the first starting with SP or HTAB (obs-fold).  Where
# a match stops short, the head breaks the grammar there (``_head_fault`` says
# how) -- or its bytes so far end in one of ``_PENDING``.  (Possessive: nothing
# is ever given back, so a match costs one pass.)
_HEAD_LINES = re.compile(
    rb"[\t\x20-\x7e\x80-\xff]*+(?:\r\n[\x21-\x7e\x80-\xff][\t\x20-\x7e\x80-\xff]*+)*+"
)
# Ends of an unfinished head that the next bytes decide.
_PENDING = (b"\r", b"\r\n", b"\r\n\r")
# Methods up to this long have an over-long target refused before the head ends.
_EARLY_METHOD: Final = 16
_FIELD_VALUE_RE = re.compile(_FIELD_VALUE)
_DIGITS = re.compile(r"[0-9]{1,15}")
# Request headers that change framing or the connection beyond keep-alive/close:
# the fast path leaves requests carrying them to h11.
_H11_ONLY = frozenset({"transfer-encoding", "expect", "upgrade", "te", "trailer"})
# Response headers the connection sets itself.
_FRAMING = frozenset({"content-length", "transfer-encoding", "connection"})


def _parse_head(buf: bytearray, end: int, limits: HttpLimits) -> _Head | None:
    """Parse ``buf[:end]`` (the head, without its blank line) if it has the common shape.

    The common shape: ``GET``, ``POST`` or ``DELETE`` of an origin-form target over
    HTTP/1.1; CRLF line ends; every header line a token, a colon and a valid
    field value; exactly one ``Host``; at most one ``Content-Length`` (digits);
    ``Connection`` at most ``keep-alive``/``close``; no transfer coding, no
    ``Expect``, no ``Upgrade``; within ``limits`` (target length, number of
    header fields, head size).  Anything else answers None and goes to h11, which
    accepts or refuses it exactly as the RFCs (and h11) say, and the h11 path
    applies the limits.
    """
    text = buf[:end].decode("latin-1")
    lines = text.split("\r\n")
    if len(lines) > limits.max_header_fields + 1:
        return None  # too many header fields: the h11 path refuses them (431)
    m = _REQUEST_LINE.fullmatch(lines[0])
    if m is None or len(m[2]) > limits.max_target_bytes:
        return None  # (a target over the limit: the h11 path refuses it, 414)
    items: list[tuple[str, str]] = []
    merged: dict[str, str] = {}
    length = -1
    hosts = 0
    keep_alive = True
    for line in lines[1:]:
        h = _HEADER_LINE.fullmatch(line)
        if h is None:
            return None
        name = h[1].lower()
        value = h[2]
        if name in _H11_ONLY:
            return None
        if name == "host":
            hosts += 1
        elif name == "content-length":
            if length >= 0 or _DIGITS.fullmatch(value) is None:
                return None
            length = int(value)
        elif name == "connection":
            tokens = {t.strip().lower() for t in value.split(",")}
            if not tokens <= {"keep-alive", "close"}:
                return None
            if "close" in tokens:
                keep_alive = False
        items.append((name, value))
        merged[name] = f"{merged[name]}, {value}" if name in merged else value
    if hosts != 1:
        return None
    max_head = limits.max_header_bytes
    if end + 4 + len(lines) > max_head:
        # Near the limit: apply it to the canonical form, exactly as the h11 path
        # does (``_head_size``), so both paths agree on every head.
        size = len(m[1]) + len(m[2]) + len("1.1") + len("  HTTP/\r\n") + 2
        if size + sum(len(n) + len(v) + 4 for n, v in items) > max_head:
            return None
    return _Head(
        method=m[1],
        target=m[2],
        headers=Headers(tuple(items), merged),
        size=end + 4,
        content_length=max(length, 0),
        keep_alive=keep_alive,
    )


def _head_fault(
    buf: bytes | bytearray, start: int, stop: int, *, complete: bool
) -> tuple[str | None, int]:
    """Check the head bytes ``buf[start:stop]`` against ``_HEAD_LINES``.

    ``start`` is 0 or where the last check of the same head said to resume.
    ``complete``: ``stop`` is where the head's blank line (``\\r\\n\\r\\n``)
    starts; otherwise ``stop`` is the end of the bytes so far.  Returns what
    breaks the grammar first (a bare LF, a bare CR, obs-fold, a control byte), or
    None and where to resume when more bytes come.  A fault is reported as soon
    as the bytes that show it are there, never before.
    """
    m = _HEAD_LINES.match(buf, start, stop)
    at = m.end() if m is not None else start
    if at == stop or (not complete and stop - at <= 3 and buf[at:stop] in _PENDING):
        return None, at
    byte = buf[at]
    if byte == 0x0D:  # the grammar stops at a CR: what follows says why
        if buf[at + 1] != 0x0A:
            return "bare CR (not followed by LF)", at
        byte = buf[at + 2]
        if byte in (0x20, 0x09):
            return "obsolete line folding (a header line starts with whitespace)", at
        if byte == 0x0D:  # (CRLF CR, not the blank line: else the head ended here)
            return "bare CR (not followed by LF)", at
    if byte == 0x0A:
        return "bare LF line end (lines end in CRLF)", at
    return f"control byte 0x{byte:02x} in the request head", at


def _check_status(status: int, *, streamed: bool, body: bytes) -> None:
    if not 200 <= status <= 999:
        raise LocalProtocolError(f"status {status}: a final response needs 200-999")
    if status in (204, 304) and (streamed or body):
        raise LocalProtocolError(f"status {status} has no body; it cannot carry one")


def _check_headers(headers: tuple[tuple[str, str], ...]) -> None:
    for name, value in headers:
        if name.lower() in _FRAMING:
            raise LocalProtocolError(f"header {name!r} is set by the connection, not the caller")
        if _TOKEN_RE.fullmatch(name) is None or _FIELD_VALUE_RE.fullmatch(value) is None:
            raise LocalProtocolError(f"cannot send Response: malformed header {name!r}")


_HeadKey = tuple[int, tuple[tuple[str, str], ...]]


class HeadCache:
    """Validated response heads by ``(status, headers)``, bounded, oldest dropped first.

    An MCP server sends the same few heads again and again (an SSE head per session
    id, a 202, a handful of refusals), and validating and encoding them is a real
    share of a small response's cost.  Share one cache among a server's connections
    (:class:`HttpConnection` takes it as ``heads``); each connection gets a small one
    of its own otherwise.  Nothing here is module state: the cache is an object its
    owner passes in.

    Args:
        limit: most heads kept (of each kind: fast-path bytes and h11 events).
    """

    __slots__ = ("_events", "_heads", "limit")

    def __init__(self, limit: int = 4096) -> None:
        if limit < 1:
            raise ValueError("a head cache must hold at least one head")
        self.limit = limit
        self._heads: dict[_HeadKey, bytes] = {}
        self._events: dict[_HeadKey, h11.Response] = {}

    def head(self, status: int, headers: tuple[tuple[str, str], ...]) -> bytes:
        """Status line, ``server`` and ``headers`` (validated), no framing or blank line.

        Raises:
            LocalProtocolError: a header the connection sets itself, or a malformed one.
        """
        key = (status, headers)
        head = self._heads.get(key)
        if head is None:
            _check_headers(headers)
            try:
                lines = "".join(f"{n}: {v}\r\n" for n, v in headers).encode("latin-1")
            except UnicodeEncodeError:
                raise LocalProtocolError("header values must be latin-1") from None
            head = b"HTTP/1.1 %d %s\r\nserver: %s\r\n%s" % (
                status,
                _phrase(status),
                _SERVER_HEADER,
                lines,
            )
            self._keep(self._heads, key, head)
        return head

    def event(self, status: int, headers: tuple[tuple[str, str], ...]) -> h11.Response:
        """The validated h11 response event for a streamed response's head."""
        key = (status, headers)
        event = self._events.get(key)
        if event is None:
            _check_headers(headers)
            event = h11.Response(
                status_code=status, headers=_headers(headers), reason=_phrase(status)
            )
            self._keep(self._events, key, event)
        return event

    def _keep(self, cache: dict[_HeadKey, _V], key: _HeadKey, value: _V) -> None:
        if len(cache) >= self.limit:
            cache.pop(next(iter(cache)))
        cache[key] = value


_V = TypeVar("_V")


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


def _phrase(status: int) -> bytes:
    try:
        return http.HTTPStatus(status).phrase.encode("ascii")
    except ValueError:
        return b""


def raw_error_response(status: int, body: bytes, headers: Iterable[tuple[str, str]] = ()) -> bytes:
    """A whole JSON error response that closes the connection, framed by hand.

    For answers outside the request/response cycle (h11 may be in its error
    state, or no request was delivered): the core's automatic 4xx and the
    driver's 408/503 for a request that never completed.
    """
    phrase = _phrase(status)
    head = b"HTTP/1.1 %d %s\r\n" % (status, phrase)
    head += b"server: weir\r\ncontent-type: application/json\r\nconnection: close\r\n"
    head += "".join(f"{n}: {v}\r\n" for n, v in headers).encode("latin-1")
    head += b"content-length: %d\r\n\r\n" % len(body)
    return head + body
