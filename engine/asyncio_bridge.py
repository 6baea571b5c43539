"""Running asyncio-only code from Trio: :func:`on_asyncio`.

Theory of operation
-------------------
A tool written for asyncio that uses an asyncio-only library (aiohttp, asyncpg,
aiosqlite, ...) cannot run in a Trio task: the library looks for a running asyncio
loop, or awaits asyncio futures, and fails (weir's app layer recognises those
failures and names this module as the fix).  ``@on_asyncio`` on such an
``async def`` runs it where it works:

* **One loop, one thread.**  The first bridged call in a process starts one asyncio
  event loop in a daemon thread (``weir-asyncio``); every later call, from any Trio
  run or thread, reuses it.  It lives until the interpreter exits, so objects bound to
  it (a client session, a connection pool) can be made once -- by a bridged call, in
  the app's lifespan say -- and used by every bridged call after.  A process that
  forks starts a fresh loop in the child on its first call.
* **A call.**  The Trio caller schedules the coroutine function on the loop with
  ``call_soon_threadsafe``; it runs there as an asyncio task, in the loop thread's own
  context (context variables do not cross).  When the task ends, the loop thread wakes
  the caller through its :class:`trio.lowlevel.TrioToken`; the caller then returns the
  task's result or raises its exception -- the same object.  A task cancelled on the
  asyncio side (not by its caller) raises :class:`AsyncioBridgeError`, never asyncio's
  ``CancelledError`` (a ``BaseException`` that Trio code would not expect).
* **Cancellation.**  A Trio cancellation of the caller (``notifications/cancelled``,
  a timeout, shutdown) cancels the asyncio task, then waits for it, shielded, at most
  ``cancel_grace`` seconds (:data:`CANCEL_GRACE`), so its ``finally`` blocks have run
  when the caller's cancellation goes on.  A task still running after that is logged
  and left on the loop; its outcome is dropped.
* **A Context.**  A :class:`~weir.app.Context` argument is passed as a copy whose
  backend forwards to the Trio side: the driver's coroutine methods (``send``,
  ``request``, ``sleep``) run as Trio tasks within the caller (cancelled with it, or
  when the asyncio code stops waiting for them), and its other methods run in the Trio
  thread while the loop thread waits.  So ``await ctx.info(...)``,
  ``ctx.report_progress``, ``ctx.sample`` and the rest work in a bridged tool.
* **Already on asyncio.**  Called where an asyncio loop runs and no Trio task does (the
  asyncio runtime, or a bridged function calling another), the wrapper just awaits the
  function: the decorator changes nothing there.
* **Process exit.**  An ``atexit`` hook stops the loop: it cancels the tasks still on
  it, waits for them, for async generators and for the default executor (each at most
  :data:`EXIT_GRACE` seconds), fails the calls still waiting, and closes the loop.  A
  call made after that raises :class:`AsyncioBridgeError`.

``functools.wraps`` keeps the original signature and annotations visible
(``inspect.signature`` and ``typing.get_type_hints`` follow ``__wrapped__``), so
``@app.tool()`` above ``@on_asyncio`` derives the same input schema and finds the same
``Context`` parameter; the wrapper awaits, so the tool never runs inline.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import contextlib
import functools
import inspect
import logging
import os
import threading
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, Generic, ParamSpec, TypeVar, cast, overload

import trio

from weir.app import Context, ContextBackend

__all__ = ["CANCEL_GRACE", "EXIT_GRACE", "AsyncioBridgeError", "on_asyncio"]

P = ParamSpec("P")
T = TypeVar("T")

log = logging.getLogger(__name__)

#: How long a cancelled caller waits, by default, for its asyncio task to finish.
CANCEL_GRACE = 2.0
#: How long each step of the loop's shutdown at process exit may take.
EXIT_GRACE = 2.0
#: The loop thread's name.
THREAD_NAME = "weir-asyncio"


class AsyncioBridgeError(RuntimeError):
    """A bridged call could not finish on the shared asyncio loop: the loop has shut
    down (the interpreter is exiting), or the task was cancelled on the asyncio side."""


# ----------------------------------------------------------------- the loop thread
class _LoopThread:
    """The shared asyncio loop and the daemon thread that runs it."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.pid = os.getpid()
        self.thread = threading.Thread(target=self._main, name=THREAD_NAME, daemon=True)
        #: Calls whose task has started and not finished (the loop thread's alone).
        self.calls: set[_Call[Any]] = set()
        #: The loop is winding down: calls that reach it now fail at once.
        self.stopping = False

    def _main(self) -> None:
        asyncio.set_event_loop(self.loop)
        try:
            self.loop.run_forever()
        finally:
            self._wind_down()

    def _bounded(self, step: Awaitable[Any]) -> None:
        try:
            self.loop.run_until_complete(asyncio.wait_for(step, EXIT_GRACE))
        except Exception:
            log.warning("the shared asyncio loop's shutdown did not finish a step", exc_info=True)

    def _wind_down(self) -> None:
        """In the loop thread, once the loop has stopped: end what is still on it."""
        self.stopping = True
        loop = self.loop
        try:
            tasks = asyncio.all_tasks(loop)
            for task in tasks:
                task.cancel()
            if tasks:
                loop.run_until_complete(asyncio.wait(tasks, timeout=EXIT_GRACE))
            self._bounded(loop.shutdown_asyncgens())
            self._bounded(loop.shutdown_default_executor())
        finally:
            for call in list(self.calls):
                call.lost()
            loop.close()

    def stop(self) -> None:
        """Stop the loop and wait (bounded) for its thread; from any other thread."""
        with contextlib.suppress(RuntimeError):  # already closed
            self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(4 * EXIT_GRACE)


