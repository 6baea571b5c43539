"""What an idle session holds, by the line that allocated it.

``python -m benchmarks.idle_memory [--sessions 2000] [--top 40] [-- weir serve options]``

Theory of operation
-------------------
The server (``weir serve benchmarks.weir_app:app``, the access log off) runs in a
child process under ``tracemalloc``.  That child is this module run with
``--child``: it installs a ``SIGUSR1`` handler and then runs ``weir``'s own
command line.  The first signal takes a snapshot (after a warm-up of 50 sessions
has imported and cached everything a request touches); the second, sent while
``--sessions`` sessions opened by :mod:`benchmarks.fanout` (``--measure idle``:
``initialize``, one call, then nothing) sit idle on their connections, takes
another and writes the difference, grouped by allocating line and by file, to a
JSON file.  This module prints it per session: the bytes still allocated, and
how many blocks, for each line that holds at least 16 bytes per session.

What it counts is Python's own allocations (what ``tracemalloc`` sees): not the
kernel's socket buffers, nor the allocator's slack, which the RSS figure of
``fanout --measure idle`` includes.  Bounded caches (the response-head cache, at
most 4,096 heads) appear per session only until they fill.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import tracemalloc
import urllib.request
from collections import defaultdict
from pathlib import Path
from types import FrameType
from typing import Any

REPO = Path(__file__).resolve().parent.parent
_SERVING = re.compile(r"serving (http://\S+)")


def _child(argv: list[str]) -> int:
    """Run ``weir`` under tracemalloc; SIGUSR1: snapshot, then difference to $OUT."""
    out = Path(os.environ["IDLE_MEMORY_OUT"])
    tracemalloc.start(1)
    base: list[tracemalloc.Snapshot] = []

    def snap(_sig: int, _frame: FrameType | None) -> None:
        gc.collect()
        now = tracemalloc.take_snapshot()
        if not base:
            base.append(now)
            print("idle_memory: baseline taken", file=sys.stderr, flush=True)
            return
        stats = now.compare_to(base[0], "lineno")
        rows = [
            [str(s.traceback[0].filename), s.traceback[0].lineno, s.size_diff, s.count_diff]
            for s in stats
            if s.size_diff > 0
        ]
        out.write_text(json.dumps(rows))
        print("idle_memory: difference written", file=sys.stderr, flush=True)

    signal.signal(signal.SIGUSR1, snap)
    from weir.engine.cli import main as weir_main

    return weir_main(argv)


def _short(path: str) -> str:
    for marker in ("/weir/", "/site-packages/"):
        if marker in path:
            return path.split(marker, 1)[1]
    return path.rsplit("/", 2)[-1] if "/" in path else path


def _fanout(url: str, pid: int, sessions: int, hold: float) -> subprocess.Popen[bytes]:
    argv = [sys.executable, "-m", "benchmarks.fanout", "--url", url, "--pid", str(pid)]
    argv += ["--measure", "idle", "--sessions", str(sessions), "--idle-hold", str(hold)]
    argv += ["--no-progress"]
    return subprocess.Popen(argv, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


def _serve(server_args: list[str], out: Path, log: Any) -> tuple[subprocess.Popen[bytes], str]:
    env = dict(os.environ, WEIR_ACCESS_LOG="off", IDLE_MEMORY_OUT=str(out))
    argv = [sys.executable, "-m", "benchmarks.idle_memory", "--child", "serve"]
    argv += ["benchmarks.weir_app:app", "--port", "0", "--shutdown-grace", "1", *server_args]
    proc = subprocess.Popen(argv, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=log)
    assert proc.stdout is not None
    line = proc.stdout.readline().decode(errors="replace")  # its 'serving URL' line
    found = _SERVING.search(line)
    if found is None:
        proc.kill()
        raise SystemExit(f"idle_memory: the server did not start: {line.strip()!r}")
    return proc, found.group(1)


def _wait_for(path: Path, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if time.monotonic() > deadline:
            raise SystemExit("idle_memory: the server wrote no snapshot difference")
        time.sleep(0.2)


def _open_connections(url: str) -> int:
    metrics = url.rsplit("/", 1)[0] + "/metrics"
    with urllib.request.urlopen(metrics, timeout=10) as resp:
        text = resp.read().decode()
    found = re.search(r"^weir_connections (\d+)", text, re.MULTILINE)
    if found is None:
        raise SystemExit("idle_memory: the server's /metrics has no weir_connections")
    return int(found.group(1))


def _wait_for_connections(url: str, sessions: int, run: subprocess.Popen[bytes]) -> None:
    """Until ``sessions`` connections are open (the metrics scrape itself is one more)."""
    deadline = time.monotonic() + 60 + sessions / 20
    while _open_connections(url) < sessions + 1:
        if run.poll() is not None:
            raise SystemExit(f"idle_memory: fanout ended early: {run.communicate()[0]!r}")
        if time.monotonic() > deadline:
            raise SystemExit("idle_memory: the sessions did not all open in time")
        time.sleep(0.5)


def measure(sessions: int, server_args: list[str]) -> list[list[Any]]:
    """Rows (file, line, bytes, blocks) held by ``sessions`` idle sessions."""
    with tempfile.TemporaryDirectory() as tmp:
        out, log_path = Path(tmp) / "diff.json", Path(tmp) / "server.log"
        with log_path.open("wb") as log:
            proc, url = _serve(server_args, out, log)
            try:
                warm = _fanout(url, proc.pid, 50, 0.5)
                warm.communicate(timeout=120)
                time.sleep(1.0)
                os.kill(proc.pid, signal.SIGUSR1)
                time.sleep(2.0)
                hold = 600.0  # (fanout is stopped once the snapshot is taken)
                run = _fanout(url, proc.pid, sessions, hold)
                _wait_for_connections(url, sessions, run)
                time.sleep(5.0)  # let anything deferred settle (timers, parking: 2 s)
                os.kill(proc.pid, signal.SIGUSR1)
                _wait_for(out, 120)
                run.terminate()
                run.communicate(timeout=60)
                return list(json.loads(out.read_text()))
            finally:
                proc.terminate()
                try:
                    proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    proc.kill()


def report(rows: list[list[Any]], sessions: int, top: int) -> str:
    """The per-session table: total, by file, then the ``top`` lines."""
    total = sum(r[2] for r in rows)
    by_file: dict[str, int] = defaultdict(int)
    for path, _line, size, _count in rows:
        by_file[_short(path)] += size
    out = [f"{sessions} idle sessions: {total / sessions / 1024:.2f} KiB per session allocated"]
    out.append("\nby file (bytes per session):")
    for name, size in sorted(by_file.items(), key=lambda kv: -kv[1])[:top]:
        if size / sessions >= 16:
            out.append(f"  {size / sessions:7.0f}  {name}")
    out.append("\nby line (bytes, blocks per session):")
    for path, line, size, count in sorted(rows, key=lambda r: -r[2])[:top]:
        if size / sessions >= 16:
            out.append(f"  {size / sessions:7.0f} {count / sessions:5.1f}  {_short(path)}:{line}")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> None:
    """Command line (see the module docstring)."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["--child"]:
        raise SystemExit(_child(args[1:]))
    server_args: list[str] = []
    if "--" in args:
        at = args.index("--")
        args, server_args = args[:at], args[at + 1 :]
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sessions", type=int, default=2000)
    parser.add_argument("--top", type=int, default=40)
    opts = parser.parse_args(args)
    if not 10 <= opts.sessions <= 20_000:
        raise SystemExit("idle_memory: --sessions must be in [10, 20000]")
    print(report(measure(opts.sessions, server_args), opts.sessions, opts.top))


if __name__ == "__main__":
    main()
