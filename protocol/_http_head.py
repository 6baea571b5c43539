"""Request heads: the fast path's parser, the line grammar, and the h11 path's early checks.

Theory of operation
-------------------
Two readers of a request head share the rules here (see :mod:`weir.protocol._http`
for the two paths):

* :func:`parse_head` reads a complete head of the common shape (the request line
  matched, the header block checked in one regular-expression pass and its fields
  taken in a second, with no per-line matching) and answers None for anything
  else, which then goes to h11;
* :func:`head_fault` checks the line grammar (CRLF line ends, no obs-fold, no
  control byte but HTAB), resumable where the last check stopped, so a trickled
  head is checked in linear time;
* :class:`HeadWatch` holds what the h11 path checks while a head arrives, before
  h11 parses it: an over-long target, a grammar fault, no blank line within the
  limit.

:func:`head_size` is the head's size in canonical form, the measure both paths
apply ``max_header_bytes`` to, so they agree on every head.

Refusals
--------
Each a configured bound of :class:`~._http_events.HttpLimits` or a rule of RFC
9110/9112, first while a head arrives:

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
"""

from __future__ import annotations

import re
from typing import Final, NamedTuple

import h11

from ._chunked import ChunkedCheck
from ._errors import Reason
from ._http_events import Headers, HttpLimits


class ParsedHead(NamedTuple):
    """A request head in the fast path's shape (a tuple: made once per request)."""

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
# The header block after the request line, checked in one pass: each line a token, a
# colon, then only HTAB, SP, visible bytes and obs-text.  Every such rest of a line
# is a field value with optional whitespace around it (words of those bytes parted by
# SP/HTAB runs), so this is the field-line grammar of RFC 9112 section 5; the value
# is the rest with the whitespace stripped.
_HEADER_BLOCK = re.compile(rf"(?:\r\n{_TOKEN}:[\t\x20-\x7e\x80-\xff]*+)*+")
_HEADER_FIELD = re.compile(rf"\r\n({_TOKEN}):([\t\x20-\x7e\x80-\xff]*)")
TOKEN_RE = re.compile(_TOKEN)
_TOKEN_BYTES = re.compile(_TOKEN.encode())
_TARGET_END = re.compile(rb"[\x00-\x08\x0a-\x1f\x7f ]")
# The line grammar of a request head (RFC 9112 sections 2.2 and 5.2, RFC 9110
# section 5.5): lines of SP, HTAB, visible bytes and obs-text (0x80-0xFF), each
# ended by CRLF, none after the first starting with SP or HTAB (obs-fold).  Where
# a match stops short, the head breaks the grammar there (``head_fault`` says
# how) -- or its bytes so far end in one of ``_PENDING``.  (Possessive: nothing
# is ever given back, so a match costs one pass.)
_HEAD_LINES = re.compile(
    rb"[\t\x20-\x7e\x80-\xff]*+(?:\r\n[\x21-\x7e\x80-\xff][\t\x20-\x7e\x80-\xff]*+)*+"
)
# Ends of an unfinished head that the next bytes decide.
_PENDING = (b"\r", b"\r\n", b"\r\n\r")
# Methods up to this long have an over-long target refused before the head ends.
EARLY_METHOD: Final = 16
FIELD_VALUE_RE = re.compile(_FIELD_VALUE)
_DIGITS = re.compile(r"[0-9]{1,15}")
# Request headers that change framing or the connection beyond keep-alive/close:
# the fast path leaves requests carrying them to h11.
_H11_ONLY = frozenset({"transfer-encoding", "expect", "upgrade", "te", "trailer"})


