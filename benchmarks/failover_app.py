"""The application the cluster failover benchmark serves: one non-idempotent tool.

``charge(key)`` appends ``key`` to the ledger file named by ``WEIR_BENCH_LEDGER`` (one
line per execution, ``O_APPEND``, so the lines of several replicas' processes never
interleave) and answers ``charged <key>``.  A key executed twice is a duplicate, read
from the ledger whatever the clients, the gateway or the store believed.
"""

from __future__ import annotations

import os

from weir.engine import App

app = App("weir-failover-bench", "0.1.0")

_LEDGER = os.environ.get("WEIR_BENCH_LEDGER", os.devnull)
_fd = os.open(_LEDGER, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)


@app.tool(read_only=False, destructive=False, idempotent=False, open_world=False)
async def charge(key: str) -> str:
    """Record one execution of ``key`` (not idempotent)."""
    os.write(_fd, key.encode() + b"\n")
    return f"charged {key}"
