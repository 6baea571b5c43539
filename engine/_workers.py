"""``weir serve --workers N``: N processes, one event loop each, sharing one port.

Theory of operation
-------------------
The parent reserves the port (binding a ``SO_REUSEPORT`` socket it never listens
on, so ``--port 0`` gets one definite port), then starts N children, each
``python -m weir <the parent's arguments> --port P --replica-id <id>-<i> --workers 1
--reuse-port`` (so on the runtime the parent was asked for: ``--runtime asyncio`` is in
those arguments too).  Each child listens on the same port with ``SO_REUSEPORT``; the kernel
spreads new connections across them.  Sessions must be in a shared store (the
CLI refuses ``--workers`` > 1 with ``--store memory``), so any worker serves any
request of any session.

Metrics: the parent makes a private directory (mode 0700) and names it to the
workers in ``$WEIR_METRICS_DIR``; each publishes its counters there, so a scrape of
any worker answers for all (:mod:`weir.common._metrics_share`).  The parent
removes it when it exits.

The parent prints ``weir: serving URL`` once every child has and forwards SIGINT and
SIGTERM to the children.  A child that dies unasked (SIGKILL, the OOM killer, a crash)
is started again under a new replica id (``<id>-<i>.<n>``: what the dead one held in
the store -- its calls' claims -- is never mistaken for the new one's; the shared store
answers those calls ``interrupted`` when their leases lapse); the others serve on
meanwhile, as the kernel stops sending connections to a closed listener.  A slot
that dies more than :data:`MAX_RESTARTS` times within :data:`RESTART_WINDOW` seconds
is in a crash loop, not unlucky: then every worker is stopped and the parent exits
with that child's status (1 for a signal).  After a signal nothing is restarted, and
the parent exits 0 once every child has (or with the first failure's status).
"""

from __future__ import annotations

import argparse
import base64
import logging
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from typing import IO

from weir.common import new_key
from weir.common._logs import OPS
from weir.common._metrics_share import ENV as METRICS_ENV

from ._server import ServerConfig

_START_TIMEOUT = 30.0
#: Restarts of one worker slot allowed within :data:`RESTART_WINDOW` seconds; one
#: more death in that window stops the server.
MAX_RESTARTS = 3
RESTART_WINDOW = 60.0


def _child_argv(argv: Sequence[str], app_dir: str, port: int, replica: str) -> list[str]:
    """The parent's own command line, with this worker's port, replica id and
    ``--workers 1 --reuse-port`` after it (the last of an option wins), so every other
    option -- authorization and limits included -- reaches every worker as given."""
    return [
        sys.executable,
        "-m",
        "weir",
        *argv,
        "--app-dir",
        os.path.abspath(app_dir),
        "--port",
        str(port),
        "--replica-id",
        replica,
        "--workers",
        "1",
        "--reuse-port",
    ]


def _reserve_port(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host, port))
    return sock


def _pump(stream: IO[str], ready: threading.Event) -> None:
    for line in stream:
        if line.startswith("weir: serving "):
            ready.set()
        else:
            sys.stdout.write(line)
            sys.stdout.flush()


def _exited(replica: str, pid: int, status: int) -> None:
    """The line for a worker that exited (with ``status``)."""
    OPS.log(
        logging.INFO if status == 0 else logging.WARNING,
        "worker %s exited (pid %d, status %d)",
        replica,
        pid,
        status,
        extra={"fields": {"event": "worker_exited", "replica": replica, "status": status}},
    )


