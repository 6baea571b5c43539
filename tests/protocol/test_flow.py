"""Tests for weir.protocol._flow: admission and in-order credit grants.

A Hypothesis state machine drives one :class:`SessionFlow` with frames of a few
streams (lanes) that fit or wait, releases, cancellations, admissions and the
end, against a model of what it must do: credit never over-committed, grants in
ticket order within each lane and never held back by another lane's waiter, no
ticket granted twice, nothing granted after the end, and the process's credit pool
holding exactly what the flow holds until the end, and nothing of it after.
"""

from __future__ import annotations

import msgspec
import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from weir.protocol import (
    Admit,
    CreditLimits,
    CreditPool,
    Reason,
    RemoteProtocolError,
    SessionFlow,
)
from weir.protocol._budget import FRAMING_ALLOWANCE, HEAD_ALLOWANCE, fit_result
from weir.protocol.budget import fit_response
from weir.protocol.states import CreditState
from weir.protocol.streams import StreamKind, StreamLog

LIMITS = CreditLimits(frames=4, bytes=1000, drain_window=5.0, liveness_timeout=60.0)
LANES = [None, "a", "b"]


class FlowMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        #: A pool this flow alone could never fill (its admission is the flow's own).
        self.pool = CreditPool(LIMITS.bytes * 1000)
        self.flow = SessionFlow(LIMITS, 0.0, self.pool)
        self.now = 0.0
        self.held: list[tuple[int, str | None]] = []  # (size, lane) of frames holding credit
        #: (ticket, size, lane), in issue order
        self.queued: list[tuple[int, int, str | None]] = []
        self.granted: set[int] = set()
        #: Per lane: the reservation units (frames, bytes) of its admitted requests,
        #: and [frames, bytes] of them its frames draw on now.
        self.units: dict[str | None, list[tuple[int, int]]] = {}
        self.drawn: dict[str | None, list[int]] = {}
        #: A frame was granted past other lanes' reservations (nothing was in use)
        #: and frames have been in use ever since.
        self.overbooked = False
        #: Tickets queued while their lane held a reservation.
        self.reserved_waiters: set[int] = set()

    def _unused(self) -> tuple[int, int]:
        frames = sum(sum(f for f, _ in u) - self.drawn[k][0] for k, u in self.units.items())
        nbytes = sum(sum(b for _, b in u) - self.drawn[k][1] for k, u in self.units.items())
        return frames, nbytes

    def _own(self, lane: str | None) -> tuple[int, int]:
        units = self.units.get(lane, [])
        drawn = self.drawn.get(lane, [0, 0])
        return sum(f for f, _ in units) - drawn[0], sum(b for _, b in units) - drawn[1]

    def _take(self, size: int, lane: str | None) -> bool:
        # The model: a frame fits in the free credit plus its own lane's unused
        # reservation, and draws on that reservation only for what the free part lacks.
        unused_f, unused_b = self._unused()
        own_f, own_b = self._own(lane)
        held_f = len(self.held) + unused_f
        held_b = sum(s for s, _ in self.held) + unused_b
        fits = held_f - own_f < LIMITS.frames and not (
            held_b and held_b - own_b + size > LIMITS.bytes
        )
        if not fits:
            # With nothing in use no acknowledgement can come: a lane that has an
            # admitted request is granted past the others' reservations.
            if self.held or lane not in self.units:
                return False
            self.overbooked = True
        if held_f >= LIMITS.frames:
            self.drawn[lane][0] += min(own_f, 1)
        if held_b and held_b + size > LIMITS.bytes:
            self.drawn[lane][1] += min(own_b, held_b + size - LIMITS.bytes)
        self.held.append((size, lane))
        return True

    def _grant(self, tickets: list[int]) -> None:
        # In ticket order, every waiter that fits and has no earlier waiter of its lane.
        expected: list[int] = []
        stuck: set[str] = set()
        for ticket, size, lane in list(self.queued):
            if (lane is None or lane not in stuck) and self._take(size, lane):
                expected.append(ticket)
                assert ticket not in self.granted
                self.granted.add(ticket)
                self.queued.remove((ticket, size, lane))
            elif lane is not None:
                stuck.add(lane)
        assert tickets == expected

    @rule(size=st.integers(1, 1500), lane=st.sampled_from(LANES))
    def send_a_frame(self, size: int, lane: str | None) -> None:
        own_f, own_b = self._own(lane)
        lane_waits = lane is not None and any(q[2] == lane for q in self.queued)
        if self.flow.try_acquire(size, self.now, lane):
            assert not self.flow.closed and not lane_waits
            assert self._take(size, lane)
        elif not self.flow.closed:
            assert lane_waits or not self._take(size, lane)
            # The reservation's promise: a frame no larger than what its own lane
            # reserved (and does not hold) is never made to wait by other lanes.
            assert lane_waits or self.overbooked or not (own_f >= 1 and size <= own_b)
            ticket = self.flow.wait_for(size, self.now, lane)
            # A waiter counts as its reservation's only if nothing of its lane waits
            # ahead of it that queued before the lane reserved (behind such a frame it
            # waits for that frame, which no reservation promised anything).
            # (The default lane, None, keeps no order among its waiters.)
            ahead = lane is not None and any(
                q[2] == lane and q[0] not in self.reserved_waiters for q in self.queued
            )
            if lane in self.units and not ahead:
                self.reserved_waiters.add(ticket)
            self.queued.append((ticket, size, lane))

    @precondition(lambda self: self.held)
    @rule(data=st.data())
    def drain_some(self, data: st.DataObject) -> None:
        lane = data.draw(st.sampled_from(sorted({x for _, x in self.held}, key=str)))
        mine = [i for i, (_, x) in enumerate(self.held) if x == lane]
        k = data.draw(st.integers(1, len(mine)))
        gone = [self.held[i] for i in mine[:k]]
        for frame in gone:
            self.held.remove(frame)
        if not self.held:
            self.overbooked = False
        frames, nbytes = k, sum(s for s, _ in gone)
        if lane in self.drawn:  # what the frames drew goes back to their reservation
            drawn = self.drawn[lane]
            drawn[0] -= min(drawn[0], frames)
            drawn[1] -= min(drawn[1], nbytes)
        self.now += 0.1
        self._grant(self.flow.release(frames, nbytes, self.now, lane))

    @precondition(lambda self: self.queued)
    @rule(data=st.data())
    def give_up_waiting(self, data: st.DataObject) -> None:
        i = data.draw(st.integers(0, len(self.queued) - 1))
        ticket, _, _ = self.queued.pop(i)
        assert self.flow.cancel(ticket, self.now)
        assert not self.flow.cancel(ticket, self.now)  # a ticket is withdrawn once

    @rule(n=st.integers(1, 3), lane=st.sampled_from(LANES))
    def admit(self, n: int, lane: str | None) -> None:
        before = self.flow.inflight
        unused_before = self._unused()
        try:
            verdict = self.flow.try_admit(n, self.now, lane=lane)
        except RemoteProtocolError as exc:
            assert exc.reason is Reason.STREAM_HALF_OPEN and exc.http_status == 429
            return
        if verdict is Admit.ADMITTED:
            assert self.flow.inflight == before + n
            f, b = self.flow.credit.reserved_frames, self.flow.credit.reserved_bytes
            added = (f - unused_before[0], b - unused_before[1])
            assert added[0] <= n and added[1] >= 0
            if n > 1 or added[0] == 1:
                each = added[1] // n
                new = [(1 if i < added[0] else 0, each) for i in range(n)]
            else:
                new = [(added[0], added[1])]
            self.units.setdefault(lane, []).extend(new)
            self.drawn.setdefault(lane, [0, 0])
        else:
            # Waiting: the reservation would not fit, and something is held.
            assert self.flow.inflight == before
            assert self.held or unused_before != (0, 0)

    @precondition(lambda self: self.units)
    @rule(data=st.data())
    def answer_one(self, data: st.DataObject) -> None:
        lane = data.draw(st.sampled_from(sorted(self.units, key=str)))
        units = sorted(self.units[lane])
        del units[0]
        drawn = self.drawn[lane]
        drawn[0] = min(drawn[0], sum(f for f, _ in units))
        drawn[1] = min(drawn[1], sum(b for _, b in units))
        if units:
            self.units[lane] = units
        else:
            del self.units[lane], self.drawn[lane]
        self._grant(self.flow.done(1, self.now, lane))

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
        self.units.clear()
        self.drawn.clear()

    @invariant()
    def the_pool_holds_what_the_flow_holds_until_its_end(self) -> None:
        held = 0 if self.flow.closed else sum(s for s, _ in self.held)
        assert self.pool.bytes_in_use == held

    @invariant()
    def credit_is_never_overcommitted(self) -> None:
        credit = self.flow.credit
        assert credit.frames_in_use == len(self.held)
        assert credit.bytes_in_use == sum(s for s, _ in self.held)
        assert (credit.reserved_frames, credit.reserved_bytes) == self._unused()
        # Frames in use never exceed the credit (only a lone frame may exceed the bytes).
        assert credit.frames_in_use <= LIMITS.frames
        if len(self.held) > 1:
            assert credit.bytes_in_use <= LIMITS.bytes
        # Reservations alone always fit in the credit.
        assert credit.reserved_frames <= LIMITS.frames
        assert credit.reserved_bytes <= LIMITS.bytes
        if self.overbooked:
            # One frame went past the others' reservations, because nothing else
            # could have ended their wait; by one frame at most.
            assert credit.held_frames <= LIMITS.frames + 1
        else:
            # Reservations count as held: frames and reservations together stay
            # within the credit (only a lone frame, nothing reserved, exceeds the bytes).
            assert credit.held_frames <= LIMITS.frames
            if len(self.held) > 1 or credit.reserved_bytes:
                assert credit.held_bytes <= LIMITS.bytes

    @invariant()
    def a_wait_that_nothing_could_end_never_lasts(self) -> None:
        # Nothing in use means no acknowledgement is coming: then no frame that waits
        # in a lane holding a reservation (as it did when the frame came) is left
        # waiting.  (A reservation made after its lane's frames queued is not how a
        # driver works: a request reserves before its stream carries anything.)
        if not self.held and not self.flow.closed:
            stuck = [q for q in self.queued if q[0] in self.reserved_waiters and q[2] in self.units]
            assert not stuck

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
    assert flow.done(1, 0.0) == []  # its reservation ends with it
    assert flow.try_admit(1, 0.0) is Admit.ADMITTED


