"""The asyncio runtime's graceful drain at shutdown, as the Trio engine's.

Theory of operation
-------------------
:func:`drain` runs once the listener is closed (no new connection is accepted) and
before :meth:`AsyncioDriver.close_all` cancels what is left:

1. **No new work.**  ``driver.closing`` is set: every request from now on, on any
   connection still open, is answered 503 ``shutting_down`` with ``Retry-After``
   (:func:`refuse_if_closing`), before its token is checked or anything runs.
2. **Running calls finish.**  For at most ``grace`` seconds it waits while any
   session or sessionless credit owner has an admitted request not yet answered
   (its flow's ``inflight``) or a keyed sessionless call still runs (a shared
   store's relays and lease renewals run as long as the driver: not work); a call's
   response is in its stream's log (or its JSON body sent) when it counts as
   answered, so its writer delivers it.
3. **Streams end with ``retry:``.**  Every ``subscriptions/listen`` stream gets
   its final result (bounded), and every SSE stream a connection is writing is
   asked to end with a ``retry:`` field (``retry_ms``), so its client reconnects
   and resumes from its ``Last-Event-ID`` -- it waits up to
   :data:`RETRY_WAIT` seconds for those writers to send it and let go.

What is left -- calls past the grace, idle keep-alive connections -- is cancelled
by ``close_all``.  The waits poll (every :data:`POLL` seconds): they are bounded,
happen once per process, and need no hook in the hot path.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING, Final

from weir.common._logs import DrainReport
from weir.protocol import Reason, RemoteProtocolError

if TYPE_CHECKING:
    from ._driver import AsyncioDriver

#: Seconds the writers of SSE streams get to send their ``retry:`` and end.
RETRY_WAIT: Final = 1.0
#: How often the drain looks again (seconds).
POLL: Final = 0.01


def refuse_if_closing(driver: AsyncioDriver) -> None:
    """Refuse a request that arrives while the driver drains.

    Raises:
        RemoteProtocolError: 503 ``shutting_down``, with ``Retry-After``.
    """
    if driver.closing:
        raise RemoteProtocolError(
            "server is shutting down",
            http_status=503,
            reason=Reason.SHUTTING_DOWN,
            retry_after_ms=driver.retry_ms,
        )


def _busy(driver: AsyncioDriver) -> bool:
    """Whether a request admitted before the drain is still unanswered."""
    holders = (*driver.sessions.values(), *driver.owners)
    return bool(driver._runs - driver._loops) or any(
        s.flow.inflight for s in holders if not s.closed
    )


def _running(driver: AsyncioDriver) -> int:
    """Requests admitted before the drain and not yet answered."""
    holders = (*driver.sessions.values(), *driver.owners)
    inflight = sum(s.flow.inflight for s in holders if not s.closed)
    return max(inflight, len(driver._runs - driver._loops))


def _writing(driver: AsyncioDriver) -> bool:
    return any(s.stream_writers for s in driver.sessions.values())


async def _wait_while(condition: Callable[[], bool], seconds: float) -> None:
    """Wait (polling) while ``condition()`` holds, for at most ``seconds``."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds
    while condition() and loop.time() < deadline:
        await asyncio.sleep(min(POLL, max(0.0, deadline - loop.time())))


async def drain(driver: AsyncioDriver, grace: float) -> None:
    """Drain ``driver`` (see the module docstring); its listener is closed already."""
    driver.closing = True
    loop = asyncio.get_running_loop()
    report = DrainReport(_running(driver), grace, loop.time())

    def busy() -> bool:
        report.progress(_running(driver), loop.time())
        return _busy(driver)

    await _wait_while(busy, grace)
    report.done(_running(driver))
    await driver.tasks.shutdown()  # each run records its task failed (interrupted)
    await driver._end_subscriptions()
    for session in list(driver.sessions.values()):
        for epoch in list(session.stream_writers):
            session.request_close(session.streams.by_epoch(epoch), driver.retry_ms)
    await _wait_while(lambda: _writing(driver), RETRY_WAIT)
