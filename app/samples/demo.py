"""The ``demo`` app: small, but it shows what weir's transport is for.

* ``echo`` -- read-only and idempotent; the fan-out benchmark calls it.
* ``increment`` -- **not** idempotent: every execution bumps a counter, so a
  duplicated delivery would be visible (``demo://counter`` shows the value).
* ``countdown`` -- a slow call that reports progress, logs, and stops promptly when
  the client sends ``notifications/cancelled``.
"""

from __future__ import annotations

from weir.app import App, Context

app = App(
    "weir-demo",
    "0.1.0",
    instructions="A demo of weir: echo, a counter, and a cancellable countdown.",
)

_counter = {"value": 0}


@app.tool(read_only=True, idempotent=True, open_world=False)
async def echo(text: str) -> str:
    """Return the text unchanged."""
    return text


@app.tool(read_only=False, destructive=False, idempotent=False, open_world=False)
async def increment(by: int = 1) -> str:
    """Add `by` to the server's counter and return the new value (not idempotent)."""
    _counter["value"] += by
    return str(_counter["value"])


@app.tool(read_only=True, open_world=False)
async def countdown(ctx: Context, seconds: int = 5) -> str:
    """Count down, one progress notification per second; cancellable at any time."""
    if not 0 <= seconds <= 3600:
        raise ValueError("seconds must be between 0 and 3600")
    for done in range(seconds):
        await ctx.report_progress(done, seconds, f"{seconds - done} s left")
        await ctx.info(f"{seconds - done} s left")
        await ctx.sleep(1)
    await ctx.report_progress(seconds, seconds, "lift-off")
    return "lift-off"


@app.resource(
    "demo://counter",
    name="counter",
    mime_type="text/plain",
    description="The current value of the increment counter",
)
def counter() -> str:
    return str(_counter["value"])


@app.prompt(
    description="Ask the model to summarise a text", arguments={"text": "the text to summarise"}
)
def summarize(text: str) -> str:
    return f"Summarise the following text in one paragraph:\n\n{text}"
