"""Trusted proxies: the forwarding-header parser (``weir.protocol.forwarded``).

Examples pin the rules (right-most untrusted hop, RFC 7239 and X-Forwarded-*,
untrusted peers ignored); properties check that no header content makes the
parser raise, that an untrusted peer's headers never matter, and that what it
returns is always a well-formed address, scheme and host.
"""

from __future__ import annotations

import ipaddress

import pytest
from hypothesis import given
from hypothesis import strategies as st

from weir.protocol import EndpointConfig, HttpRequest, check_host_and_origin
from weir.protocol._forwarded import ClientView, _forwarded_elements
from weir.protocol._http_events import Headers
from weir.protocol.forwarded import TrustedProxies, forwarded_request, resolve

LOCAL = TrustedProxies.parse("127.0.0.1, 10.0.0.0/8")


def _h(*pairs: tuple[str, str]) -> Headers:
    return Headers.from_raw((n.encode(), v.encode("latin-1")) for n, v in pairs)


def test_parse_accepts_ips_networks_and_star() -> None:
    t = TrustedProxies.parse(" 127.0.0.1 ,10.0.0.0/8,::1,fd00::/8,")
    assert t.trusts("127.0.0.1") and t.trusts("10.9.8.7") and t.trusts("[::1]")
    assert t.trusts("::ffff:10.1.1.1")  # an IPv4-mapped peer is its IPv4 address
    assert not t.trusts("192.0.2.1") and not t.trusts("unknown") and not t.trusts("")
    assert TrustedProxies.parse("*").trusts("203.0.113.9")
    assert not TrustedProxies.parse("").anyone and not TrustedProxies().trusts("127.0.0.1")


@pytest.mark.parametrize("bad", ["localhost", "10.0.0.0/33", "1.2.3", "*x", "10.0.0.1:80"])
def test_parse_refuses_what_is_not_an_address(bad: str) -> None:
    with pytest.raises(ValueError, match="is not an IP address"):
        TrustedProxies.parse(f"127.0.0.1,{bad}")


def test_untrusted_peer_is_ignored_entirely() -> None:
    h = _h(
        ("host", "localhost:8000"),
        ("x-forwarded-for", "1.2.3.4"),
        ("x-forwarded-proto", "https"),
        ("x-forwarded-host", "evil.example"),
        ("forwarded", "for=5.6.7.8;proto=https;host=evil.example"),
    )
    assert resolve("192.0.2.1", h, LOCAL, "http") == ClientView(
        "192.0.2.1", "http", "localhost:8000"
    )


def test_trusted_peer_x_forwarded() -> None:
    h = _h(
        ("host", "upstream:8000"),
        ("x-forwarded-for", "203.0.113.7, 10.0.0.2"),
        ("x-forwarded-proto", "https"),
        ("x-forwarded-host", "mcp.example.com"),
    )
    assert resolve("127.0.0.1", h, LOCAL, "http") == ClientView(
        "203.0.113.7", "https", "mcp.example.com"
    )


def test_right_most_untrusted_hop_wins_over_a_spoofed_left() -> None:
    # The client put "1.1.1.1" in front itself; the trusted proxy appended its peer.
    h = _h(("x-forwarded-for", "1.1.1.1, 198.51.100.4, 10.0.0.9"))
    assert resolve("10.0.0.1", h, LOCAL, "http").client == "198.51.100.4"
    # Every hop trusted: the left-most.
    h = _h(("x-forwarded-for", "10.0.0.3, 10.0.0.9"))
    assert resolve("10.0.0.1", h, LOCAL, "http").client == "10.0.0.3"


def test_rfc7239_forwarded_takes_the_chosen_hops_proto_and_host() -> None:
    h = _h(
        ("host", "upstream"),
        (
            "forwarded",
            'for=192.0.2.60;proto=https;host="mcp.example.com:8443", '
            'For="[2001:db8:cafe::17]:4711";proto=http;host=inner, for=10.0.0.5',
        ),
        ("x-forwarded-host", "ignored.example"),
    )
    v = resolve("10.0.0.1", h, LOCAL, "http")
    assert v == ClientView("2001:db8:cafe::17", "http", "inner")


def test_malformed_fields_are_ignored_not_fatal() -> None:
    h = _h(
        ("host", "localhost"),
        ("x-forwarded-for", "not-an-ip"),
        ("x-forwarded-proto", "gopher"),
        ("x-forwarded-host", "bad host/with space"),
    )
    assert resolve("127.0.0.1", h, LOCAL, "http") == ClientView("127.0.0.1", "http", "localhost")
    # A malformed Forwarded falls back to X-Forwarded-*.
    h = _h(("forwarded", "for=1.2.3.4;;"), ("x-forwarded-proto", "https"))
    assert resolve("127.0.0.1", h, LOCAL, "http").scheme == "https"
    # Obfuscated and unknown nodes are clients, not errors.
    assert resolve("127.0.0.1", _h(("forwarded", "for=_hidden")), LOCAL, "http").client == (
        "_hidden"
    )
    assert resolve("127.0.0.1", _h(("x-forwarded-for", "unknown")), LOCAL, "http").client == (
        "unknown"
    )


