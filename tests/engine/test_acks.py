"""The server's one acknowledgement re-checker: its schedule and what it forgets."""

from __future__ import annotations

from typing import Any, cast

import pytest
import trio
import trio.testing

from weir.engine._acks import MAX_POLL, MIN_POLL, AckPoller


class _Tracker:
    def __init__(self) -> None:
        self.acked = 0
        self.outstanding = 1


class _Peer:
    """What the poller reads and calls on a connection: progress comes from a script."""

    def __init__(self, progress_at: set[int]) -> None:
        self.tracker = _Tracker()
        self.poll_due = False
        self.poll_delay = MIN_POLL
        self.closed = False
        self.checks: list[float] = []
        self.progress_at = progress_at

    def check_acks(self) -> bool:
        self.checks.append(trio.current_time())
        if len(self.checks) in self.progress_at:
            self.tracker.acked += 1
        return bool(self.tracker.outstanding)


async def _run_for(poller: AckPoller, seconds: float) -> None:
    async with trio.open_nursery() as nursery:
        nursery.start_soon(poller.run)
        await trio.sleep(seconds)
        nursery.cancel_scope.cancel()


async def test_a_silent_peer_is_rechecked_on_a_doubling_backoff_reset_by_progress(
    autojump_clock: trio.testing.MockClock,
) -> None:
    poller = AckPoller()
    peer = _Peer(progress_at={5})
    start = trio.current_time()
    poller.watch(cast(Any, peer))
    await _run_for(poller, 2.0)
    gaps = [round(b - a, 3) for a, b in zip([start, *peer.checks], peer.checks, strict=False)]
    # 10, 20, 40, 80, 160 ms; progress at the 5th check resets to 10 ms; then doubles
    # again and stays at the 250 ms cap.
    assert gaps[:8] == [0.01, 0.02, 0.04, 0.08, 0.16, 0.01, 0.02, 0.04]
    assert max(gaps) == pytest.approx(MAX_POLL)
    assert poller.watched == 1  # still waiting: one entry, never more


async def test_a_closed_or_drained_connection_leaves_the_heap(
    autojump_clock: trio.testing.MockClock,
) -> None:
    poller = AckPoller()
    closed, drained = _Peer(set()), _Peer(set())
    for peer in (closed, drained):
        poller.watch(cast(Any, peer))
        poller.watch(cast(Any, peer))  # a second watch while due adds nothing
    assert poller.watched == 2
    closed.closed = True
    drained.tracker.outstanding = 0
    await _run_for(poller, 1.0)
    assert poller.watched == 0
    assert closed.checks == drained.checks == []  # nothing asked the kernel for them


async def test_an_earlier_entry_wakes_a_poller_sleeping_on_a_later_one(
    autojump_clock: trio.testing.MockClock,
) -> None:
    poller = AckPoller()
    slow, fast = _Peer(set()), _Peer(set())
    slow.poll_delay = MAX_POLL
    async with trio.open_nursery() as nursery:
        nursery.start_soon(poller.run)
        start = trio.current_time()
        poller.watch(cast(Any, slow))
        await trio.sleep(0.001)
        poller.watch(cast(Any, fast))
        await trio.sleep(0.05)
        nursery.cancel_scope.cancel()
    assert fast.checks and fast.checks[0] - start == pytest.approx(0.011)
