"""Tasks on the asyncio runtime: each run an asyncio task beside its lease renewal.

Theory of operation
-------------------
Every decision is :class:`weir.engine._tasks.Tasks`'s (the same records in the same
store, so a task created here is read, answered, cancelled or declared lost by a
Trio replica and the other way round); this module gives it asyncio's tasks.  A run
(started by the driver as a background task: a drain does not wait for it) starts
its handler as a task of its own -- the run's stopper in
:attr:`~weir.engine._tasks.Tasks.running` -- and the base's renewal loop as another,
which cancels the handler once the record no longer names this run.
The run waits for the handler without being cancelled by its end: a handler stopped
that way ends the run with ``task_interrupted`` (which leaves a cancelled record as
it is).  A run cancelled from outside (shutdown) stops its handler, records the task
``interrupted`` within :data:`~weir.engine._tasks.SHUTDOWN_WAIT`, and lets the
cancellation go on.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

from weir.app import AccessToken
from weir.engine._tasks import SHUTDOWN_WAIT, Tasks
from weir.protocol.tasks import TaskRecord, task_interrupted


class AsyncioTasks(Tasks):
    """:class:`~weir.engine._tasks.Tasks` whose runs are asyncio tasks."""

    async def _run(self, principal: str, record: TaskRecord, access: AccessToken | None) -> None:
        key, run = (principal, record.id), record.run
        loop = asyncio.get_running_loop()
        handler = loop.create_task(self._handle(principal, record, access))
        self.running[key] = (run, handler)
        renewal = loop.create_task(self._renew(principal, record.id, run, handler))
        try:
            await asyncio.wait({handler})
        except asyncio.CancelledError:  # the runtime is going away
            handler.cancel()
            with contextlib.suppress(TimeoutError, asyncio.CancelledError):
                await asyncio.wait_for(
                    self._finish(principal, record.id, run, task_interrupted), SHUTDOWN_WAIT
                )
            raise
        finally:
            renewal.cancel()
            if self.running.get(key, (None,))[0] == run:
                del self.running[key]
        outcome: Callable[[TaskRecord, float], TaskRecord] | None = None
        if not handler.cancelled():
            outcome = handler.result()
        # No outcome: the handler was stopped -- by a cancel (the record says so
        # already, and the rule leaves it), or declared lost elsewhere.
        await self._finish(principal, record.id, run, outcome or task_interrupted)

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)

    async def shutdown(self) -> None:
        for _, handler in list(self.running.values()):
            handler.cancel()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + SHUTDOWN_WAIT
        while self.running and loop.time() < deadline:
            await asyncio.sleep(0.01)