def test_a_session_that_stops_draining_is_refused_429_after_the_window() -> None:
    flow = SessionFlow(CreditLimits(frames=1, bytes=1000, drain_window=5.0), 0.0)
    assert flow.try_acquire(10, 0.0)
    flow.wait_for(10, 1.0)
    with pytest.raises(RemoteProtocolError) as info:
        flow.try_admit(1, 6.0)
    assert info.value.reason is Reason.STREAM_HALF_OPEN
    assert flow.release(1, 10, 6.5) == [1]  # progress: the waiter is granted


def test_a_full_credit_pool_refuses_every_owner_503_until_bytes_come_back() -> None:
    """Owners each within their own credit can together fill the process's pool; then
    every owner's admission is refused 503 ``overloaded`` (with a retry delay), even
    one holding nothing, until acknowledged bytes -- or an owner's end -- return room."""
    pool = CreditPool(1500)
    limits = CreditLimits(frames=4, bytes=1000, drain_window=5.0)
    stalled = [SessionFlow(limits, 0.0, pool) for _ in range(2)]
    fresh = SessionFlow(limits, 0.0, pool)
    for flow in stalled:
        assert flow.try_admit(1, 0.0, lane="s") is Admit.ADMITTED
        assert flow.try_acquire(800, 0.0, lane="s")  # each within its own credit
    assert pool.bytes_in_use == 1600 and pool.full
    with pytest.raises(RemoteProtocolError) as info:
        fresh.try_admit(1, 1.0, request_id=7)
    refusal = info.value
    assert (refusal.http_status, refusal.reason) == (503, Reason.OVERLOADED)
    assert refusal.request_id == 7 and refusal.retry_after_ms == 5000
    assert fresh.inflight == 0 and fresh.credit.reserved_bytes == 0  # nothing admitted
    # A frame's real size replaces its estimate in the pool too.
    stalled[0].credit.correct(800, 600)
    assert pool.bytes_in_use == 1400 and not pool.full
    assert fresh.try_admit(1, 2.0) is Admit.ADMITTED
    assert stalled[1].try_acquire(200, 2.0, lane="s")
    assert pool.full
    # An owner that ends gives back all it held, however its frames fare afterwards.
    stalled[1].close()
    assert pool.bytes_in_use == 600
    stalled[1].release(1, 800, 3.0)  # (its writer lets go of a frame after the end)
    assert pool.bytes_in_use == 600 and pool.peak_bytes == 1600
    stalled[0].release(1, 600, 3.0)
    assert pool.bytes_in_use == 0