def run_workers(args: argparse.Namespace, config: ServerConfig, argv: Sequence[str]) -> int:
    """Run ``args.workers`` children on one port, each started with ``argv`` (the
    parent's command line, see :func:`_child_argv`); return the exit status."""
    try:
        reserved = _reserve_port(config.host, config.port)
    except OSError as exc:
        print(f"weir: cannot listen on {config.host}:{config.port}: {exc}", file=sys.stderr)
        return 1
    port = int(reserved.getsockname()[1])
    base = args.replica_id or secrets.token_hex(4)
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    # Every worker must open the request state any other sealed: one key set for all.
    keys = config.state_keys or (new_key(),)
    env["WEIR_STATE_KEYS"] = ",".join(base64.b64encode(k).decode() for k in keys)
    children: list[subprocess.Popen[str]] = []
    shared_metrics = env[METRICS_ENV] = tempfile.mkdtemp(prefix="weir-metrics-")
    try:
        readiness = []
        for i in range(args.workers):
            replica = f"{base}-{i}"
            child_argv = _child_argv(argv, args.app_dir, port, replica)
            readiness.append(_start_worker(children, i, replica, child_argv, env))
        deadline = time.monotonic() + _START_TIMEOUT
        for proc, ready in zip(children, readiness, strict=True):
            while not ready.wait(0.1):
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"worker {proc.pid} did not start (status {proc.poll()})")
        host = f"[{config.host}]" if ":" in config.host else config.host
        print(
            f"weir: serving {config.scheme}://{host}:{port}{config.path} ({args.workers} workers)",
            flush=True,
        )

        def restart(i: int, generation: int) -> None:
            replica = f"{base}-{i}.{generation}"
            _start_worker(children, i, replica, _child_argv(argv, args.app_dir, port, replica), env)

        return _supervise(children, base, restart)
    except RuntimeError as exc:
        print(f"weir: {exc}", file=sys.stderr)
        return 1
    finally:
        _stop_workers(children)
        reserved.close()
        shutil.rmtree(shared_metrics, ignore_errors=True)


def _start_worker(
    children: list[subprocess.Popen[str]],
    slot: int,
    replica: str,
    argv: list[str],
    env: dict[str, str],
) -> threading.Event:
    """Start worker ``replica`` as ``children[slot]`` (put there at once, so it is
    stopped whatever happens next); the event is set when it says it is serving."""
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True, env=env)
    if slot < len(children):
        children[slot] = proc
    else:
        children.append(proc)
    ready = threading.Event()
    assert proc.stdout is not None
    threading.Thread(target=_pump, args=(proc.stdout, ready), daemon=True).start()
    OPS.info(
        "worker %s started (pid %d)",
        replica,
        proc.pid,
        extra={"fields": {"event": "worker_started", "replica": replica}},
    )
    return ready


def _supervise(
    children: list[subprocess.Popen[str]], base: str, restart: Callable[[int, int], None]
) -> int:
    """Forward SIGINT and SIGTERM to the workers, say when each exits, start again one
    that died unasked (``restart(slot, generation)``), stop them all at a crash loop;
    the exit status once all have exited (the first failure's, 0 after a signal)."""
    stopping = False

    def forward(signum: int, _frame: object) -> None:
        nonlocal stopping
        stopping = True
        for child in children:
            if child.poll() is None:
                child.send_signal(signum)

    signal.signal(signal.SIGINT, forward)
    signal.signal(signal.SIGTERM, forward)
    told = [False] * len(children)  # whether each slot's current child's exit was told
    deaths: list[list[float]] = [[] for _ in children]
    generations = [0] * len(children)
    failure = 0
    while True:
        for i, child in enumerate(children):
            status = child.poll()
            if status is None or told[i]:
                continue
            told[i] = True
            name = f"{base}-{i}" + (f".{generations[i]}" if generations[i] else "")
            _exited(name, child.pid, status)
            if stopping:
                failure = failure or (status if status > 0 else 0)
                continue
            now = time.monotonic()
            deaths[i] = [t for t in deaths[i] if now - t < RESTART_WINDOW] + [now]
            if len(deaths[i]) > MAX_RESTARTS:
                _crash_loop(name, len(deaths[i]))
                failure = status if status > 0 else 1
                forward(signal.SIGTERM, None)
                continue
            generations[i] += 1
            restart(i, generations[i])
            told[i] = False
            if stopping:  # (a signal between the start and its place in ``children``)
                children[i].send_signal(signal.SIGTERM)
        if all(told):
            return failure
        time.sleep(0.2)


def _crash_loop(replica: str, deaths: int) -> None:
    OPS.error(
        "worker %s died %d times within %d s: stopping every worker",
        replica,
        deaths,
        int(RESTART_WINDOW),
        extra={"fields": {"event": "worker_crash_loop", "replica": replica}},
    )


def _stop_workers(children: list[subprocess.Popen[str]]) -> None:
    """Terminate the workers still running; kill one that has not exited in 15 s."""
    for child in children:
        if child.poll() is None:
            child.terminate()
    for child in children:
        try:
            child.wait(timeout=15)
        except subprocess.TimeoutExpired:
            child.kill()
