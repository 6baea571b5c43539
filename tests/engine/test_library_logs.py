"""What ``weir serve`` lets through of its libraries' logs.

A store client's reconnection in progress when weir shuts down is cancelled, and
coredis then logs ``Connection attempt failed unexpectedly!`` at ERROR with the
cancellation's traceback -- or does not, depending on whether a reconnection was
under way (the store-outage log test failed on it once in CI).  weir drops a
library's report of a cancellation, keeps its other errors, and keeps everything
under ``--log-level debug``.  Real cancellations of both runtimes are logged
through :func:`weir.common._logs.configure`'s handler into a buffer.
"""

from __future__ import annotations

import asyncio
import io
import json
import logging
from collections.abc import Iterator

import pytest
import trio

from weir.common._logs import DIRECT, configure, is_cancellation

from .logstate import logging_restored

LIBRARY = logging.getLogger("coredis")


@pytest.fixture
def logged() -> Iterator[io.StringIO]:
    """A buffer for :func:`configured`; logging put back after."""
    with logging_restored():
        yield io.StringIO()


def configured(level: str, buffer: io.StringIO) -> None:
    """``weir serve --log-level level --log-format json``, its stderr ``buffer``."""
    configure(level, fmt="json")
    assert DIRECT.handler is not None
    DIRECT.handler.setStream(buffer)


def trio_cancellation() -> BaseException:
    """A real ``trio.Cancelled``, caught as a library would see it."""
    caught: list[BaseException] = []

    async def cancelled() -> None:
        with trio.CancelScope() as scope:
            scope.cancel()
            try:
                await trio.lowlevel.checkpoint()
            except trio.Cancelled as exc:
                caught.append(exc)
                raise

    trio.run(cancelled)
    return caught[0]


def asyncio_cancellation() -> BaseException:
    """A real ``asyncio.CancelledError`` from a cancelled task."""

    async def cancelled() -> BaseException:
        task = asyncio.ensure_future(asyncio.sleep(10))
        await asyncio.sleep(0)
        task.cancel()
        try:
            await task
        except asyncio.CancelledError as exc:
            return exc
        raise AssertionError("the task was not cancelled")

    return asyncio.run(cancelled())


def report(exc: BaseException) -> None:
    """What coredis does: an ERROR with the exception's traceback."""
    LIBRARY.error("Connection attempt failed unexpectedly!", exc_info=(type(exc), exc, None))


def lines(buffer: io.StringIO) -> list[dict[str, object]]:
    return [json.loads(line) for line in buffer.getvalue().splitlines()]


def test_a_librarys_report_of_a_cancellation_is_dropped_and_its_errors_are_kept(
    logged: io.StringIO,
) -> None:
    configured("info", logged)
    report(trio_cancellation())
    report(asyncio_cancellation())
    report(ConnectionRefusedError(111, "Connection refused"))
    logging.getLogger("weir.ops").error("weir's own", exc_info=asyncio_cancellation())
    kept = lines(logged)
    assert [(e["logger"], e["msg"]) for e in kept] == [
        ("coredis", "Connection attempt failed unexpectedly!"),
        ("weir.ops", "weir's own"),
    ], kept
    assert "ConnectionRefusedError" in str(kept[0]["exc"])


def test_debug_keeps_the_reports_of_cancellations(logged: io.StringIO) -> None:
    configured("info", logged)
    configured("debug", logged)  # (after a configure that installed the filter)
    report(trio_cancellation())
    assert [e["msg"] for e in lines(logged)] == ["Connection attempt failed unexpectedly!"]


def test_only_the_runtimes_cancellations_count() -> None:
    assert is_cancellation(trio_cancellation())
    assert is_cancellation(asyncio_cancellation())
    assert not is_cancellation(KeyboardInterrupt())
    assert not is_cancellation(TimeoutError())
    assert not is_cancellation(None)
