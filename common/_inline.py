"""A tool that never suspends, run where the request is read: what both runtimes do the same.

Theory of operation
-------------------
A lone ``tools/call`` of a tool whose ``async def`` has no suspension point
(:func:`weir.app.never_suspends`), when what the call records cannot wait either, runs
in the task that read the request instead of a handler task of its own
(:func:`runs_inline`, the rule both runtimes apply).  What happens then is the same on
both and written once here: the tool is stepped once (:func:`weir.app.call_tool_now`),
counted in ``weir_inline_calls_total`` and observed in the duration histograms exactly
as :meth:`Metrics.timed` observes a handler task (``ok``, ``tool_error``, ``error``,
``input_required``).
"""

from __future__ import annotations

from time import perf_counter
from typing import Any

from weir.app import (
    App,
    Context,
    InputRequired,
    McpError,
    call_tool_now,
    failure,
    inline_tool,
)
from weir.protocol.jsonrpc import Request
from weir.protocol.sessionless_run import InputAsked

from ._era import handler_error
from ._metrics import Metrics


def runs_inline(app: App, records_on_shared_store: bool, req: Request) -> bool:
    """May ``req``'s handler run in the task that read it, with no handler task?

    Yes for a ``tools/call`` of a tool that never suspends (such a tool is never a task)
    unless its run records something on a shared store (``records_on_shared_store``: a
    keyed sessionless call there, or one that may become a task), so that nothing the
    run does waits either.  Nothing can cancel such a handler half-way or let it
    outlive its response, so running it there changes nothing a client can see but the
    latency.  A keyed run whose record waits on the network must not run in the
    connection's task: a client going away would cancel the record with it.  (The
    session era records every call in its gate, so on a shared store its runtimes
    never ask: only with a process-local one, passing False.)  The one rule both
    runtimes apply, on both eras.
    """
    return not records_on_shared_store and inline_tool(app, req) is not None


def call_inline(app: App, metrics: Metrics, req: Request, ctx: Context) -> dict[str, Any]:
    """Run ``req``'s never-suspending tool now: its result.

    Raises:
        McpError: the tool's own JSON-RPC error.
        InputRequired: the tool asked the client for input (sessionless era).
    """
    params = req.params or {}
    metrics.inline_calls[str(params.get("name"))] += 1
    start, outcome = perf_counter(), "error"
    try:
        result = call_tool_now(app, params, ctx)
        outcome = "tool_error" if result.get("isError") is True else "ok"
        return result
    except InputRequired:
        outcome = "input_required"
        raise
    finally:
        metrics.observe(req.method, req.params, outcome, perf_counter() - start)


def sessionless_inline(app: App, metrics: Metrics, req: Request, ctx: Context) -> object:
    """What a sessionless run's handler step answers for a never-suspending tool: its
    result, :class:`~weir.protocol.sessionless_run.InputAsked`, or an error body --
    the answers a handler task gives for the same tool."""
    try:
        return call_inline(app, metrics, req, ctx)
    except InputRequired as asked:
        return InputAsked(asked.requests, ctx.answered)
    except McpError as exc:
        return handler_error(req, exc)
    except Exception as exc:
        return failure(req, exc)
