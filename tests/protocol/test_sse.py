"""Tests for weir.protocol._sse: exact encoder bytes, WHATWG decoder rules, properties.

Every decoder case runs twice, once with the input fed whole and once byte by
byte, and both must give the same items (h11's ``t_body_reader`` pattern).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from weir.protocol._sse import (
    SseComment,
    SseDecodeError,
    SseDecoder,
    SseEvent,
    SseItem,
    encode_comment,
    encode_event,
    encode_retry,
)

# --------------------------------------------------------------------------------------
# Helpers
# --------------------------------------------------------------------------------------


def feed_chunks(chunks: list[bytes], decoder: SseDecoder | None = None) -> list[SseItem]:
    """Feed ``chunks`` in order, then close; return every item produced."""
    decoder = decoder if decoder is not None else SseDecoder()
    items: list[SseItem] = []
    for chunk in chunks:
        items += decoder.feed(chunk)
    items += decoder.close()
    return items


def bytewise(data: bytes) -> list[bytes]:
    return [data[i : i + 1] for i in range(len(data))]


def decode(data: bytes) -> list[SseItem]:
    """Decode ``data`` whole and byte by byte; assert both agree; return the items."""
    whole = feed_chunks([data])
    assert feed_chunks(bytewise(data)) == whole
    return whole


def split_at(data: bytes, cuts: list[int]) -> list[bytes]:
    bounds = [0, *sorted(set(cuts)), len(data)]
    return [data[a:b] for a, b in itertools.pairwise(bounds)]


def ev(
    data: str, *, event: str = "message", id: str | None = None, retry: int | None = None
) -> SseEvent:
    return SseEvent(data=data, event=event, id=id, retry=retry)


# --------------------------------------------------------------------------------------
# Encoder
# --------------------------------------------------------------------------------------


def test_encode_data_only() -> None:
    assert encode_event("hello") == b"data: hello\n\n"


def test_encode_empty_data_is_one_data_line() -> None:
    assert encode_event("") == b"data: \n\n"


def test_encode_priming_event() -> None:
    assert encode_event("", id="0000abcd:0") == b"id: 0000abcd:0\ndata: \n\n"


def test_encode_field_order() -> None:
    assert encode_event("d", retry=5, event="e", id="1") == (
        b"id: 1\nevent: e\nretry: 5\ndata: d\n\n"
    )


@pytest.mark.parametrize(
    ("kwargs", "expected"),
    [
        ({"id": "42"}, b"id: 42\ndata: x\n\n"),
        ({"id": ""}, b"id: \ndata: x\n\n"),
        ({"id": " lead"}, b"id:  lead\ndata: x\n\n"),
        ({"event": "update"}, b"event: update\ndata: x\n\n"),
        ({"event": "a\0b"}, b"event: a\0b\ndata: x\n\n"),
        ({"retry": 0}, b"retry: 0\ndata: x\n\n"),
        ({"retry": 3000}, b"retry: 3000\ndata: x\n\n"),
    ],
)
def test_encode_single_field(kwargs: dict[str, str | int], expected: bytes) -> None:
    assert encode_event("x", **kwargs) == expected  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        ("a\nb", b"data: a\ndata: b\n\n"),
        ("a\r\nb", b"data: a\ndata: b\n\n"),
        ("a\rb", b"data: a\ndata: b\n\n"),
        ("a\n", b"data: a\ndata: \n\n"),
        ("\n", b"data: \ndata: \n\n"),
        ("a\r\n\r\nb", b"data: a\ndata: \ndata: b\n\n"),
        ("a\n\rb", b"data: a\ndata: \ndata: b\n\n"),
        ("a\u2028b\x85c", "data: a\u2028b\x85c\n\n".encode()),
    ],
)
def test_encode_multiline_data(data: str, expected: bytes) -> None:
    assert encode_event(data) == expected
    assert encode_event(data, id="1") == b"id: 1\n" + expected


def test_encode_is_utf8() -> None:
    assert (
        encode_event("h\u00e9 \u20ac \U0001d11e") == "data: h\u00e9 \u20ac \U0001d11e\n\n".encode()
    )


@pytest.mark.parametrize("bad", ["a\rb", "a\nb", "a\r\n", "\n", "a\0b"])
def test_encode_rejects_bad_id(bad: str) -> None:
    with pytest.raises(ValueError, match="id"):
        encode_event("x", id=bad)


@pytest.mark.parametrize("bad", ["a\rb", "a\nb", "\r\n"])
def test_encode_rejects_bad_event(bad: str) -> None:
    with pytest.raises(ValueError, match="event"):
        encode_event("x", event=bad)


def test_encode_rejects_negative_retry() -> None:
    with pytest.raises(ValueError, match="retry"):
        encode_event("x", retry=-1)
    with pytest.raises(ValueError, match="retry"):
        encode_retry(-1)


@pytest.mark.parametrize("bad", [True, 1.5, "10", None])
def test_encode_rejects_non_int_retry(bad: object) -> None:
    with pytest.raises(TypeError, match="retry"):
        encode_retry(bad)  # type: ignore[arg-type]
    if bad is not None:
        with pytest.raises(TypeError, match="retry"):
            encode_event("x", retry=bad)  # type: ignore[arg-type]


def test_encode_rejects_lone_surrogate() -> None:
    with pytest.raises(UnicodeEncodeError):
        encode_event("\ud800")


def test_encode_retry() -> None:
    assert encode_retry(3000) == b"retry: 3000\n\n"
    assert encode_retry(0) == b"retry: 0\n\n"


@pytest.mark.parametrize(
    ("text", "blank_line", "expected"),
    [
        ("", True, b": \n\n"),
        ("ping", True, b": ping\n\n"),
        ("replica=r1", False, b": replica=r1\n"),
        ("a\nb", True, b": a\n: b\n\n"),
        ("a\r\nb\rc", False, b": a\n: b\n: c\n"),
        ("x\n", True, b": x\n: \n\n"),
    ],
)
def test_encode_comment(text: str, blank_line: bool, expected: bytes) -> None:
    assert encode_comment(text, blank_line=blank_line) == expected


def test_encode_comment_default_ends_block() -> None:
    assert encode_comment() == b": \n\n"
    assert encode_comment("ping").endswith(b"\n\n")


# --------------------------------------------------------------------------------------
# Decoder: the examples from the WHATWG spec
# --------------------------------------------------------------------------------------


def test_spec_example_multiline_stock() -> None:
    stream = b"data: YHOO\ndata: +2\ndata: 10\n\n"
    assert decode(stream) == [ev("YHOO\n+2\n10")]


def test_spec_example_ids_and_comment() -> None:
    stream = (
        b": test stream\n\n"
        b"data: first event\nid: 1\n\n"
        b"data:second event\nid\n\n"
        b"data:  third event\n\n"
    )
    assert decode(stream) == [
        SseComment(text="test stream"),
        ev("first event", id="1"),
        ev("second event", id=""),
        ev(" third event", id=""),
    ]


def test_spec_example_last_block_needs_blank_line() -> None:
    stream = b"data: first event\nid: 1\n\ndata:  third event\n"
    assert decode(stream) == [ev("first event", id="1")]


def test_spec_example_empty_data() -> None:
    stream = b"data\n\ndata\ndata\n\ndata:"
    assert decode(stream) == [ev(""), ev("\n")]


def test_spec_example_optional_space() -> None:
    stream = b"data:test\n\ndata: test\n\n"
    assert decode(stream) == [ev("test"), ev("test")]


def test_spec_example_event_type() -> None:
    stream = b"event: add\ndata: 73857293\n\nevent: remove\ndata: 2153\n\ndata: 113411\n\n"
    assert decode(stream) == [
        ev("73857293", event="add"),
        ev("2153", event="remove"),
        ev("113411"),
    ]


# --------------------------------------------------------------------------------------
# Decoder: line endings, BOM, UTF-8
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("eol", [b"\n", b"\r", b"\r\n"])
def test_line_endings(eol: bytes) -> None:
    stream = eol.join([b"id: 1", b"data: a", b"data: b", b"", b"data: c", b"", b""])
    assert decode(stream) == [ev("a\nb", id="1"), ev("c", id="1")]


def test_mixed_line_endings() -> None:
    assert decode(b"data: a\r\rdata: b\n\r\ndata: c\r\n\n") == [ev("a"), ev("b"), ev("c")]


def test_lf_cr_is_two_line_endings() -> None:
    assert decode(b"data: a\n\rdata: b\n\n") == [ev("a"), ev("b")]


def test_crlf_split_across_feeds_is_one_line_ending() -> None:
    # Were the LF taken as a second line ending, "a" would be dispatched alone.
    assert feed_chunks([b"data: a\r", b"\ndata: b\r\n\r\n"]) == [ev("a\nb")]


def test_crlf_split_with_empty_feed_between() -> None:
    assert feed_chunks([b"data: a\r", b"", b"\ndata: b\n\n"]) == [ev("a\nb")]


def test_cr_at_chunk_end_dispatches_without_waiting() -> None:
    decoder = SseDecoder()
    assert decoder.feed(b"data: a\n\r") == [ev("a")]
    assert decoder.feed(b"\ndata: b\n") == []  # that LF completed the CRLF
    assert decoder.feed(b"\n") == [ev("b")]


def test_cr_then_cr_across_feeds() -> None:
    assert feed_chunks([b"data: a\r", b"\r"]) == [ev("a")]


def test_lf_at_chunk_start_without_preceding_cr() -> None:
    assert feed_chunks([b"data: a\n", b"\n"]) == [ev("a")]


def test_cr_inside_chunk_does_not_swallow_next_chunk_lf() -> None:
    assert feed_chunks([b"data: a\rdata: b", b"\n\n"]) == [ev("a\nb")]


BOM = b"\xef\xbb\xbf"


def test_bom_stripped() -> None:
    assert decode(BOM + b"data: x\n\n") == [ev("x")]


@pytest.mark.parametrize("cut", [1, 2, 3, 4])
def test_bom_split_across_feeds(cut: int) -> None:
    stream = BOM + b"data: x\n\n"
    assert feed_chunks([stream[:cut], stream[cut:]]) == [ev("x")]


def test_bom_alone_in_first_feed() -> None:
    assert feed_chunks([BOM, b"data: x\n\n"]) == [ev("x")]


def test_only_first_bom_stripped() -> None:
    # The second BOM becomes part of the field name "\ufeffdata", which is unknown.
    assert decode(BOM + BOM + b"data: x\n\n") == []


def test_bom_later_in_stream_not_stripped() -> None:
    assert decode(b"data: a\n\n" + BOM + b"data: b\n\n") == [ev("a")]


def test_partial_bom_is_data() -> None:
    assert decode(b"\xef\xbbdata: x\n\n") == []
    assert decode(b"\xef\xbb\n: c\n") == [SseComment(text="c")]


def test_partial_bom_at_eof() -> None:
    assert feed_chunks([b"\xef", b"\xbb"]) == []


def test_utf8_split_anywhere() -> None:
    text = "h\u00e9llo \u20ac \U0001d11e"
    stream = f"event: \u00e9\u00e9\ndata: {text}\n: {text}\n\n".encode()
    expected = [SseComment(text=text), ev(text, event="\u00e9\u00e9")]
    for cut in range(len(stream) + 1):
        assert feed_chunks([stream[:cut], stream[cut:]]) == expected
    assert decode(stream) == expected


def test_invalid_utf8_replaced() -> None:
    assert decode(b"data: \xff\xe2\x82\n\n") == [ev("\ufffd\ufffd")]


def test_truncated_char_before_line_end_replaced() -> None:
    assert feed_chunks([b"data: \xe2\x82", b"\rdata: \xac\n\n"]) == [ev("\ufffd\n\ufffd")]


# --------------------------------------------------------------------------------------
# Decoder: fields
# --------------------------------------------------------------------------------------


def test_id_persists_across_events() -> None:
    decoder = SseDecoder()
    items = feed_chunks([b"id: 7\ndata: a\n\ndata: b\n\n"], decoder)
    assert items == [ev("a", id="7"), ev("b", id="7")]
    assert decoder.last_event_id == "7"


def test_id_never_set_is_none() -> None:
    decoder = SseDecoder()
    assert feed_chunks([b"data: a\n\n"], decoder) == [ev("a")]
    assert decoder.last_event_id is None


def test_empty_id_resets_to_empty_string() -> None:
    assert decode(b"id: 1\ndata: a\n\nid\ndata: b\n\nid:\ndata: c\n\n") == [
        ev("a", id="1"),
        ev("b", id=""),
        ev("c", id=""),
    ]


def test_id_with_nul_ignored() -> None:
    assert decode(b"id: 1\ndata: a\n\nid: 2\x003\ndata: b\n\n") == [
        ev("a", id="1"),
        ev("b", id="1"),
    ]


def test_id_only_block_not_dispatched_but_committed() -> None:
    decoder = SseDecoder()
    assert feed_chunks([b"id: X\n\n"], decoder) == []
    assert decoder.last_event_id == "X"


def test_priming_event_is_dispatched_with_empty_data() -> None:
    # "data: " appends LF to the data buffer, so it is not empty at dispatch.
    decoder = SseDecoder()
    assert decoder.feed(encode_event("", id="X")) == [ev("", id="X")]
    assert decoder.last_event_id == "X"


def test_last_event_id_committed_only_at_blank_line() -> None:
    decoder = SseDecoder()
    assert decoder.feed(b"id: 5\ndata: x\n") == []
    assert decoder.last_event_id is None
    assert decoder.feed(b"\n") == [ev("x", id="5")]
    assert decoder.last_event_id == "5"


def test_incomplete_block_id_not_committed_at_eof() -> None:
    decoder = SseDecoder()
    assert feed_chunks([b"id: 1\ndata: a\n\nid: 2\ndata: b\n"], decoder) == [ev("a", id="1")]
    assert decoder.last_event_id == "1"


def test_event_type_reset_after_each_block() -> None:
    assert decode(b"event: a\n\ndata: x\n\nevent: b\ndata: y\n\nevent:\ndata: z\n\n") == [
        ev("x"),
        ev("y", event="b"),
        ev("z"),
    ]


def test_last_field_wins() -> None:
    assert decode(b"event: a\nevent: b\nid: 1\nid: 2\ndata: x\n\n") == [ev("x", event="b", id="2")]


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (b"1000", 1000),
        (b"0", 0),
        (b"007", 7),
        (b"000000000000000000000000000000042", 42),
        (b"", None),
        (b"-1", None),
        (b"+1", None),
        (b"1.5", None),
        (b" 10", None),  # the second space is part of the value
        (b"10 ", None),
        (b"10a", None),
        ("\u0661\u0662".encode(), None),  # Arabic-Indic digits are not ASCII digits
        ("\u00b2".encode(), None),
        (b"9" * 5000, None),  # absurd: ignored, never an int-conversion error
    ],
)
def test_retry_parsing(value: bytes, expected: int | None) -> None:
    decoder = SseDecoder()
    items = feed_chunks([b"retry: " + value + b"\ndata: x\n\n"], decoder)
    assert items == [ev("x", retry=expected)]
    assert decoder.retry == expected
    assert feed_chunks(bytewise(b"retry: " + value + b"\ndata: x\n\n")) == items


def test_retry_only_block_sets_decoder_retry() -> None:
    decoder = SseDecoder()
    assert feed_chunks([encode_retry(2500)], decoder) == []
    assert decoder.retry == 2500


def test_retry_takes_effect_at_once_and_persists() -> None:
    decoder = SseDecoder()
    assert decoder.feed(b"retry: 10\n") == []
    assert decoder.retry == 10
    assert decoder.feed(b"data: a\n\ndata: b\n\nretry: x\ndata: c\n\n") == [
        ev("a", retry=10),
        ev("b"),
        ev("c"),
    ]
    assert decoder.retry == 10


def test_unknown_fields_ignored() -> None:
    stream = b"foo: bar\ndata: x\nDATA: y\nData\n data: z\nretry\nid : 3\n\n"
    assert decode(stream) == [ev("x")]


def test_unknown_field_only_block_not_dispatched() -> None:
    assert decode(b"foo: bar\n\n") == []


@pytest.mark.parametrize(
    ("line", "data"),
    [
        (b"data", ""),
        (b"data:", ""),
        (b"data: ", ""),
        (b"data:  ", " "),
        (b"data:x", "x"),
        (b"data: a:b", "a:b"),
        (b"data:a: b", "a: b"),
        (b"data:\tx", "\tx"),
        (b"data: \0", "\0"),
    ],
)
def test_field_value_parsing(line: bytes, data: str) -> None:
    assert decode(line + b"\n\n") == [ev(data)]


@pytest.mark.parametrize(
    ("line", "text"),
    [
        (b": replica=r1", "replica=r1"),
        (b":no-space", "no-space"),
        (b":", ""),
        (b": ", ""),
        (b":  two", " two"),
        (b":: x", ": x"),
    ],
)
def test_comment_text(line: bytes, text: str) -> None:
    assert decode(line + b"\n") == [SseComment(text=text)]


def test_comments_in_order_with_events() -> None:
    stream = b": a\ndata: x\n: b\n\n: ping\n\ndata: y\n\n"
    assert decode(stream) == [
        SseComment(text="a"),
        SseComment(text="b"),
        ev("x"),
        SseComment(text="ping"),
        ev("y"),
    ]


def test_comment_does_not_end_block() -> None:
    assert decode(b"data: a\n: c\ndata: b\n\n") == [SseComment(text="c"), ev("a\nb")]


# --------------------------------------------------------------------------------------
# Decoder: end of stream and lifecycle
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "stream",
    [b"data: x", b"data: x\n", b"data: x\r", b"id: 1\ndata: x\nevent: e\n", b": partial"],
)
def test_eof_discards_incomplete_event(stream: bytes) -> None:
    assert decode(stream) == []


def test_close_returns_nothing_and_keeps_state() -> None:
    decoder = SseDecoder()
    assert decoder.feed(b"retry: 5\nid: 1\ndata: a\n\nid: 2\ndata: b\n") == [
        ev("a", id="1", retry=5)
    ]
    assert decoder.close() == []
    assert decoder.close() == []
    assert decoder.last_event_id == "1"
    assert decoder.retry == 5


def test_feed_after_close_raises() -> None:
    decoder = SseDecoder()
    decoder.close()
    with pytest.raises(RuntimeError, match="closed"):
        decoder.feed(b"data: x\n\n")


def test_empty_feed() -> None:
    decoder = SseDecoder()
    assert decoder.feed(b"") == []
    assert decoder.feed(b"data: x\n\n") == [ev("x")]
    assert decoder.feed(b"") == []


# --------------------------------------------------------------------------------------
# Decoder: limits
# --------------------------------------------------------------------------------------


def test_line_at_limit_accepted() -> None:
    line = b"data: " + b"x" * 10
    decoder = SseDecoder(max_line_bytes=len(line))
    assert feed_chunks([line + b"\n\n"], decoder) == [ev("x" * 10)]


@pytest.mark.parametrize("terminated", [True, False])
def test_line_over_limit_rejected(terminated: bool) -> None:
    line = b"data: " + b"x" * 11
    stream = line + (b"\n\n" if terminated else b"")
    for chunks in ([stream], bytewise(stream)):
        decoder = SseDecoder(max_line_bytes=len(line) - 1)
        with pytest.raises(SseDecodeError, match="max_line_bytes"):
            feed_chunks(chunks, decoder)


def test_comment_line_over_limit_rejected() -> None:
    with pytest.raises(SseDecodeError, match="max_line_bytes"):
        SseDecoder(max_line_bytes=8).feed(b": 123456789\n")


def test_error_is_sticky() -> None:
    decoder = SseDecoder(max_line_bytes=4)
    with pytest.raises(SseDecodeError):
        decoder.feed(b"data: long\n\n")
    with pytest.raises(SseDecodeError, match="already failed"):
        decoder.feed(b"\n")
    assert decoder.close() == []


def test_event_limit() -> None:
    # Each "data: xx" line costs 8 bytes plus 1 for its terminator.
    assert feed_chunks([b"data: xx\ndata: xx\n\n"], SseDecoder(max_event_bytes=18)) == [
        ev("xx\nxx")
    ]
    with pytest.raises(SseDecodeError, match="max_event_bytes"):
        feed_chunks([b"data: xx\ndata: xx\n\n"], SseDecoder(max_event_bytes=17))


def test_event_limit_is_per_block_and_counts_only_data() -> None:
    decoder = SseDecoder(max_event_bytes=9)
    stream = b": a long comment line\nid: a-long-id\ndata: xx\n\ndata: yy\n\n"
    assert feed_chunks([stream], decoder) == [
        SseComment(text="a long comment line"),
        ev("xx", id="a-long-id"),
        ev("yy", id="a-long-id"),
    ]


@pytest.mark.parametrize(
    "kwargs",
    [
        {"max_line_bytes": 0},
        {"max_line_bytes": -1},
        {"max_event_bytes": 0},
        {"max_event_bytes": True},
        {"max_line_bytes": 1.5},
    ],
)
def test_limits_validated(kwargs: dict[str, object]) -> None:
    with pytest.raises(ValueError, match="must be a positive int"):
        SseDecoder(**kwargs)  # type: ignore[arg-type]


def test_decode_error_is_value_error() -> None:
    assert issubclass(SseDecodeError, ValueError)


# --------------------------------------------------------------------------------------
# Round trips
# --------------------------------------------------------------------------------------


def test_round_trip() -> None:
    stream = b"".join(
        [
            encode_retry(1000),
            encode_event("", id="e:0"),
            encode_comment("replica=r1", blank_line=False),
            encode_event('{"jsonrpc":"2.0"}', id="e:1", event="message"),
            encode_comment(),
            encode_event("two\nlines\r\nhere\r", event="custom", retry=50),
            encode_event("\u20ac", id=""),
        ]
    )
    decoder = SseDecoder()
    assert decoder.feed(stream) == [
        ev("", id="e:0"),
        SseComment(text="replica=r1"),
        ev('{"jsonrpc":"2.0"}', id="e:1"),
        SseComment(text=""),
        ev("two\nlines\nhere\n", event="custom", id="e:1", retry=50),
        ev("\u20ac", id=""),
    ]
    assert decoder.last_event_id == ""
    assert decoder.retry == 50
    assert feed_chunks(bytewise(stream)) == decode(stream)


# --------------------------------------------------------------------------------------
# Property tests
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Comment:
    text: str
    blank_line: bool


@dataclass(frozen=True)
class _Event:
    data: str
    id: str | None
    event: str | None
    retry: int | None


_no_crlf = st.text().filter(lambda s: "\r" not in s and "\n" not in s)
_items = st.one_of(
    st.builds(
        _Event,
        data=st.text(),
        id=st.none() | _no_crlf.filter(lambda s: "\0" not in s),
        event=st.none() | _no_crlf,
        retry=st.none() | st.integers(min_value=0, max_value=10**12),
    ),
    st.builds(_Comment, text=st.text(), blank_line=st.booleans()),
)


def _normalise(text: str) -> str:
    return text.replace("\r\n", "\n").replace("\r", "\n")


def _encode_and_expect(items: list[_Event | _Comment]) -> tuple[bytes, list[SseItem]]:
    chunks: list[bytes] = []
    expected: list[SseItem] = []
    last_id: str | None = None
    for item in items:
        if isinstance(item, _Comment):
            chunks.append(encode_comment(item.text, blank_line=item.blank_line))
            expected += [SseComment(text=t) for t in _normalise(item.text).split("\n")]
        else:
            chunks.append(encode_event(item.data, id=item.id, event=item.event, retry=item.retry))
            last_id = item.id if item.id is not None else last_id
            expected.append(
                SseEvent(
                    data=_normalise(item.data),
                    event=item.event or "message",
                    id=last_id,
                    retry=item.retry,
                )
            )
    return b"".join(chunks), expected


@settings(max_examples=200, deadline=None)
@given(items=st.lists(_items, max_size=12), data=st.data())
def test_property_round_trip_any_split(items: list[_Event | _Comment], data: st.DataObject) -> None:
    stream, expected = _encode_and_expect(items)
    cuts = data.draw(st.lists(st.integers(min_value=0, max_value=len(stream)), max_size=20))
    assert feed_chunks(split_at(stream, cuts)) == expected


_garbage_pieces = st.sampled_from(
    [
        b"data",
        b"id",
        b"event",
        b"retry",
        b":",
        b" ",
        b"\r",
        b"\n",
        b"\r\n",
        b"\0",
        b"1",
        b"x",
        BOM,
        b"\xef",
        b"\xe2\x82",
        b"\xff",
    ]
)
_garbage = st.one_of(st.binary(max_size=400), st.lists(_garbage_pieces, max_size=80).map(b"".join))


def _run(chunks: list[bytes], max_line: int, max_event: int) -> list[SseItem] | None:
    """Decode; None if SseDecodeError was raised (any other exception propagates)."""
    try:
        return feed_chunks(chunks, SseDecoder(max_line_bytes=max_line, max_event_bytes=max_event))
    except SseDecodeError:
        return None


@settings(max_examples=200, deadline=None)
@given(
    stream=_garbage,
    data=st.data(),
    max_line=st.integers(min_value=1, max_value=64) | st.just(1 << 20),
    max_event=st.integers(min_value=1, max_value=128) | st.just(16 << 20),
)
def test_property_garbage_only_raises_decode_error(
    stream: bytes, data: st.DataObject, max_line: int, max_event: int
) -> None:
    cuts = data.draw(st.lists(st.integers(min_value=0, max_value=len(stream)), max_size=20))
    whole = _run([stream], max_line, max_event)
    # Chunking changes neither whether the limits trip nor, if not, the items.
    assert _run(split_at(stream, cuts), max_line, max_event) == whole
    assert _run(bytewise(stream), max_line, max_event) == whole
    for item in whole or []:
        assert isinstance(item, SseEvent | SseComment)
