"""The command line: ``python -m benchmarks.fanout``.

Theory of operation
-------------------
:func:`parser` defines the options (``--help`` lists them), :func:`options`
validates them into :class:`benchmarks.fanout.common.Options` (a bad combination
exits with a message, before anything starts), and :func:`main` runs and reports:

* ``--url``: one run against a running server; ``--server NAME``: one run against a
  server started here; ``--server all``: weir, the ceiling and the SDK one after
  another (the SDK is skipped with a message if the ``sdk`` extra is not installed);
  ``--server sdk-compare``: the SDK's app served by weir (``sdk-weir``), by the SDK's
  own transport (``sdk``), and weir's native app, one after another
  (:mod:`.sdk_side`: the ratios and a side-by-side table, medians of the rounds);
  ``--server table``: the floor, weir and the SDK on both eras and both response modes
  at each ``--table-sessions`` count, and their ratios to the floor (:mod:`.matrix`).
* ``--ab PAIRS`` answers "the other sessions' p99 with the peers against a run without
  them" in one invocation: PAIRS runs without the peers and PAIRS with them, in ABBA
  order, each on a fresh server with the same options.  The headline ratio compares the
  p99 of all the other sessions' calls pooled per arm; the mean of the per-run p99s and
  each pair's ratio are reported beside it (:func:`benchmarks.fanout.report.ab_ratio`).
* ``--peers-only`` (internal; ``--peer-process`` starts it): run only the half-open
  peers and print their counts as one ``stats {...}`` line.

Output: a progress bar on stderr when it is a terminal, then a table and exactly
one JSON line on stdout (with the p99 of every 5 s of the phase), and a PNG when
``--plot`` names one and matplotlib is installed -- for ``--server table``, an SVG of
CPU per call, p50 and p99 against sessions instead (:mod:`.svg_plot`, no library).
Exit status 0, 1 when a run could not be carried out
(:class:`benchmarks.fanout.common.BenchError`), 130 on Ctrl-C.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from dataclasses import asdict, replace
from pathlib import Path

import trio

from .common import REPO, BenchError, Options
from .load import run_peers_only
from .matrix import matrix_summary, matrix_table, run_matrix
from .peers import _PEER_COUNTS
from .report import RunResult, machine, plot, ratios, source_tree, table
from .sdk_side import ROTATION, sdk_ratios, side_by_side, side_by_side_table
from .servers import run_one
from .svg_plot import table_svg
from .system import own_cpu_seconds

WEIR_APP = "benchmarks.weir_app:app"
DEFAULT_PLOT = REPO / "benchmarks" / "out" / "fanout.png"


def parser() -> argparse.ArgumentParser:
    """The ``python -m benchmarks.fanout`` argument parser."""
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.fanout",
        description="Fan-out benchmark of MCP Streamable HTTP servers (weir, a ceiling, the SDK).",
    )
    target = p.add_mutually_exclusive_group()
    target.add_argument("--url", help="benchmark this running server (needs an echo tool)")
    target.add_argument(
        "--server",
        choices=[
            *("weir", "floor", "ceiling", "sdk", "sdk-weir"),
            *("compare", "all", "sdk-compare", "table"),
        ],
        default="weir",
        help="start this server here (sdk-weir: the sdk's app served by weir; compare: "
        "weir, floor and ceiling; all: those and sdk; sdk-compare: sdk-weir, sdk and weir; "
        "one after another; table: the floor, weir and the SDK on both eras and both "
        "response modes at each --table-sessions count, and the table of ratios)",
    )
    p.add_argument(
        "--table-sessions",
        default="50,400",
        help="--server table: the session counts, comma-separated (50,400)",
    )
    p.add_argument(
        "--table-no-sdk",
        action="store_true",
        help="--server table: leave the SDK out (at thousands of sessions it takes "
        "many times weir's wall time)",
    )
    p.add_argument(
        "--measure",
        choices=["session", "phase", "idle"],
        help="session: each session's whole life (connect, initialize, the calls), all "
        "starting at once -- what a user sees (the default); phase: only the calls, after "
        "an unmeasured setup (the default with --duration, --rate or --half-open); idle: "
        "open the sessions, leave them idle, weigh the server",
    )
    p.add_argument(
        "--repeat",
        type=int,
        default=1,
        metavar="N",
        help="run the servers N times in rotation; ratios are medians of the rounds'",
    )
    p.add_argument(
        "--idle-hold",
        type=float,
        default=5.0,
        help="--measure idle: seconds idle before weighing (5: past weir's 2 s --park-idle-after)",
    )
    p.add_argument(
        "--compare-store",
        metavar="URL",
        help="run weir with the memory store and with --store URL side by side in each "
        "round (the shared store's cost per call)",
    )
    p.add_argument("--pid", type=int, help="with --url: the server's pid, for CPU and RSS")
    p.add_argument(
        "--client",
        metavar="CMD",
        help="an independent load generator drives the servers (e.g. 'python -m "
        "benchmarks.h11_client'; see benchmarks/fanout/external.py)",
    )
    p.add_argument("--sessions", type=int, default=400, help="sessions (default 400)")
    p.add_argument("--calls", type=int, default=25, help="tools/call per session (default 25)")
    p.add_argument("--concurrency", type=int, help="most calls in flight (default: sessions)")
    p.add_argument("--duration", type=float, help="call for this many seconds instead")
    p.add_argument("--rate", type=float, help="pace all sessions to this many calls/s in total")
    p.add_argument(
        "--warmup", type=int, default=1, help="--measure phase: unmeasured calls per session (1)"
    )
    p.add_argument("--text-size", type=int, default=64, help="bytes of echo text (64)")
    p.add_argument("--json-response", action="store_true", help="JSON instead of SSE responses")
    p.add_argument(
        "--sessionless",
        action="store_true",
        help="speak MCP 2026-07-28: server/discover instead of initialize, every call "
        "self-contained (_meta, MCP-Protocol-Version, Mcp-Method, Mcp-Name)",
    )
    p.add_argument(
        "--idempotency-keys",
        action="store_true",
        help="with --sessionless: every tools/call carries a fresh Idempotency-Key, so "
        "weir claims and records it in its gate (the keyed call's store path)",
    )
    p.add_argument("--half-open", type=int, default=0, metavar="N", help="stalled peers (0)")
    p.add_argument("--half-open-rate", type=float, default=20.0, help="POSTs/s per peer (20)")
    p.add_argument("--half-open-pad", type=int, default=16384, help="bytes echoed per frame")
    p.add_argument(
        "--half-open-posters", type=int, default=8, help="concurrent POST connections per peer"
    )
    p.add_argument(
        "--half-open-control",
        action="store_true",
        help="the peers read their streams (same traffic, healthy sessions): a control",
    )
    p.add_argument(
        "--peer-process",
        action="store_true",
        help="run the half-open peers in their own process, so this event loop times "
        "only the other sessions",
    )
    p.add_argument(
        "--peer-nice",
        type=int,
        default=0,
        metavar="N",
        help="with --peer-process: its niceness (and the gateway's, with --gateway-scope "
        "half-open); 19 stands in for the peer being on another machine (0)",
    )
    p.add_argument(
        "--pin-server",
        action="store_true",
        help="pin the server to the first CPU and everything else started here to the rest",
    )
    p.add_argument(
        "--ab",
        type=int,
        default=0,
        metavar="PAIRS",
        help="with --half-open: PAIRS runs without the peers and PAIRS with them, "
        "alternately, a fresh server each; compares the other sessions' p99",
    )
    p.add_argument("--peers-only", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--half-open-via", help=argparse.SUPPRESS)
    p.add_argument("--phase-start", type=float, help=argparse.SUPPRESS)
    p.add_argument("--gateway-retries", type=int, default=0, metavar="R", help="retrying gateway")
    p.add_argument("--gateway-timeout", type=float, default=2.0, help="seconds to headers (2.0)")
    p.add_argument(
        "--gateway-scope",
        choices=["all", "half-open"],
        default="all",
        help="whose POSTs go through the gateway (all)",
    )
    p.add_argument("--credit-frames", type=int, help="weir: frame credit per session")
    p.add_argument("--credit-bytes", type=int, help="weir: byte credit per session")
    p.add_argument("--drain-window", type=float, help="weir: seconds to half-open")
    p.add_argument("--liveness-timeout", type=float, help="weir: seconds to teardown")
    p.add_argument(
        "--store",
        help="weir: --store URL (e.g. redis://127.0.0.1:6379); "
        "also reports store round trips per call",
    )
    p.add_argument("--workers", type=int, default=1, help="weir: --workers N (needs --store)")
    p.add_argument(
        "--runtime",
        choices=["trio", "asyncio"],
        default="trio",
        help="weir: the runtime it serves on (weir serve --runtime)",
    )
    p.add_argument(
        "--store-replicas",
        type=int,
        default=0,
        metavar="N",
        help="weir: --store-replicas N on the run(s) with a store (0)",
    )
    p.add_argument("--sample-interval", type=float, default=1.0, help="/metrics period (1.0 s)")
    p.add_argument("--call-timeout", type=float, default=30.0, help="seconds per call (30)")
    p.add_argument("--weir-app", default=WEIR_APP, help=f"app weir serves ({WEIR_APP})")
    p.add_argument("--metrics-path", default="/metrics")
    p.add_argument("--legacy-sse-path", default="/sse")
    p.add_argument(
        "--plot",
        default=str(DEFAULT_PLOT),
        help="PNG to write ('' for none; default benchmarks/out/fanout.png); --server "
        "table writes an SVG of CPU per call, p50 and p99 against sessions beside it",
    )
    p.add_argument("--out-json", help="also write the JSON line to this file")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument(
        "--quiet-wait",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="before each run, wait up to this long for other processes to go quiet",
    )
    return p


def _ensure_descriptors(needed: int) -> None:
    """Raise this process's open-file limit to ``needed`` (the hard one too, where the
    process may), else exit with a clear message.

    Each session holds a socket here, and one in the server (whose own soft limit, less a
    reserve, is ``weir serve``'s default connection limit); 10,000 sessions need more than
    10,000 on both sides.
    """
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft >= needed:
        return
    if hard != resource.RLIM_INFINITY and hard < needed:
        try:  # (allowed with CAP_SYS_RESOURCE, up to the kernel's fs.nr_open)
            resource.setrlimit(resource.RLIMIT_NOFILE, (needed, needed))
        except (OSError, ValueError):
            raise SystemExit(
                f"fanout: {needed} open files needed, but the hard limit is {hard} and this "
                "process may not raise it; raise it (ulimit -Hn) or run fewer sessions"
            ) from None
        return
    resource.setrlimit(resource.RLIMIT_NOFILE, (needed, hard))


def options(args: argparse.Namespace) -> Options:
    """Validate the command line into :class:`Options`."""
    if args.sessions < 1 or args.calls < 1:
        raise SystemExit("fanout: --sessions and --calls must be >= 1")
    if args.duration is not None and not 0 < args.duration <= 3600:
        raise SystemExit("fanout: --duration must be in (0, 3600]")
    if args.half_open and args.half_open_rate <= 0:
        raise SystemExit("fanout: --half-open-rate must be > 0")
    if args.half_open and args.server != "weir" and args.url is None:
        raise SystemExit(
            "fanout: --half-open needs weir's legacy /sse (use --server weir or --url)"
        )
    if args.peer_process and not args.half_open:
        raise SystemExit("fanout: --peer-process needs --half-open N")
    if not 0 <= args.peer_nice <= 19:
        raise SystemExit("fanout: --peer-nice must be in [0, 19]")
    if args.peer_nice and not args.peer_process:
        raise SystemExit("fanout: --peer-nice needs --peer-process")
    if args.pin_server and args.url is not None:
        raise SystemExit("fanout: --pin-server pins a server started here (not with --url)")
    if args.compare_store and (args.server != "weir" or args.store or args.url):
        raise SystemExit(
            "fanout: --compare-store runs weir twice (not with --server/--store/--url)"
        )
    if args.idempotency_keys and not args.sessionless:
        raise SystemExit("fanout: --idempotency-keys is for --sessionless calls")
    if not 1 <= args.repeat <= 50:
        raise SystemExit("fanout: --repeat must be in [1, 50]")
    _ensure_descriptors(args.sessions + args.half_open * (args.half_open_posters + 2) + 256)
    paced = bool(args.duration or args.rate or args.half_open)
    if args.measure is None:
        args.measure = "phase" if paced else "session"
    if args.measure != "phase" and paced:
        raise SystemExit("fanout: --duration, --rate and --half-open need --measure phase")
    if args.client is not None and (
        args.half_open or args.ab or paced or args.measure == "idle" or args.gateway_retries
    ):
        raise SystemExit(
            "fanout: --client runs its own calls (not with --half-open, --ab, --duration, "
            "--rate, --gateway-retries or --measure idle)"
        )
    if args.server == "table" and (
        args.url or args.ab or args.half_open or args.compare_store or args.gateway_retries
    ):
        raise SystemExit(
            "fanout: --server table starts its own servers (not with --url, --ab, "
            "--half-open, --compare-store or --gateway-retries)"
        )
    try:
        args.table_counts = [int(n) for n in args.table_sessions.split(",") if n.strip()]
    except ValueError:
        raise SystemExit("fanout: --table-sessions takes numbers, e.g. 50,400") from None
    if not args.table_counts or min(args.table_counts) < 1:
        raise SystemExit("fanout: --table-sessions needs session counts >= 1")
    if args.server == "table":
        _ensure_descriptors(max(args.table_counts) + 64)
    if args.ab < 0:
        raise SystemExit("fanout: --ab must be >= 0")
    if args.ab and (
        not args.half_open
        or args.url is not None
        or args.server in ("all", "compare", "sdk-compare")
    ):
        raise SystemExit("fanout: --ab needs --half-open N and one server started here")
    if args.peers_only and (args.url is None or args.phase_start is None or not args.half_open):
        raise SystemExit("fanout: --peers-only is internal (--peer-process starts it)")
    from weir.protocol import CreditLimits

    given = {
        "frames": args.credit_frames,
        "bytes": args.credit_bytes,
        "drain_window": args.drain_window,
        "liveness_timeout": args.liveness_timeout,
    }
    defaults = asdict(CreditLimits())
    credit = {k: float(v if v is not None else defaults[k]) for k, v in given.items()}
    return Options(
        sessions=args.sessions,
        calls=args.calls,
        concurrency=args.concurrency or args.sessions,
        duration=args.duration,
        rate=args.rate,
        warmup=args.warmup,
        text_size=args.text_size,
        json_response=args.json_response,
        sessionless=args.sessionless,
        idempotency_keys=args.idempotency_keys,
        half_open=args.half_open,
        half_open_rate=args.half_open_rate,
        half_open_pad=args.half_open_pad,
        half_open_posters=args.half_open_posters,
        half_open_control=args.half_open_control,
        gateway_retries=args.gateway_retries,
        gateway_timeout=args.gateway_timeout,
        gateway_scope=args.gateway_scope,
        sample_interval=args.sample_interval,
        call_timeout=args.call_timeout,
        credit=credit,
        weir_app=args.weir_app,
        metrics_path=args.metrics_path,
        legacy_sse_path=args.legacy_sse_path,
        progress=not args.no_progress,
        quiet_wait=args.quiet_wait,
        store=args.store,
        store_replicas=args.store_replicas,
        workers=args.workers,
        runtime=args.runtime,
        peer_process=args.peer_process,
        peer_nice=args.peer_nice,
        pin_server=args.pin_server,
        measure=args.measure,
        idle_hold=args.idle_hold,
        client=args.client,
    )


async def _main(args: argparse.Namespace, opts: Options) -> list[RunResult]:
    results: list[RunResult] = []
    with tempfile.TemporaryDirectory(prefix="fanout-") as tmp:
        if args.url is not None:
            results.append(await run_one("url", opts, args.url, args.pid, Path(tmp)))
            return results
        if args.ab:  # without and with the peers, alternately (ABBA), a fresh server each
            arms = [("without", replace(opts, half_open=0)), ("with", opts)]
            for i in range(args.ab):
                for arm, arm_opts in arms if i % 2 == 0 else arms[::-1]:
                    result = await run_one(args.server, arm_opts, None, None, Path(tmp))
                    result.arm = arm
                    results.append(result)
            return results
        if args.server == "table":
            counts, repeat = args.table_counts, args.repeat
            return await run_matrix(
                opts, counts, repeat, Path(tmp), _have_sdk() and not args.table_no_sdk
            )
        names = {
            "all": ["weir", "floor", "ceiling", "sdk"],
            "compare": ["weir", "floor", "ceiling"],
            "sdk-compare": ROTATION,
        }.get(args.server, [args.server])
        if args.compare_store:
            names = ["weir", "weir-store"]
        for name in names * args.repeat:
            if name == "weir-store":
                result = await run_one(
                    "weir", replace(opts, store=args.compare_store), None, None, Path(tmp)
                )
                result.server = "weir-store"
                results.append(result)
                continue
            if name in ("sdk", "sdk-weir") and not _have_sdk():
                print(
                    f"fanout: the mcp SDK is not installed (extra 'sdk'): {name} skipped",
                    file=sys.stderr,
                )
                continue
            results.append(await run_one(name, opts, None, None, Path(tmp)))
    return results


def _have_sdk() -> bool:
    import importlib.util

    return importlib.util.find_spec("mcp") is not None


def main(argv: list[str] | None = None) -> int:
    """``python -m benchmarks.fanout``."""
    args = parser().parse_args(argv)
    opts = options(args)
    if args.peers_only:
        via = args.half_open_via or args.url
        half = trio.run(run_peers_only, opts, args.url, via, args.phase_start)
        counts = {key: getattr(half, key) for key in _PEER_COUNTS}
        print("stats " + json.dumps({**counts, "cpu_s": own_cpu_seconds()}))
        return 0
    try:
        results = trio.run(_main, args, opts)
    except BenchError as exc:
        print(f"fanout: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    print(table(results))
    grid = matrix_table(results)
    if grid:
        print(grid)
    # (--server table mixes eras and modes: its ratios are the grid's, per cell)
    found = {} if grid else ratios(results) | sdk_ratios(results)
    sides = side_by_side(results)
    if sides:
        print(side_by_side_table(sides))
    for key, value in found.items():
        target = value.get("target_max", value.get("target_min"))
        verdict = (
            "" if target is None else (" (target met)" if value["met"] else " (target MISSED)")
        )
        bound = "<=" if "target_max" in value else ">="
        goal = "" if target is None else f", target {bound} {target}"
        print(f"{key}: {value['value']:.2f}{goal}{verdict}")
        if "pair_ratios" in value:
            print(
                f"  pooled p99 {value['pooled_p99_ms']['with']:.3f} ms with the peers, "
                f"{value['pooled_p99_ms']['without']:.3f} ms without; mean of run p99s "
                f"{value['mean_ratio']:.2f}x; each pair {value['pair_ratios']}"
            )
    peers = "control peers (reading)" if opts.half_open_control else "half-open"
    for r in results:
        if r.half_open:
            h = r.half_open
            print(
                f"{r.server} {peers}: {h['sessions_opened']} sessions, {h['sent']} POSTs, "
                f"{h['accepted']} accepted, {h['refused_429']} x 429, {h['gone_404']} x 404; "
                f"max queue depth {h['max_queue_depth']:.0f} frames / "
                f"{h['max_queue_bytes'] / 1024:.0f} KiB (credit "
                f"{(r.credit or {}).get('frames', 0):.0f} frames / "
                f"{(r.credit or {}).get('bytes', 0) / 1024:.0f} KiB); "
                f"RSS growth {r.rss_growth_mib or 0:.1f} MiB"
            )
        if r.gateway:
            print(f"{r.server} gateway: {r.gateway}")
        foreign = "n/a" if r.foreign_cpu_s is None else f"{r.foreign_cpu_s:.1f} s"
        print(
            f"{r.server} phase: {r.elapsed_s:.1f} s; CPU: server {r.server_cpu_s or 0:.1f} s, "
            f"load generator {r.client_cpu_s:.1f} s, gateway {r.gateway_cpu_s or 0:.1f} s, "
            + (f"peer process {r.peer_cpu_s:.1f} s, " if r.peer_cpu_s is not None else "")
            + f"other processes {foreign} (machine busy {r.machine_busy_s:.1f} s of "
            f"{r.elapsed_s * (os.cpu_count() or 1):.1f}); "
            f"load average before {r.loadavg_before:.2f}"
        )
        if r.error_kinds:
            print(f"{r.server} errors: {r.error_kinds}")
    line = json.dumps(
        {
            "benchmark": "fanout",
            "machine": machine(),
            "source": source_tree(),
            "argv": sys.argv[1:] if argv is None else argv,
            "options": asdict(opts),
            "runs": [r.public() for r in results],
            "ratios": found,
            **({"side_by_side": sides} if sides else {}),
            **({"matrix": matrix_summary(results)} if grid else {}),
        },
        separators=(",", ":"),
    )
    print(line)
    if args.out_json:
        Path(args.out_json).write_text(line + "\n")
    if args.plot and grid:
        # Against sessions, per server: SVG, drawn without a plotting library.
        svg = Path(args.plot).with_suffix(".svg")
        svg.parent.mkdir(parents=True, exist_ok=True)
        svg.write_text(table_svg(r.public() for r in results))
        print(f"fanout: wrote {svg}", file=sys.stderr)
    elif args.plot:
        problem = plot(results, args.plot)
        print(f"fanout: {problem}" if problem else f"fanout: wrote {args.plot}", file=sys.stderr)
    return 0
