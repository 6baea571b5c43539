"""Tests for weir.protocol._streams: StreamLog frames, replay, retention; StreamTable."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from weir.protocol import Reason, RemoteProtocolError
from weir.protocol._errors import LocalProtocolError
from weir.protocol._event_ids import EventId
from weir.protocol.sse import SseDecoder, SseEvent
from weir.protocol.states import StreamInput, StreamState
from weir.protocol.streams import (
    StreamKind,
    StreamLog,
    StreamTable,
    WriterStep,
    completes,
    writer_step,
)

EPOCH = "0000abcd"


def log_with(n: int, *, max_events: int = 4096, epoch: str = EPOCH) -> StreamLog:
    """A log of ``n`` frames, each acknowledged by the peer as soon as it is appended.

    (Retention drops only acknowledged frames; an unacknowledged one still holds
    credit and is never dropped.)
    """
    log = StreamLog(epoch, StreamKind.REQUEST, max_events=max_events)
    for i in range(n):
        log.append(f'{{"n":{i}}}')
        log.mark_drained(log.next_seq)
    return log


def frame(seq: int, epoch: str = EPOCH) -> bytes:
    return f'id: {epoch}:{seq}\ndata: {{"n":{seq}}}\n\n'.encode()


def state_of(log: StreamLog) -> StreamState:
    return log.state  # (a call, so mypy does not keep an earlier narrowing)


def assert_cursor_unknown(exc: pytest.ExceptionInfo[RemoteProtocolError]) -> None:
    assert (exc.value.http_status, exc.value.reason) == (409, Reason.CURSOR_UNKNOWN)


# --------------------------------------------------------------------- appending


def test_append_returns_consecutive_ids_and_exact_frames() -> None:
    log = StreamLog(EPOCH, StreamKind.REQUEST)
    assert log.state is StreamState.LIVE_DETACHED
    assert log.prime() == EventId(EPOCH, 0)
    assert log.append('{"a":1}') == EventId(EPOCH, 1)
    assert log.append("x\ny", event="message") == EventId(EPOCH, 2)
    assert log.next_seq == 3
    assert log.frames_from(0) == [
        b"id: 0000abcd:0\ndata: \n\n",
        b'id: 0000abcd:1\ndata: {"a":1}\n\n',
        b"id: 0000abcd:2\nevent: message\ndata: x\ndata: y\n\n",
    ]


def test_a_frame_encoded_for_its_size_is_the_frame_appended() -> None:
    log = StreamLog(EPOCH, StreamKind.REQUEST)
    encoded = log.encode_next('{"a":1}')
    assert encoded == (0, b'id: 0000abcd:0\ndata: {"a":1}\n\n')
    log.append('{"a":1}', encoded=encoded)
    assert log.frames_from(0)[0] is encoded[1]  # the same bytes, not encoded again


def test_a_stale_encoding_is_not_used_for_a_later_seq() -> None:
    # Another frame went in between (a sender waited for credit meanwhile): the id
    # inside the pre-encoded frame is no longer the next one, so it is re-encoded.
    log = StreamLog(EPOCH, StreamKind.REQUEST)
    stale = log.encode_next('{"late":1}')
    log.append('{"first":1}')
    log.append('{"late":1}', encoded=stale)
    assert log.frames_from(1) == [b'id: 0000abcd:1\ndata: {"late":1}\n\n']


def test_frames_decode_back_to_the_payloads_and_ids() -> None:
    log = log_with(3)
    items = SseDecoder().feed(b"".join(log.frames_from(0)))
    assert items == [SseEvent(data=f'{{"n":{i}}}', id=f"{EPOCH}:{i}") for i in range(3)]


def test_final_append_moves_to_final_and_nothing_may_follow() -> None:
    log = log_with(2)
    assert not log.finished
    log.append('{"result":1}', final=True)
    assert log.state is StreamState.FINAL_DETACHED
    assert log.finished
    with pytest.raises(LocalProtocolError):
        log.append("late")
    with pytest.raises(LocalProtocolError):
        log.prime()
    assert log.next_seq == 3  # the refused append consumed no seq
    assert len(log.frames_from(0)) == 3


def test_final_while_attached() -> None:
    log = log_with(1)
    assert log.handle(StreamInput.ATTACH) is StreamState.LIVE_ATTACHED
    log.append("r", final=True)
    assert log.state is StreamState.FINAL_ATTACHED
    assert log.handle(StreamInput.DELIVERED) is StreamState.CLOSED
    assert log.finished


def test_append_to_closed_stream_raises() -> None:
    log = log_with(1)
    log.handle(StreamInput.ABORT)
    with pytest.raises(LocalProtocolError):
        log.append("x")


def test_illegal_lifecycle_input_raises_and_keeps_state() -> None:
    log = log_with(1)
    with pytest.raises(LocalProtocolError):
        log.handle(StreamInput.DETACH)
    assert log.state is StreamState.LIVE_DETACHED
    log.handle(StreamInput.ATTACH)
    with pytest.raises(LocalProtocolError):
        log.handle(StreamInput.ATTACH)  # a second writer
    assert state_of(log) is StreamState.LIVE_ATTACHED


def test_emit_ids_false_writes_no_id_lines() -> None:
    log = StreamLog(EPOCH, StreamKind.STANDALONE, emit_ids=False)
    assert log.append("a") == EventId(EPOCH, 0)
    log.append("b", event="endpoint")
    frames = log.frames_from(0)
    assert frames == [b"data: a\n\n", b"event: endpoint\ndata: b\n\n"]
    assert all(b"id:" not in f for f in frames)


@pytest.mark.parametrize("epoch", ["ABCDEF01", "abc", "", "0000abcd:1"])
def test_invalid_epoch_is_refused(epoch: str) -> None:
    with pytest.raises(ValueError):
        StreamLog(epoch, StreamKind.REQUEST)


def test_max_events_must_be_positive() -> None:
    with pytest.raises(ValueError):
        StreamLog(EPOCH, StreamKind.REQUEST, max_events=0)


# ------------------------------------------------------------------------ replay


def test_cursor_after_and_frames_from_replay_exactly_what_follows() -> None:
    log = log_with(5)
    for last in range(5):
        nxt = log.cursor_after(EventId(EPOCH, last))
        assert nxt == last + 1
        assert log.frames_from(nxt) == [frame(s) for s in range(last + 1, 5)]


def test_cursor_at_head_replays_nothing_then_continues_live() -> None:
    log = log_with(3)
    nxt = log.cursor_after(EventId(EPOCH, 2))
    assert log.frames_from(nxt) == []
    log.append('{"n":3}')
    assert log.frames_from(nxt) == [frame(3)]


@pytest.mark.parametrize(
    "cursor",
    [
        EventId(EPOCH, 3),
        EventId(EPOCH, 4),
        EventId(EPOCH, 10**12),
        EventId("0000abce", 0),
        EventId("00000000", 1),
    ],
)
def test_cursor_of_another_epoch_or_beyond_head_is_409(cursor: EventId) -> None:
    log = log_with(3)
    with pytest.raises(RemoteProtocolError) as info:
        log.cursor_after(cursor)
    assert_cursor_unknown(info)


def test_cursor_on_empty_log_is_409() -> None:
    log = StreamLog(EPOCH, StreamKind.REQUEST)
    with pytest.raises(RemoteProtocolError) as info:
        log.cursor_after(EventId(EPOCH, 0))
    assert_cursor_unknown(info)
    assert log.frames_from(0) == []


def test_frames_from_beyond_head_is_409() -> None:
    log = log_with(2)
    assert log.frames_from(2) == []
    with pytest.raises(RemoteProtocolError) as info:
        log.frames_from(3)
    assert_cursor_unknown(info)


def test_retention_drops_oldest_and_never_skips_silently() -> None:
    log = log_with(10, max_events=3)
    assert log.first_retained() == 7
    assert log.next_seq == 10
    assert log.frames_from(7) == [frame(7), frame(8), frame(9)]
    # Cursor 6 needs 7.. which is kept; cursors before it need dropped frames.
    assert log.cursor_after(EventId(EPOCH, 6)) == 7
    for old in range(6):
        with pytest.raises(RemoteProtocolError) as info:
            log.cursor_after(EventId(EPOCH, old))
        assert_cursor_unknown(info)
    with pytest.raises(RemoteProtocolError) as info:
        log.frames_from(6)
    assert_cursor_unknown(info)


def test_retention_of_one() -> None:
    log = log_with(3, max_events=1)
    assert log.frames_from(2) == [frame(2)]
    assert log.cursor_after(EventId(EPOCH, 2)) == 3
    assert log.cursor_after(EventId(EPOCH, 1)) == 2
    with pytest.raises(RemoteProtocolError):
        log.cursor_after(EventId(EPOCH, 0))


def test_closed_stream_still_replays_its_final_frame() -> None:
    log = log_with(2)
    log.append('{"n":2}', final=True)
    log.handle(StreamInput.ABORT)
    assert log.handle(StreamInput.ATTACH) is StreamState.CLOSED  # replay only
    assert log.frames_from(log.cursor_after(EventId(EPOCH, 1))) == [frame(2)]


# ---------------------------------------------------------------------- table


def test_table_add_get_and_duplicate_epoch() -> None:
    table = StreamTable()
    a = table.add(StreamLog("00000001", StreamKind.REQUEST))
    assert table.get(EventId("00000001", 99)) is a
    assert len(table) == 1
    with pytest.raises(ValueError):
        table.add(StreamLog("00000001", StreamKind.STANDALONE))
    assert len(table) == 1
    assert table.standalone is None


def test_table_get_unknown_epoch_is_409() -> None:
    table = StreamTable()
    table.add(StreamLog("00000001", StreamKind.REQUEST))
    with pytest.raises(RemoteProtocolError) as info:
        table.get(EventId("00000002", 0))
    assert_cursor_unknown(info)


def test_table_tracks_the_standalone_stream() -> None:
    table = StreamTable()
    table.add(StreamLog("00000001", StreamKind.REQUEST))
    assert table.standalone is None
    s = table.add(StreamLog("00000002", StreamKind.STANDALONE))
    assert table.standalone is s
    table.add(StreamLog("00000003", StreamKind.REQUEST))
    assert table.standalone is s
    s2 = table.add(StreamLog("00000004", StreamKind.STANDALONE))
    assert table.standalone is s2


def test_table_iterates_in_insertion_order_over_a_snapshot() -> None:
    table = StreamTable()
    logs = [table.add(StreamLog(f"0000000{i}", StreamKind.REQUEST)) for i in range(3)]
    seen = []
    for log in table:
        seen.append(log)
        if len(seen) == 1:
            table.add(StreamLog("0000000f", StreamKind.REQUEST))  # no RuntimeError
    assert seen == logs


def test_table_evicts_oldest_closed_streams_beyond_max_closed_never_live_ones() -> None:
    table = StreamTable(max_closed=2)
    live = [table.add(StreamLog(f"0000000{i}", StreamKind.REQUEST)) for i in range(3)]
    closed = [table.add(StreamLog(f"0000001{i}", StreamKind.REQUEST)) for i in range(4)]
    for log in closed:
        log.handle(StreamInput.ABORT)
    # Eviction happens when a stream is added.
    newest = table.add(StreamLog("00000020", StreamKind.REQUEST))
    assert list(table) == [*live, closed[2], closed[3], newest]
    for gone in closed[:2]:
        with pytest.raises(RemoteProtocolError) as info:
            table.get(EventId(gone.epoch, 0))
        assert_cursor_unknown(info)
    for kept in [*live, closed[2], closed[3], newest]:
        assert table.get(EventId(kept.epoch, 0)) is kept


def test_table_never_evicts_live_or_final_streams() -> None:
    table = StreamTable(max_closed=0)
    logs = [table.add(log_with(1, epoch=f"0000000{i}")) for i in range(3)]
    logs[1].append("r", final=True)  # FINAL_DETACHED: not closed, its response is pending
    logs[2].handle(StreamInput.ATTACH)
    table.add(StreamLog("0000000a", StreamKind.REQUEST))
    assert len(table) == 4
    logs[0].handle(StreamInput.ABORT)
    table.add(StreamLog("0000000b", StreamKind.REQUEST))
    assert [log.epoch for log in table] == ["00000001", "00000002", "0000000a", "0000000b"]


# ------------------------------------------------------------------ the writer's next move
def _writer_log(*inputs: StreamInput, frames: int = 0, final: bool = False) -> StreamLog:
    log = StreamLog("0000abcd", StreamKind.REQUEST)
    for event in inputs:
        log.handle(event)
    for i in range(frames):
        log.append("{}", final=final and i == frames - 1)
    return log


def test_frames_are_always_sent_before_the_stream_ends_or_retries() -> None:
    log = _writer_log(StreamInput.ATTACH, frames=2, final=True)
    for closed, retry in ((False, None), (True, None), (False, 500)):
        step = writer_step(log, 0, session_closed=closed, close_retry_ms=retry)
        assert step is WriterStep.SEND
    assert not completes(log, 1) and completes(log, 2)
    assert writer_step(log, 2, session_closed=False, close_retry_ms=500) is WriterStep.FINISH


def test_after_the_frames_end_retry_and_wait_in_that_order() -> None:
    live = _writer_log(StreamInput.ATTACH, frames=1)
    assert writer_step(live, 1, session_closed=False, close_retry_ms=None) is WriterStep.WAIT
    assert writer_step(live, 1, session_closed=False, close_retry_ms=250) is WriterStep.RETRY
    assert writer_step(live, 1, session_closed=True, close_retry_ms=250) is WriterStep.END
    aborted = _writer_log(StreamInput.ATTACH, StreamInput.ABORT)
    assert writer_step(aborted, 0, session_closed=False, close_retry_ms=None) is WriterStep.END
    assert not completes(live, 1)


@settings(max_examples=150, deadline=None)
@given(
    max_events=st.integers(min_value=1, max_value=24),
    steps=st.lists(
        st.one_of(
            st.tuples(st.just("append"), st.integers(min_value=0, max_value=40)),
            st.tuples(st.just("drain"), st.integers(min_value=0, max_value=400)),
            st.just(("trim", 0)),
        ),
        max_size=400,
    ),
)
def test_retention_matches_a_plain_model(max_events: int, steps: list[tuple[str, int]]) -> None:
    """Whatever the order of appends, acknowledgements and trims, the log holds exactly
    what the rule says: every unacknowledged frame, and at most ``max_events`` frames
    unless more are unacknowledged; the retained bytes, the first retained seq and the
    replay from every retained seq agree with a list kept the obvious way."""
    log = StreamLog(EPOCH, StreamKind.REQUEST, max_events=max_events)
    model: list[tuple[int, bytes]] = []
    drained = 0
    for kind, n in steps:
        if kind == "append":
            seq = log.next_seq
            log.append("x" * n)
            model.append((seq, log.frame(seq, "x" * n)))
            while len(model) > max_events and model[0][0] < drained:
                model.pop(0)
        elif kind == "drain":
            log.mark_drained(n)
            drained = max(drained, min(n, log.next_seq))
        else:
            log.trim_drained()
            model = [(s, f) for s, f in model if s >= drained]
        first = model[0][0] if model else log.next_seq
        assert log.first_retained() == first
        assert log.retained_bytes == sum(len(f) for _, f in model)
        assert log.last_frame_size() == (len(model[-1][1]) if model else 0)
        if model:
            middle = len(model) // 2
            assert log.frames_from(model[middle][0]) == [f for _, f in model[middle:]]
    for i, (seq, _) in enumerate(model):
        assert log.frames_from(seq) == [f for _, f in model[i:]]
    if model and model[0][0] > 0:
        with pytest.raises(RemoteProtocolError):
            log.frames_from(model[0][0] - 1)
