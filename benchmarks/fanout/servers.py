"""The processes under test: the server, the retrying gateway, and one run around them.

Theory of operation
-------------------
:func:`start_process` starts a server (or the gateway) as a subprocess on 127.0.0.1,
port 0, and waits at most 60 s for its ``NAME: serving URL`` line on stdout; its
stderr goes to a log file whose tail is printed when something fails.
:func:`stop_process` sends SIGTERM, then SIGKILL after 5 s.  The servers
(:func:`server_argv`):

* ``weir`` -- ``python -m weir serve benchmarks.weir_app:app`` (the demo's
  ``echo`` plus a ``mark`` tally used to count duplicate executions exactly); the
  credit flags are passed only if this checkout's ``weir serve`` knows them
  (:func:`weir_flags`);
* ``ceiling`` -- :mod:`benchmarks.ceiling`, a minimal Trio + h11 server answering
  the same requests in the same wire format without any MCP machinery;
* ``floor`` -- :mod:`benchmarks.floor`, the same answers with HTTP framed by hand
  (no h11), the least a Trio server can spend on these requests;
* ``sdk`` -- :mod:`benchmarks.sdk_server`, the official Python SDK on uvicorn;
* ``sdk-weir`` -- ``python -m weir serve benchmarks.sdk_server:server``: the SDK's
  app of ``sdk``, unchanged, served by weir (:mod:`.sdk_side`), with weir's flags.

**Gateway retries** (``--gateway-retries R``): the POSTs (of every session, or
only of the half-open peers with ``--gateway-scope half-open``) go through
:mod:`benchmarks.gateway` (started here as its own process), which re-sends a POST
on a new upstream connection when no response headers arrive within
``--gateway-timeout``.  Its own counts (``/_gateway/stats``) go into the record;
how duplicates are counted is in :mod:`benchmarks.fanout.load`.  Serving only the
peers, the gateway is on the peers' side of the network and gets ``--peer-nice``.

``--pin-server`` pins the server to the first CPU and everything else started here
to the others, as a server has its own machine; the record's ``layout`` says who ran
where.

:func:`run_one` is one whole run: start what is needed, run
:class:`benchmarks.fanout.load.Run`, stop everything (always, in reverse order).  A
server or gateway that exits during its run marks the run invalid (``died``).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import trio

from .client import Client, Endpoint, HttpError
from .common import REPO, BenchError, Options
from .external import run_external
from .load import Run
from .report import RunResult
from .sdk_side import SDK_APP, WEIR_KINDS
from .system import child_setup, pin_self, wait_for_quiet


@dataclass
class ServerProcess:
    """A server (or the gateway) started as a subprocess."""

    name: str
    proc: subprocess.Popen[bytes]
    url: str
    log_path: Path

    @property
    def pid(self) -> int:
        return self.proc.pid

    def log_tail(self, n: int = 20) -> str:
        try:
            lines = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return ""
        return "\n".join(lines[-n:])


async def start_process(
    name: str, argv: list[str], logdir: Path, setup: Callable[[], None] | None = None
) -> ServerProcess:
    """Start ``argv``; wait (at most 60 s) for its ``NAME: serving URL`` line.

    ``setup`` runs in the child before ``exec`` (CPU affinity, niceness).
    """
    log_path = logdir / f"{name}.log"
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    with log_path.open("wb") as log_file:
        proc = subprocess.Popen(
            argv,
            cwd=REPO,
            env=env,
            stdout=subprocess.PIPE,
            stderr=log_file,
            stdin=subprocess.DEVNULL,
            preexec_fn=setup,
        )
    sp = ServerProcess(name, proc, "", log_path)
    assert proc.stdout is not None
    line = b""
    with trio.move_on_after(60):
        line = await trio.to_thread.run_sync(proc.stdout.readline, abandon_on_cancel=True)
    match = re.search(rb"serving (http://\S+)", line)
    if match is None:
        await stop_process(sp)
        raise BenchError(f"{name} did not start (first line {line!r}):\n{sp.log_tail()}")
    sp.url = match.group(1).decode()
    return sp


async def stop_process(sp: ServerProcess) -> None:
    """SIGTERM, then SIGKILL after 5 s."""
    proc = sp.proc
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        with trio.move_on_after(5):
            while proc.poll() is None:
                await trio.sleep(0.05)
        if proc.poll() is None:
            proc.kill()
            await trio.to_thread.run_sync(proc.wait)
    if proc.stdout is not None:
        proc.stdout.close()


def server_argv(name: str, opts: Options, weir_flags: set[str]) -> tuple[str, list[str]]:
    """(process label, argv) of a server started here."""
    py = sys.executable
    if name in WEIR_KINDS:
        app = opts.weir_app if name == "weir" else SDK_APP
        argv = [py, "-m", "weir", "serve", app, "--port", "0", "--shutdown-grace", "1"]
        if opts.json_response:
            argv.append("--json-response")
        if opts.sessions > 10_000:  # the defaults hold 10,000 sessions
            argv += ["--max-sessions", str(opts.sessions)]
        if opts.store:
            argv += ["--store", opts.store]
            if opts.store_replicas:
                argv += ["--store-replicas", str(opts.store_replicas)]
        if opts.workers > 1:
            argv += ["--workers", str(opts.workers)]
        if opts.runtime != "trio":
            argv += ["--runtime", opts.runtime]
        for key, flag in (
            ("frames", "--credit-frames"),
            ("bytes", "--credit-bytes"),
            ("drain_window", "--drain-window"),
            ("liveness_timeout", "--liveness-timeout"),
        ):
            if key in opts.credit and flag in weir_flags:
                value = opts.credit[key]
                argv += [flag, str(int(value) if key in ("frames", "bytes") else value)]
        return name, argv
    module = {
        "floor": "benchmarks.floor",
        "ceiling": "benchmarks.ceiling",
        "sdk": "benchmarks.sdk_server",
    }[name]
    argv = [py, "-m", module, "--port", "0"]
    if opts.json_response:
        argv.append("--json-response")
    return name, argv


async def _gateway_stats(url: str) -> dict[str, Any]:
    gep = Endpoint.parse(url + "/_gateway/stats")
    client = Client(gep.host, gep.port)
    req = f"GET /_gateway/stats HTTP/1.1\r\nHost: {gep.authority}\r\n\r\n".encode()
    try:
        with trio.fail_after(5):
            reply = await client.exchange(req, None)
        stats = json.loads(reply.body)
    except (HttpError, trio.TooSlowError, ValueError):
        return {"error": "no stats"}
    finally:
        await client.close()
    return dict(stats) if isinstance(stats, dict) else {"error": "no stats"}


async def run_one(
    name: str, opts: Options, url: str | None, pid: int | None, logdir: Path
) -> RunResult:
    """Start the server (unless ``url``) and the gateway (if asked), run, stop them."""
    procs: list[ServerProcess] = []
    quiet = await wait_for_quiet(opts.quiet_wait) if opts.quiet_wait > 0 else None
    own_cpus = os.sched_getaffinity(0)
    server_cpus: set[int] | None = None
    if opts.pin_server:  # the server alone on the first CPU; everything else on the rest
        cpus = sorted(own_cpus)
        if len(cpus) < 2:
            raise BenchError(f"--pin-server needs at least 2 CPUs; this process may use {cpus}")
        server_cpus = {cpus[0]}
        pin_self(set(cpus[1:]))
    peer_side = opts.peer_process and opts.gateway_scope == "half-open"
    layout = {
        "server_cpus": sorted(server_cpus) if server_cpus else None,
        "client_cpus": sorted(os.sched_getaffinity(0)),
        "peer_process": opts.peer_process,
        "peer_nice": opts.peer_nice if opts.peer_process else None,
        "gateway_nice": opts.peer_nice if peer_side else 0,
    }
    try:
        if url is None:
            flags = weir_flags() if name in WEIR_KINDS else set()
            label, argv = server_argv(name, opts, flags)
            server = await start_process(label, argv, logdir, child_setup(cpus=server_cpus))
            procs.append(server)
            url, pid = server.url, server.pid
        endpoint = Endpoint.parse(url)
        main_endpoint = half_endpoint = endpoint
        gateway_url = None
        if opts.gateway_retries > 0:
            argv = [sys.executable, "-m", "benchmarks.gateway"]
            argv += ["--upstream", f"http://{endpoint.authority}"]
            argv += ["--retries", str(opts.gateway_retries), "--timeout", str(opts.gateway_timeout)]
            # Serving only the peers, the gateway is on the peers' side of the network.
            nice = opts.peer_nice if peer_side else 0
            gateway = await start_process("gateway", argv, logdir, child_setup(nice))
            procs.append(gateway)
            gateway_url = gateway.url
            through = Endpoint.parse(gateway.url + endpoint.path)
            half_endpoint = through
            if opts.gateway_scope == "all":
                main_endpoint = through
        if opts.client is not None:  # an independent client drives it (:mod:`.external`)
            return await run_external(opts.client, opts, name, url, pid)
        gateway_pid = procs[-1].pid if gateway_url is not None else None
        run = Run(opts, name, endpoint, pid, main_endpoint, half_endpoint, gateway_pid)
        run.logdir = logdir
        result = await run.execute()
        result.busy_before_cores = quiet
        result.layout = layout
        for p in procs:
            code = p.proc.poll()
            if code is not None:  # it must still be serving: nothing here stopped it
                result.died.append(f"{p.name} exited with {code} during the run")
                print(
                    f"fanout: INVALID RUN: {p.name} exited with {code} during the run:\n"
                    f"{p.log_tail()}",
                    file=sys.stderr,
                )
        if gateway_url is not None:
            result.gateway = {
                "scope": opts.gateway_scope,
                "retries": opts.gateway_retries,
                "timeout_s": opts.gateway_timeout,
                **{f"{k}_seen": v for k, v in (await _gateway_stats(gateway_url)).items()},
            }
        return result
    except BenchError:
        for p in procs:
            tail = p.log_tail()
            if tail:
                print(f"--- {p.name} log ---\n{tail}", file=sys.stderr)
        raise
    finally:
        for p in reversed(procs):
            await stop_process(p)
        if server_cpus is not None:
            pin_self(own_cpus)


_WEIR_FLAGS = ("--credit-frames", "--credit-bytes", "--drain-window", "--liveness-timeout")


def weir_flags() -> set[str]:
    """The credit flags this checkout's ``weir serve`` understands."""
    try:
        out = subprocess.run(
            [sys.executable, "-m", "weir", "serve", "--help"],
            cwd=REPO,
            capture_output=True,
            timeout=30,
            check=False,
        ).stdout
    except (OSError, subprocess.TimeoutExpired):
        return set()
    return {f for f in _WEIR_FLAGS if f.encode() in out}
