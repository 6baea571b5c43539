"""How the Redis store writes names and durations, and reads the server's replies.

Theory of operation
-------------------
* **Names in keys.**  :func:`_enc` percent-encodes a principal, a session id, an
  epoch or a mailbox name with no safe characters, so no key component holds
  ``{``, ``}``, ``:`` or ``%`` raw: the encoding is injective, and no id can move a
  hash tag or name another session's keys (the key layout is
  :mod:`._redis_connection`'s).
* **Durations** go to the server as whole milliseconds, rounded up and never 0
  (:func:`_ms`): a TTL or lease is never shorter than asked, nor "no expiry".
* **Replies** are decoded by shape.  One of the wrong type or shape -- data in the
  store that weir never wrote -- is :class:`~._store_errors.StoreUnavailable`
  (:func:`_reading`, :func:`_text`, :func:`_blob`, :func:`_items`), so the engine
  fails closed, never with a traceback; :func:`_record` rebuilds a
  :class:`~._store_records.SessionRecord` from its hash under the same rule.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator, Sequence
from urllib.parse import quote

from coredis.typing import ResponseType

from ._store_errors import StoreUnavailable
from ._store_records import SessionRecord


def _enc(text: str) -> str:
    """Percent-encode ``text`` so it holds no ``{ } : %`` (injective, see the module doc)."""
    return quote(text.encode("utf-8", "surrogatepass"), safe="")


def _ms(seconds: float) -> int:
    return max(1, math.ceil(seconds * 1000))


def _text(value: ResponseType) -> str:
    if isinstance(value, bytes):
        return value.decode("utf-8", "surrogateescape")
    if isinstance(value, str):
        return value
    raise StoreUnavailable(f"unexpected reply from the store: {value!r}")


def _blob(value: ResponseType) -> bytes:
    if isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode()
    raise StoreUnavailable(f"unexpected reply from the store: {value!r}")


def _items(value: ResponseType) -> list[ResponseType]:
    if isinstance(value, list):
        return value
    if isinstance(value, tuple):
        return list(value)
    raise StoreUnavailable(f"unexpected reply from the store: {value!r}")


@contextlib.contextmanager
def _reading(what: str) -> Iterator[None]:
    """Decode a reply: one of the wrong type or shape is :class:`StoreUnavailable`."""
    try:
        yield
    except (ValueError, TypeError, IndexError, KeyError, AttributeError) as exc:
        raise StoreUnavailable(f"{what}: malformed reply from the store: {exc!r}") from exc


def _record(principal: str, session_id: str, fields: dict[str, bytes]) -> SessionRecord:
    try:
        return SessionRecord(
            session_id=session_id,
            principal=principal,
            protocol_version=fields["protocol_version"].decode(),
            created_at=float(fields["created_at"]),
            generation=int(fields["generation"]),
            secret=fields["secret"].decode(),
            salt=fields.get("salt", b"").decode(),
            bound=fields.get("bound", b"0") == b"1",
            client=fields.get("client", b"").decode(),
        )
    except (KeyError, ValueError, UnicodeDecodeError) as exc:
        # Never written by this module: fail closed rather than guess.
        raise StoreUnavailable(f"malformed session record for {session_id!r}") from exc


def _pairs(flat: Sequence[ResponseType]) -> dict[str, bytes]:
    return {_text(flat[i]): _blob(flat[i + 1]) for i in range(0, len(flat) - 1, 2)}
