"""Server CPU per tools/call with and without the access log, side by side.

``python -m benchmarks.access_log [--calls N] [--rounds R] [--runtime trio|asyncio]``

Starts ``weir serve demo`` twice per round (``--access-log`` and ``--no-access-log``,
alternating, stderr to a file), makes N ``echo`` calls over one keep-alive
connection, and reads the server's CPU time (user + system, from ``/proc``) before
and after: CPU per call, not wall time, so a loaded machine skews it less.  Prints
microseconds per call of each and their ratio (median over rounds).
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

_TICK = os.sysconf("SC_CLK_TCK")


def _cpu(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICK


def _post(conn: http.client.HTTPConnection, body: dict[str, object], sid: str | None) -> str:
    headers = {"content-type": "application/json", "accept": "application/json, text/event-stream"}
    if sid:
        headers["mcp-session-id"] = sid
    conn.request("POST", "/mcp", json.dumps(body), headers)
    resp = conn.getresponse()
    resp.read()
    return resp.getheader("mcp-session-id") or ""


def one(access: bool, calls: int, runtime: str) -> float:
    """Server CPU microseconds per call."""
    flag = "--access-log" if access else "--no-access-log"
    with tempfile.TemporaryFile() as err:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "weir",
                "serve",
                "demo",
                "--port",
                "0",
                "--json-response",
                "--runtime",
                runtime,
                flag,
            ],
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
        )
        try:
            assert proc.stdout is not None
            url = proc.stdout.readline().split()[-1]
            port = int(url.rsplit(":", 1)[1].split("/")[0])
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
            params = {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {}}
            init = {"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": params}
            sid = _post(conn, init, None)
            _post(conn, {"jsonrpc": "2.0", "method": "notifications/initialized"}, sid)
            echo = {"name": "echo", "arguments": {"text": "hi"}}
            for i in range(200):  # warm-up
                _post(
                    conn, {"jsonrpc": "2.0", "id": i, "method": "tools/call", "params": echo}, sid
                )
            before = _cpu(proc.pid)
            for i in range(calls):
                _post(
                    conn, {"jsonrpc": "2.0", "id": i, "method": "tools/call", "params": echo}, sid
                )
            return (_cpu(proc.pid) - before) / calls * 1e6
        finally:
            proc.terminate()
            proc.wait(10)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--calls", type=int, default=5000)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--runtime", default="trio", choices=["trio", "asyncio"])
    a = p.parse_args()
    on, off = [], []
    for _ in range(a.rounds):
        off.append(one(False, a.calls, a.runtime))
        on.append(one(True, a.calls, a.runtime))
        time.sleep(0.1)
    mon, moff = statistics.median(on), statistics.median(off)
    print(f"{a.runtime}: access log on {mon:.1f} us/call, off {moff:.1f} us/call")
    print(f"  ratio on/off {mon / moff:.3f}")
    print(f"  rounds on={[round(x, 1) for x in on]} off={[round(x, 1) for x in off]}")


if __name__ == "__main__":
    main()
