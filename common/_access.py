"""The access log: one line per HTTP request, the same fields on both runtimes.

Theory of operation
-------------------
A runtime that serves a request with the access log on (:func:`enabled`) makes one
:class:`AccessRecord` when the request is complete (:meth:`AccessRecord.begin`, with
its own monotonic clock's reading and the TCP peer), lets the router note who the
request speaks for (:meth:`AccessRecord.speaks_for`), and closes it when the response
has ended (:meth:`AccessRecord.end`, the status and refusal body the HTTP core
recorded, the bytes written): for an SSE stream that is when the stream ends, so the
duration is the stream's lifetime.  Nothing is formatted unless a handler takes the
line: the record is the log call's one argument, rendered by ``str()`` (text) or
read field by field (:mod:`weir.common._logs`'s JSON formatter).

Session ids are bearer secrets and never logged: :func:`tag` gives a keyed hash
(keyed BLAKE2b, 12 hex digits, under a key derived from the first request-state key),
the same on every replica given the same ``--state-key-file`` (or on every worker
of one ``--workers`` parent, which shares its keys), so one session's lines can be
followed across replicas; without shared keys each process hashes with its own.
Principals are hashed the same way (they may name a person).
"""

from __future__ import annotations

import hashlib
import hmac
import logging
from contextvars import ContextVar
from typing import Any, Protocol

import msgspec

from weir.common._logs import DIRECT


class Headers(Protocol):
    """What the access log reads of a request's headers (the core's ``Headers``)."""

    def get(self, name: str, default: str | None = None) -> str | None: ...


#: The logger of the access log (INFO; ``weir serve --no-access-log`` turns it off).
ACCESS = logging.getLogger("weir.access")

#: The record of the request being served in this task (None: the log is off).
CURRENT: ContextVar[AccessRecord | None] = ContextVar("weir_access_record", default=None)

_KEY = [hashlib.sha256(b"weir access log: no key set").digest()]  # (set_key replaces it)


def set_key(state_key: bytes) -> None:
    """Derive the hashing key from ``state_key`` (the first request-state key)."""
    _KEY[0] = hmac.new(state_key, b"weir access log", hashlib.sha256).digest()


def tag(value: str) -> str:
    """A keyed hash of ``value`` (12 hex digits): correlates, never reveals."""
    return hashlib.blake2b(value.encode(), key=_KEY[0], digest_size=6).hexdigest()


def enabled() -> bool:
    """Whether the access log takes lines now (checked once per request)."""
    return ACCESS.isEnabledFor(logging.INFO)


def client_address(peer: object, headers: Headers | None) -> str:
    """The client address of a request: the TCP peer (``host:port``).

    The one place that decides it: trusted-proxy handling (``Forwarded``,
    ``X-Forwarded-For`` from known proxies) belongs here.
    """
    if isinstance(peer, tuple) and len(peer) >= 2:
        host = str(peer[0])
        return f"[{host}]:{peer[1]}" if ":" in host else f"{host}:{peer[1]}"
    return "-" if peer is None else str(peer)


class _Params(msgspec.Struct):
    name: Any = None


class _Peek(msgspec.Struct):
    method: Any = None
    params: _Params | None = None


_peek = msgspec.json.Decoder(_Peek)


class _Data(msgspec.Struct):
    reason: Any = None


class _Error(msgspec.Struct):
    data: _Data | None = None


class _Refusal(msgspec.Struct):
    error: _Error | None = None


_refusal = msgspec.json.Decoder(_Refusal)


def _clean(text: str, limit: int = 64) -> str:
    """``text`` (a client's) fit for one log line: at most ``limit`` characters, each
    visible ASCII (anything else, spaces and line breaks included, is ``?``), so a
    client can neither break a line nor forge a field."""
    text = text[:limit]
    if text.isascii() and text.isprintable() and " " not in text:
        return text or "?"
    return "".join(c if "!" <= c <= "~" else "?" for c in text) or "?"


def _mcp(headers: Headers, body: bytes) -> tuple[str, str]:
    """(MCP method, tool name) of a request: the ``Mcp-Method`` / ``Mcp-Name``
    headers, else the body's (a batch is ``batch``; a response ``-``)."""
    method = headers.get("mcp-method")
    if method is not None:
        if method.startswith("tasks/"):  # its Mcp-Name is a task id: a handle, not logged
            return _clean(method), "-"
        return _clean(method), _clean(headers.get("mcp-name") or "-")
    if not body:
        return "-", "-"
    if body.lstrip()[:1] == b"[":
        return "batch", "-"
    try:
        peek = _peek.decode(body)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return "-", "-"
    if not isinstance(peek.method, str):
        return "-", "-"
    name = peek.params.name if peek.params is not None else None
    tool = _clean(name) if peek.method == "tools/call" and isinstance(name, str) else "-"
    return _clean(peek.method), tool


