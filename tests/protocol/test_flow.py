"""Tests for weir.protocol._flow: admission and in-order credit grants.

A Hypothesis state machine drives one :class:`SessionFlow` with frames of a few
streams (lanes) that fit or wait, releases, cancellations, admissions and the
end, against a model of what it must do: credit never over-committed, grants in
ticket order within each lane and never held back by another lane's waiter, no
ticket granted twice, nothing granted after the end.
"""

from __future__ import annotations

import msgspec
import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from weir.protocol import Admit, CreditLimits, Reason, RemoteProtocolError, SessionFlow
from weir.protocol.budget import HEAD_ALLOWANCE, fit_result
from weir.protocol.states import CreditState

LIMITS = CreditLimits(frames=4, bytes=1000, drain_window=5.0, liveness_timeout=60.0)


class FlowMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.flow = SessionFlow(LIMITS, 0.0)
        self.now = 0.0
        self.held: list[int] = []  # sizes of frames holding credit
        #: (ticket, size, lane), in issue order
        self.queued: list[tuple[int, int, str | None]] = []
        self.granted: set[int] = set()

    def _fits(self, size: int) -> bool:
        if len(self.held) >= LIMITS.frames:
            return False
        return not self.held or sum(self.held) + size <= LIMITS.bytes

    def _grant(self, tickets: list[int]) -> None:
        # In ticket order, every waiter that fits and has no earlier waiter of its lane.
        expected: list[int] = []
        stuck: set[str] = set()
        for ticket, size, lane in list(self.queued):
            if (lane is None or lane not in stuck) and self._fits(size):
                expected.append(ticket)
                assert ticket not in self.granted
                self.granted.add(ticket)
                self.held.append(size)
                self.queued.remove((ticket, size, lane))
            elif lane is not None:
                stuck.add(lane)
        assert tickets == expected

    @rule(size=st.integers(1, 1500), lane=st.sampled_from([None, "a", "b"]))
    def send_a_frame(self, size: int, lane: str | None) -> None:
        if self.flow.try_acquire(size, self.now, lane):
            assert not self.flow.closed
            assert lane is None or all(q[2] != lane for q in self.queued)
            self.held.append(size)
        elif not self.flow.closed:
            assert (lane is not None and any(q[2] == lane for q in self.queued)) or not (
                self._fits(size)
            )
            self.queued.append((self.flow.wait_for(size, self.now, lane), size, lane))

    @precondition(lambda self: self.held)
    @rule(data=st.data())
    def drain_some(self, data: st.DataObject) -> None:
        k = data.draw(st.integers(1, len(self.held)))
        frames, nbytes = k, sum(self.held[:k])
        del self.held[:k]
        self.now += 0.1
        self._grant(self.flow.release(frames, nbytes, self.now))

    @precondition(lambda self: self.queued)
    @rule(data=st.data())
    def give_up_waiting(self, data: st.DataObject) -> None:
        i = data.draw(st.integers(0, len(self.queued) - 1))
        ticket, _, _ = self.queued.pop(i)
        assert self.flow.cancel(ticket, self.now)
        assert not self.flow.cancel(ticket, self.now)  # a ticket is withdrawn once

    @rule(n=st.integers(1, 3))
    def admit(self, n: int) -> None:
        before = self.flow.inflight
        try:
            verdict = self.flow.try_admit(n, self.now)
        except RemoteProtocolError as exc:
            assert exc.reason is Reason.STREAM_HALF_OPEN and exc.http_status == 429
            return
        if verdict is Admit.ADMITTED:
            assert self.flow.inflight == before + n
        else:
            # Nothing in flight: admitted unless frames are held and leave no room.
            assert (before > 0 or self.held) and self.flow.inflight == before

    @precondition(lambda self: self.flow.inflight > 0)
    @rule()
    def answer_one(self) -> None:
        self.flow.done()

    @rule(dt=st.floats(0.0, 10.0))
    def time_passes(self, dt: float) -> None:
        self.now += dt
        if self.flow.credit.handle_timer(self.now) is CreditState.DEAD and not self.flow.closed:
            self.end()  # what a driver does with a dead session: tear it down

    @precondition(lambda self: not self.flow.closed)
    @rule()
    def end(self) -> None:
        assert self.flow.close() == [t for t, _, _ in self.queued]
        self.queued.clear()

    @invariant()
    def credit_is_never_overcommitted(self) -> None:
        credit = self.flow.credit
        assert credit.frames_in_use == len(self.held) <= LIMITS.frames
        assert credit.bytes_in_use == sum(self.held)
        if len(self.held) > 1:  # only a lone frame may exceed the byte credit
            assert credit.bytes_in_use <= LIMITS.bytes

    @invariant()
    def waiting_frames_mean_exhausted_credit(self) -> None:
        assert self.flow.waiting == len(self.queued)
        if self.queued:
            assert self.flow.credit.state is not CreditState.OPEN
            assert not self.flow.closed


FlowMachine.TestCase.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
TestFlowMachine = FlowMachine.TestCase


def test_admission_caps_flight_by_the_bytes_left_at_the_typical_frame_size() -> None:
    flow = SessionFlow(CreditLimits(frames=8, bytes=1000), 0.0)
    for _ in range(20):
        flow.observe_frame(400)  # the average converges on 400-byte frames
    assert 390 < flow.typical_frame <= 400
    assert flow.try_admit(1, 0.0) is Admit.ADMITTED
    assert flow.try_admit(1, 0.0) is Admit.ADMITTED  # 1000 // ~400 = 2 in flight
    assert flow.try_admit(1, 0.0) is Admit.BLOCKED  # this refusal exhausts the credit
    assert flow.try_admit(1, 0.0) is Admit.WAIT  # ... once
    flow.done()
    assert flow.try_admit(1, 0.0) is Admit.ADMITTED


