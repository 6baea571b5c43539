"""The asyncio runtime's read deadline: one timer per connection, moved lazily.

A wait past its deadline is cancelled and told apart from anyone else's
cancellation; a deadline moved on by a later wait does not end that wait at the
earlier instant; a timer that fires between waits lapses.  Real event loop, no
sleeps: each wait is a future some other callback settles (or nobody does).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from weir.asyncio._read_deadline import ReadDeadline

#: Bound (seconds) on each test's whole run.
BOUND = 5.0


def run(body: Callable[[asyncio.AbstractEventLoop, ReadDeadline], Awaitable[str]]) -> str:
    """``body``'s answer, run in a task of a fresh loop with a deadline for that task."""

    async def main() -> str:
        loop = asyncio.get_running_loop()
        task = asyncio.current_task()
        assert task is not None
        deadline = ReadDeadline(loop, task)
        try:
            return await body(loop, deadline)
        finally:
            deadline.close()

    async def bounded() -> str:
        return await asyncio.wait_for(main(), BOUND)

    return asyncio.run(bounded())


async def wait(deadline: ReadDeadline, until: float, bytes_: asyncio.Future[bytes]) -> str:
    """One read wait as the connection does it: what it ended with."""
    deadline.wait_until(until)
    try:
        return (await bytes_).decode()
    except asyncio.CancelledError:
        if not deadline.timed_out():
            raise
        return "timed out"
    finally:
        deadline.done()


def arriving(
    loop: asyncio.AbstractEventLoop, data: bytes | None, at: float | None = None
) -> asyncio.Future[bytes]:
    """Bytes a wait will get: ``data`` at loop time ``at`` (None: already there), or
    never (``data`` None)."""
    future: asyncio.Future[bytes] = loop.create_future()
    if data is not None and at is None:
        future.set_result(data)
    elif data is not None and at is not None:
        loop.call_at(at, future.set_result, data)
    return future


def test_a_wait_past_its_deadline_times_out() -> None:
    async def body(loop: asyncio.AbstractEventLoop, deadline: ReadDeadline) -> str:
        return await wait(deadline, loop.time() + 0.01, arriving(loop, None))

    assert run(body) == "timed out"


def test_a_deadline_moved_on_does_not_end_the_later_wait_early() -> None:
    async def body(loop: asyncio.AbstractEventLoop, deadline: ReadDeadline) -> str:
        assert await wait(deadline, loop.time() + 0.01, arriving(loop, b"first")) == "first"
        # The timer stays set for the first deadline; this wait's is far later,
        # and its bytes come after the first deadline has passed.
        later = arriving(loop, b"second", loop.time() + 0.05)
        return await wait(deadline, loop.time() + 60, later)

    assert run(body) == "second"


def test_an_earlier_deadline_arms_the_timer_again() -> None:
    async def body(loop: asyncio.AbstractEventLoop, deadline: ReadDeadline) -> str:
        assert await wait(deadline, loop.time() + 60, arriving(loop, b"first")) == "first"
        return await wait(deadline, loop.time() + 0.01, arriving(loop, None))

    assert run(body) == "timed out"


def test_a_timer_that_fires_between_waits_lapses() -> None:
    async def body(loop: asyncio.AbstractEventLoop, deadline: ReadDeadline) -> str:
        assert await wait(deadline, loop.time() + 0.01, arriving(loop, b"first")) == "first"
        await arriving(loop, b"", loop.time() + 0.05)  # the timer fires: no wait is on
        return await wait(deadline, loop.time() + 60, arriving(loop, b"second"))

    assert run(body) == "second"


def test_a_cancellation_not_the_timers_goes_through() -> None:
    async def body(loop: asyncio.AbstractEventLoop, deadline: ReadDeadline) -> str:
        task = asyncio.current_task()
        assert task is not None
        loop.call_soon(task.cancel)  # (a shutdown, say)
        try:
            return await wait(deadline, loop.time() + 60, arriving(loop, None))
        except asyncio.CancelledError:
            task.uncancel()
            return "cancelled"

    assert run(body) == "cancelled"


def test_a_cancellation_on_top_of_the_timers_goes_through() -> None:
    async def body(loop: asyncio.AbstractEventLoop, deadline: ReadDeadline) -> str:
        task = asyncio.current_task()
        assert task is not None
        # The timer cancels the task; someone else asks for a cancellation before
        # the task runs again: the wait must not swallow that one as a timeout.
        loop.call_at(loop.time() + 0.01, lambda: loop.call_soon(task.cancel))
        try:
            return await wait(deadline, loop.time() + 0.01, arriving(loop, None))
        except asyncio.CancelledError:
            return "cancelled"

    assert run(body) == "cancelled"
