"""``--client CMD``: an independent load generator drives the server fanout started.

Theory of operation
-------------------
Any command can be the client, so that a figure fanout prints can be checked with a
client that shares nothing with fanout's own.  fanout starts the server as usual,
then runs ``CMD`` (split like a shell line, from the repository root) with the
target in its environment -- ``FANOUT_URL``, ``FANOUT_SESSIONS``, ``FANOUT_CALLS``,
``FANOUT_ERA`` (``session`` or ``sessionless``), ``FANOUT_JSON`` (``1`` when the server
answers with JSON bodies) and ``FANOUT_TEXT_SIZE`` -- and reads its stdout:

* an optional line ``phase``: the client's sessions are open and its calls start;
  the server's CPU is counted from there (without it, from the command's start);
* as its last line, one JSON object: ``calls`` (successful calls, required) and,
  if it has them, ``errors``, ``p50_ms``, ``p90_ms``, ``p99_ms``, ``max_ms``, ``elapsed_s``.

The server's CPU per call is its CPU over the phase divided by ``calls``; the
client's own CPU is the command's (its children's rusage).  A command that exits
non-zero, prints no such line, or outlives ``--call-timeout`` x (calls + 10) is a
failed run (:class:`~.common.BenchError`), never a silent zero.
``benchmarks/h11_client.py`` is one such client (Trio and h11).
"""

from __future__ import annotations

import json
import os
import resource
import shlex
import subprocess
import time
from typing import Any

import trio

from .common import REPO, BenchError, Options
from .report import RunResult
from .system import CpuReading, cpu_reading, cpu_used, machine_busy_seconds

#: What the client's stdout may hold at most (its lines are short).
MAX_OUTPUT = 1 << 20


def client_env(opts: Options, url: str) -> dict[str, str]:
    """The environment the client command runs with: the target, then this process's."""
    return {
        **os.environ,
        "FANOUT_URL": url,
        "FANOUT_SESSIONS": str(opts.sessions),
        "FANOUT_CALLS": str(opts.calls),
        "FANOUT_ERA": "sessionless" if opts.sessionless else "session",
        "FANOUT_JSON": "1" if opts.json_response else "0",
        "FANOUT_TEXT_SIZE": str(opts.text_size),
    }


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _server_cpu(pid: int | None) -> CpuReading | None:
    return cpu_reading(pid) if pid is not None else None


async def run_external(
    command: str, opts: Options, name: str, url: str, pid: int | None
) -> RunResult:
    """Run ``command`` against ``url`` (served by ``pid``); the run it measured."""
    result = RunResult(
        server=name,
        url=url,
        response_mode="json" if opts.json_response else "sse",
        sessions=opts.sessions,
        measure="phase",
    )
    argv = shlex.split(command)
    if not argv:
        raise BenchError("--client: an empty command")
    child0 = _children_cpu()
    cpu0, busy0, t0 = _server_cpu(pid), machine_busy_seconds(), time.monotonic()
    result.loadavg_before = os.getloadavg()[0]
    out = bytearray()
    limit = opts.call_timeout * (opts.calls + 10)
    with trio.move_on_after(limit) as scope:
        proc = await trio.lowlevel.open_process(
            argv, stdout=subprocess.PIPE, env=client_env(opts, url), cwd=REPO
        )
        assert proc.stdout is not None
        try:
            while chunk := await proc.stdout.receive_some(65536):
                if len(out) + len(chunk) > MAX_OUTPUT:
                    raise BenchError(f"--client printed more than {MAX_OUTPUT} bytes")
                seen = b"\n" + out
                if b"\nphase\n" not in seen and b"\nphase\n" in seen + chunk:
                    cpu0, busy0, t0 = _server_cpu(pid), machine_busy_seconds(), time.monotonic()
                out += chunk
            code = await proc.wait()
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
    if scope.cancelled_caught:
        raise BenchError(f"--client did not finish within {limit:.0f} s")
    cpu1, elapsed = _server_cpu(pid), time.monotonic() - t0
    if code != 0:
        tail = bytes(out[-500:]).decode(errors="replace")
        raise BenchError(f"--client exited with {code}: {tail}")
    report = _last_json(out.decode(errors="replace"))
    _fill(result, report, elapsed)
    result.client_cpu_s = _children_cpu() - child0
    result.machine_busy_s = machine_busy_seconds() - busy0
    if cpu0 is not None and cpu1 is not None:
        result.server_cpu_s = cpu_used(cpu0, cpu1)
        result.cpu_us_per_call = result.server_cpu_s / result.calls * 1e6 if result.calls else None
    return result


def _last_json(text: str) -> dict[str, Any]:
    lines = [line for line in text.splitlines() if line.strip()]
    try:
        report = json.loads(lines[-1]) if lines else None
    except json.JSONDecodeError:
        report = None
    if not isinstance(report, dict) or not isinstance(report.get("calls"), int):
        raise BenchError('--client must end its output with a JSON line holding "calls"')
    return report


def _fill(result: RunResult, report: dict[str, Any], elapsed: float) -> None:
    result.calls = report["calls"]
    result.errors = int(report.get("errors", 0))
    result.p50_ms = float(report.get("p50_ms", 0.0))
    result.p90_ms = float(report.get("p90_ms", 0.0))
    result.p99_ms = float(report.get("p99_ms", 0.0))
    result.max_ms = float(report.get("max_ms", 0.0))
    result.elapsed_s = float(report.get("elapsed_s", elapsed))
    result.calls_per_s = result.calls / result.elapsed_s if result.elapsed_s > 0 else 0.0
    result.requests_sent = result.calls + result.errors
