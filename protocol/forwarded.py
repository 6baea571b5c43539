"""Trusted proxies: which requests' forwarding headers to believe, and what they say.

A driver needs :class:`TrustedProxies` (``--forwarded-allow-ips``), :func:`resolve`
(one request's client, scheme and host) and :func:`forwarded_request` (the request with
the ``Host`` the client used).

(Public; see :mod:`weir.protocol`.)
"""

from __future__ import annotations

from ._forwarded import TrustedProxies, forwarded_request, peer_address, resolve

__all__ = [
    "TrustedProxies",
    "forwarded_request",
    "peer_address",
    "resolve",
]