def test_a_session_that_stops_draining_is_refused_429_after_the_window() -> None:
    flow = SessionFlow(CreditLimits(frames=1, bytes=1000, drain_window=5.0), 0.0)
    assert flow.try_acquire(10, 0.0)
    flow.wait_for(10, 1.0)
    with pytest.raises(RemoteProtocolError) as info:
        flow.try_admit(1, 6.0)
    assert info.value.reason is Reason.STREAM_HALF_OPEN
    assert flow.release(1, 10, 6.5) == [1]  # progress: the waiter is granted


def test_a_large_waiting_frame_is_not_overtaken_by_small_ones_of_its_stream() -> None:
    flow = SessionFlow(CreditLimits(frames=8, bytes=1000), 0.0)
    assert flow.try_acquire(900, 0.0, "a")
    big = flow.wait_for(600, 0.0, "a")
    assert not flow.try_acquire(10, 0.0, "a")  # its stream waits: no jumping the queue
    small = flow.wait_for(10, 0.0, "a")
    assert flow.release(1, 900, 1.0) == [big, small]


def test_a_stalled_stream_never_parks_another_streams_small_result() -> None:
    # Stream A's peer stopped reading: its frames hold most of the credit and its
    # next (large) frame waits.  Stream B's small result must not queue behind it.
    flow = SessionFlow(CreditLimits(frames=8, bytes=1000, drain_window=5.0), 0.0)
    assert flow.try_admit(1, 0.0) is Admit.ADMITTED  # B's request, before A fills up
    assert flow.try_acquire(450, 0.0, "a") and flow.try_acquire(450, 0.0, "a")
    big = flow.wait_for(300, 0.1, "a")  # A's third frame: no room
    assert flow.credit.state is CreditState.EXHAUSTED
    assert flow.try_acquire(80, 0.2, "b")  # B's result: it fits, so it goes now
    flow.done()
    # B's peer acknowledges; A's waiter still does not fit, nothing else waits.
    assert flow.release(1, 80, 0.3) == []
    assert flow.waiting == 1 and flow.cancel(big, 0.4)


def test_a_later_small_waiter_of_another_stream_is_granted_past_a_large_one() -> None:
    flow = SessionFlow(CreditLimits(frames=8, bytes=1000), 0.0)
    assert flow.try_acquire(900, 0.0, "b")  # B's own earlier frame fills the credit
    big = flow.wait_for(600, 0.0, "a")
    small = flow.wait_for(80, 0.0, "b")
    assert flow.release(1, 900, 1.0) == [big, small]  # both fit once B's frame drains
    flow2 = SessionFlow(CreditLimits(frames=8, bytes=1000), 0.0)
    assert flow2.try_acquire(500, 0.0, "a") and flow2.try_acquire(450, 0.0, "b")
    big = flow2.wait_for(600, 0.0, "a")  # behind A's stalled frame: does not fit
    small = flow2.wait_for(80, 0.0, "b")
    assert flow2.release(1, 450, 1.0) == [small]  # B's frame drained: B goes, A waits


def test_admission_refuses_into_a_full_credit_even_with_nothing_in_flight() -> None:
    # A request admitted now would run and find no room for its result: it waits
    # for a change instead, and is refused 429 once the session is half-open.
    flow = SessionFlow(CreditLimits(frames=8, bytes=1000, drain_window=5.0), 0.0)
    assert flow.try_acquire(1000, 0.0, "a")
    assert flow.inflight == 0
    assert flow.try_admit(1, 1.0) is Admit.BLOCKED
    with pytest.raises(RemoteProtocolError) as info:
        flow.try_admit(1, 6.5)
    assert info.value.reason is Reason.STREAM_HALF_OPEN
    assert flow.inflight == 0


def test_a_withdrawn_last_waiter_leaves_the_credit_open() -> None:
    # Nothing waits any more, so the drain window must not run out into a 429.
    flow = SessionFlow(CreditLimits(frames=1, bytes=1000, drain_window=5.0), 0.0)
    assert flow.try_acquire(10, 0.0)
    ticket = flow.wait_for(10, 0.0)
    states = [flow.credit.state]
    assert flow.cancel(ticket, 1.0)
    states.append(flow.credit.state)
    assert states == [CreditState.EXHAUSTED, CreditState.OPEN]
    assert flow.credit.handle_timer(6.0) is CreditState.OPEN  # the old wait left no timer
    # The frame credit is still full, so a request waits -- it is not refused.
    assert flow.try_admit(1, 6.0) is Admit.BLOCKED
    assert flow.release(1, 10, 6.5) == [] and flow.try_admit(1, 6.5) is Admit.ADMITTED


def test_a_result_that_fits_is_itself_and_one_that_cannot_is_result_too_large() -> None:
    payload = b'{"jsonrpc":"2.0","id":3,"result":{}}'
    assert fit_result(3, payload, 1000, 1000) is payload
    refused = msgspec.json.decode(fit_result(3, payload, 1001, 1000))
    assert refused["id"] == 3 and refused["error"]["code"] == -32603
    assert refused["error"]["data"] == {"reason": "result_too_large", "size": 1001, "limit": 1000}
    assert HEAD_ALLOWANCE > 0