_lock = threading.Lock()
_current: _LoopThread | None = None
_exiting = False
_hooked = False


def _loop_thread() -> _LoopThread:
    """The process's loop thread, started if there is none (or it died, or we forked)."""
    global _current, _hooked
    with _lock:
        if _exiting:
            raise AsyncioBridgeError("the shared asyncio loop has shut down (process exit)")
        runner = _current
        if runner is None or runner.pid != os.getpid() or not runner.thread.is_alive():
            runner = _current = _LoopThread()
            runner.thread.start()
            if not _hooked:
                atexit.register(_at_exit)
                _hooked = True
        return runner


def _at_exit() -> None:
    global _exiting
    with _lock:
        _exiting = True
        runner = _current
    if runner is not None and runner.pid == os.getpid():
        runner.stop()


def _forget_after_fork() -> None:
    # The loop thread does not exist in a forked child; its next call starts another.
    global _current, _lock
    _current, _lock = None, threading.Lock()


os.register_at_fork(after_in_child=_forget_after_fork)


# ----------------------------------------------------------------- one call
class _Call(Generic[T]):
    """One bridged call: its asyncio task, its outcome, and its hops back to Trio.

    Fields are written by one thread each: ``task``, ``cancelled``, the outcome and
    ``finished`` by the loop thread (the outcome before ``done`` is set, through the
    Trio token); ``hops`` and ``hop_scopes`` by the Trio thread.
    """

    def __init__(self, runner: _LoopThread, name: str) -> None:
        self.runner = runner
        self.name = name
        self.token = trio.lowlevel.current_trio_token()
        self.done = trio.Event()
        self.task: asyncio.Task[T] | None = None
        self.cancelled = False
        self.finished = False
        self.result: T | None = None
        self.error: BaseException | None = None
        self.hops: trio.Nursery | None = None
        self.hop_scopes: dict[concurrent.futures.Future[Any], trio.CancelScope] = {}

    # -- Trio thread
    def submit(
        self,
        fn: Callable[..., Coroutine[Any, Any, T]],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> None:
        try:
            self.runner.loop.call_soon_threadsafe(self._start, fn, args, kwargs)
        except RuntimeError as exc:  # the loop is closed
            raise AsyncioBridgeError("the shared asyncio loop has shut down") from exc

    def cancel_soon(self) -> None:
        with contextlib.suppress(RuntimeError):  # a closed loop has failed the call already
            self.runner.loop.call_soon_threadsafe(self._cancel)

    def outcome(self) -> T:
        if self.error is not None:
            raise self.error
        return cast("T", self.result)

    def rebind(self, value: Any) -> Any:
        """``value``, or for a :class:`Context` a copy that speaks to Trio (see above)."""
        if not isinstance(value, Context):
            return value
        return value.with_backend(cast("ContextBackend", _HopBackend(value.backend, self)))

    def _start_hop(
        self, future: concurrent.futures.Future[Any], job: Callable[[], Awaitable[Any]]
    ) -> None:
        # A run_sync_soon callback: it must not raise.
        if not future.set_running_or_notify_cancel():
            return  # the asyncio side stopped waiting before it began
        hops = self.hops
        if hops is None:
            future.set_exception(AsyncioBridgeError(f"{self.name}: the Trio call has ended"))
            return
        scope = self.hop_scopes[future] = trio.CancelScope()
        try:
            hops.start_soon(self._run_hop, future, scope, job)
        except RuntimeError:  # the nursery is closing
            del self.hop_scopes[future]
            future.set_exception(AsyncioBridgeError(f"{self.name}: the Trio call has ended"))

    async def _run_hop(
        self,
        future: concurrent.futures.Future[Any],
        scope: trio.CancelScope,
        job: Callable[[], Awaitable[Any]],
    ) -> None:
        try:
            with scope:
                result = await job()
        except Exception as exc:
            future.set_exception(exc)
            return
        except BaseException:
            future.set_exception(AsyncioBridgeError(f"{self.name}: cancelled on the Trio side"))
            raise
        finally:
            self.hop_scopes.pop(future, None)
        if scope.cancelled_caught:
            future.set_exception(AsyncioBridgeError(f"{self.name}: the asyncio side gave up"))
        else:
            future.set_result(result)

    def _cancel_hop(self, future: concurrent.futures.Future[Any]) -> None:
        scope = self.hop_scopes.get(future)
        if scope is not None:
            scope.cancel()

    # -- loop thread
    def _start(
        self,
        fn: Callable[..., Coroutine[Any, Any, T]],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> None:
        if self.runner.stopping:
            self.lost()
            return
        self.runner.calls.add(self)
        try:
            task = self.task = self.runner.loop.create_task(fn(*args, **kwargs))
        except BaseException as exc:
            self._finish(None, exc)
            return
        task.add_done_callback(self._finished)

    def _cancel(self) -> None:
        self.cancelled = True
        if self.task is not None:
            self.task.cancel()

    def _finished(self, task: asyncio.Task[T]) -> None:
        if task.cancelled():
            self._finish(None, AsyncioBridgeError(f"{self.name} was cancelled on the asyncio loop"))
        elif (exc := task.exception()) is not None:
            self._finish(None, exc)
        else:
            self._finish(task.result(), None)

    def lost(self) -> None:
        """The loop is going away with this call unfinished."""
        self._finish(None, AsyncioBridgeError(f"the shared asyncio loop stopped under {self.name}"))

    def _finish(self, result: T | None, error: BaseException | None) -> None:
        if self.finished:
            return
        self.finished = True
        self.result, self.error = result, error
        self.runner.calls.discard(self)
        with contextlib.suppress(trio.RunFinishedError):  # nobody waits any more
            self.token.run_sync_soon(self.done.set)

    # -- loop thread, from the asyncio code (through _HopBackend)
    async def hop(self, fn: Callable[..., Awaitable[Any]], *args: Any, **kwargs: Any) -> Any:
        """Await ``fn(*args, **kwargs)`` as a Trio task within the caller."""
        future: concurrent.futures.Future[Any] = concurrent.futures.Future()
        job = functools.partial(fn, *args, **kwargs)
        try:
            self.token.run_sync_soon(self._start_hop, future, job)
        except trio.RunFinishedError:
            raise AsyncioBridgeError(f"{self.name}: the Trio run has ended") from None
        try:
            return await asyncio.wrap_future(future)
        except asyncio.CancelledError:
            if not future.done():
                with contextlib.suppress(trio.RunFinishedError):
                    self.token.run_sync_soon(self._cancel_hop, future)
            raise

    def run_sync(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Call ``fn(*args, **kwargs)`` in the Trio thread; the loop thread waits."""
        return trio.from_thread.run_sync(
            functools.partial(fn, *args, **kwargs), trio_token=self.token
        )


class _HopBackend:
    """A Trio-side context backend as seen from the loop thread: coroutine methods hop
    to a Trio task (:meth:`_Call.hop`), other methods run in the Trio thread
    (:meth:`_Call.run_sync`), plain attributes are read as they are."""

    __slots__ = ("_call", "_inner")

    def __init__(self, inner: ContextBackend, call: _Call[Any]) -> None:
        self._inner = inner
        self._call = call

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._inner, name)
        if not callable(value):
            return value
        if inspect.iscoroutinefunction(value):
            return functools.partial(self._call.hop, value)
        return functools.partial(self._call.run_sync, value)


async def _bridge(
    fn: Callable[..., Coroutine[Any, Any, T]],
    grace: float,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
) -> T:
    """Run ``fn(*args, **kwargs)`` on the shared loop from a Trio task (see above)."""
    call: _Call[T] = _Call(_loop_thread(), getattr(fn, "__qualname__", repr(fn)))
    args = tuple(call.rebind(a) for a in args)
    kwargs = {k: call.rebind(v) for k, v in kwargs.items()}
    interrupted: BaseException | None = None
    async with trio.open_nursery() as hops:
        call.hops = hops
        submitted = False
        try:
            call.submit(fn, args, kwargs)
            submitted = True
            await call.done.wait()
        except BaseException as exc:  # cancelled (or interrupted): take the task with us
            interrupted = exc
            if submitted:
                call.cancel_soon()
                with trio.move_on_after(grace, shield=True):
                    await call.done.wait()
                if not call.done.is_set():
                    log.warning(
                        "%s: its asyncio task did not finish within %s s of being "
                        "cancelled; it is left running on the shared loop",
                        call.name,
                        grace,
                    )
        finally:
            call.hops = None
            hops.cancel_scope.cancel()
    if interrupted is not None:
        raise interrupted  # re-raised outside the nursery: not wrapped in a group
    return call.outcome()


def _asyncio_running() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


# ----------------------------------------------------------------- the decorator
@overload
def on_asyncio(
    fn: Callable[P, Coroutine[Any, Any, T]], /
) -> Callable[P, Coroutine[Any, Any, T]]: ...


@overload
def on_asyncio(
    *, cancel_grace: float = CANCEL_GRACE
) -> Callable[[Callable[P, Coroutine[Any, Any, T]]], Callable[P, Coroutine[Any, Any, T]]]: ...


def on_asyncio(
    fn: Callable[P, Coroutine[Any, Any, T]] | None = None,
    /,
    *,
    cancel_grace: float = CANCEL_GRACE,
) -> (
    Callable[P, Coroutine[Any, Any, T]]
    | Callable[[Callable[P, Coroutine[Any, Any, T]]], Callable[P, Coroutine[Any, Any, T]]]
):
    """Run an ``async def`` on weir's shared asyncio loop when it is called from Trio.

    Usable as ``@on_asyncio`` or ``@on_asyncio(cancel_grace=...)``, below
    ``@app.tool()`` (or ``@app.resource(...)``, ``@app.prompt()``); or as
    ``await on_asyncio(fn)(*args)`` anywhere in Trio code.  Called where asyncio runs
    already (and Trio does not), it awaits ``fn`` directly.

    Args:
        fn: the coroutine function.
        cancel_grace: how long a cancelled caller waits for the asyncio task to finish.

    Raises:
        TypeError: ``fn`` is not an ``async def``.
    """

    def decorate(fn: Callable[P, Coroutine[Any, Any, T]]) -> Callable[P, Coroutine[Any, Any, T]]:
        if not inspect.iscoroutinefunction(fn):
            raise TypeError(f"on_asyncio needs an async def, not {fn!r}")

        @functools.wraps(fn)
        async def bridged(*args: P.args, **kwargs: P.kwargs) -> T:
            if trio.lowlevel.in_trio_task():
                return await _bridge(fn, cancel_grace, args, kwargs)
            if _asyncio_running():
                return await fn(*args, **kwargs)
            raise RuntimeError(f"{fn.__qualname__}: called outside both Trio and asyncio")

        return bridged

    return decorate if fn is None else decorate(fn)
