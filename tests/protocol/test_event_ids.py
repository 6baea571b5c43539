"""Tests for weir.protocol._event_ids: the ``<epoch>:<seq>`` grammar, ordering, epochs."""

from __future__ import annotations

import pytest

from weir.protocol import Reason, RemoteProtocolError
from weir.protocol._event_ids import EventId, parse_event_id
from weir.protocol.event_ids import format_epoch


@pytest.mark.parametrize(
    ("raw", "epoch", "seq"),
    [
        ("00000000:0", "00000000", 0),
        ("0000abcd:1", "0000abcd", 1),
        ("ffffffff:42", "ffffffff", 42),
        ("deadbeef:999999999999999999", "deadbeef", 10**18 - 1),
        (" 0000abcd:7\t", "0000abcd", 7),
    ],
)
def test_parse_and_format_round_trip(raw: str, epoch: str, seq: int) -> None:
    eid = parse_event_id(raw)
    assert eid == EventId(epoch, seq)
    assert (eid.epoch, eid.seq) == (epoch, seq)
    assert str(eid) == f"{epoch}:{seq}"
    assert parse_event_id(str(eid)) == eid


@pytest.mark.parametrize(
    "raw",
    [
        "42",  # a per-process counter
        "",
        " ",
        ":",
        "0000ABCD:1",  # uppercase hex
        "0000abcD:1",
        "abcd:1",  # epoch too short
        "000000abcd:1",  # epoch too long
        "0000abcg:1",  # not hex
        "0000abcd:",
        ":1",
        "0000abcd",
        "0000abcd:01",  # leading zero in seq
        "00000001:00",
        "0000abcd:-1",  # negative
        "0000abcd:+1",
        "0000abcd:1.0",
        "0000abcd:1e3",
        "0000abcd:1:2",
        "0000abcd:1000000000000000000",  # 19 digits: beyond the grammar
        "0000abcd:" + "9" * 5000,
        "0000abcd:\u0661",  # non-ASCII digit
        "0000abcd:1\n",
        "0000abcd :1",
        "garbage",
        "x" * 500,
    ],
)
def test_malformed_ids_are_400_cursor_invalid(raw: str) -> None:
    with pytest.raises(RemoteProtocolError) as info:
        parse_event_id(raw)
    exc = info.value
    assert (exc.http_status, exc.reason) == (400, Reason.CURSOR_INVALID)
    assert len(exc.message) < 300  # a huge header is not echoed back whole


def test_ordering_is_by_epoch_then_seq() -> None:
    ids = [
        EventId("00000002", 0),
        EventId("00000001", 10),
        EventId("00000001", 9),
        EventId("0000000a", 0),
        EventId("00000001", 0),
    ]
    assert sorted(ids) == [
        EventId("00000001", 0),
        EventId("00000001", 9),
        EventId("00000001", 10),
        EventId("00000002", 0),
        EventId("0000000a", 0),
    ]
    assert EventId("00000001", 9) < EventId("00000001", 10)  # numeric, not textual
    assert EventId("00000001", 3) == parse_event_id("00000001:3")
    assert len({EventId("00000001", 3), parse_event_id("00000001:3")}) == 1


def test_next_follows_on_the_same_stream() -> None:
    eid = EventId("0000abcd", 41)
    assert eid.next() == EventId("0000abcd", 42)
    assert eid.next() > eid
    assert str(EventId("0000abcd", 0).next()) == "0000abcd:1"


@pytest.mark.parametrize(
    ("epoch", "seq"),
    [("ABCDEF01", 0), ("abc", 0), ("abcdef012", 0), ("abcdefgh", 0), ("00000001", -1)],
)
def test_constructor_validates(epoch: str, seq: int) -> None:
    with pytest.raises(ValueError):
        EventId(epoch, seq)


def test_event_id_is_frozen() -> None:
    eid = EventId("00000001", 1)
    with pytest.raises(AttributeError):
        eid.seq = 2  # type: ignore[misc]


@pytest.mark.parametrize(
    ("n", "text"),
    [(0, "00000000"), (1, "00000001"), (0xABCDEF, "00abcdef"), (0xFFFFFFFF, "ffffffff")],
)
def test_format_epoch(n: int, text: str) -> None:
    assert format_epoch(n) == text
    assert EventId(format_epoch(n), 0).epoch == text


@pytest.mark.parametrize("n", [-1, 0x1_0000_0000, 2**64])
def test_format_epoch_out_of_range(n: int) -> None:
    with pytest.raises(ValueError):
        format_epoch(n)
