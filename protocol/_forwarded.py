"""Trusted proxies: which request's forwarding headers to believe, and what they say.

Theory of operation
-------------------
A proxy in front of weir opens its own TCP connections, so the peer weir sees is the
proxy, and the ``Host`` the proxy sends may be its upstream's name rather than the
one the client used.  Proxies say what they received in ``X-Forwarded-For``,
``X-Forwarded-Proto``, ``X-Forwarded-Host`` or RFC 7239 ``Forwarded`` -- headers
anyone can send, so they are believed only when the TCP peer is in the operator's
:class:`TrustedProxies` (``--forwarded-allow-ips``).

:func:`resolve` computes a :class:`ClientView` (client address, scheme, host) for
**one request**, from its headers and its connection's peer: a proxy's one
keep-alive connection carries many users' requests, so nothing is kept on the
connection.  The rules:

* an untrusted peer: every forwarding header is ignored; the client is the peer;
* a trusted peer: ``Forwarded`` if it is present and well-formed, else the
  ``X-Forwarded-*`` headers.  The hops (``for=`` / ``X-Forwarded-For``, oldest
  first) are walked from the right past every trusted address; the first untrusted
  one is the client (all trusted: the left-most), and that hop's ``proto``/``host``
  are the scheme and host the client used (an ``X-Forwarded-Proto``/``-Host`` of one
  value applies to whichever hop is chosen);
* a field that does not parse is ignored (its default stands), never an error: a
  proxy's odd header must not break a request.  A client address is an IP address
  (or RFC 7239's ``unknown``/obfuscated ``_name``); a scheme is ``http`` or
  ``https``; a host is a DNS name, IPv4 or bracketed IPv6, with an optional port.

:func:`forwarded_request` applies a view to the request the endpoint rules see: its
``Host`` becomes the forwarded host, so the DNS-rebinding allow-list checks the
name the client used, not the proxy's upstream name.

Nothing here does I/O; the peer address comes in as an argument.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from typing import Final

from ._http_events import Headers, HttpRequest

_Net = ipaddress.IPv4Network | ipaddress.IPv6Network
_Addr = ipaddress.IPv4Address | ipaddress.IPv6Address

#: The most hops looked at (a header with more is walked only this far from the right).
MAX_HOPS: Final = 32

_HOST: Final = re.compile(
    r"(?:[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}"
    r"[A-Za-z0-9])?)*\.?|\[[0-9A-Fa-f:.]{2,45}\])(?::[0-9]{1,5})?"
)
_TOKEN: Final = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
_OBFUSCATED: Final = re.compile(r"_[A-Za-z0-9._-]{1,64}")


@dataclass(frozen=True, slots=True)
class TrustedProxies:
    """The peers whose forwarding headers are believed (``--forwarded-allow-ips``).

    Build it with :meth:`parse`.  ``everyone`` trusts every peer (``*``); otherwise a
    peer is trusted when its address lies in one of ``networks`` (an IPv4-mapped
    IPv6 peer counts as its IPv4 address).  The default trusts nobody.
    """

    networks: tuple[_Net, ...] = ()
    everyone: bool = False

    @classmethod
    def parse(cls, text: str) -> TrustedProxies:
        """``text``: comma-separated IP addresses and CIDR networks, or ``*``.

        Raises:
            ValueError: an entry that is neither, naming it.
        """
        nets: list[_Net] = []
        everyone = False
        for raw in text.split(","):
            entry = raw.strip()
            if not entry:
                continue
            if entry == "*":
                everyone = True
                continue
            try:
                nets.append(ipaddress.ip_network(entry, strict=False))
            except ValueError:
                raise ValueError(f"{entry!r} is not an IP address, a CIDR network or '*'") from None
        return cls(tuple(nets), everyone)

    @property
    def anyone(self) -> bool:
        """Whether any peer at all may be trusted (else :func:`resolve` is a no-op)."""
        return self.everyone or bool(self.networks)

    def trusts(self, address: str) -> bool:
        """Whether the peer or hop ``address`` (an IP, perhaps bracketed) is trusted."""
        if self.everyone:
            return True
        ip = _ip(address)
        if ip is None:
            return False
        return any(ip.version == n.version and ip in n for n in self.networks)


@dataclass(frozen=True, slots=True)
class ClientView:
    """Who sent one request, as far as the trusted proxies say.

    ``client`` is an address (or RFC 7239 ``unknown``/``_name``); ``scheme`` is
    ``http`` or ``https``; ``host`` is the authority the client asked for, or None
    when neither a proxy nor the request named one.
    """

    client: str
    scheme: str
    host: str | None


def resolve(peer: str, headers: Headers, trusted: TrustedProxies, scheme: str) -> ClientView:
    """The :class:`ClientView` of one request from ``peer`` (its connection's remote
    address) with ``headers``, on a listener serving ``scheme`` (see the module
    docstring for the rules).  Never raises on header content."""
    own = ClientView(peer, scheme, headers.get("host"))
    if not trusted.anyone or not trusted.trusts(peer):
        return own
    hops = _forwarded_hops(headers.get("forwarded"))
    if hops is None:
        hops = _x_forwarded_hops(headers)
    if not hops:
        return own
    # Walk from the right past the trusted proxies; the first other hop is the client.
    chosen = hops[0]
    for hop in reversed(hops[-MAX_HOPS:]):
        if hop.client is None or not trusted.trusts(hop.client):
            chosen = hop
            break
    else:
        chosen = hops[-MAX_HOPS:][0]
    return ClientView(
        chosen.client or peer,
        chosen.scheme or scheme,
        chosen.host or own.host,
    )


def peer_address(peername: object) -> str:
    """The address part of a socket's peer name (``(host, port, ...)``), or ``""``
    for one that has none (a Unix socket, a test stream): trusted by no list."""
    if isinstance(peername, tuple) and peername and isinstance(peername[0], str):
        return peername[0]
    return ""


def forwarded_request(request: HttpRequest, view: ClientView) -> HttpRequest:
    """``request`` with its ``Host`` set to ``view.host`` (itself if unchanged)."""
    if view.host is None or view.host == request.headers.get("host"):
        return request
    items = [(n, v) for n, v in request.headers.items if n != "host"]
    items.insert(0, ("host", view.host))
    headers = Headers.from_raw((n.encode("latin-1"), v.encode("latin-1")) for n, v in items)
    return HttpRequest(
        method=request.method,
        target=request.target,
        headers=headers,
        body=request.body,
        http_version=request.http_version,
    )


@dataclass(frozen=True, slots=True)
class _Hop:
    client: str | None  # None: the hop's address is absent or malformed
    scheme: str | None
    host: str | None


def _ip(text: str) -> _Addr | None:
    t = text.strip()
    if t.startswith("[") and t.endswith("]"):
        t = t[1:-1]
    try:
        ip = ipaddress.ip_address(t)
    except ValueError:
        return None
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    return ip


def _node(text: str) -> str | None:
    """A hop's address: ``ip``, ``ip:port``, ``[ipv6]``, ``[ipv6]:port``, ``unknown``
    or an obfuscated ``_name`` (port dropped); None if it is none of these."""
    t = text.strip()
    if t.lower() == "unknown" or _OBFUSCATED.fullmatch(t):
        return t
    if t.startswith("["):
        end = t.find("]")
        rest = t[end + 1 :] if end != -1 else "x"
        if rest and not (rest.startswith(":") and _port(rest[1:])):
            return None
        t = t[: end + 1]
    elif t.count(":") == 1:
        t, _, port = t.partition(":")
        if not _port(port):
            return None
    ip = _ip(t)
    return None if ip is None else str(ip)


def _port(text: str) -> bool:
    return text.isascii() and text.isdigit() and len(text) <= 5 and int(text) <= 65535


def _scheme(text: str | None) -> str | None:
    if text is None:
        return None
    s = text.strip().lower()
    return s if s in ("http", "https") else None


def _host(text: str | None) -> str | None:
    if text is None:
        return None
    h = text.strip()
    if len(h) > 261 or _HOST.fullmatch(h) is None:
        return None
    if h.startswith("[") and _ip(h.partition("]")[0] + "]") is None:
        return None
    if h.rpartition(":")[1] and not h.endswith("]") and not _port(h.rpartition(":")[2]):
        return None
    return h


def _x_forwarded_hops(headers: Headers) -> list[_Hop]:
    xff = headers.get("x-forwarded-for")
    protos = _list(headers.get("x-forwarded-proto"))
    hosts = _list(headers.get("x-forwarded-host"))
    clients = _list(xff)[-MAX_HOPS:] if xff is not None else []
    n = max(len(clients), 1)
    hops: list[_Hop] = []
    for i in range(n):
        client = _node(clients[i]) if clients else None
        hops.append(_Hop(client, _scheme(_aligned(protos, i, n)), _host(_aligned(hosts, i, n))))
    return hops


def _list(value: str | None) -> list[str]:
    return [] if value is None else [v.strip() for v in value.split(",")][-MAX_HOPS:]


def _aligned(values: list[str], i: int, n: int) -> str | None:
    """Hop ``i`` of ``n``'s entry in a list proxies appended to (aligned on the right);
    a single value applies to every hop."""
    if len(values) == 1:
        return values[0]
    j = len(values) - (n - i)
    return values[j] if 0 <= j < len(values) and len(values) == n else None


def _forwarded_hops(value: str | None) -> list[_Hop] | None:
    """RFC 7239 elements as hops, oldest first; None if absent or malformed (then the
    ``X-Forwarded-*`` headers are consulted instead)."""
    if value is None:
        return None
    elements = _forwarded_elements(value)
    if not elements:
        return None
    hops: list[_Hop] = []
    for pairs in elements[-MAX_HOPS:]:
        node = pairs.get("for")
        hops.append(
            _Hop(
                _node(node) if node is not None else None,
                _scheme(pairs.get("proto")),
                _host(pairs.get("host")),
            )
        )
    return hops


def _forwarded_elements(value: str) -> list[dict[str, str]] | None:
    """``forwarded-element *( "," forwarded-element )``, each ``pair *( ";" pair )``
    with ``token "=" ( token / quoted-string )``; None on any syntax error."""
    elements: list[dict[str, str]] = []
    pairs: dict[str, str] = {}
    i, n = 0, len(value)
    while True:
        while i < n and value[i] in " \t":
            i += 1
        m = _TOKEN.match(value, i)
        if m is None:
            return None
        name = m.group().lower()
        i = m.end()
        if i >= n or value[i] != "=":
            return None
        i += 1
        if i < n and value[i] == '"':
            out: list[str] = []
            i += 1
            while i < n and value[i] != '"':
                if value[i] == "\\":
                    i += 1
                    if i >= n:
                        return None
                out.append(value[i])
                i += 1
            if i >= n:
                return None
            i += 1
            val = "".join(out)
        else:
            m = _TOKEN.match(value, i)
            if m is None:
                return None
            val, i = m.group(), m.end()
        if name in pairs:
            return None  # (RFC 7239 section 4: each parameter at most once per element)
        pairs[name] = val
        while i < n and value[i] in " \t":
            i += 1
        if i >= n:
            elements.append(pairs)
            return elements
        if value[i] == ";":
            i += 1
        elif value[i] == ",":
            elements.append(pairs)
            pairs = {}
            i += 1
        else:
            return None
