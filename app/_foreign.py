"""Recognising a handler that used an asyncio-only library on another event loop.

Theory of operation
-------------------
A library written for asyncio (aiohttp, asyncpg, aiosqlite, ...) cannot run on
Trio as it is.  It does not fail with an error that says so: it fails wherever it
first touches the loop, with whatever that loop says.  These are the signs, read
from the exception alone, that a handler did this:

* Trio's ``TypeError: trio.run received unrecognized yield message ...``: an asyncio
  future (or a bare ``asyncio.sleep(0)``) was awaited in a Trio task;
* asyncio's ``RuntimeError: no running event loop`` (``asyncio.get_running_loop()``
  and what calls it: ``create_task``, ``sleep`` with a delay, client constructors)
  and ``There is no current event loop`` (``asyncio.get_event_loop()``);
* sniffio's ``AsyncLibraryNotFoundError`` (a library that asks which loop it is on).

The exception a handler raises is often not the sign itself but a later one (a
library's own error ``from`` it, or one raised while handling it, or an exception
group from a nursery), so :func:`asyncio_only_failure` searches the chain --
``__cause__``, ``__context__`` and group members -- visiting at most
:data:`MAX_LINKS` exceptions, each once (a chain can be long, or even a cycle).

This module only reads exceptions: it imports neither asyncio nor trio, and names
the fix in words (:func:`asyncio_only_hint`), for the app layer to log.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator

#: How many exceptions :func:`asyncio_only_failure` looks at before giving up.
MAX_LINKS = 32

#: Messages (their start) that only asyncio code on a non-asyncio loop produces.
_SIGNS: tuple[tuple[type[BaseException], str], ...] = (
    (TypeError, "trio.run received unrecognized yield message"),
    (RuntimeError, "no running event loop"),
    (RuntimeError, "There is no current event loop"),
)


def _is_sign(exc: BaseException) -> bool:
    kind = type(exc)
    if kind.__name__ == "AsyncLibraryNotFoundError" and kind.__module__.startswith("sniffio"):
        return True
    message = str(exc)
    return any(isinstance(exc, t) and message.startswith(s) for t, s in _SIGNS)


def exception_chain(exc: BaseException, limit: int = MAX_LINKS) -> Iterator[BaseException]:
    """``exc``, its group members, causes and contexts, breadth first, each once, at
    most ``limit`` of them (a chain can be long, or even a cycle)."""
    queue: deque[BaseException] = deque([exc])
    seen: set[int] = set()
    while queue and len(seen) < limit:
        current = queue.popleft()
        if id(current) in seen:
            continue
        seen.add(id(current))
        yield current
        if isinstance(current, BaseExceptionGroup):
            queue.extend(current.exceptions)
        for linked in (current.__cause__, current.__context__):
            if linked is not None:
                queue.append(linked)


def asyncio_only_failure(exc: BaseException) -> BaseException | None:
    """The exception in ``exc``'s chain showing that asyncio-only code ran on another
    loop (``exc`` itself, a cause, a context or a group member), or None.

    Visits at most :data:`MAX_LINKS` exceptions, breadth first, each once.
    """
    return next((e for e in exception_chain(exc) if _is_sign(e)), None)


def asyncio_only_hint(what: str) -> str:
    """The log message for ``what`` (``"tool fetch"``, ``"handler for resources/read"``)
    having failed because it used an asyncio-only library, naming the fixes."""
    return (
        f"{what} failed: it used a library written for asyncio (aiohttp, asyncpg, "
        "aiosqlite, ...), which does not run on Trio, the loop this server ran it on. "
        "Decorate the function with @weir.engine.asyncio_bridge.on_asyncio (below the "
        "@app.tool() line) to run it on a shared asyncio loop, or serve the app with "
        "weir serve --runtime asyncio; see docs/asyncio-libraries.md"
    )


def asyncio_only_result(what: str) -> str:
    """What a client is told about ``what`` having failed for that reason: that it
    needs asyncio, and nothing of the server's internals."""
    return f"{what} failed: it needs an asyncio event loop; the server logged the details"
