"""Tasks on the Trio engine: each run in a nursery beside its lease renewal.

Theory of operation
-------------------
Every decision is :class:`weir.engine._tasks.Tasks`'s; this module gives it Trio's
structured concurrency.  A run opens a nursery holding its handler (in a cancel scope
registered as the run's stopper) and the base's renewal loop, which cancels that scope
once the record no longer names this run.  A run cancelled from outside (the server going
away) records its task ``interrupted`` in a shielded scope bounded by
:data:`~weir.engine._tasks.SHUTDOWN_WAIT`, then lets the cancellation go on.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import trio

from weir.app import AccessToken
from weir.protocol.tasks import TaskRecord, task_interrupted

from ._tasks import SHUTDOWN_WAIT, Tasks


class TrioTasks(Tasks):
    """:class:`~weir.engine._tasks.Tasks` whose runs are Trio tasks."""

    async def _run(self, principal: str, record: TaskRecord, access: AccessToken | None) -> None:
        key, run = (principal, record.id), record.run
        outcome: Callable[[TaskRecord, float], TaskRecord] | None = None
        try:
            async with trio.open_nursery() as nursery:
                handler_scope = trio.CancelScope()
                self.running[key] = (run, handler_scope)
                nursery.start_soon(self._renew, principal, record.id, run, handler_scope)
                with handler_scope:
                    outcome = await self._handle(principal, record, access)
                nursery.cancel_scope.cancel()
        except trio.Cancelled:
            with trio.CancelScope(shield=True) as shield:  # the server is going away
                shield.deadline = trio.current_time() + SHUTDOWN_WAIT
                await self._finish(principal, record.id, run, task_interrupted)
            raise
        finally:
            if self.running.get(key, (None,))[0] == run:
                del self.running[key]
        # No outcome: the handler was stopped -- by a cancel (the record says so
        # already, and the rule leaves it), or by this server's shutdown.
        await self._finish(principal, record.id, run, outcome or task_interrupted)

    async def sleep(self, seconds: float) -> None:
        await trio.sleep(seconds)

    async def shutdown(self) -> None:
        for _, scope in list(self.running.values()):
            scope.cancel()
        with contextlib.suppress(trio.TooSlowError), trio.fail_after(SHUTDOWN_WAIT):
            while self.running:
                await trio.sleep(0.01)
