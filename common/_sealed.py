"""Sealed request state: what a sessionless request's next round brings back.

Theory of operation
-------------------
An input-required result (MCP 2026-07-28) hands the client a ``requestState``
string that it echoes, unchanged, when it re-issues the request with the answers.
The state holds the answers of earlier rounds, so that any replica can run the
handler again without remembering anything.  The client holds it, so it must be
unreadable and unforgeable: :class:`StateSealer` seals it with AES-256-GCM (the
``cryptography`` library), a fresh 96-bit nonce each time.

* **Bound to its request.**  The sealed claims name the principal, the method, its
  target (tool or prompt name, resource URI), a digest of the other arguments and
  an expiry (wall-clock seconds, so that every replica reads it the same way).  A
  state replayed into another request, by another principal, or late, fails to
  open just like a tampered one.
* **Keys rotate.**  The first key seals; every key opens.  Each sealed string
  names its key by an 8-hex-digit id (a digest of the key), so opening tries one.
* **Bounded.**  A state is at most :data:`MAX_STATE` characters: what the client
  answered is carried back, and a client cannot make it grow without bound.

Opening never says why it failed: ``None`` is the only answer for a state that is
malformed, forged, tampered with, foreign or expired.
"""

from __future__ import annotations

import base64
import hashlib
import os
import time
from collections.abc import Sequence
from typing import Any, Final

import msgspec
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

#: The longest sealed state accepted or produced, in characters.
MAX_STATE: Final = 256 * 1024
#: How long a state stays valid, in seconds.
STATE_TTL: Final = 600.0

_PREFIX: Final = "w1."
_AAD: Final = b"weir request state v1"


def new_key() -> bytes:
    """A fresh random 256-bit key (for a single process, or to configure replicas)."""
    return AESGCM.generate_key(bit_length=256)


def parse_key(text: str) -> bytes:
    """A key from its configured form: 32 bytes, base64 (standard or URL-safe).

    Raises:
        ValueError: not base64 of exactly 32 bytes.
    """
    try:
        raw = base64.b64decode(text.strip().replace("-", "+").replace("_", "/"), validate=True)
    except ValueError:
        raise ValueError("a request-state key is 32 bytes, base64-encoded") from None
    if len(raw) != 32:
        raise ValueError("a request-state key is 32 bytes, base64-encoded")
    return raw


def _key_id(key: bytes) -> str:
    return hashlib.sha256(b"weir state key id" + key).hexdigest()[:8]


class StateSealer:
    """Seals and opens request state with a list of keys (the first one seals)."""

    __slots__ = ("_keys", "_seal_id", "ttl")

    def __init__(self, keys: Sequence[bytes], *, ttl: float = STATE_TTL) -> None:
        if not keys:
            raise ValueError("at least one key is needed")
        self._keys = {_key_id(k): AESGCM(k) for k in keys}
        self._seal_id = _key_id(keys[0])
        self.ttl = ttl

    def seal(self, claims: dict[str, Any], *, now: float | None = None) -> str:
        """``claims`` sealed, with an expiry ``ttl`` from ``now`` (wall clock).

        Raises:
            ValueError: the sealed state would be longer than :data:`MAX_STATE`.
        """
        issued = time.time() if now is None else now
        body = msgspec.json.encode({**claims, "exp": issued + self.ttl})
        nonce = os.urandom(12)
        sealed = self._keys[self._seal_id].encrypt(nonce, body, _AAD)
        token = _PREFIX + self._seal_id + "." + base64.urlsafe_b64encode(nonce + sealed).decode()
        if len(token) > MAX_STATE:
            raise ValueError(f"the request state would exceed {MAX_STATE} characters")
        return token

    def open(self, token: str, *, now: float | None = None) -> dict[str, Any] | None:
        """The claims of a state this server sealed and that has not expired, else None."""
        if len(token) > MAX_STATE or not token.startswith(_PREFIX):
            return None
        kid, _, b64 = token[len(_PREFIX) :].partition(".")
        aead = self._keys.get(kid)
        if aead is None:
            return None
        try:
            raw = base64.b64decode(b64, altchars=b"-_", validate=True)
            # One spelling per state: a last character that differs only in base64's
            # unused low bits decodes to the same bytes, and must not open as the same.
            if len(raw) < 12 + 16 or base64.urlsafe_b64encode(raw).decode() != b64:
                return None
            claims = msgspec.json.decode(aead.decrypt(raw[:12], raw[12:], _AAD))
        except (InvalidTag, ValueError, msgspec.DecodeError):
            return None
        if not isinstance(claims, dict):
            return None
        exp = claims.get("exp")
        if not isinstance(exp, int | float) or exp < (time.time() if now is None else now):
            return None
        return claims
