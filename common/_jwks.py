"""JSON Web Key Sets for :class:`~weir.common.JwtVerifier`: which keys it keeps.

Theory of operation
-------------------
:func:`usable_keys` keeps only public keys that can verify one of the
verifier's (asymmetric) algorithms: ``kty`` ``RSA`` for ``RS*``/``PS*``, ``EC`` for
``ES*``, ``OKP`` for ``EdDSA``.  A key whose ``alg`` is not allowed or does not fit
its ``kty``, one meant for another ``use`` than ``sig``, a symmetric (``oct``) key --
whose material an attacker could sign HMAC tokens with -- or one PyJWT cannot load
is dropped, and one log line per key set says how many and why.  A key that names
its ``alg`` verifies only that algorithm (:meth:`Key.accepts`).

Fetching a key set is the runtime's (each has its own HTTP client: Trio's
``engine._jwks``, asyncio's ``weir.asyncio._jwks``); both follow no redirect, read
at most :data:`MAX_JWKS_BYTES` and raise :class:`JwksError`.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

import jwt

log = logging.getLogger("weir.auth")

#: The most bytes of a JWKS document read.
MAX_JWKS_BYTES: Final = 1 << 20
#: The most keys kept from one key set.
MAX_KEYS: Final = 64
#: The key type each accepted algorithm verifies with.
FAMILY: Final[Mapping[str, str]] = {
    "RS256": "RSA",
    "RS384": "RSA",
    "RS512": "RSA",
    "PS256": "RSA",
    "PS384": "RSA",
    "PS512": "RSA",
    "ES256": "EC",
    "ES384": "EC",
    "EdDSA": "OKP",
}


class JwksError(Exception):
    """The key set could not be fetched (a failed connection, a redirect, a large body)."""


@dataclass(frozen=True, slots=True)
class Key:
    """One usable public key of a key set."""

    kty: str
    #: The one algorithm the JWK names (``alg``), or None: any of its ``kty``.
    alg: str | None
    #: The public key (a ``cryptography`` object), as PyJWT verifies with it.
    key: Any

    def accepts(self, alg: str) -> bool:
        """Whether this key may verify a signature made with ``alg``."""
        return FAMILY.get(alg) == self.kty and (self.alg is None or self.alg == alg)


def usable_keys(jwks: object, algorithms: Sequence[str]) -> dict[str, Key]:
    """The keys of ``jwks`` (by ``kid``) that can verify one of ``algorithms``.

    Everything else is dropped, with one warning for the whole set (see the module
    docstring); at most :data:`MAX_KEYS` are kept, and of keys sharing a ``kid``
    the first.
    """
    keys, dropped = screen_keys(jwks, algorithms)
    if dropped:
        log.warning("ignoring %s", dropped)
    return keys


def screen_keys(jwks: object, algorithms: Sequence[str]) -> tuple[dict[str, Key], str]:
    """What :func:`usable_keys` keeps of ``jwks``, and what it drops and why
    (``""`` if nothing), without logging it."""
    entries = jwks.get("keys") if isinstance(jwks, Mapping) else None
    if not isinstance(entries, list):
        return {}, "a JWKS without a list of keys"
    keys: dict[str, Key] = {}
    dropped: list[str] = []
    for i, jwk in enumerate(entries):
        why, key = _usable(jwk, algorithms)
        kid = jwk.get("kid", "") if isinstance(jwk, Mapping) else ""
        if key is not None and (not isinstance(kid, str) or kid in keys):
            why, key = "a missing or repeated kid", None
        if key is None:
            dropped.append(f"key {i}: {why}")
        elif len(keys) >= MAX_KEYS:
            dropped.append(f"key {i}: more than {MAX_KEYS} keys")
        else:
            keys[kid] = key
    if not dropped:
        return keys, ""
    shown = "; ".join(dropped[:8]) + ("; ..." if len(dropped) > 8 else "")
    return keys, f"{len(dropped)} of {len(entries)} JWKS keys: {shown}"


def _usable(jwk: object, algorithms: Sequence[str]) -> tuple[str, Key | None]:
    """Why ``jwk`` is not usable (and None), or ``("", key)``."""
    if not isinstance(jwk, Mapping):
        return "not an object", None
    kty, alg, use = jwk.get("kty"), jwk.get("alg"), jwk.get("use")
    if kty not in {FAMILY[a] for a in algorithms}:
        return f"kty {_short(kty)} cannot verify {'/'.join(algorithms)}", None
    if alg is not None and (alg not in algorithms or FAMILY.get(alg) != kty):
        return f"alg {_short(alg)} is not allowed for kty {kty}", None
    if use is not None and use != "sig":
        return f"use {_short(use)} is not sig", None
    try:
        loaded = jwt.PyJWK(dict(jwk))
    except (jwt.PyJWTError, ValueError, TypeError, KeyError) as exc:
        return f"not loadable ({type(exc).__name__})", None
    if alg is None and kty == "EC":
        alg = loaded.algorithm_name  # (an EC curve fixes its algorithm)
        if alg not in algorithms:
            return f"its curve needs {alg}, not allowed", None
    return "", Key(kty=str(kty), alg=alg, key=loaded.key)


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 24 else text[:21] + "..."
