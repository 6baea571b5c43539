"""The cluster pipe on Trio: :class:`TrioClusterPipe`.

Theory of operation
-------------------
How commands are routed by slot, how redirections and failovers are followed, and
what is bounded is :class:`~._slots.ClusterPipe`'s (see :mod:`._slots`).  This
subclass only says how that runs on Trio: each primary's :class:`~._resp.RespPipe`
runs in the nursery that :meth:`TrioClusterPipe.run` opens (the store's owner task),
under a cancel scope of its own that is cancelled when the node leaves the layout;
``run`` reads the layout first, retrying with the pipes' back-off (50 ms doubling
to 1 s) until the cluster answers.
"""

from __future__ import annotations

import ssl
from collections.abc import Sequence

import trio

from ._resp import _BACKOFF_MAX, _BACKOFF_MIN, RespPipe
from ._slots import Address, ClusterPipe, Flag, NodePipe

__all__ = ["TrioClusterPipe"]


class TrioClusterPipe(ClusterPipe):
    """A :class:`~._slots.ClusterPipe` of :class:`~._resp.RespPipe` nodes, on Trio.

    Args:
        seeds: the cluster's seed nodes.
        username, password: for every node's ``AUTH`` (None: no ``AUTH``).
        tls: an SSL context for every node (None: plain TCP).
        timeout: each node pipe's connect timeout and reply deadline.
    """

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
            return RespPipe(
                host, port, username=username, password=password, tls=tls, timeout=timeout
            )

        self._nursery: trio.Nursery | None = None
        self._scopes: dict[int, trio.CancelScope] = {}
        self._waiting: list[NodePipe] = []  # asked for before run() began
        super().__init__(seeds, node)

    def _flag(self) -> Flag:
        return trio.Event()

    def _start(self, pipe: NodePipe) -> None:
        scope = self._scopes[id(pipe)] = trio.CancelScope()
        if self._nursery is None:
            self._waiting.append(pipe)
        else:
            self._nursery.start_soon(_run_node, pipe, scope)

    def _stop(self, pipe: NodePipe) -> None:
        scope = self._scopes.pop(id(pipe), None)
        if scope is not None:
            scope.cancel()

    async def run(self) -> None:
        """Read the layout, then keep every primary's pipe running until cancelled."""
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            for pipe in self._waiting:
                nursery.start_soon(_run_node, pipe, self._scopes[id(pipe)])
            self._waiting.clear()
            backoff = _BACKOFF_MIN
            while True:
                await self.refresh()
                if self.layout_failure is None and self.refreshes:
                    break
                await trio.sleep(backoff)
                backoff = min(backoff * 2, _BACKOFF_MAX)
            await trio.sleep_forever()


async def _run_node(pipe: NodePipe, scope: trio.CancelScope) -> None:
    with scope:
        await pipe.run()
