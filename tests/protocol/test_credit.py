"""Tests for weir.protocol._credit: per-session drain credit, half-open detection, drain tracking.

Pure: no trio.  Time is a float handed in by hand, so every deadline is checked
exactly (``math.nextafter(t, -inf)`` is "just before").  The legal credit
transitions are listed here independently of :data:`protocol.CREDIT_TRANSITIONS`,
so a change to the table has to be made twice, on purpose.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from weir.protocol import SERVER_ERROR, CreditLimits, DrainTracker, Reason, RemoteProtocolError
from weir.protocol._credit import SessionCredit
from weir.protocol._errors import LocalProtocolError
from weir.protocol._states import CREDIT_TRANSITIONS, CreditInput, credit_transition
from weir.protocol.states import CreditState

CS, CI = CreditState, CreditInput
LIMITS = CreditLimits(frames=3, bytes=100, drain_window=5.0, liveness_timeout=20.0)


def before(t: float) -> float:
    """The largest float strictly below ``t``."""
    return math.nextafter(t, -math.inf)


def state_of(credit: SessionCredit) -> CreditState:
    """The state, read through a call (so the type checker does not over-narrow it)."""
    return credit.state


def exhausted_at(t_first: float, t_blocked: float, limits: CreditLimits = LIMITS) -> SessionCredit:
    """A credit with one frame taken at ``t_first`` and a frame waiting since ``t_blocked``."""
    credit = SessionCredit(limits, 0.0)
    assert credit.try_acquire(10, t_first)
    credit.mark_blocked(t_blocked)
    assert credit.state is CS.EXHAUSTED
    return credit


# ----------------------------------------------------------------- CreditLimits


def test_limits_defaults_are_valid() -> None:
    lim = CreditLimits()
    assert lim.frames >= 1 and lim.bytes >= 1
    assert 0 < lim.drain_window <= lim.liveness_timeout


@pytest.mark.parametrize(
    "kwargs",
    [
        {"frames": 0},
        {"frames": -1},
        {"bytes": 0},
        {"bytes": -5},
        {"drain_window": 0.0},
        {"drain_window": -1.0},
        {"drain_window": 10.0, "liveness_timeout": 9.999},
    ],
)
def test_limits_validation(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        CreditLimits(**kwargs)  # type: ignore[arg-type]


def test_limits_drain_window_may_equal_liveness() -> None:
    lim = CreditLimits(frames=1, bytes=1, drain_window=7.0, liveness_timeout=7.0)
    assert lim.drain_window == lim.liveness_timeout == 7.0


# ----------------------------------------------------------------- try_acquire


def test_new_credit_is_open_and_empty() -> None:
    credit = SessionCredit(LIMITS, 3.0)
    assert credit.state is CS.OPEN
    assert (credit.frames_in_use, credit.bytes_in_use) == (0, 0)
    assert credit.last_progress == 3.0
    assert credit.deadline() == math.inf
    assert credit.handle_timer(1e9) is CS.OPEN  # nothing pending: never DEAD


def test_try_acquire_within_and_over_the_frame_budget() -> None:
    credit = SessionCredit(LIMITS, 0.0)
    assert [credit.try_acquire(10, 1.0) for _ in range(3)] == [True, True, True]
    assert (credit.frames_in_use, credit.bytes_in_use) == (3, 30)
    assert not credit.fits(1)
    assert credit.try_acquire(1, 1.0) is False
    assert (credit.frames_in_use, credit.bytes_in_use) == (3, 30)  # a refusal takes nothing
    assert credit.state is CS.OPEN  # try_acquire never changes state


def test_try_acquire_within_and_over_the_byte_budget() -> None:
    credit = SessionCredit(LIMITS, 0.0)
    assert credit.try_acquire(60, 1.0)
    assert not credit.fits(41)
    assert credit.try_acquire(41, 1.0) is False
    assert credit.bytes_in_use == 60
    assert credit.try_acquire(40, 1.0)  # exactly the budget
    assert (credit.frames_in_use, credit.bytes_in_use) == (2, 100)
    assert credit.try_acquire(1, 1.0) is False


def test_an_oversized_frame_fits_only_when_nothing_is_held() -> None:
    credit = SessionCredit(LIMITS, 0.0)
    assert credit.try_acquire(1, 1.0)
    assert credit.try_acquire(500, 1.0) is False  # something held: no
    credit.release(1, 1, 2.0)
    assert credit.try_acquire(500, 3.0)  # nothing held: yes
    assert (credit.frames_in_use, credit.bytes_in_use) == (1, 500)
    assert credit.try_acquire(1, 3.0) is False  # and nothing else fits beside it
    credit.release(1, 500, 4.0)
    assert credit.try_acquire(1, 5.0)


def test_correct_replaces_the_acquired_size_by_the_actual_one() -> None:
    credit = SessionCredit(LIMITS, 0.0)
    assert credit.try_acquire(40, 1.0)
    credit.correct(40, 43)
    assert credit.bytes_in_use == 43
    credit.correct(43, 30)
    assert credit.bytes_in_use == 30


def test_liveness_clock_starts_at_the_first_pending_frame() -> None:
    credit = SessionCredit(LIMITS, 0.0)
    assert credit.try_acquire(10, 50.0)
    assert credit.last_progress == 50.0
    assert credit.try_acquire(10, 60.0)  # a second frame does not restart it
    assert credit.last_progress == 50.0
    assert credit.deadline() == 70.0  # 50 + liveness_timeout
    credit.release(2, 20, 65.0)
    assert credit.deadline() == math.inf  # nothing pending: no liveness deadline
    assert credit.try_acquire(10, 100.0)  # pending again: clock restarts here
    assert credit.last_progress == 100.0
    assert credit.deadline() == 120.0


# ----------------------------------------------------------------- half-open


def test_mark_blocked_exhausts_and_the_drain_window_is_exact() -> None:
    credit = exhausted_at(1.0, 2.0)
    assert credit.deadline() == 7.0  # exhausted_since + drain_window
    assert credit.handle_timer(before(7.0)) is CS.EXHAUSTED
    assert not credit.is_half_open(before(7.0))
    assert credit.handle_timer(7.0) is CS.HALF_OPEN
    assert credit.deadline() == 21.0  # only liveness is left: 1 + 20


def test_mark_blocked_again_does_not_restart_the_window() -> None:
    credit = exhausted_at(1.0, 2.0)
    credit.mark_blocked(4.0)
    assert credit.deadline() == 7.0


def test_progress_in_half_open_goes_back_to_exhausted_and_restarts_the_window() -> None:
    credit = exhausted_at(1.0, 2.0)
    assert credit.handle_timer(7.0) is CS.HALF_OPEN
    credit.progress(9.0)
    assert credit.state is CS.EXHAUSTED
    assert credit.last_progress == 9.0
    assert credit.deadline() == 14.0  # progress time + drain_window
    assert credit.handle_timer(before(14.0)) is CS.EXHAUSTED
    assert credit.handle_timer(14.0) is CS.HALF_OPEN
    assert credit.deadline() == 29.0  # liveness from the progress too


def test_progress_while_exhausted_pushes_the_window() -> None:
    credit = exhausted_at(1.0, 2.0)
    credit.progress(4.0)
    assert credit.state is CS.EXHAUSTED
    assert credit.deadline() == 9.0
    assert credit.handle_timer(before(9.0)) is CS.EXHAUSTED


def test_progress_never_moves_the_clock_backwards() -> None:
    credit = exhausted_at(1.0, 2.0)
    credit.progress(6.0)
    credit.progress(3.0)
    assert credit.last_progress == 6.0


def test_release_is_progress_and_unblocking_reopens() -> None:
    credit = exhausted_at(1.0, 2.0)
    assert credit.handle_timer(7.0) is CS.HALF_OPEN
    credit.release(1, 10, 12.0)
    assert credit.last_progress == 12.0
    assert credit.state is CS.EXHAUSTED
    credit.mark_unblocked(12.0)
    assert state_of(credit) is CS.OPEN
    assert credit.deadline() == math.inf


def test_mark_unblocked_from_half_open_reopens_directly() -> None:
    credit = exhausted_at(1.0, 2.0)
    assert credit.handle_timer(7.0) is CS.HALF_OPEN
    credit.mark_unblocked(8.0)
    assert credit.state is CS.OPEN


def test_empty_release_is_not_progress() -> None:
    credit = exhausted_at(1.0, 2.0)
    credit.release(0, 0, 6.0)
    assert credit.last_progress == 1.0
    assert credit.handle_timer(7.0) is CS.HALF_OPEN


def test_mark_unblocked_and_progress_in_open_change_nothing() -> None:
    credit = SessionCredit(LIMITS, 0.0)
    credit.mark_unblocked(1.0)
    credit.progress(2.0)
    assert credit.state is CS.OPEN


# ----------------------------------------------------------------- DEAD


@pytest.mark.parametrize("blocked", [False, True])
@pytest.mark.parametrize("stalled", [False, True])
def test_dead_exactly_at_liveness_timeout_with_frames_pending(blocked: bool, stalled: bool) -> None:
    credit = SessionCredit(LIMITS, 0.0)
    assert credit.try_acquire(10, 1.0)
    if blocked:
        credit.mark_blocked(2.0)
    if blocked and stalled:
        assert credit.handle_timer(7.0) is CS.HALF_OPEN
    assert credit.deadline() == (7.0 if blocked and not stalled else 21.0)
    assert credit.handle_timer(before(21.0)) is not CS.DEAD
    assert credit.handle_timer(21.0) is CS.DEAD
    assert credit.deadline() == math.inf


def test_never_dead_with_nothing_pending() -> None:
    credit = SessionCredit(LIMITS, 0.0)
    assert credit.try_acquire(10, 1.0)
    credit.release(1, 10, 2.0)
    assert credit.handle_timer(1e6) is CS.OPEN
    credit.mark_blocked(3.0)  # a waiter with nothing held is odd but possible
    assert credit.handle_timer(8.0) is CS.HALF_OPEN
    assert credit.handle_timer(1e6) is CS.HALF_OPEN


def test_dead_is_terminal() -> None:
    credit = SessionCredit(LIMITS, 0.0)
    assert credit.try_acquire(10, 1.0)
    assert credit.handle_timer(21.0) is CS.DEAD
    with pytest.raises(LocalProtocolError):
        credit.try_acquire(1, 22.0)
    credit.mark_blocked(22.0)
    credit.mark_unblocked(22.0)
    credit.progress(23.0)
    credit.release(1, 10, 24.0)  # teardown gives the credit back
    assert (credit.frames_in_use, credit.bytes_in_use) == (0, 0)
    assert credit.handle_timer(25.0) is CS.DEAD
    assert credit.state is CS.DEAD
    with pytest.raises(LocalProtocolError):
        credit.try_acquire(1, 26.0)


# ----------------------------------------------------------------- admit


@pytest.mark.parametrize(
    ("drain_window", "retry_ms"), [(5.0, 5000), (2.5, 2500), (1.0, 1000), (0.25, 1000)]
)
@pytest.mark.parametrize("request_id", [7, "req-7", None])
def test_admit_refuses_half_open_with_429(
    drain_window: float, retry_ms: int, request_id: int | str | None
) -> None:
    limits = CreditLimits(frames=2, bytes=100, drain_window=drain_window, liveness_timeout=30.0)
    credit = exhausted_at(1.0, 2.0, limits)
    credit.admit(before(2.0 + drain_window), request_id)  # EXHAUSTED: admitted
    with pytest.raises(RemoteProtocolError) as info:
        credit.admit(2.0 + drain_window, request_id)  # applies the timer itself
    exc = info.value
    assert credit.state is CS.HALF_OPEN
    assert exc.http_status == 429
    assert exc.reason is Reason.STREAM_HALF_OPEN and str(exc.reason) == "stream_half_open"
    assert exc.code == SERVER_ERROR
    assert exc.retry_after_ms == retry_ms == max(1000, int(drain_window * 1000))
    assert exc.request_id == request_id
    assert exc.error_data() == {"reason": "stream_half_open", "retryAfterMs": retry_ms}


def test_admit_passes_in_open_and_exhausted() -> None:
    full = SessionCredit(LIMITS, 0.0)
    for _ in range(3):
        assert full.try_acquire(10, 1.0)
    full.admit(before(21.0), 1)  # OPEN at credit zero, nothing waiting: admitted
    assert full.state is CS.OPEN
    credit = exhausted_at(1.0, 2.0)
    credit.admit(6.0, 1)
    credit.admit(before(7.0), 2)
    assert credit.state is CS.EXHAUSTED
    idle = SessionCredit(LIMITS, 0.0)
    idle.admit(1e6, 1)
    assert idle.state is CS.OPEN


def test_admit_refuses_a_dead_session_too() -> None:
    credit = SessionCredit(LIMITS, 0.0)
    assert credit.try_acquire(10, 1.0)
    with pytest.raises(RemoteProtocolError) as info:
        credit.admit(21.0, 3)
    assert credit.state is CS.DEAD and info.value.http_status == 429


# ----------------------------------------------------------------- release errors


@pytest.mark.parametrize(("frames", "nbytes"), [(2, 10), (1, 11), (-1, 0), (0, -1), (5, 500)])
def test_release_of_more_than_held_raises(frames: int, nbytes: int) -> None:
    credit = SessionCredit(LIMITS, 0.0)
    assert credit.try_acquire(10, 1.0)
    credit.mark_blocked(2.0)
    with pytest.raises(LocalProtocolError):
        credit.release(frames, nbytes, 3.0)
    assert (credit.frames_in_use, credit.bytes_in_use) == (1, 10)  # unchanged
    assert credit.last_progress == 1.0  # and no progress counted
    assert credit.state is CS.EXHAUSTED


# ----------------------------------------------------------------- the table

EXPECTED_CREDIT: dict[tuple[CreditState, CreditInput], CreditState] = {
    (CS.OPEN, CI.EXHAUST): CS.EXHAUSTED,
    (CS.OPEN, CI.REPLENISH): CS.OPEN,
    (CS.OPEN, CI.PROGRESS): CS.OPEN,
    (CS.OPEN, CI.EXPIRE): CS.DEAD,
    (CS.EXHAUSTED, CI.EXHAUST): CS.EXHAUSTED,
    (CS.EXHAUSTED, CI.REPLENISH): CS.OPEN,
    (CS.EXHAUSTED, CI.PROGRESS): CS.EXHAUSTED,
    (CS.EXHAUSTED, CI.STALL): CS.HALF_OPEN,
    (CS.EXHAUSTED, CI.EXPIRE): CS.DEAD,
    (CS.HALF_OPEN, CI.EXHAUST): CS.HALF_OPEN,
    (CS.HALF_OPEN, CI.REPLENISH): CS.OPEN,
    (CS.HALF_OPEN, CI.PROGRESS): CS.EXHAUSTED,
    (CS.HALF_OPEN, CI.EXPIRE): CS.DEAD,
}
CREDIT_CELLS = list(itertools.product(CreditState, CreditInput))


def test_the_table_has_exactly_the_expected_cells() -> None:
    table = {(s, i): t for s, row in CREDIT_TRANSITIONS.items() for i, t in row.items()}
    assert table == EXPECTED_CREDIT
    assert set(CREDIT_TRANSITIONS) == set(CreditState)  # every state has a row
    assert CREDIT_TRANSITIONS[CS.DEAD] == {}


@pytest.mark.parametrize(("state", "event"), CREDIT_CELLS, ids=lambda v: v.value)
def test_every_credit_cell(state: CreditState, event: CreditInput) -> None:
    expected = EXPECTED_CREDIT.get((state, event))
    if expected is None:
        with pytest.raises(LocalProtocolError) as info:
            credit_transition(state, event)
        assert state.value in info.value.message and event.value in info.value.message
    else:
        assert credit_transition(state, event) is expected


# ----------------------------------------------------------------- DrainTracker


def test_tracker_releases_marks_exactly_when_acked_reaches_them() -> None:
    t: DrainTracker[str] = DrainTracker()
    assert t.wrote(10) == 10
    t.mark(4, "a")
    t.mark(10, "b")
    assert t.pending and t.outstanding == 10
    assert t.bytes_drained(3) == []  # byte 3 (the 4th) not yet acknowledged
    assert t.bytes_drained(1) == ["a"]  # acked == 4 == offset
    assert t.bytes_drained(5) == []
    assert t.acked == 9 and t.outstanding == 1 and t.pending
    assert t.bytes_drained(1) == ["b"]
    assert not t.pending and t.outstanding == 0


def test_tracker_returns_several_marks_in_order() -> None:
    t: DrainTracker[int] = DrainTracker()
    t.wrote(6)
    for i, off in enumerate([2, 2, 4, 6]):
        t.mark(off, i)
    assert t.bytes_drained(6) == [0, 1, 2, 3]
    assert t.bytes_drained(0) == []


def test_tracker_partial_acks_across_writes() -> None:
    t: DrainTracker[str] = DrainTracker()
    t.wrote(5)
    t.mark(5, "x")
    t.wrote(5)
    t.mark(10, "y")
    out: list[str] = []
    for _ in range(10):
        out += t.bytes_drained(1)
        assert out == (["x"] if t.acked >= 5 else []) + (["y"] if t.acked >= 10 else [])
    assert out == ["x", "y"]


def test_bytes_drained_zero_flushes_marks_at_or_below_acked() -> None:
    t: DrainTracker[str] = DrainTracker()
    t.wrote(10)
    assert t.bytes_drained(10) == []
    t.mark(5, "late")
    t.mark(10, "edge")
    assert t.bytes_drained(0) == ["late", "edge"]
    t.wrote(3)
    t.mark(13, "next")
    assert t.bytes_drained(0) == []


def test_acknowledged_total_from_the_kernels_unacked_count() -> None:
    t: DrainTracker[str] = DrainTracker()
    t.wrote(100)
    t.mark(30, "x")
    t.mark(100, "y")
    assert t.acknowledged_total(80) == []
    assert t.acked == 20
    assert t.acknowledged_total(70) == ["x"]
    assert t.acked == 30
    assert t.acknowledged_total(90) == []  # the kernel never un-acknowledges
    assert t.acked == 30
    assert t.acknowledged_total(0) == ["y"]
    assert t.acked == 100 and t.outstanding == 0


def test_tracker_errors() -> None:
    t: DrainTracker[str] = DrainTracker()
    t.wrote(10)
    t.mark(6, "a")
    with pytest.raises(ValueError):
        t.mark(11, "beyond what was written")
    with pytest.raises(ValueError):
        t.mark(5, "out of order")
    with pytest.raises(ValueError):
        t.bytes_drained(11)  # over-ack
    with pytest.raises(ValueError):
        t.bytes_drained(-1)
    assert t.acked == 0 and t.written == 10  # nothing changed
    assert t.bytes_drained(10) == ["a"]
    with pytest.raises(ValueError):
        t.bytes_drained(1)  # over-ack after everything is acknowledged


# ----------------------------------------------------------------- property


@dataclass(frozen=True)
class Op:
    kind: str  # acquire | release | progress | timer | block | unblock
    dt: float
    n: int = 0


OPS = st.builds(
    Op,
    kind=st.sampled_from(
        ["acquire", "acquire", "release", "progress", "timer", "block", "unblock"]
    ),
    dt=st.sampled_from([0.0, 0.0, 0.5, 1.0, 2.5, 5.0, 7.0, 25.0]),
    n=st.integers(min_value=0, max_value=300),
)
LIMITS_ST = st.builds(
    lambda frames, nbytes, window, extra: CreditLimits(
        frames=frames, bytes=nbytes, drain_window=window, liveness_timeout=window + extra
    ),
    st.integers(min_value=1, max_value=6),
    st.integers(min_value=1, max_value=400),
    st.sampled_from([0.5, 1.0, 5.0]),
    st.sampled_from([0.0, 1.0, 10.0, 20.0]),
)
REACHABLE = {s: {s, *CREDIT_TRANSITIONS[s].values()} for s in CreditState}


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(limits=LIMITS_ST, ops=st.lists(OPS, max_size=60))
def test_random_interleavings_keep_credit_within_budget(
    limits: CreditLimits, ops: list[Op]
) -> None:
    now = 0.0
    credit = SessionCredit(limits, now)
    held: list[int] = []  # sizes of the frames we hold, oldest first (the model)
    for op in ops:
        now += op.dt
        prev = credit.state
        if op.kind == "acquire":
            size = op.n + 1
            if prev is CS.DEAD:
                with pytest.raises(LocalProtocolError):
                    credit.try_acquire(size, now)
            else:
                fits = len(held) < limits.frames and (not held or sum(held) + size <= limits.bytes)
                assert credit.try_acquire(size, now) is fits
                if fits:
                    held.append(size)
        elif op.kind == "release":
            k = min(len(held), op.n % 3)
            credit.release(k, sum(held[:k]), now)
            del held[:k]
        elif op.kind == "progress":
            credit.progress(now)
        elif op.kind == "timer":
            assert credit.handle_timer(now) is credit.state
            # No deadline may have been skipped: the next one lies in the future.
            assert credit.state is CS.DEAD or credit.deadline() > now
        elif op.kind == "block":
            credit.mark_blocked(now)
        else:
            credit.mark_unblocked(now)
        # Invariants after every step.
        assert credit.state in CREDIT_TRANSITIONS
        assert credit.state in REACHABLE[prev]
        assert 0 <= credit.frames_in_use <= limits.frames
        assert credit.frames_in_use == len(held)
        assert credit.bytes_in_use == sum(held)
        assert credit.bytes_in_use <= limits.bytes or (
            credit.frames_in_use == 1 and held[0] > limits.bytes  # the lone oversized frame
        )
        if credit.state is not CS.DEAD and credit.frames_in_use:
            assert credit.deadline() <= credit.last_progress + limits.liveness_timeout
    event(f"final state {credit.state.value}")


def test_peaks_are_high_water_marks_that_release_does_not_lower() -> None:
    credit = SessionCredit(CreditLimits(frames=3, bytes=100), 0.0)
    assert credit.try_acquire(40, 0.0) and credit.try_acquire(50, 0.0)
    assert (credit.peak_frames, credit.peak_bytes) == (2, 90)
    assert not credit.try_acquire(20, 0.0)  # would pass the byte credit: nothing changes
    credit.release(2, 90, 1.0)
    assert (credit.frames_in_use, credit.peak_frames, credit.peak_bytes) == (0, 2, 90)
    # A lone frame larger than the whole byte credit is let through (else it never
    # could be sent); the peak says so.
    assert credit.try_acquire(250, 1.0)
    assert credit.peak_bytes == 250 and credit.peak_frames == 2


def test_settle_names_the_owner_of_a_partly_acknowledged_frame_only() -> None:
    # Two frames: A's bytes [0, 100), B's [100, 250).  Acknowledged bytes of A's
    # frame are A's progress; once A completes, nothing is "partial" in that step.
    tracker: DrainTracker[str] = DrainTracker()
    tracker.mark(tracker.wrote(100), "A")
    tracker.mark(tracker.wrote(150), "B")
    assert tracker.settle(250) == ([], None)  # nothing acknowledged: no progress
    assert tracker.settle(200) == ([], "A")  # 50 bytes of A's frame
    assert tracker.settle(200) == ([], None)  # no new bytes: no progress again
    assert tracker.settle(120) == (["A"], None)  # A done (and 20 of B's bytes)
    assert tracker.settle(10) == ([], "B")
    assert tracker.settle(0) == (["B"], None)
    assert tracker.settle(0) == ([], None) and tracker.outstanding == 0


def test_settle_gives_no_owner_for_bytes_written_without_a_mark() -> None:
    # A refusal's body carries no mark: its acknowledgement is nobody's progress.
    tracker: DrainTracker[str] = DrainTracker()
    tracker.wrote(300)
    assert tracker.settle(100) == ([], None)