def test_a_credit_pool_needs_room_for_a_byte() -> None:
    with pytest.raises(ValueError):
        CreditPool(0)


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
    assert flow.try_admit(1, 0.0, lane="b") is Admit.ADMITTED  # B's request, before A fills up
    assert flow.try_acquire(360, 0.0, "a") and flow.try_acquire(360, 0.0, "a")
    big = flow.wait_for(300, 0.1, "a")  # A's third frame: no room
    assert flow.credit.state is CreditState.EXHAUSTED
    assert flow.try_acquire(80, 0.2, "b")  # B's result: it fits, so it goes now
    assert flow.done(1, 0.2, "b") == []
    # B's peer acknowledges; A's waiter still does not fit, nothing else waits.
    assert flow.release(1, 80, 0.3, "b") == []
    assert flow.waiting == 1 and flow.cancel(big, 0.4)


def test_an_admitted_requests_reservation_is_its_own_whatever_other_streams_hold() -> None:
    # Request A is admitted: it reserves a typical frame for its result.  Stalled
    # stream B then fills every byte that is not reserved (and waits for more);
    # A's result, no larger than its reservation, is granted at once, and frames
    # plus reservations never exceed the credit.
    limits = CreditLimits(frames=8, bytes=1000, drain_window=5.0)
    flow = SessionFlow(limits, 0.0)
    assert flow.try_admit(1, 0.0, lane="a") is Admit.ADMITTED
    assert flow.reserved("a") == (1, 256) and flow.credit.held_bytes == 256
    for _ in range(3):
        assert flow.try_acquire(248, 0.0, "b")  # 744 of the 744 unreserved bytes
    assert not flow.try_acquire(1, 0.0, "b")  # B never takes A's reservation
    flow.wait_for(100, 0.1, "b")
    assert not flow.try_acquire(1, 0.1, None)  # nor does any other lane
    assert flow.credit.held_bytes == limits.bytes
    assert flow.try_acquire(200, 0.2, "a")  # A's result: at once
    assert flow.reserved("a") == (1, 56) and flow.credit.held_bytes == limits.bytes
    assert flow.done(1, 0.2, "a") == []  # A is answered: the rest of its reservation ends
    assert flow.credit.held_bytes == 944 and flow.credit.reserved_bytes == 0
    # A new request finds no room for a reservation: it waits (and is refused 429
    # once the drain window passes), it does not run.
    assert flow.try_admit(1, 0.3, lane="c") is Admit.WAIT
    with pytest.raises(RemoteProtocolError) as info:
        flow.try_admit(1, 5.2, lane="c")
    assert info.value.reason is Reason.STREAM_HALF_OPEN


