"""Tests for weir.protocol._deadlines: read deadlines by what the peer owes."""

from __future__ import annotations

import pytest

from weir.protocol import (
    HttpConnection,
    Inbound,
    ReadClock,
    ReadTimeouts,
    Reason,
)

TIMEOUTS = ReadTimeouts(keepalive=75.0, head=30.0, body=60.0)


def test_an_idle_wait_starts_afresh_and_is_no_timeout_to_answer() -> None:
    clock = ReadClock(TIMEOUTS)
    assert clock.deadline(Inbound.IDLE, 10.0) == 85.0
    assert clock.deadline(Inbound.IDLE, 50.0) == 125.0
    assert not clock.owed  # a missed idle deadline just closes


def test_a_trickled_head_does_not_reset_its_deadline() -> None:
    clock = ReadClock(TIMEOUTS)
    assert clock.deadline(Inbound.HEAD, 100.0) == 130.0
    for now in (101.0, 110.0, 129.0):  # byte after byte: the same deadline
        assert clock.deadline(Inbound.HEAD, now) == 130.0
    assert clock.owed
    refusal = clock.refusal()
    assert (refusal.http_status, refusal.reason) == (408, Reason.REQUEST_TIMEOUT)
    assert "head" in refusal.message


def test_the_body_gets_its_own_deadline_from_the_end_of_the_head() -> None:
    clock = ReadClock(TIMEOUTS)
    clock.deadline(Inbound.HEAD, 0.0)
    assert clock.deadline(Inbound.BODY, 20.0) == 80.0
    assert clock.deadline(Inbound.BODY, 70.0) == 80.0
    assert "body" in clock.refusal().message
    clock.request_done()
    assert not clock.owed and clock.deadline(Inbound.IDLE, 90.0) == 165.0


def _owed(conn: HttpConnection) -> Inbound:
    return conn.inbound


def test_the_phases_follow_what_the_connection_owes() -> None:
    conn, clock = HttpConnection(), ReadClock(TIMEOUTS)
    assert clock.deadline(conn.inbound, 0.0) == 75.0
    conn.receive_data(b"POST /mcp HTTP/1.1\r\nHost: x\r\n")
    assert conn.next_event() is not None and _owed(conn) is Inbound.HEAD
    assert clock.deadline(_owed(conn), 1.0) == 31.0
    conn.receive_data(b"Content-Length: 5\r\n\r\nab")
    conn.next_event()
    assert _owed(conn) is Inbound.BODY and clock.deadline(_owed(conn), 2.0) == 62.0


@pytest.mark.parametrize("field", ["keepalive", "head", "body"])
def test_a_timeout_must_be_positive(field: str) -> None:
    with pytest.raises(ValueError):
        ReadTimeouts(**{field: 0.0})


@pytest.mark.parametrize("linger", [-0.5, 61.0])
def test_linger_is_zero_to_a_minute(linger: float) -> None:
    with pytest.raises(ValueError, match="linger"):
        ReadTimeouts(linger=linger)
    assert ReadTimeouts(linger=0).linger == 0  # off: close at once
