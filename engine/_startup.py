"""Start-up failures of ``weir serve``, each told in one line: the cause and the fix.

Theory of operation
-------------------
What stops a server from starting -- a port in use, a ``--host`` that does not
resolve, an app's lifespan that raises, a store that refuses the password or has
no such database -- surfaces from ``trio.run`` as whatever raised it, often inside
an exception group (Trio's nurseries wrap what their tasks raise), with a traceback
that names weir's internals rather than the fix.  The CLI hands that exception to
:func:`explain`, which looks through the groups (and ``__cause__`` /
``__context__`` chains, at most :data:`MAX_LINKS` exceptions) for a cause it knows
and returns one line naming it and what to do; the CLI prints that line and exits
non-zero.  :class:`StartupError` carries a line already written where the cause
was known (the store), :class:`LifespanFailed` marks what the app's lifespan
raised (:func:`guard_lifespan`), so that it is never mistaken for weir's own.
"""

from __future__ import annotations

import contextlib
import errno
import socket
from collections.abc import AsyncIterator
from typing import Any

import trio

from weir.app import App, exception_chain
from weir.common._unix import UnixListenError

#: How many exceptions :func:`explain` looks at before giving up.
MAX_LINKS = 64


#: Seconds an app's lifespan may take to start (``weir serve --startup-timeout``).
STARTUP_TIMEOUT = 60.0


class StartupError(Exception):
    """A start-up failure whose one-line explanation is its message."""


class LifespanFailed(Exception):
    """The app's lifespan raised while the server started (``__cause__``)."""


def guard_lifespan(app: App, timeout: float = STARTUP_TIMEOUT) -> None:
    """Mark what ``app``'s lifespan raises on entry as :class:`LifespanFailed`
    (what it raises later, on exit, is left alone), and give its entry ``timeout``
    seconds: a lifespan still starting then is cancelled and the start fails with
    one line (:class:`StartupError`) instead of waiting silently forever."""
    inner = app.lifespan_fn
    if inner is None:
        return

    @contextlib.asynccontextmanager
    async def guarded(served: App) -> AsyncIterator[Any]:
        async with contextlib.AsyncExitStack() as stack:
            state: Any = None
            with trio.move_on_after(timeout) as waited:
                try:
                    state = await stack.enter_async_context(inner(served))
                except Exception as exc:
                    raise LifespanFailed(describe(exc)) from exc
            if waited.cancelled_caught:
                raise StartupError(
                    f"weir: the app's lifespan did not finish starting within {timeout:g} s;"
                    " find what it waits for, or give it longer with --startup-timeout"
                )
            yield state

    app.lifespan(guarded)


def describe(exc: BaseException) -> str:
    """``Type: message`` of ``exc`` (of its first leaf, for a group), on one line."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def explain(exc: BaseException, host: str, port: int) -> str | None:
    """One line (``weir: ...``) saying why the server did not start and what to do,
    or None if nothing in ``exc`` is a cause this knows."""
    found = list(exception_chain(exc, MAX_LINKS))
    for e in found:
        if isinstance(e, StartupError):
            return str(e)
    for e in found:
        if isinstance(e, LifespanFailed):
            return f"weir: the app's lifespan failed at start-up: {e}"
    for e in found:
        if isinstance(e, OSError):
            return _listen_failure(e, host, port)
        if isinstance(e, UnicodeError) and "idna" in str(e):  # not even a host name
            return f"weir: cannot listen on {host}: --host is not a valid host name ({e})"
    return None


def _listen_failure(exc: OSError, host: str, port: int) -> str:
    if isinstance(exc, UnixListenError):
        return f"weir: cannot listen on unix:{exc.filename}: {exc.strerror}"
    where = f"weir: cannot listen on {host}:{port}"
    if isinstance(exc, socket.gaierror):
        return (
            f"weir: cannot listen on {host}: --host does not resolve "
            f"({exc.strerror or exc}); pass an IP address (127.0.0.1, 0.0.0.0) or a known name"
        )
    if exc.errno == errno.EADDRINUSE:
        return (
            f"{where}: the port is in use; pass another --port (0 picks a free one) "
            "or stop the process that holds it"
        )
    if exc.errno == errno.EADDRNOTAVAIL:
        return f"{where}: no interface of this machine has that address; check --host"
    if exc.errno == errno.EACCES:
        return f"{where}: permission denied (ports below 1024 need privileges); pass --port 1024+"
    return f"{where}: {exc.strerror or exc}"


def store_failure(exc: BaseException, where: str) -> StartupError:
    """The one-line :class:`StartupError` for a store at ``where`` (a URL without its
    credentials) that could not be opened with ``exc``."""
    for e in exception_chain(exc, MAX_LINKS):
        kind = type(e).__name__
        if kind == "AuthenticationFailureError":
            return StartupError(
                f"weir: the store {where} refused the password: authentication failed; "
                "put the right one in the --store URL (redis://[USER]:PASSWORD@host:port/db)"
            )
        if kind == "AuthenticationRequiredError":
            return StartupError(
                f"weir: the store {where} requires a password: authentication failed; "
                "put it in the --store URL (redis://[USER]:PASSWORD@host:port/db)"
            )
        if kind == "AuthorizationError":
            return StartupError(
                f"weir: the store {where} refused a command to this user ({e}); "
                "grant it the commands weir uses, or use another user"
            )
        if "DB index is out of range" in str(e):
            return StartupError(
                f"weir: the store {where} has no such database (DB index is out of range); "
                "use an index it has in the --store URL (0 to 15 by default)"
            )
    said = " ".join(str(exc).split()) or describe(exc)
    return StartupError(
        f"weir: cannot reach the store {where}: {said}; check that it runs and the --store URL"
    )


__all__ = [
    "LifespanFailed",
    "StartupError",
    "describe",
    "explain",
    "guard_lifespan",
    "store_failure",
]