def test_a_reservation_drawn_on_comes_back_when_its_frames_drain() -> None:
    # A's request sends a progress frame while B holds all the free credit: the
    # frame draws on A's reservation; once acknowledged, the room is A's again.
    flow = SessionFlow(CreditLimits(frames=8, bytes=1000), 0.0)
    assert flow.try_admit(1, 0.0, lane="a") is Admit.ADMITTED
    assert flow.try_acquire(744, 0.0, "b")
    assert flow.try_acquire(100, 0.0, "a") and flow.reserved("a") == (1, 156)
    assert not flow.try_acquire(200, 0.0, "a")  # more than is left of it: it waits
    ticket = flow.wait_for(200, 0.0, "a")
    assert flow.release(1, 100, 0.1, "a") == [ticket]  # the progress frame drained
    assert flow.reserved("a") == (1, 56)
    # The frame credit is reserved the same way.
    flow2 = SessionFlow(CreditLimits(frames=2, bytes=1000), 0.0)
    assert flow2.try_admit(1, 0.0, lane="a") is Admit.ADMITTED
    assert flow2.try_acquire(10, 0.0, "b") and not flow2.try_acquire(10, 0.0, "b")
    assert flow2.try_acquire(10, 0.0, "a")


def test_a_reservation_made_before_its_stream_existed_moves_to_it() -> None:
    flow = SessionFlow(CreditLimits(frames=8, bytes=1000), 0.0)
    key = object()
    assert flow.try_admit(1, 0.0, lane=key) is Admit.ADMITTED
    flow.move(key, "a")
    assert flow.reserved(key) == (0, 0) and flow.reserved("a") == (1, 256)
    assert flow.try_acquire(744, 0.0, "b") and flow.try_acquire(256, 0.0, "a")
    # A refused batch entry's empty reservation ends with it, not an admitted one's.
    assert flow.try_admit(1, 0.0, lane="c") is Admit.BLOCKED
    flow.count_in(1, "a")
    assert flow.done(1, 0.0, "a") == [] and flow.reserved("a") == (1, 0)
    assert flow.done(1, 0.0, "a") == [] and flow.reserved("a") == (0, 0)
    assert flow.credit.held_bytes == 1000 and flow.credit.held_frames == 2


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


