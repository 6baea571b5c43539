"""What commits cost, side by side: ``python -m benchmarks.across_commits REV [REV ...]``.

Checks each revision out into a temporary work tree (``git worktree add``), gives every
tree this checkout's ``benchmarks/`` (one harness for all, so only the server differs),
then runs ``python -m benchmarks.fanout --server weir --measure phase`` against each tree
in turn, round after round (alternating, so a machine that slows down slows every tree
alike), and prints the server's CPU per call per revision: the median of the rounds,
their range, and each revision's ratio to the first.  The same virtualenv serves every
tree (each tree's ``weir`` is imported from its own directory).

Example (both eras, 50 sessions, three rounds; ``--env`` sets variables for every
server, e.g. ``WEIR_ACCESS_LOG=off``)::

    python -m benchmarks.across_commits 19d8364 HEAD --sessions 50 --calls 80 \\
        --rounds 3 --era session --era sessionless

``REV:asyncio`` serves that revision on the asyncio runtime (``weir serve --runtime
asyncio``; revisions that have it).  The work trees are removed at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent


def _tree(rev: str, into: Path) -> Path:
    """A work tree of ``rev`` under ``into`` holding this checkout's ``benchmarks/``."""
    path = into / rev.replace("/", "_")
    subprocess.run(
        ["git", "-C", str(HERE), "worktree", "add", "--detach", "-f", str(path), rev],
        check=True,
        capture_output=True,
    )
    shutil.rmtree(path / "benchmarks", ignore_errors=True)
    shutil.copytree(HERE / "benchmarks", path / "benchmarks")
    return path


def _run(
    tree: Path, runtime: str, era: str, args: argparse.Namespace, env: dict[str, str]
) -> float:
    """One fanout run against ``tree``: the server's CPU per call (µs)."""
    out = tree / "run.json"
    argv = [sys.executable, "-m", "benchmarks.fanout", "--server", "weir", "--measure", "phase"]
    argv += ["--sessions", str(args.sessions), "--calls", str(args.calls), "--no-progress"]
    argv += ["--out-json", str(out)]
    if runtime != "trio":
        argv += ["--runtime", runtime]
    if era == "sessionless":
        argv.append("--sessionless")
    subprocess.run(argv, cwd=tree, env=env, check=True, capture_output=True, timeout=600)
    run = json.loads(out.read_text())["runs"][0]
    if run["errors"] or run["duplicates"]:
        raise SystemExit(f"{tree.name}: {run['errors']} errors, {run['duplicates']} duplicates")
    return float(run["cpu_us_per_call"])


def main(argv: list[str] | None = None) -> None:
    """Run the rounds and print the table."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("revs", nargs="+", help="revisions (REV or REV:asyncio); the first is the base")
    p.add_argument("--sessions", type=int, default=50)
    p.add_argument("--calls", type=int, default=80)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--era", action="append", choices=["session", "sessionless"])
    p.add_argument("--env", action="append", default=[], metavar="NAME=VALUE")
    args = p.parse_args(argv)
    eras = args.era or ["session"]
    env = dict(os.environ)
    env.update(dict(item.split("=", 1) for item in args.env))
    env.pop("PYTHONPATH", None)
    arms = [(rev.split(":")[0], rev.split(":")[1] if ":" in rev else "trio") for rev in args.revs]
    with tempfile.TemporaryDirectory(prefix="weir-across-") as tmp:
        trees = {rev: _tree(rev, Path(tmp)) for rev in dict.fromkeys(r for r, _ in arms)}
        try:
            cpu: dict[tuple[str, str, str], list[float]] = {}
            for _ in range(args.rounds):
                for era in eras:
                    for rev, runtime in arms:
                        got = _run(trees[rev], runtime, era, args, env)
                        cpu.setdefault((era, rev, runtime), []).append(got)
            print(f"server CPU per call (µs), {args.sessions} sessions, {args.rounds} rounds")
            for era in eras:
                base = statistics.median(cpu[(era, *arms[0])])
                for rev, runtime in arms:
                    runs = cpu[(era, rev, runtime)]
                    mid = statistics.median(runs)
                    # (Where CPU is read in 10 ms ticks, a tiny run may measure 0.)
                    ratio = f"x{mid / base:.2f}" if base > 0 else "x-"
                    print(
                        f"{era:12} {rev:>10} {runtime:8} {mid:7.0f}  "
                        f"({min(runs):.0f}-{max(runs):.0f})  {ratio}"
                    )
        finally:
            for tree in trees.values():
                subprocess.run(
                    ["git", "-C", str(HERE), "worktree", "remove", "--force", str(tree)],
                    capture_output=True,
                )


if __name__ == "__main__":
    main()
