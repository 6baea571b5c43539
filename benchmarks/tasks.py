"""Tasks at scale: what creating and polling tasks costs weir, per task.

``python -m benchmarks.tasks [--clients 400] [--work 2.0] [--poll 0.25] [--store URL]``

A ``weir serve benchmarks.tasks:app`` process on 127.0.0.1 (the embedded store, or
``--store`` shared), and in this process ``--clients`` concurrent clients, each on
one keep-alive connection of its own (trio + h11): it declares the tasks extension,
calls ``work`` (a task that sleeps ``--work`` seconds, then answers 64 bytes), then
polls ``tasks/get`` every ``--poll`` seconds until the task has completed.  All at
once, so the server holds ``--clients`` live tasks together.

Reported, from one run: tasks completed, wall time, the latency of the creating call
and of a poll (p50/p99, from writing the request to the end of its response), polls
per task, the server's CPU seconds per task (``/proc/<pid>/stat``, the whole phase:
creations, runs, lease renewals and polls), its RSS before and at the end, and with
``--store``, the store's commands per task (``INFO commandstats``, every command but
``INFO`` itself, those a script runs included) and the round trips among them (the
task operations' ``EVALSHA`` and ``HMGET``, and the change bus's ``XADD``), over the
phase.  Every loop here is bounded.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import h11
import trio

from weir.app import App, Context

app = App("tasks-bench", "0.0.0")


@app.tool(task="required")
async def work(ctx: Context, seconds: float = 2.0) -> str:
    """Sleeps ``seconds`` (at most a minute), then answers 64 bytes."""
    await ctx.sleep(min(max(seconds, 0.0), 60.0))
    return "x" * 64


V = "2026-07-28"
META = {
    "io.modelcontextprotocol/protocolVersion": V,
    "io.modelcontextprotocol/clientCapabilities": {
        "extensions": {"io.modelcontextprotocol/tasks": {}}
    },
}
ROOT = Path(__file__).resolve().parents[1]


class Conn:
    """One keep-alive HTTP/1.1 connection (h11), one request at a time."""

    def __init__(self, stream: trio.SocketStream, port: int) -> None:
        self.stream, self.port = stream, port
        self.h11 = h11.Connection(h11.CLIENT)

    async def post(self, rid: int, method: str, params: dict[str, Any], name: str) -> Any:
        body = json.dumps(
            {"jsonrpc": "2.0", "id": rid, "method": method, "params": {**params, "_meta": META}}
        ).encode()
        headers = [
            ("host", f"127.0.0.1:{self.port}"),
            ("content-type", "application/json"),
            ("accept", "application/json, text/event-stream"),
            ("content-length", str(len(body))),
            ("mcp-protocol-version", V),
            ("mcp-method", method),
            ("mcp-name", name),
        ]
        out = self.h11.send(h11.Request(method="POST", target="/mcp", headers=headers))
        out += self.h11.send(h11.Data(data=body)) + self.h11.send(h11.EndOfMessage())
        await self.stream.send_all(out)
        chunks: list[bytes] = []
        for _ in range(100_000):
            event = self.h11.next_event()
            if event is h11.NEED_DATA:
                self.h11.receive_data(await self.stream.receive_some(65536))
            elif isinstance(event, h11.Data):
                chunks.append(bytes(event.data))
            elif isinstance(event, h11.EndOfMessage):
                self.h11.start_next_cycle()
                raw = b"".join(chunks)
                if raw.startswith(b"{"):
                    return json.loads(raw)
                datas = [ln[5:] for ln in raw.split(b"\n") if ln.startswith(b"data:")]
                return json.loads(datas[-1])
            elif isinstance(event, h11.ConnectionClosed):
                raise ConnectionError("closed")
        raise RuntimeError("a response never ended")


async def one_client(port: int, args: argparse.Namespace, out: dict[str, list[float]]) -> None:
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    conn = Conn(stream, port)
    try:
        t0 = time.perf_counter()
        created = await conn.post(
            1, "tools/call", {"name": "work", "arguments": {"seconds": args.work}}, "work"
        )
        out["create"].append(time.perf_counter() - t0)
        task_id = created["result"]["taskId"]
        for rid in range(2, 2 + 10_000):
            await trio.sleep(args.poll)
            t0 = time.perf_counter()
            got = await conn.post(rid, "tasks/get", {"taskId": task_id}, task_id)
            out["get"].append(time.perf_counter() - t0)
            status = got["result"]["status"]
            if status == "completed":
                out["done"].append(1.0)
                out["polls"].append(rid - 1)
                return
            if status != "working":
                out["other"].append(1.0)
                return
    finally:
        await stream.aclose()


def _cpu_seconds(pid: int) -> float:
    """CPU seconds ``pid``'s live threads have run: to the nanosecond where the kernel
    keeps scheduler statistics (a short run may use less than one 10 ms clock tick, which
    ``/proc/<pid>/stat`` would report as none), else in clock ticks."""
    try:
        threads = Path(f"/proc/{pid}/task").iterdir()
        return sum(int((t / "schedstat").read_text().split()[0]) for t in threads) / 1e9
    except (OSError, ValueError, IndexError):
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def _store_commands(url: str) -> tuple[int, int]:
    """Commands the store has run so far (``INFO commandstats``, ``info`` left out),
    those inside scripts included; and of them the round trips weir's task operations
    make (``evalsha``, ``eval``, ``hmget``; ``xadd``, the change bus)."""
    host, port = re.match(r"redis://([^:/]+):(\d+)", url).groups()  # type: ignore[union-attr]
    with socket.create_connection((host, int(port)), timeout=5) as s:
        s.sendall(b"*2\r\n$4\r\nINFO\r\n$12\r\ncommandstats\r\n")
        data = b""
        for _ in range(1000):
            data += s.recv(65536)
            head, _, rest = data.partition(b"\r\n")
            if head.startswith(b"$") and len(rest) >= int(head[1:]):
                break
    text = data.decode(errors="replace")
    total = trips = 0
    for name, calls in re.findall(r"cmdstat_([a-z|]+):calls=(\d+)", text):
        if name != "info":
            total += int(calls)
        if name in ("evalsha", "eval", "hmget", "xadd"):
            trips += int(calls)
    return total, trips


def _start_server(store: str | None) -> tuple[subprocess.Popen[bytes], int]:
    cmd = [sys.executable, "-m", "weir", "serve", "benchmarks.tasks:app", "--port", "0"]
    cmd += ["--no-access-log", "--max-tasks-per-principal", "5000"]
    if store:
        cmd += ["--store", store]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    assert proc.stdout is not None
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        line = proc.stdout.readline().decode()
        found = re.search(r"weir: serving http://127\.0\.0\.1:(\d+)/", line)
        if found:
            return proc, int(found.group(1))
        if not line and proc.poll() is not None:
            break
    proc.kill()
    raise SystemExit("tasks: the server did not start")


def _quantile(xs: list[float], q: float) -> float:
    return sorted(xs)[min(len(xs) - 1, int(q * len(xs)))] * 1000 if xs else 0.0


async def run(args: argparse.Namespace) -> dict[str, Any]:
    proc, port = _start_server(args.store)
    try:
        await trio.sleep(0.5)
        rss_before = _rss_mib(proc.pid)
        cpu0 = _cpu_seconds(proc.pid)
        cmds0 = _store_commands(args.store) if args.store else (0, 0)
        out: dict[str, list[float]] = {k: [] for k in ("create", "get", "done", "polls", "other")}
        t0 = time.perf_counter()
        with trio.fail_after(args.work + 120):
            async with trio.open_nursery() as nursery:
                for _ in range(args.clients):
                    nursery.start_soon(one_client, port, args, out)
        wall = time.perf_counter() - t0
        cpu = _cpu_seconds(proc.pid) - cpu0
        done = len(out["done"])
        row: dict[str, Any] = {
            "clients": args.clients,
            "store": "redis" if args.store else "memory",
            "work_s": args.work,
            "poll_s": args.poll,
            "tasks_completed": done,
            "tasks_other": len(out["other"]),
            "wall_s": round(wall, 2),
            "create_ms": {
                "p50": round(_quantile(out["create"], 0.5), 2),
                "p99": round(_quantile(out["create"], 0.99), 2),
            },
            "get_ms": {
                "p50": round(_quantile(out["get"], 0.5), 2),
                "p99": round(_quantile(out["get"], 0.99), 2),
            },
            "polls_per_task": round(statistics.fmean(out["polls"]), 1) if out["polls"] else 0,
            "server_cpu_ms_per_task": round(cpu / max(done, 1) * 1000, 3),
            "rss_mib": {"before": round(rss_before, 1), "end": round(_rss_mib(proc.pid), 1)},
        }
        if args.store:
            total, trips = _store_commands(args.store)
            row["store_commands_per_task"] = round((total - cmds0[0]) / max(done, 1), 1)
            row["store_round_trips_per_task"] = round((trips - cmds0[1]) / max(done, 1), 1)
        return row
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()


def main() -> None:
    """``python -m benchmarks.tasks``."""
    p = argparse.ArgumentParser(prog="benchmarks.tasks", description=__doc__.split("\n")[0])
    p.add_argument("--clients", type=int, default=400)
    p.add_argument("--work", type=float, default=2.0, help="seconds each task works")
    p.add_argument("--poll", type=float, default=0.25, help="seconds between a client's polls")
    p.add_argument("--store", default=None, help="redis://HOST:PORT (default: the embedded store)")
    p.add_argument("--json", default=None, help="append the row to this file")
    args = p.parse_args()
    if not 1 <= args.clients <= 5000 or not 0 <= args.work <= 60 or not 0.01 <= args.poll <= 10:
        raise SystemExit("tasks: --clients 1..5000, --work 0..60, --poll 0.01..10")
    row = trio.run(run, args)
    line = json.dumps(row)
    print(f"tasks: {line}")
    if args.json:
        with open(args.json, "a", encoding="utf-8") as f:
            f.write(line + "\n")


if __name__ == "__main__":
    main()