def test_fit_response_measures_the_frame_it_would_be_sent_in() -> None:
    payload = b'{"jsonrpc":"2.0","id":3,"result":{"t":"' + b"x" * 900 + b'"}}'
    log = StreamLog("0000000a", StreamKind.REQUEST, max_events=8)
    framed = log.size_of(payload.decode())
    assert len(payload) < framed < len(payload) + FRAMING_ALLOWANCE
    # Far under the credit: itself, unmeasured.
    assert fit_response(3, payload, len(payload) + FRAMING_ALLOWANCE, log) is payload
    # Exactly the frame's size fits; one byte less cannot.
    assert fit_response(3, payload, framed, log) is payload
    refused = msgspec.json.decode(fit_response(3, payload, framed - 1, log))
    assert refused["error"]["data"]["size"] == framed
    # A JSON body is its payload plus the head's allowance.
    json_size = len(payload) + HEAD_ALLOWANCE
    assert fit_response(3, payload, json_size, None) is payload
    assert msgspec.json.decode(fit_response(3, payload, json_size - 1, None))["error"]


def test_a_json_answers_reservation_stays_until_its_body_holds_credit() -> None:
    # JSON mode: the handler is done before its body is sent; the reservation is
    # kept (``keep``) for the body, which draws on it, and ends at ``settle``.
    flow = SessionFlow(CreditLimits(frames=8, bytes=1000), 0.0)
    assert flow.try_admit(1, 0.0, lane="j") is Admit.ADMITTED
    assert flow.done(1, 0.0, "j", keep=True) == [] and flow.inflight == 0
    assert flow.try_acquire(744, 0.0, "b") and not flow.try_acquire(1, 0.0, "b")
    assert flow.try_acquire(200, 0.0, "j")  # the body: from its reservation
    assert flow.settle("j", 0.0) == [] and flow.reserved("j") == (0, 0)
    assert flow.credit.held_bytes == 944 and flow.credit.held_frames == 2


def test_results_that_outgrow_reservations_filling_the_credit_do_not_wait_for_ever() -> None:
    # Found by the cluster simulator (seed 45, credit 2 frames / 512 bytes): two
    # requests are admitted and reserve the whole credit; each stream's priming
    # event draws on its own reservation and is acknowledged; then each result is
    # larger than what is left of its own reservation, and the other's keeps it
    # out.  Nothing is in use, so no acknowledgement will ever come: the oldest
    # waiter is granted past the other reservation, and the other follows once
    # that frame is acknowledged.
    flow = SessionFlow(CreditLimits(frames=2, bytes=512, drain_window=5.0), 0.0)
    assert flow.try_admit(1, 0.0, lane="a") is Admit.ADMITTED
    assert flow.try_admit(1, 0.0, lane="b") is Admit.ADMITTED
    assert flow.credit.held_bytes == 512
    for lane in ("a", "b"):
        assert flow.try_acquire(43, 0.0, lane)  # the priming event
    assert not flow.try_acquire(330, 0.0, "a")  # behind b's priming event: wait
    first = flow.wait_for(330, 0.0, "a")
    assert flow.release(1, 43, 0.1, "a") == []  # b's priming still in use
    assert flow.release(1, 43, 0.1, "b") == [first]
    assert flow.credit.frames_in_use == 1 and flow.credit.bytes_in_use == 330
    # b's result waits for a's to drain, not for ever; and a stream without a
    # reservation never gets reserved room this way.
    assert not flow.try_acquire(330, 0.2, "b")
    second = flow.wait_for(330, 0.2, "b")
    assert flow.done(1, 0.2, "a") == []
    assert flow.release(1, 330, 0.3, "a") == [second]
    assert flow.done(1, 0.3, "b") == []
    assert flow.release(1, 330, 0.4, "b") == []
    assert flow.credit.held_frames == 0 and flow.credit.held_bytes == 0


def test_a_stream_without_a_reservation_never_takes_reserved_room() -> None:
    flow = SessionFlow(CreditLimits(frames=2, bytes=512, drain_window=5.0), 0.0)
    assert flow.try_admit(2, 0.0, lane="a") is Admit.ADMITTED  # the whole credit
    assert flow.credit.frames_in_use == 0
    assert not flow.try_acquire(10, 0.0, "get")
    flow.wait_for(10, 0.0, "get")
    assert flow.credit.frames_in_use == 0 and flow.waiting == 1
