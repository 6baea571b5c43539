"""Run the simulator from the command line: one seed, a range of seeds, or a plan.

    python -m tests.sim --seed 17            # one run, its summary (--trace: every line)
    python -m tests.sim --seeds 0:2000       # many runs; each failure's replay command
    python -m tests.sim --plan '<json>'      # replay a plan exactly (as printed)
    python -m tests.sim --seeds 0:200 --bug identity-from-connection   # must fail

Exit status 1 if any run broke a promise.
"""

from __future__ import annotations

import argparse
import shlex
import sys
import time
from collections import Counter

from .bugs import BUGS
from .checks import violations
from .plan import Plan
from .world import Outcome, simulate


def replay_command(plan: Plan) -> str:
    """The one command that replays ``plan`` exactly."""
    if plan == Plan.from_seed(plan.seed, plan.bugs):
        bugs = "".join(f" --bug {b}" for b in plan.bugs)
        return f"python -m tests.sim --seed {plan.seed}{bugs} --trace"
    return f"python -m tests.sim --plan {shlex.quote(plan.to_json())} --trace"


def summary(out: Outcome) -> str:
    """One line: calls answered and refused, faults, virtual time, the trace digest."""
    answered = sum(1 for c in out.calls if c.answer is not None)
    refused = Counter(c.refusal for c in out.calls if c.refusal)
    return (
        f"seed {out.plan.seed}: {len(out.calls)} calls, {answered} answered, "
        f"refused {dict(refused)}, {len(out.plan.faults)} faults, "
        f"{out.ended_at:.0f} s simulated, trace {out.digest()}"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.sim", description=__doc__.split("\n")[0])
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("--seed", type=int, help="one plan drawn from this seed")
    what.add_argument("--seeds", help="A:B, the plans of seeds A (included) to B (excluded)")
    what.add_argument("--plan", help="a plan as JSON (as a failure prints it)")
    parser.add_argument("--bug", action="append", default=[], choices=sorted(BUGS))
    parser.add_argument("--trace", action="store_true", help="print every line of the trace")
    args = parser.parse_args(argv)
    bugs = tuple(args.bug)
    if args.plan:
        plans = [Plan.from_json(args.plan)]
    elif args.seeds:
        first, _, last = args.seeds.partition(":")
        plans = [Plan.from_seed(s, bugs) for s in range(int(first), int(last))]
    else:
        plans = [Plan.from_seed(args.seed, bugs)]
    failed = 0
    started = time.perf_counter()
    for plan in plans:
        out = simulate(plan)
        broken = violations(out)
        if args.trace:
            print("\n".join(out.trace))
        if broken or len(plans) == 1:
            print(summary(out))
        if broken:
            failed += 1
            for line in broken:
                print(f"  broken: {line}")
            print(f"  replay: {replay_command(plan)}")
    took = time.perf_counter() - started
    print(f"{len(plans)} runs, {failed} broke a promise, {took:.1f} s")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
