"""Response heads: checked once, encoded once, cached; and the hand-framed error answer.

Theory of operation
-------------------
A server sends the same few response heads again and again; :class:`HeadCache`
validates and encodes each ``(status, headers)`` once (bytes for the fast path,
an h11 event for the h11 path) and keeps a bounded number.  The checks
(:func:`check_status`, :func:`check_headers`) refuse what would corrupt the
response's framing: a header the connection sets itself, a malformed name or
value, a body on a status that has none.  :func:`raw_error_response` frames a
whole closing error answer by hand, for answers outside the request/response
cycle.
"""

from __future__ import annotations

import http
from collections.abc import Iterable
from typing import Final, TypeVar

import h11

from ._errors import LocalProtocolError
from ._http_head import FIELD_VALUE_RE, TOKEN_RE

_SERVER_HEADER: Final = b"weir"
# Response headers the connection sets itself.
_FRAMING = frozenset({"content-length", "transfer-encoding", "connection"})


def check_status(status: int, *, streamed: bool, body: bytes) -> None:
    if not 200 <= status <= 999:
        raise LocalProtocolError(f"status {status}: a final response needs 200-999")
    if status in (204, 304) and (streamed or body):
        raise LocalProtocolError(f"status {status} has no body; it cannot carry one")


def check_headers(headers: tuple[tuple[str, str], ...]) -> None:
    for name, value in headers:
        if name.lower() in _FRAMING:
            raise LocalProtocolError(f"header {name!r} is set by the connection, not the caller")
        if TOKEN_RE.fullmatch(name) is None or FIELD_VALUE_RE.fullmatch(value) is None:
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
            check_headers(headers)
            try:
                lines = "".join(f"{n}: {v}\r\n" for n, v in headers).encode("latin-1")
            except UnicodeEncodeError:
                raise LocalProtocolError("header values must be latin-1") from None
            head = b"HTTP/1.1 %d %s\r\nserver: %s\r\n%s" % (
                status,
                reason_phrase(status),
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
            check_headers(headers)
            event = h11.Response(
                status_code=status, headers=encode_headers(headers), reason=reason_phrase(status)
            )
            self._keep(self._events, key, event)
        return event

    def _keep(self, cache: dict[_HeadKey, _V], key: _HeadKey, value: _V) -> None:
        if len(cache) >= self.limit:
            cache.pop(next(iter(cache)))
        cache[key] = value


_V = TypeVar("_V")


def encode_headers(headers: Iterable[tuple[str, str]]) -> list[tuple[bytes, bytes]]:
    out = [(b"server", _SERVER_HEADER)]
    out.extend((k.encode("latin-1"), v.encode("latin-1")) for k, v in headers)
    return out


def reason_phrase(status: int) -> bytes:
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
    phrase = reason_phrase(status)
    head = b"HTTP/1.1 %d %s\r\n" % (status, phrase)
    head += b"server: weir\r\ncontent-type: application/json\r\nconnection: close\r\n"
    head += "".join(f"{n}: {v}\r\n" for n, v in headers).encode("latin-1")
    head += b"content-length: %d\r\n\r\n" % len(body)
    return head + body