def parse_head(buf: bytearray, end: int, limits: HttpLimits) -> ParsedHead | None:
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
    line_end = text.find("\r\n")
    if line_end < 0:
        return None  # no header at all (no Host): the h11 path refuses it
    m = _REQUEST_LINE.fullmatch(text, 0, line_end)
    if m is None or len(m[2]) > limits.max_target_bytes:
        return None  # (a target over the limit: the h11 path refuses it, 414)
    if _HEADER_BLOCK.fullmatch(text, line_end) is None:
        return None  # a line off the grammar: the h11 path says which and refuses it
    items = [(n.lower(), v.strip(" \t")) for n, v in _HEADER_FIELD.findall(text, line_end)]
    if len(items) > limits.max_header_fields:
        return None  # too many header fields: the h11 path refuses them (431)
    merged = dict(items)
    if len(merged) != len(items):  # a repeated name (rare): values joined in order
        names = [n for n, _ in items]
        if names.count("host") != 1 or names.count("content-length") > 1:
            return None
        merged = {}
        for name, value in items:
            merged[name] = f"{merged[name]}, {value}" if name in merged else value
    if "host" not in merged or not _H11_ONLY.isdisjoint(merged):
        return None
    length = 0
    declared = merged.get("content-length")
    if declared is not None:
        if _DIGITS.fullmatch(declared) is None:
            return None
        length = int(declared)
    keep_alive = True
    connection = merged.get("connection")
    if connection is not None:
        tokens = {t.strip().lower() for t in connection.split(",")}
        if not tokens <= {"keep-alive", "close"}:
            return None
        keep_alive = "close" not in tokens
    max_head = limits.max_header_bytes
    if end + 5 + len(items) > max_head:
        # Near the limit: apply it to the canonical form, exactly as the h11 path
        # does (``head_size``), so both paths agree on every head.
        size = len(m[1]) + len(m[2]) + len("1.1") + len("  HTTP/\r\n") + 2
        if size + sum(len(n) + len(v) + 4 for n, v in items) > max_head:
            return None
    return ParsedHead(m[1], m[2], Headers(tuple(items), merged), end + 4, length, keep_alive)


