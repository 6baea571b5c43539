"""StoreTail: serving a cursor from a shared store, with no store and no clock.

The driver's loop is played here by hand: the store's answers are lists of events,
time is a number.  What is checked is what a resuming client sees -- the bytes,
decoded by the core's own SSE decoder -- and what the tail makes a server hold:
it never waits past its bound, and it never resumes from the head.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import pytest

from weir.protocol import Reason, RemoteProtocolError
from weir.protocol._event_ids import EventId, parse_event_id
from weir.protocol._resume import StoreTail, TailExpire
from weir.protocol.resume import KEEPALIVE, TailPause, TailSend
from weir.protocol.sse import SseComment, SseDecoder, SseEvent


@dataclass(frozen=True)
class Ev:
    seq: int
    data: bytes
    final: bool = False
    replica: str = "r-2"


def _tail(cursor: str = "0000abcd:3", **kw: object) -> StoreTail:
    args: dict[str, object] = {
        "binding": 0,
        "last_seq": 5,
        "finished": False,
        "token": None,
        "now": 0.0,
        "keepalive": 15.0,
        "lease": 6.0,
        "give_up_after": 100.0,
        "replica": "r-1",
    }
    args.update(kw)
    return StoreTail(parse_event_id(cursor), **args)  # type: ignore[arg-type]


def _decode(*chunks: bytes) -> list[SseEvent | SseComment]:
    dec = SseDecoder()
    items: list[SseEvent | SseComment] = []
    for chunk in chunks:
        for i in range(len(chunk)):  # byte by byte: the framing must not depend on chunks
            items.extend(dec.feed(chunk[i : i + 1]))
    return items


def test_no_such_stream_is_cursor_unknown_before_anything_is_sent() -> None:
    with pytest.raises(RemoteProtocolError) as caught:
        _tail(binding=None)
    assert caught.value.http_status == 409 and caught.value.reason is Reason.CURSOR_UNKNOWN


def test_a_cursor_of_another_channel_generation_is_refused() -> None:
    with pytest.raises(RemoteProtocolError) as caught:
        _tail(binding=2, token=(1, "secret"))
    assert caught.value.reason is Reason.CHANNEL_UNBOUND


def test_events_no_longer_held_are_refused_on_the_first_read_only() -> None:
    with pytest.raises(RemoteProtocolError) as caught:
        _tail().feed(None, 0.0)
    assert caught.value.reason is Reason.CURSOR_UNKNOWN
    tail = _tail()
    tail.feed([], 0.0)
    assert tail.feed(None, 0.1) == [] and tail.ended  # a later gap just ends it


def test_events_are_framed_as_produced_with_their_replica_then_the_final_ends() -> None:
    tail = _tail()
    first = tail.feed([Ev(4, b'{"n":4}'), Ev(5, b'{"n":5}', replica="")], 0.0)
    assert len(first) == 1 and isinstance(first[0], TailSend)
    assert tail.after == 5 and not tail.ended
    last = tail.feed([Ev(5, b"dup"), Ev(6, b'{"n":6}', final=True), Ev(7, b"after")], 1.0)
    assert isinstance(last[0], TailSend) and tail.ended and tail.after == 6
    items = _decode(first[0].data, last[0].data)
    assert items == [
        SseComment(text="replica=r-2"),
        SseEvent(data='{"n":4}', id="0000abcd:4"),
        SseComment(text="replica=r-1"),  # unknown producer: this replica names itself
        SseEvent(data='{"n":5}', id="0000abcd:5"),
        SseComment(text="replica=r-2"),
        SseEvent(data='{"n":6}', id="0000abcd:6"),
    ]
    assert parse_event_id("0000abcd:6") == EventId("0000abcd", 6)


def test_a_finished_stream_read_at_its_end_sends_nothing() -> None:
    tail = _tail(cursor="0000abcd:5", finished=True)
    assert tail.ended and tail.feed([], 0.0) == []


def test_silence_polls_with_backoff_and_keepalives() -> None:
    tail = _tail(keepalive=1.0, lease=1000.0)
    now, pauses, keepalives = 0.0, [], [0.0]
    for _ in range(40):  # bounded walk over 40 quiet reads
        steps = tail.feed([], now)
        if any(isinstance(s, TailSend) and s.data == KEEPALIVE for s in steps):
            keepalives.append(now)
        pause = steps[-1]
        assert isinstance(pause, TailPause)
        pauses.append(pause.until - now)
        now = pause.until
    assert pauses[:3] == pytest.approx([0.01, 0.02, 0.04])
    assert max(pauses) == pytest.approx(0.25)
    # One keep-alive per second of silence (give or take one poll), not one per read.
    gaps = [b - a for a, b in itertools.pairwise(keepalives)]
    assert len(gaps) >= 7 and all(1.0 <= g <= 1.25 + 1e-9 for g in gaps)
    # An event resets the backoff.
    tail.feed([Ev(4, b"x")], now)
    steps = tail.feed([], now)
    assert isinstance(steps[-1], TailPause) and steps[-1].until - now == pytest.approx(0.01)


def test_a_silent_producer_is_asked_about_after_a_lease_at_most_every_half_lease() -> None:
    tail = _tail(keepalive=None, lease=2.0)
    now, asked = 0.0, []
    while now < 10.0:
        steps = tail.feed([], now)
        if any(isinstance(s, TailExpire) for s in steps):
            asked.append(now)
        pause = steps[-1]
        assert isinstance(pause, TailPause)
        now = pause.until
    assert asked and asked[0] >= 2.0
    assert all(b - a >= 1.0 for a, b in itertools.pairwise(asked))
    assert len(asked) <= 9


def test_the_tail_gives_up_at_its_bound() -> None:
    tail = _tail(give_up_after=1.0, keepalive=None)
    now = 0.0
    for _ in range(100):
        steps = tail.feed([], now)
        if tail.ended:
            break
        pause = steps[-1]
        assert isinstance(pause, TailPause) and pause.until <= 1.0
        now = pause.until
    assert tail.ended and now == pytest.approx(1.0)
