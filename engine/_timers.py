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
  are skipped when they reach the top.  Stale entries are counted as they appear
  (no scan; a session that closes is scheduled at ``inf``, which makes its entry
  stale), and the heap is rebuilt from the valid ones when they make up more than
  half of it (and above 64 entries), so it stays within about twice the
  scheduled sessions at O(1) amortised cost per schedule.  Below that size a
  closed session's stale entry may stay until its deadline: the heap holds the
  session *object* that long, never what it buffered (``Session.close`` lets go of
  its streams' frames when it closes, so a stale entry costs its object only).
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
        self._superseded = 0  # entries in the heap whose session has a newer one
        #: Entries pushed so far (how often sessions asked for an earlier wake-up).
        self.scheduled = 0
        #: Handler calls for due entries.
        self.fired = 0

    def __len__(self) -> int:
        return len(self._heap)

    def schedule(self, session: Timed, when: float) -> None:
        """Make ``when`` the session's deadline (its previous entry becomes stale)."""
        if session.timer_key:
            self._superseded += 1  # its current entry stays in the heap, now stale
        if when == math.inf:  # (none: a closed session's entry is stale too)
            session.timer_at, session.timer_key = math.inf, 0
        else:
            key = next(self._keys)
            session.timer_at, session.timer_key = when, key
            heapq.heappush(self._heap, (when, key, session))
            self.scheduled += 1
        if len(self._heap) > 64 and 2 * self._superseded > len(self._heap):
            self._compact()
        if when < self._sleeping_until and self._wake is not None:
            self._wake.set()

    def pending(self) -> list[Timed]:
        """Every entry still valid (each scheduled object once), in no particular order."""
        return [entry[2] for entry in self._heap if self._valid(entry[1], entry[2])]

    def _valid(self, key: int, session: Timed) -> bool:
        return key == session.timer_key and not session.closed

    def _compact(self) -> None:
        self._heap = [entry for entry in self._heap if self._valid(entry[1], entry[2])]
        heapq.heapify(self._heap)
        self._superseded = 0

    def _pop(self) -> tuple[float, int, Timed]:
        entry = heapq.heappop(self._heap)
        if entry[1] != entry[2].timer_key:
            self._superseded -= 1
        return entry

    def fire_due(self, now: float) -> None:
        """Call the handler for every valid entry due at ``now``, earliest first."""
        # self._heap, not a local: a handler that schedules may compact (replace) it.
        while self._heap and self._heap[0][0] <= now:
            _, key, session = self._pop()
            if not self._valid(key, session):
                continue
            session.timer_at, session.timer_key = math.inf, 0
            self.fired += 1
            self._on_due(session, now)

    async def run(self) -> None:
        """Serve the heap until cancelled."""
        while True:
            while self._heap and not self._valid(self._heap[0][1], self._heap[0][2]):
                self._pop()
            self._sleeping_until = self._heap[0][0] if self._heap else math.inf
            wake = self._wake = trio.Event()
            with trio.move_on_at(self._sleeping_until):
                await wake.wait()
            self._wake = None
            self._sleeping_until = math.inf
            self.fire_due(trio.current_time())
