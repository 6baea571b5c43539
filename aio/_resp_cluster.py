"""The cluster pipe on asyncio: :class:`AsyncioClusterPipe`, the twin of the Trio one.

Theory of operation
-------------------
Routing by slot, redirections, the refresh on the first error and the bounds are
:class:`weir.engine._slots.ClusterPipe`'s.  Here each primary's
:class:`~._resp.AsyncioRespPipe` runs as an asyncio task started by
:meth:`AsyncioClusterPipe.run` (the store's owner task) and cancelled when its node
leaves the layout or the store closes; ``run`` reads the layout first, retrying with
the pipes' back-off until the cluster answers.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections.abc import Sequence

from weir.engine._resp import _BACKOFF_MAX, _BACKOFF_MIN
from weir.engine._slots import Address, ClusterPipe, Flag, NodePipe

from ._resp import AsyncioRespPipe

__all__ = ["AsyncioClusterPipe"]


class AsyncioClusterPipe(ClusterPipe):
    """A :class:`~weir.engine._slots.ClusterPipe` of :class:`~._resp.AsyncioRespPipe`
    nodes (same arguments as the Trio runtime's
    :class:`~weir.engine._resp_cluster.TrioClusterPipe`)."""

    def __init__(
        self,
        seeds: Sequence[Address],
        *,
        username: str | None = None,
        password: str | None = None,
        tls: ssl.SSLContext | None = None,
        timeout: float = 2.0,
    ) -> None:
        def node(host: str, port: int) -> NodePipe:
            return AsyncioRespPipe(
                host, port, username=username, password=password, tls=tls, timeout=timeout
            )

        self._tasks: dict[int, asyncio.Task[None]] = {}
        self._waiting: list[NodePipe] = []  # asked for before run() began
        self._running = False
        super().__init__(seeds, node)

    def _flag(self) -> Flag:
        return asyncio.Event()

    def _start(self, pipe: NodePipe) -> None:
        if not self._running:
            self._waiting.append(pipe)
            return
        self._tasks[id(pipe)] = asyncio.get_running_loop().create_task(pipe.run())

    def _stop(self, pipe: NodePipe) -> None:
        task = self._tasks.pop(id(pipe), None)
        if task is not None:
            task.cancel()
        elif pipe in self._waiting:
            self._waiting.remove(pipe)

    async def run(self) -> None:
        """Read the layout, then keep every primary's pipe running until cancelled."""
        self._running = True
        try:
            for pipe in self._waiting:
                self._start(pipe)
            self._waiting.clear()
            backoff = _BACKOFF_MIN
            while True:
                await self.refresh()
                if self.layout_failure is None and self.refreshes:
                    break
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, _BACKOFF_MAX)
            await asyncio.get_running_loop().create_future()  # until cancelled
        finally:
            self._running = False
            tasks = list(self._tasks.values())
            self._tasks.clear()
            for task in tasks:
                task.cancel()
            with contextlib.suppress(BaseException):
                await asyncio.gather(*tasks, return_exceptions=True)
