"""Every session's credit deadline in one heap, served by one task.

Theory of operation
-------------------
A session's credit has at most one instant of interest at a time
(:meth:`weir.protocol.SessionFlow.deadline`): the end of its drain window, or of
its liveness timeout.  Most sessions, most of the time, have none.  Rather than a
task per session, the server keeps one :class:`Deadlines` heap and one task
(:meth:`Deadlines.run`) that sleeps until the earliest entry.

* :meth:`Deadlines.schedule` is called by a session when its deadline moves
  *earlier* than the one it is already scheduled at (``Session.timer_at``).  A
  later deadline needs no entry: when the earlier one fires, the handler finds
  nothing due and schedules the session again at its new deadline.  So a busy
  session whose deadline slides forward with every acknowledged frame costs
  nothing per frame.
* A session has exactly one *valid* entry: the one whose key equals its
  ``timer_key``.  Entries superseded by an earlier one, or of closed sessions,
  are skipped when they reach the top; the heap is rebuilt from the valid ones
  when stale entries outnumber them, so it stays within twice the scheduled
  sessions.
* The task wakes when a new entry becomes the earliest, and calls the handler
  for every due entry, in deadline order.  The handler must not block (it only
  applies the timers and, for a dead session, starts its teardown elsewhere), so
  one session's teardown never delays another's deadline.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Callable
from typing import Protocol

import trio


class Timed(Protocol):
    """What the heap needs of a session."""

    timer_at: float  # the instant of its valid entry (inf: none)
    timer_key: int  # the key of its valid entry

    @property
    def closed(self) -> bool: ...


class Deadlines:
    """One heap of session deadlines and the task that serves it (see module docstring)."""

    def __init__(self, on_due: Callable[[Timed, float], None]) -> None:
        self._on_due = on_due
        self._heap: list[tuple[float, int, Timed]] = []
        self._keys = itertools.count(1)
        self._sleeping_until = math.inf
        self._wake: trio.Event | None = None
        #: Entries pushed so far (how often sessions asked for an earlier wake-up).
        self.scheduled = 0
        #: Handler calls for due entries.
        self.fired = 0

    def __len__(self) -> int:
        return len(self._heap)

    def schedule(self, session: Timed, when: float) -> None:
        """Make ``when`` the session's deadline (its previous entry becomes stale)."""
        if when == math.inf:
            session.timer_at, session.timer_key = math.inf, 0
            return
        key = next(self._keys)
        session.timer_at, session.timer_key = when, key
        heapq.heappush(self._heap, (when, key, session))
        self.scheduled += 1
        if len(self._heap) > 64 and len(self._heap) > 2 * self._valid_count():
            self._compact()
        if when < self._sleeping_until and self._wake is not None:
            self._wake.set()

    def _valid(self, key: int, session: Timed) -> bool:
        return key == session.timer_key and not session.closed

    def _valid_count(self) -> int:
        return sum(1 for _, key, s in self._heap if self._valid(key, s))

    def _compact(self) -> None:
        self._heap = [entry for entry in self._heap if self._valid(entry[1], entry[2])]
        heapq.heapify(self._heap)

    def fire_due(self, now: float) -> None:
        """Call the handler for every valid entry due at ``now``, earliest first."""
        heap = self._heap
        while heap and heap[0][0] <= now:
            _, key, session = heapq.heappop(heap)
            if not self._valid(key, session):
                continue
            session.timer_at, session.timer_key = math.inf, 0
            self.fired += 1
            self._on_due(session, now)

    async def run(self) -> None:
        """Serve the heap until cancelled."""
        heap = self._heap
        while True:
            while self._heap and not self._valid(self._heap[0][1], self._heap[0][2]):
                heapq.heappop(self._heap)
            heap = self._heap
            self._sleeping_until = heap[0][0] if heap else math.inf
            wake = self._wake = trio.Event()
            with trio.move_on_at(self._sleeping_until):
                await wake.wait()
            self._wake = None
            self._sleeping_until = math.inf
            self.fire_due(trio.current_time())
