"""The app the mixed-runtime replica tests serve, from Trio and asyncio processes alike.

Nothing in it names an event loop (it sleeps on the driver's clock, ``ctx.sleep``), so
the same module runs under ``weir serve`` and ``weir serve --runtime asyncio``.  Every
execution of ``charge`` is appended to the file named by ``WEIR_TEST_LEDGER`` (one line
when it starts, one when it finishes, with the process id), so a test counts
executions across processes that may die without warning.
"""

from __future__ import annotations

import os

from weir.app import App, Context

app = App("mixed-test", "0.0.0")


def _note(line: str) -> None:
    with open(os.environ["WEIR_TEST_LEDGER"], "a", encoding="utf-8") as ledger:
        ledger.write(line + "\n")


@app.tool(idempotent=False, destructive=True)
async def charge(key: str, ctx: Context, seconds: float = 0.0) -> str:
    """Charge ``key`` once; takes ``seconds``."""
    _note(f"start {key} {os.getpid()}")
    if seconds:
        await ctx.sleep(seconds)
    _note(f"done {key} {os.getpid()}")
    return f"charged {key}"


@app.tool(idempotent=False)
async def stamp(key: str) -> str:
    """Note ``key`` in the ledger; never suspends (it may run in the connection's task)."""
    _note(f"stamp {key} {os.getpid()}")
    return f"stamped {key}"


@app.tool()
async def chatter(count: int, ctx: Context) -> str:
    """Send ``count`` log messages on the call's stream, one every 50 ms, then answer."""
    for i in range(count):
        await ctx.info(f"line {i}")
        await ctx.sleep(0.05)
    return f"said {count}"


@app.tool()
async def announce(ctx: Context) -> str:
    """Announce that the tool list changed (every replica's listeners hear it)."""
    ctx.changed("tools")
    return "announced"


@app.tool()
async def confirm(key: str, ctx: Context) -> str:
    """Ask the user to confirm ``key`` (on the sessionless era, an input round: the
    handler runs again with the answer), noting each run and the confirmation."""
    _note(f"ask {key} {os.getpid()}")
    answer = await ctx.elicit(f"Charge {key}?", {"type": "object"}, key="ok")
    _note(f"confirmed {key} {os.getpid()}")
    return f"{key}: {answer.get('action')}"


@app.tool(task="required")
async def charge_task(key: str, ctx: Context, seconds: float = 30.0) -> str:
    """:func:`charge` as a task (the tasks extension), noting when its run ends."""
    _note(f"start {key} {os.getpid()}")
    try:
        await ctx.sleep(seconds)
    finally:
        _note(f"stop {key} {os.getpid()}")
    return f"charged {key}"