def refusal_reason(body: bytes) -> str:
    """``error.data.reason`` of a refusal body, or ``-``."""
    try:
        err = _refusal.decode(body).error
    except (msgspec.DecodeError, msgspec.ValidationError):
        return "-"
    if err is None or err.data is None or not isinstance(err.data.reason, str):
        return "-"
    return _clean(err.data.reason)


#: The keys of a line, in order (the JSON formatter's keys, the text line's order).
FIELDS = (
    "method",
    "path",
    "mcp_method",
    "tool",
    "status",
    "reason",
    "duration_ms",
    "bytes_sent",
    "session",
    "principal",
    "client",
)


class AccessRecord:
    """One request's line (see the module docstring).  Strings are already
    bounded; no field is the client's session id or principal in the clear."""

    __slots__ = (
        "_start",
        "_written",
        "bytes_sent",
        "client",
        "duration_ms",
        "mcp_method",
        "method",
        "path",
        "principal",
        "reason",
        "session",
        "status",
        "tool",
    )

    def __init__(self) -> None:
        self.method = self.path = self.mcp_method = self.tool = "-"
        self.reason = self.session = self.principal = self.client = "-"
        self.status = self.bytes_sent = self._written = 0
        self.duration_ms = self._start = 0.0

    @classmethod
    def begin(
        cls,
        method: str,
        target: str,
        headers: Headers,
        body: bytes,
        *,
        peer: object,
        now: float,
        written: int,
    ) -> AccessRecord:
        """A record for a complete request, at ``now`` (the runtime's monotonic
        clock, seconds) with ``written`` bytes already sent on its connection."""
        r = cls()
        r.method, r.path = _clean(method, 16), _clean(target.split("?", 1)[0], 256)
        if method == "POST":
            r.mcp_method, r.tool = _mcp(headers, body)
        sid = headers.get("mcp-session-id")
        if sid:
            r.session = tag(sid)
        r.client = client_address(peer, headers)
        r._start, r._written = now, written
        return r

    @classmethod
    def refused(cls, status: int, reason: str, *, peer: object, nbytes: int) -> AccessRecord:
        """A record for a request refused before it was complete (no head or body)."""
        r = cls()
        r.status, r.reason, r.bytes_sent = status, reason, nbytes
        r.client = client_address(peer, None)
        return r

    def speaks_for(self, principal: str, authorized: bool) -> None:
        """The request speaks for ``principal`` (hashed; ``-`` unless authorized)."""
        if authorized:
            self.principal = tag(principal)

    def end(self, status: int, error_body: bytes, *, now: float, written: int) -> None:
        """The response has ended (or the connection has) at ``now``."""
        self.status = status
        if status >= 400 and error_body:
            self.reason = refusal_reason(error_body)
        self.duration_ms = round((now - self._start) * 1000, 3)
        self.bytes_sent = written - self._written

    def fields(self) -> dict[str, object]:
        """The line's fields by :data:`FIELDS` key."""
        return {k: getattr(self, k) for k in FIELDS}

    def __str__(self) -> str:
        return (
            f"{self.method} {self.path} mcp={self.mcp_method} tool={self.tool} "
            f"status={self.status} reason={self.reason} ms={self.duration_ms:.3f} "
            f"bytes={self.bytes_sent} session={self.session} principal={self.principal} "
            f"client={self.client}"
        )

    def emit(self) -> None:
        """Hand the line to the access logger (straight to ``weir serve``'s stderr
        handler when nothing else would see it: the same line, a fraction of the
        cost; see :class:`weir.common._logs._Direct`)."""
        if (
            ACCESS.handlers
            or ACCESS.filters
            or not ACCESS.propagate
            or not DIRECT.write(ACCESS.name, str(self), self)
        ):
            ACCESS.info("%s", self, extra={"fields": self})


def speaks_for(principal: str, authorized: bool) -> None:
    """Note on the current request's record (if any) who it speaks for."""
    record = CURRENT.get()
    if record is not None:
        record.speaks_for(principal, authorized)


def new_session(session_id: str) -> None:
    """The current request (an initialize) made session ``session_id``: its line
    names it (hashed), so the session's first line is found with the rest."""
    record = CURRENT.get()
    if record is not None and record.session == "-":
        record.session = tag(session_id)
