"""A connection's read deadline on the asyncio runtime: one timer, moved lazily.

Theory of operation
-------------------
A keep-alive connection waits for its next bytes once per request.  A fresh
``asyncio.timeout`` around each wait arms a loop timer and cancels it again every
time (a timer handle, a heap entry, a task lookup), a measurable share of what a
small request costs.  :class:`ReadDeadline` keeps one timer per connection
instead.  Each wait only records its deadline (:meth:`ReadDeadline.wait_until`);
the timer is armed anew only when that deadline is earlier than the one the timer
is set for.  When the timer fires it compares the time with the deadline of the
wait in progress: past it, it cancels the waiting task, and
:meth:`ReadDeadline.timed_out` turns that cancellation into a timeout; before it
(a later wait moved the deadline on), it is set again for that deadline; with no
wait in progress it lapses, and the next wait arms it.  A busy connection so sets
its timer about once per deadline period, not once per read.

A cancellation that did not come from the timer (the runtime's shutdown, say) is
never taken for a timeout: :meth:`ReadDeadline.timed_out` says so only when the
timer cancelled the task and nothing else asked for a cancellation since.
"""

from __future__ import annotations

import asyncio
import math


class ReadDeadline:
    """The deadline of one task's read waits (see the module docstring)."""

    __slots__ = ("_base", "_deadline", "_fired", "_loop", "_task", "_timer", "_waiting")

    def __init__(self, loop: asyncio.AbstractEventLoop, task: asyncio.Task[object]) -> None:
        self._loop, self._task = loop, task
        self._timer: asyncio.TimerHandle | None = None
        self._deadline = math.inf
        self._waiting = self._fired = False
        #: The task's cancellation requests as the wait began (anyone's but ours).
        self._base = 0

    def wait_until(self, deadline: float) -> None:
        """A wait begins that must end by ``deadline`` (loop time; ``inf``: never)."""
        self._deadline, self._waiting, self._fired = deadline, True, False
        self._base = self._task.cancelling()
        timer = self._timer
        if deadline != math.inf and (timer is None or deadline < timer.when()):
            if timer is not None:
                timer.cancel()
            self._timer = self._loop.call_at(deadline, self._due)

    def done(self) -> None:
        """The wait ended (with bytes, an error, or a timeout)."""
        self._waiting = False

    def timed_out(self) -> bool:
        """Whether the :class:`asyncio.CancelledError` being handled is the timer's
        (then it is withdrawn: the caller goes on as after a timeout); False for
        anyone else's, which the caller must let through."""
        if not self._fired:
            return False
        self._fired = False
        return self._task.uncancel() <= self._base

    def close(self) -> None:
        """The connection is over: no timer is left behind."""
        self._waiting = False
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _due(self) -> None:
        self._timer = None
        if not self._waiting:
            return  # (the next wait arms the timer again)
        if self._loop.time() < self._deadline:
            self._timer = self._loop.call_at(self._deadline, self._due)
            return
        self._waiting, self._fired = False, True
        self._task.cancel()


__all__ = ["ReadDeadline"]