def test_forwarded_host_reaches_the_host_check() -> None:
    config = EndpointConfig(allowed_hosts=frozenset({"mcp.example.com"}))
    request = HttpRequest(
        method="POST",
        target="/mcp",
        headers=_h(("host", "upstream:8000"), ("x-forwarded-host", "mcp.example.com")),
    )
    with pytest.raises(Exception, match="not allowed"):
        check_host_and_origin(request.headers, config)
    seen = forwarded_request(request, resolve("127.0.0.1", request.headers, LOCAL, "http"))
    check_host_and_origin(seen.headers, config)
    assert seen.headers.get("x-forwarded-host") == "mcp.example.com"
    # Untrusted: the request is left exactly as it came.
    same = forwarded_request(request, resolve("192.0.2.1", request.headers, LOCAL, "http"))
    assert same is request


_FIELD = st.text(st.characters(min_codepoint=0x20, max_codepoint=0xFF), max_size=80)
_NAMES = st.sampled_from(["forwarded", "x-forwarded-for", "x-forwarded-proto", "x-forwarded-host"])
_HEADERS = st.lists(st.tuples(_NAMES, _FIELD), max_size=6)
_PEERS = st.sampled_from(["127.0.0.1", "10.1.2.3", "192.0.2.1", "::1", "2001:db8::1"])


@given(_HEADERS, _PEERS)
def test_any_header_content_gives_a_well_formed_view(
    pairs: list[tuple[str, str]], peer: str
) -> None:
    view = resolve(peer, _h(("host", "localhost"), *pairs), LOCAL, "http")
    assert view.scheme in ("http", "https")
    if view.client not in ("unknown",) and not view.client.startswith("_"):
        ipaddress.ip_address(view.client)
    assert view.host is not None
    assert all(0x21 <= ord(c) <= 0x7E for c in view.host)


@given(_HEADERS)
def test_an_untrusted_peers_headers_never_matter(pairs: list[tuple[str, str]]) -> None:
    view = resolve("192.0.2.1", _h(("host", "localhost"), *pairs), LOCAL, "https")
    assert view == ClientView("192.0.2.1", "https", "localhost")


@given(
    st.lists(st.ip_addresses(v=4).map(str), min_size=1, max_size=8),
    st.lists(st.sampled_from(["10.0.0.7", "127.0.0.1"]), max_size=4),
)
def test_the_client_is_the_right_most_untrusted_hop(outside: list[str], proxies: list[str]) -> None:
    chain = ", ".join(outside + proxies)
    view = resolve("127.0.0.1", _h(("x-forwarded-for", chain)), LOCAL, "http")
    untrusted = [a for a in outside + proxies if not LOCAL.trusts(a)]
    assert view.client == (untrusted[-1] if untrusted else (outside + proxies)[0])


@given(
    st.lists(
        st.tuples(st.ip_addresses().map(str), st.sampled_from(["http", "https"])),
        min_size=1,
        max_size=5,
    )
)
def test_rfc7239_round_trip(hops: list[tuple[str, str]]) -> None:
    def node(a: str) -> str:
        return f'"[{a}]"' if ":" in a else a

    value = ", ".join(f"for={node(a)};proto={p}" for a, p in hops)
    view = resolve("1.2.3.4", _h(("forwarded", value)), TrustedProxies.parse("*"), "http")
    a, p = hops[0]  # (every hop trusted: the left-most)
    ip = ipaddress.ip_address(a)
    mapped = ip.ipv4_mapped if isinstance(ip, ipaddress.IPv6Address) else None
    assert view.client == str(mapped or ip) and view.scheme == p


_QUOTED = st.text(st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=30)


@given(st.lists(_QUOTED, min_size=1, max_size=4))
def test_rfc7239_quoted_values_keep_commas_semicolons_and_escapes(values: list[str]) -> None:
    """A quoted-string may hold ``,``, ``;``, ``=`` and escaped quotes: the elements
    still split where the header says, so each hop keeps its own ``for=``."""

    def quoted(text: str) -> str:
        return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'

    value = ", ".join(f"host={quoted(v)};for=10.0.0.{i}" for i, v in enumerate(values))
    elements = _forwarded_elements(value)
    assert elements is not None
    assert [e["host"] for e in elements] == values
    assert [e["for"] for e in elements] == [f"10.0.0.{i}" for i in range(len(values))]
