"""The app the SIGKILL tests serve from ``weir serve`` processes: one slow, non-idempotent
tool, and the same as a task.

Every execution is appended to the file named by ``WEIR_TEST_LEDGER`` (one line when
it starts, one when it finishes), so a test can count executions across processes
that may die without warning.
"""

from __future__ import annotations

import os

import trio

from weir.engine import App

app = App("lease-test", "0.0.0")


def _note(line: str) -> None:
    with open(os.environ["WEIR_TEST_LEDGER"], "a", encoding="utf-8") as ledger:
        ledger.write(line + "\n")


@app.tool(idempotent=False, destructive=True)
async def charge(key: str, seconds: float = 30.0) -> str:
    """Charge ``key`` once; takes ``seconds``."""
    _note(f"start {key} {os.getpid()}")
    await trio.sleep(seconds)
    _note(f"done {key}")
    return f"charged {key}"


@app.tool(task="required")
async def charge_task(key: str, seconds: float = 30.0) -> str:
    """:func:`charge`, as a task."""
    _note(f"start {key} {os.getpid()}")
    await trio.sleep(seconds)
    _note(f"done {key}")
    return f"charged {key}"
