"""The application weir serves under the benchmark: the demo's ``echo`` plus a tally.

``echo`` is the demo app's tool, byte for byte the same work.  ``mark`` is the
non-idempotent call the half-open peers make: it counts executions per ``key`` (the
client makes every key unique), so a duplicated delivery shows up as a key executed
twice, exactly, whatever the gateway did.  ``pad`` is echoed back, which makes the
response frames as large as the benchmark wants (to spend byte credit).
``mark_stats`` reports the tally.  The tally only grows with the half-open peers'
calls (a few per second), so it does not disturb the RSS measurement.
"""

from __future__ import annotations

from weir.engine import App

app = App("weir-bench", "0.1.0", instructions="weir's fan-out benchmark app.")

_marks: dict[str, int] = {}


@app.tool(read_only=True, idempotent=True, open_world=False)
async def echo(text: str) -> str:
    """Return the text unchanged."""
    return text


@app.tool(read_only=False, destructive=False, idempotent=False, open_world=False)
async def mark(key: str, pad: str = "") -> str:
    """Count one execution of ``key`` (not idempotent); returns the count and ``pad``."""
    _marks[key] = _marks.get(key, 0) + 1
    return f"{_marks[key]} {pad}"


@app.tool(read_only=True, idempotent=True, open_world=False)
async def mark_stats() -> dict[str, int]:
    """How many ``mark`` executions, distinct keys and duplicated executions so far."""
    executions = sum(_marks.values())
    return {
        "executions": executions,
        "keys": len(_marks),
        "duplicates": executions - len(_marks),
    }
