"""Redis clients on Trio, side by side: client CPU per command at fan-out concurrency.

Theory of operation
-------------------
``python -m benchmarks.store_clients --url redis://127.0.0.1:6379 [--tasks 400]
[--per-task 50] [--rounds 3]`` runs ``--tasks`` Trio tasks, each sending
``--per-task`` ``EVALSHA`` of a one-line script (``INCR`` of the task's own key)
one after another -- the shape of the store traffic of a fan-out, where every
session's call waits for its own script -- through each client in turn, and
reports this process's CPU time (user + system) per command and commands per
second.  The clients, in rotation each round:

* ``coredis`` -- ``coredis.Redis`` as weir configured it before (no retries,
  every timeout set); ``coredis-pool64`` -- the same with a 64-connection pool;
  ``coredis-no-timeout`` -- without the per-command stream timeout;
* ``resp-pipe`` -- :class:`weir.engine._resp.RespPipe`: hiredis' C parser on one
  Trio socket, commands pipelined, one watchdog for the deadline.

The store's choice (``engine/_redis_url.py``) follows these numbers; see
``benchmarks/RESULTS.md``.  A warm-up of 500 commands precedes each measurement.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import time
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import urlsplit

import coredis
import trio
from coredis.retry import NoRetryPolicy

from weir.engine._resp import RespPipe, script_sha

_LUA = "return redis.call('INCR', KEYS[1])"
Op = Callable[[int], Awaitable[Any]]


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


async def _drive(op: Op, tasks: int, per: int) -> tuple[float, float]:
    async def one(i: int) -> None:
        for _ in range(per):
            await op(i)

    cpu0, wall0 = _cpu(), time.perf_counter()
    async with trio.open_nursery() as nursery:
        for i in range(tasks):
            nursery.start_soon(one, i)
    n = tasks * per
    return (_cpu() - cpu0) / n * 1e6, n / (time.perf_counter() - wall0)


async def _coredis(url: str, tasks: int, per: int, **options: Any) -> tuple[float, float]:
    client = coredis.Redis.from_url(
        url, decode_responses=False, verify_version=False, retry_policy=NoRetryPolicy(), **options
    )
    async with client:
        script = client.register_script(_LUA)

        async def op(i: int) -> Any:
            return await script([f"bench:store-clients:{i}"], [])

        await _drive(op, 50, 10)
        return await _drive(op, tasks, per)


async def _pipe(url: str, tasks: int, per: int) -> tuple[float, float]:
    parts = urlsplit(url)
    pipe = RespPipe(parts.hostname or "127.0.0.1", parts.port or 6379, timeout=5.0)
    sha = script_sha(_LUA)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(pipe.run)
        await pipe.wait_up()

        async def op(i: int) -> Any:
            return await pipe.evalsha(_LUA, sha, [f"bench:store-clients:{i}"], [])

        await _drive(op, 50, 10)
        result = await _drive(op, tasks, per)
        nursery.cancel_scope.cancel()
    return result


async def _main(args: argparse.Namespace) -> dict[str, Any]:
    url, t, per = args.url, args.tasks, args.per_task
    clients: dict[str, Callable[[], Awaitable[tuple[float, float]]]] = {
        "coredis": lambda: _coredis(url, t, per, stream_timeout=2.0, connect_timeout=2.0),
        "coredis-pool64": lambda: _coredis(url, t, per, stream_timeout=2.0, max_connections=64),
        "coredis-no-timeout": lambda: _coredis(url, t, per),
        "resp-pipe": lambda: _pipe(url, t, per),
    }
    runs: dict[str, list[tuple[float, float]]] = {name: [] for name in clients}
    for _ in range(args.rounds):
        for name, run in clients.items():
            runs[name].append(await run())
    out: dict[str, Any] = {"tasks": t, "per_task": per, "rounds": args.rounds, "clients": {}}
    for name, values in runs.items():
        out["clients"][name] = {
            "cpu_us_per_command": statistics.median(v[0] for v in values),
            "commands_per_s": statistics.median(v[1] for v in values),
        }
    base = out["clients"]["coredis"]["cpu_us_per_command"]
    for entry in out["clients"].values():
        entry["vs_coredis"] = entry["cpu_us_per_command"] / base
    return out


def main(argv: list[str] | None = None) -> None:
    """``python -m benchmarks.store_clients``."""
    p = argparse.ArgumentParser(prog="benchmarks.store_clients", description=__doc__.split("\n")[0])
    p.add_argument("--url", default="redis://127.0.0.1:6379")
    p.add_argument("--tasks", type=int, default=400)
    p.add_argument("--per-task", type=int, default=50)
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args(argv)
    if args.tasks < 1 or args.per_task < 1 or not 1 <= args.rounds <= 20:
        raise SystemExit("store_clients: --tasks and --per-task >= 1, --rounds in [1, 20]")
    result = trio.run(_main, args)
    for name, entry in result["clients"].items():
        print(
            f"{name:20s} {entry['cpu_us_per_command']:8.1f} us CPU/command  "
            f"{entry['commands_per_s']:8.0f} commands/s  {entry['vs_coredis']:.3f} x coredis"
        )
    print(json.dumps(result, separators=(",", ":")))


if __name__ == "__main__":
    main()
