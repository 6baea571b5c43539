"""The shared session store on asyncio: :class:`AsyncioRedisStore`.

Theory of operation
-------------------
Everything a Redis-protocol store promises -- key layout, Lua scripts, failure
mapping, the pipelined hot path -- is :class:`weir.engine._redis_store.RedisStore`'s,
and is the same bytes on the wire whichever runtime sends them: a Trio replica and
an asyncio replica on one Valkey read each other's sessions, claims, outcomes and
event logs.  Only how the store lives in its event loop differs, and that is all
this subclass replaces:

* **The owner.**  coredis 6 clients must be entered and exited by one task; here
  that task is an ``asyncio`` task (the Trio store uses a Trio system task).  It
  also runs the pipelined connection, :class:`~._resp.AsyncioRespPipe` (the twin of
  the Trio pipe).  If it stops, every later operation raises
  :class:`~weir.engine._store_errors.StoreUnavailable`.
* **The deadline.**  Every operation that does not go through the pipe (whose own
  watchdog is the deadline) runs under ``asyncio.timeout(timeout)``; running out is
  :class:`StoreUnavailable`, as on Trio.

The Trio code is not touched on its hot path: nothing here is imported by it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import Any, ClassVar, TypeVar

from weir.engine._redis_connection import _is_outage
from weir.engine._redis_store import RedisStore
from weir.engine._resp import Pipe
from weir.engine._store_errors import StoreUnavailable

from ._resp import AsyncioRespPipe
from ._resp_cluster import AsyncioClusterPipe

__all__ = ["AsyncioRedisStore"]

T = TypeVar("T")


class AsyncioRedisStore(RedisStore):
    """:class:`~weir.engine._redis_store.RedisStore` for the asyncio runtime.

    Create it with :meth:`connect` (same arguments, same errors) inside a running
    asyncio loop; close it with :meth:`aclose`.
    """

    _pipe_kind: ClassVar[Callable[..., Pipe]] = AsyncioRespPipe
    _cluster_pipe_kind: ClassVar[Callable[..., Pipe]] = AsyncioClusterPipe

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._owner: asyncio.Task[None] | None = None

    async def _start(self) -> None:
        ready = asyncio.Event()
        self._owner = asyncio.get_running_loop().create_task(
            self._own_aio(ready), name=f"AsyncioRedisStore({self._where})"
        )
        try:
            try:
                async with asyncio.timeout(self.timeout):
                    await ready.wait()
            except TimeoutError:
                pass
            if not self._entered:
                raise StoreUnavailable(
                    f"store {self._where}: could not open a client within {self.timeout}s"
                ) from self._failure
            await self._run("connect", self._client.ping)
            if self._pipe is not None:
                try:
                    async with asyncio.timeout(self.timeout):
                        await self._pipe.wait_up()
                except TimeoutError:
                    pass
                if self._pipe.failure is not None or not self._entered:
                    raise StoreUnavailable(
                        f"store {self._where}: no pipelined connection within {self.timeout}s"
                    ) from self._pipe.failure
        except BaseException:
            await self.aclose()
            raise
        self.health.connected()

    async def _own_aio(self, ready: asyncio.Event) -> None:
        """The task that owns the coredis client and the pipe (see the module docstring)."""
        pipe: asyncio.Task[None] | None = None
        try:
            async with self._client:
                if self._pipe is not None:
                    pipe = asyncio.get_running_loop().create_task(self._pipe.run())
                self._entered = True
                ready.set()
                try:
                    await asyncio.get_running_loop().create_future()  # until aclose
                finally:
                    self._entered = False
                    if pipe is not None:
                        pipe.cancel()
                        await asyncio.gather(pipe, return_exceptions=True)
        except asyncio.CancelledError:
            pass  # aclose: the owner ends quietly
        except BaseException as exc:
            self._failure = exc
        finally:
            self._entered = False
            ready.set()

    async def aclose(self) -> None:
        """Close the client (idempotent; waits at most ``timeout`` for it to wind down)."""
        self._closed = True
        owner = self._owner
        if owner is None or owner.done():
            return
        owner.cancel()
        await asyncio.wait({owner}, timeout=self.timeout)

    async def _run(self, what: str, op: Callable[[], Awaitable[T]], *, piped: bool = False) -> T:
        """Run one store operation under the deadline, mapping outages to StoreUnavailable."""
        self._refuse_if_down(what)
        deadline, lost = asyncio.timeout(self.timeout), self.health.lost
        try:
            if piped:  # the pipe's watchdog is the deadline
                out = await op()
            else:
                async with deadline:
                    out = await op()
        except TimeoutError as exc:
            if deadline.expired():
                raise lost(
                    StoreUnavailable(f"{what}: no answer from {self._where} within {self.timeout}s")
                ) from exc
            raise lost(StoreUnavailable(f"{what}: {self._where} unavailable: {exc}")) from exc
        except Exception as exc:
            failure = self._store_failure(what, exc)
            if failure is exc:
                raise
            if _is_outage(exc) and self._layout() is not None:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(self.timeout):
                        await self._refresh_layout()
            raise failure from exc
        if self.health.down:
            self.health.up()
        return out