def head_fault(
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


def head_size(req: h11.Request) -> int:
    # The size of the request line plus header block in canonical form
    # ("name: value" lines, CRLF endings): exact for what clients send, and what
    # h11's incremental limit measures on the raw bytes.
    line = len(req.method) + len(req.target) + len(req.http_version) + len(b"  HTTP/\r\n")
    return line + sum(len(n) + len(v) + 4 for n, v in req.headers) + 2


def head_refusal(req: h11.Request, limits: HttpLimits) -> tuple[int, Reason, str] | None:
    """The refusal of a complete head on the h11 path (status, reason, message), or None.

    The order (the first that applies answers): 431 head size, 414 target, 431
    header count, 400 ``Content-Length`` with ``Transfer-Encoding`` (or
    ``Transfer-Encoding`` on HTTP/1.0), 417 unknown expectation, 413 declared body
    size.  Every answer depends on the head alone, so it is the same however the
    bytes were split.
    """
    # h11 enforces max_incomplete_event_size only while the head is still
    # incomplete, so a head that arrives in one chunk would slip through; check
    # the complete head too (same answer however split): as received that is done
    # before h11 parses it (``HeadWatch``), here in its canonical form (which can
    # be the longer).
    if head_size(req) > limits.max_header_bytes:
        return 431, Reason.HEADERS_TOO_LARGE, "request header block too large"
    if len(req.target) > limits.max_target_bytes:
        # (A short method's over-long target is refused before the head ends.)
        return target_too_long(limits.max_target_bytes)
    if len(req.headers) > limits.max_header_fields:
        return (
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
        # RFC 9112 section 6.1: such a message is a request smuggling attempt or a
        # broken intermediary; never guess which framing the peer meant.
        return (
            400,
            Reason.AMBIGUOUS_FRAMING,
            "request has both Content-Length and Transfer-Encoding",
        )
    if chunked and req.http_version == b"1.0":
        # RFC 9112 section 6.1: an HTTP/1.0 message with Transfer-Encoding has faulty
        # framing (a 1.0 front end would not read it as chunked).
        return 400, Reason.AMBIGUOUS_FRAMING, "an HTTP/1.0 request may not have Transfer-Encoding"
    if expect and any(
        m.strip() and m.strip().lower() != b"100-continue" for m in b",".join(expect).split(b",")
    ):
        return (
            417,
            Reason.EXPECTATION_FAILED,
            "unsupported expectation (only 100-continue is supported)",
        )
    if declared is not None and declared > limits.max_body_bytes:
        return body_too_large(limits)
    return None


def target_too_long(max_target_bytes: int) -> tuple[int, Reason, str]:
    """The 414 of a request target over ``max_target_bytes``."""
    return 414, Reason.URI_TOO_LONG, f"request target longer than {max_target_bytes} bytes"


def body_too_large(limits: HttpLimits) -> tuple[int, Reason, str]:
    """The 413 of a request body over ``max_body_bytes``."""
    return 413, Reason.PAYLOAD_TOO_LARGE, f"request body larger than {limits.max_body_bytes} bytes"


def chunks_refusal(chunks: ChunkedCheck, limits: HttpLimits) -> tuple[int, Reason, str] | None:
    """The refusal of a chunked body whose lines break the grammar (400) or whose
    declared sizes pass ``max_body_bytes`` (413), or None."""
    if chunks.fault is not None:
        return 400, Reason.MALFORMED_HTTP, f"malformed HTTP request: {chunks.fault}"
    if chunks.too_large:
        return body_too_large(limits)
    return None


def h11_refusal(exc: h11.RemoteProtocolError) -> tuple[int, Reason, str]:
    """The refusal of what h11 rejected: 431 for a head too large, else its status
    with its verdict alone (never the bytes it quotes after it: a refusal does not
    echo the client, and the text is the same however the bytes were split)."""
    status = exc.error_status_hint
    text = str(exc)
    if status == 431 or "exceeds" in text.lower() or "too long" in text.lower():
        return 431, Reason.HEADERS_TOO_LARGE, "request header block too large"
    verdict = text.split(":", 1)[0].strip() or "unparseable head"
    return status, Reason.MALFORMED_HTTP, f"malformed HTTP request: {verdict}"


class HeadWatch:
    """The h11 path's own checks of a request head while it arrives.

    h11 parses a head only once it is complete, and accepts some heads a front end
    may read otherwise; these checks answer as soon as the bytes that decide have
    arrived, before every h11 parse, so the answer is the same however the bytes
    are split: an over-long target (:meth:`target_too_long`, a method of at most
    :data:`EARLY_METHOD` bytes), a break of the line grammar (:meth:`malformed`),
    no blank line within the head limit (:meth:`too_large`).  It keeps at most the
    first ``max_header_bytes + 1`` bytes of the head, and only those not decided yet.

    ``line`` mirrors the first ``_cap`` bytes of the head (so the request line can be
    checked before the head is complete, and a driver can tell a head begun from
    none); ``line_open`` until the target check has a final answer.  ``_tail``
    holds the bytes ``malformed`` has not checked yet (from ``_tail_check`` on,
    with the three before, where a blank line may start), of the first
    ``max_header_bytes + 1`` (``_seen`` so far); ``found`` once the blank line has
    been seen.
    """

    __slots__ = (
        "_cap",
        "_limit",
        "_max_target",
        "_seen",
        "_tail",
        "_tail_check",
        "found",
        "line",
        "line_open",
    )

    def __init__(self, data: bytes | bytearray, limits: HttpLimits) -> None:
        self._limit = limits.max_header_bytes
        self._max_target = limits.max_target_bytes
        self._cap = min(self._limit, EARLY_METHOD + self._max_target + 2)
        self.line = bytearray(data[: self._cap])
        self.line_open = True
        self._tail = bytearray(data[: self._limit + 1])
        self._tail_check = 0
        self._seen = len(self._tail)
        self.found = False

    @property
    def held(self) -> int:
        """Bytes of the head kept for the grammar check (undecided ones, at most 3 more)."""
        return len(self._tail)

    def feed(self, data: bytes | bytearray) -> None:
        """More bytes of the head (and maybe what follows it) arrived."""
        line = self.line
        if len(line) < self._cap:
            line += data[: self._cap - len(line)]
        room = self._limit + 1 - self._seen
        if room > 0 and not self.found:
            piece = data[:room]
            self._tail += piece
            self._seen += len(piece)

    def target_too_long(self) -> bool:
        """True when the request line arriving on the h11 path has an over-long target.

        Looks only at the start of the head (``line``, its first ``_cap``
        bytes), before h11 parses it: a method token of at most ``EARLY_METHOD``
        bytes, a space, then more than ``max_target_bytes`` bytes without a space
        or a control byte other than HTAB (CR and LF included: a control byte is
        refused as soon as it is seen, see ``malformed``).  The answer only
        ever turns from False to True as bytes arrive, and is checked before every
        h11 parse, so it is the same however the bytes are split; once it can no
        longer turn True, ``line_open`` is cleared (a long method's long target is
        refused when its head is complete).
        """
        line = self.line
        max_target = self._max_target
        if len(line) < max_target + 3:
            return False  # cannot hold a method, a space and max_target + 1 bytes yet
        sp = line.find(b" ", 0, EARLY_METHOD + 1)
        if sp < 0 or _TOKEN_BYTES.fullmatch(line, 0, sp) is None:
            if sp >= 0 or len(line) > EARLY_METHOD:
                self.line_open = False  # no (short) method: not for this check
            return False
        stop = sp + 2 + max_target  # the target would end at or past this offset
        if _TARGET_END.search(line, sp + 1, stop) is not None:
            self.line_open = False  # the target ends in time
            return False
        if len(line) >= stop:
            return True
        if len(line) >= self._cap:
            self.line_open = False  # the rest is past the head limit: h11 says 431
        return False

    def malformed(self) -> str | None:
        """What breaks the line grammar in the head arriving on the h11 path, or None.

        Checks the first ``max_header_bytes + 1`` bytes of the head, up to its
        blank line, with ``head_fault``, a piece at a time (``_tail``: what came
        since the last check, and the few bytes that one could not decide), so the
        head is not kept twice (h11 holds it).  h11 would accept bare LF line ends
        and obs-fold, and control bytes in field values; RFC 9112 lets a server
        refuse them, and a front end that reads them differently could be made to
        see another request than this server does (request smuggling).  Called
        before every h11 parse, after ``target_too_long``: a fault is refused as
        soon as its bytes are here, so the answer is the same however the bytes
        are split (a fault past the first ``max_header_bytes + 1`` bytes is never
        seen: such a head is refused 431 whatever it holds).
        """
        tail = self._tail
        end = tail.find(b"\r\n\r\n")  # (none starts before _tail_check)
        if end >= 0:
            fault, _ = head_fault(tail, self._tail_check, end, complete=True)
            self.found = True
            tail.clear()
            return fault
        fault, at = head_fault(tail, self._tail_check, len(tail), complete=False)
        # Keep what is undecided, and the last three bytes: a blank line may start there.
        keep = min(at, max(0, len(tail) - 3))
        del tail[:keep]
        self._tail_check = at - keep
        return fault

    def refusal(self) -> tuple[int, Reason, str] | None:
        """What to refuse the head with before h11 parses it, in order (414, 400
        ``malformed_http``, 431), or None."""
        if self.line_open and self.target_too_long():
            return target_too_long(self._max_target)
        if not self.found:
            fault = self.malformed()
            if fault is not None:
                return 400, Reason.MALFORMED_HTTP, f"malformed HTTP request: {fault}"
            if self.too_large():
                return 431, Reason.HEADERS_TOO_LARGE, "request header block too large"
        return None

    def too_large(self) -> bool:
        """True when no blank line came in the first ``max_header_bytes + 1`` bytes:
        what h11 says of a head still arriving, said before h11 parses one that came
        whole (it might refuse it otherwise, or let it pass).  (h11 refuses a head
        starting below 0x21 at its first byte.)"""
        return not self.found and self._seen > self._limit and self.line[0] > 0x20
