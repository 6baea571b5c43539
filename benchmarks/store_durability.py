"""What waiting for replicas costs a call's store writes, side by side.

``python -m benchmarks.store_durability --url redis://127.0.0.1:6379 [--url ...]
[--tasks 400] [--per-task 25] [--rounds 3] [--replicas 0,1] [--paths pipe,coredis]``

Each round, for each ``--replicas`` setting in turn, a :class:`RedisStore` with
that setting runs ``--tasks`` Trio tasks, each making ``--per-task`` keyed calls'
store writes one after another -- ``begin_call`` (the claim) then ``finish_call``
(the outcome), the two writes of a call that ``--store-replicas`` makes wait for
``WAIT`` -- in a session of its own.  Reported per setting (medians over the
rounds): calls per second, this process's CPU per call (user + system), and the
latency of a call's two writes (p50/p99).  The server needs replicas for a
setting above 0 to succeed: a primary with ``valkey-server --replicaof`` replicas,
or a cluster (``redis+cluster://``) whose primaries have them.

Several ``--url`` are measured side by side (each round runs every store and
setting in turn).  ``--paths pipe,coredis`` also measures each store with its
pipelined connection switched off after connecting, so every command goes through
coredis (what a cluster store cost before its pipe, and what a ``rediss://`` store
costs now).
"""

from __future__ import annotations

import argparse
import json
import resource
import secrets
import statistics
import time
from typing import Any

import trio

from weir.engine._redis_store import RedisStore
from weir.engine._redis_url import _redact
from weir.engine._store_records import SessionRecord


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def _run(url: str, path: str, replicas: int, tasks: int, per: int) -> dict[str, float]:
    prefix = f"bench-durable-{secrets.token_hex(4)}"
    latencies: list[float] = []
    async with await RedisStore.connect(
        url, prefix=prefix, replicas=replicas, replica_timeout=1.0
    ) as store:
        if path == "coredis":
            store._pipe = None  # (left running idle; every command through coredis)

        async def one(i: int) -> None:
            sid = f"s-{secrets.token_urlsafe(24)}"
            record = SessionRecord(
                session_id=sid,
                principal="bench",
                protocol_version="2025-11-25",
                created_at=0.0,
                secret="x",
                salt="y",
            )
            await store.create_session(record)
            for n in range(per):
                t0 = time.perf_counter()
                await store.begin_call("bench", sid, f"k{n}", b"fp", None, owner="b", lease=30)
                await store.finish_call("bench", sid, f"k{n}", b'{"result":{}}')
                latencies.append(time.perf_counter() - t0)

        cpu0, wall0 = _cpu(), time.perf_counter()
        async with trio.open_nursery() as nursery:
            for i in range(tasks):
                nursery.start_soon(one, i)
        cpu, wall = _cpu() - cpu0, time.perf_counter() - wall0
    calls = tasks * per
    latencies.sort()
    return {
        "calls_per_s": calls / wall,
        "cpu_us_per_call": cpu / calls * 1e6,
        "p50_ms": latencies[len(latencies) // 2] * 1000,
        "p99_ms": latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))] * 1000,
    }


async def _main(args: argparse.Namespace) -> dict[str, Any]:
    settings = [int(x) for x in args.replicas.split(",")]
    paths = args.paths.split(",")
    if not set(paths) <= {"pipe", "coredis"}:
        raise SystemExit("store_durability: --paths takes pipe and/or coredis")
    cases = [(url, path, n) for url in args.url for path in paths for n in settings]
    runs: dict[tuple[str, str, int], list[dict[str, float]]] = {case: [] for case in cases}
    for _ in range(args.rounds):
        for case in cases:
            runs[case].append(await _run(*case, args.tasks, args.per_task))
    out: dict[str, Any] = {"tasks": args.tasks, "per_task": args.per_task, "runs": []}
    for (url, path, n), values in runs.items():
        entry: dict[str, Any] = {"url": _redact(url), "path": path, "replicas": n}
        for key in values[0]:
            entry[key] = round(statistics.median(v[key] for v in values), 3)
        out["runs"].append(entry)
    return out


def main(argv: list[str] | None = None) -> None:
    """``python -m benchmarks.store_durability``."""
    p = argparse.ArgumentParser(
        prog="benchmarks.store_durability", description=__doc__.split("\n")[0]
    )
    p.add_argument("--url", action="append", help="a store (repeat to compare)")
    p.add_argument("--tasks", type=int, default=400)
    p.add_argument("--per-task", type=int, default=25)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--replicas", default="0,1", help="comma-separated settings to compare")
    p.add_argument("--paths", default="pipe", help="pipe and/or coredis, comma-separated")
    args = p.parse_args(argv)
    args.url = args.url or ["redis://127.0.0.1:6379"]
    if args.tasks < 1 or args.per_task < 1 or not 1 <= args.rounds <= 20:
        raise SystemExit("store_durability: --tasks and --per-task >= 1, --rounds in [1, 20]")
    result = trio.run(_main, args)
    for entry in result["runs"]:
        print(
            f"{entry['url']} {entry['path']:7} replicas={entry['replicas']}: "
            f"{entry['calls_per_s']:8.0f} calls/s  "
            f"{entry['cpu_us_per_call']:7.1f} us CPU/call  "
            f"p50 {entry['p50_ms']:.2f} ms  p99 {entry['p99_ms']:.2f} ms"
        )
    print(json.dumps(result, separators=(",", ":")))


if __name__ == "__main__":
    main()
