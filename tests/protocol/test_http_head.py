"""The fast path's head parser on its own: which heads it takes, and what it reads.

The differential test in ``test_http_fastpath.py`` shows the fast path and h11 agree
on what a connection answers; it would also pass if ``parse_head`` declined every
head.  These pin what the fast path itself takes (and how it reads the fields) and
what it leaves to h11.
"""

from __future__ import annotations

import pytest

from weir.protocol._http_events import HttpLimits
from weir.protocol._http_head import ParsedHead, parse_head


def _parse(
    *fields: str, limits: HttpLimits | None = None, line: str = "POST /mcp HTTP/1.1"
) -> ParsedHead | None:
    head = "\r\n".join([line, *fields]).encode("latin-1")
    buf = bytearray(head + b"\r\n\r\n")
    return parse_head(buf, len(head), limits or HttpLimits())


def test_a_common_post_is_read_field_by_field() -> None:
    head = _parse(
        "Host: localhost:8000",
        "Content-Type: \t application/json \t",
        "X-Odd: a\tb  c",
        "X-Latin: caf\xe9",
        "Content-Length: 12",
    )
    assert head is not None
    assert (head.method, head.target, head.content_length, head.keep_alive) == (
        "POST",
        "/mcp",
        12,
        True,
    )
    assert head.headers.items == (
        ("host", "localhost:8000"),
        ("content-type", "application/json"),  # whitespace around a value is not part of it
        ("x-odd", "a\tb  c"),  # ... whitespace inside it is
        ("x-latin", "caf\xe9"),  # obs-text stays
        ("content-length", "12"),
    )
    assert head.size == len(
        b"POST /mcp HTTP/1.1\r\nHost: localhost:8000\r\nContent-Type: \t application/json \t"
        b"\r\nX-Odd: a\tb  c\r\nX-Latin: caf\xe9\r\nContent-Length: 12\r\n\r\n"
    )


def test_a_repeated_field_is_joined_in_order_and_connection_close_is_read() -> None:
    head = _parse(
        "Host: x", "Accept: a/b", "accept: c/d", "Connection: keep-alive", "Connection: close"
    )
    assert head is not None
    assert head.headers.get("accept") == "a/b, c/d"
    assert [n for n, _ in head.headers.items].count("accept") == 2
    assert head.keep_alive is False
    assert head.content_length == 0


@pytest.mark.parametrize(
    "fields",
    [
        ("Content-Length: 1",),  # no Host
        ("Host: a", "Host: b"),
        ("Host: a", "Content-Length: 1", "Content-Length: 1"),
        ("Host: a", "Content-Length: +1"),
        ("Host: a", "Content-Length: " + "9" * 16),
        ("Host: a", "Transfer-Encoding: chunked"),
        ("Host: a", "Expect: 100-continue"),
        ("Host: a", "Connection: upgrade"),
        ("Host: a", " folded"),  # obs-fold
        ("Host: a", "X-Bad: a\x00b"),
        ("Host: a", "X-Bad: a\rb"),
        ("Host: a", "X-Bad: a\nb"),
        ("Host: a", "Bad Name: v"),
        ("Host: a", "NoColon"),
    ],
)
def test_anything_else_is_left_to_h11(fields: tuple[str, ...]) -> None:
    assert _parse(*fields) is None


@pytest.mark.parametrize("line", ["PUT /mcp HTTP/1.1", "POST /mcp HTTP/1.0", "POST mcp HTTP/1.1"])
def test_a_request_line_off_the_common_shape_is_left_to_h11(line: str) -> None:
    assert _parse("Host: a", line=line) is None


def test_the_limits_send_a_head_to_h11() -> None:
    fields = ("Host: a", "A: 1", "B: 2")
    assert _parse(*fields, limits=HttpLimits(max_header_fields=3)) is not None
    assert _parse(*fields, limits=HttpLimits(max_header_fields=2)) is None
    assert _parse(*fields, limits=HttpLimits(max_target_bytes=3)) is None  # "/mcp" is 4
    # The canonical size, as the h11 path measures it: "POST /mcp HTTP/1.1" and CRLF
    # (20), "host: a" and CRLF (9), "a: 1" and "b: 2" with theirs (6 each), CRLF (2).
    canonical = 20 + 9 + 6 + 6 + 2
    assert _parse(*fields, limits=HttpLimits(max_header_bytes=canonical)) is not None
    assert _parse(*fields, limits=HttpLimits(max_header_bytes=canonical - 1)) is None
