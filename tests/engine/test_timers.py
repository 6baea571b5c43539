"""Tests for engine._timers: one heap of session deadlines, served by one task.

Virtual time (``autojump_clock``); the sessions are stand-ins with the three
attributes the heap reads.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import trio
import trio.testing

from weir.engine._session import Session
from weir.engine._store_records import SessionRecord
from weir.engine._timers import Deadlines, Timed


@dataclass(eq=False)
class Fake:
    name: str
    timer_at: float = math.inf
    timer_key: int = 0
    closed: bool = False


async def test_due_sessions_fire_once_in_deadline_order(
    autojump_clock: trio.testing.MockClock,
) -> None:
    fired: list[tuple[str, float]] = []

    def due(session: Timed, now: float) -> None:
        assert isinstance(session, Fake)
        fired.append((session.name, now))

    heap = Deadlines(due)
    a, b, c, gone = Fake("a"), Fake("b"), Fake("c"), Fake("gone")
    async with trio.open_nursery() as nursery:
        nursery.start_soon(heap.run)
        heap.schedule(a, 5.0)
        heap.schedule(b, 2.0)
        heap.schedule(c, 9.0)
        heap.schedule(gone, 1.0)
        gone.closed = True  # a closed session's entry is skipped
        heap.schedule(c, 3.0)  # earlier: the entry at 9 becomes stale
        await trio.sleep_until(10.0)
        nursery.cancel_scope.cancel()
    assert fired == [("b", 2.0), ("c", 3.0), ("a", 5.0)]
    assert (a.timer_at, c.timer_at) == (math.inf, math.inf)  # nothing scheduled any more


async def test_an_earlier_entry_wakes_the_sleeping_task(
    autojump_clock: trio.testing.MockClock,
) -> None:
    fired: list[float] = []
    heap = Deadlines(lambda session, now: fired.append(now))
    s = Fake("s")
    async with trio.open_nursery() as nursery:
        nursery.start_soon(heap.run)
        heap.schedule(s, 100.0)
        await trio.sleep(1.0)  # the task now sleeps until 100
        heap.schedule(s, 4.0)
        await trio.sleep_until(50.0)
        nursery.cancel_scope.cancel()
    assert fired == [4.0]


def test_stale_entries_never_outnumber_the_live_ones_for_long() -> None:
    heap = Deadlines(lambda session, now: None)
    sessions = [Fake(str(i)) for i in range(10)]
    for step in range(1000):  # every session keeps moving its deadline earlier
        heap.schedule(sessions[step % 10], 1e6 - step)
    assert len(heap) <= max(64, 2 * len(sessions)) + 1
    assert heap.scheduled == 1000


def test_an_infinite_deadline_unschedules() -> None:
    heap = Deadlines(lambda session, now: None)
    s = Fake("s")
    heap.schedule(s, 3.0)
    heap.schedule(s, math.inf)
    assert s.timer_at == math.inf
    heap.fire_due(10.0)
    assert heap.fired == 0


def test_closed_sessions_are_let_go_of_before_their_deadline() -> None:
    """Sessions that close while scheduled (a sessionless connection's credit owner:
    one per connection, its liveness deadline a minute away) are unscheduled as they
    close; the heap then keeps about as many entries as live sessions, not one per
    session closed within the deadline (it held them all, found by a probe)."""
    heap = Deadlines(lambda session, now: None)
    live = [Fake(f"live{i}") for i in range(10)]
    for s in live:
        heap.schedule(s, 1e6)
    for i in range(2000):  # a new connection each: its owner scheduled, then closed
        record = SessionRecord(
            session_id=f"o{i}", principal="p", protocol_version="v", created_at=0
        )
        owner = Session(record)
        owner.schedule = heap.schedule
        heap.schedule(owner, 60.0 + i)
        owner.close()
        assert owner.timer_key == 0 and len(heap) <= max(64, 2 * len(live)) + 1, i
    assert sorted(map(id, heap.pending())) == sorted(map(id, live))
