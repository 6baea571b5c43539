"""Who each request comes from: the per-request view both runtimes take of it.

:func:`as_seen` is what the Trio engine and the asyncio runtime call on every
request before routing it: with trusted proxies configured, the request's
forwarding headers (:mod:`weir.protocol.forwarded`) decide the ``Host`` the
allow-list checks, and the client the access log names for the request (the
proxy's client, not the proxy); the ``weir.requests`` logger, at DEBUG, names each
request's client too.  Per request, never per connection: a
proxy's one keep-alive connection carries many users.
"""

from __future__ import annotations

import logging

from weir.common._access import CURRENT as CURRENT_ACCESS
from weir.protocol import HttpRequest
from weir.protocol.forwarded import TrustedProxies, forwarded_request, resolve

#: One DEBUG line per request naming its client, scheme and host.
REQUEST_LOG = logging.getLogger("weir.requests")


def as_seen(request: HttpRequest, peer: str, trusted: TrustedProxies, scheme: str) -> HttpRequest:
    """``request`` as its client sent it, by what ``trusted`` proxies say (the
    request itself when nobody is trusted); logged at DEBUG on ``weir.requests``."""
    logged = REQUEST_LOG.isEnabledFor(logging.DEBUG)
    if not trusted.anyone and not logged:
        return request
    view = resolve(peer, request.headers, trusted, scheme)
    record = CURRENT_ACCESS.get()
    if record is not None and view.client != peer:  # (a trusted proxy named the client)
        record.client = view.client
    if logged:
        REQUEST_LOG.debug(
            "%s %r from client %s (%s, host %r, via %s)",
            request.method,
            request.path,
            view.client,
            view.scheme,
            view.host,
            peer,
        )
    return forwarded_request(request, view)
