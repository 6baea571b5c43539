"""What the HTTP/1.1 core hands a driver: request events, headers, limits, and what
the peer owes.

Theory of operation
-------------------
:class:`~weir.protocol._http.HttpConnection` turns a connection's bytes into these
events: a whole :class:`HttpRequest` (its body complete), an :class:`HttpError`
(the refusal is queued to send, the connection then closes), :class:`ConnectionClosed`,
or :data:`NEED_DATA`.  :class:`HttpLimits` bounds everything a peer can make a
connection hold; :class:`Inbound` names what the peer owes while the driver waits,
so the driver can arm the matching read deadline.  Plain values: nothing here does
I/O or keeps state beyond one object.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Final, Protocol

from ._errors import Reason


class _Need(enum.Enum):
    NEED_DATA = "NEED_DATA"


#: Returned by :meth:`HttpConnection.next_event` when more bytes are needed.
NEED_DATA: Final = _Need.NEED_DATA


class _Lookup(Protocol):
    def __call__(self, name: str, default: str | None = None, /) -> str | None: ...


@dataclass(frozen=True, slots=True)
class Headers:
    """Request headers, names lower-cased, values decoded as latin-1.

    Repeated headers are kept in order; :meth:`get` joins them with ``", "``
    as RFC 9110 allows for list-valued fields.
    """

    items: tuple[tuple[str, str], ...]
    _map: Mapping[str, str] = field(repr=False, compare=False)
    #: ``get(name, default=None)``: the value of header ``name`` (lower-case), or
    #: ``default``.  The map's own lookup: a request reads its headers about ten
    #: times, and a method wrapping it was a Python call each time.
    get: _Lookup = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "get", self._map.get)

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
