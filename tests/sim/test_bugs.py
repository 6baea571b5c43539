"""The simulator catches known bugs: each switched on alone, within a bounded number of seeds.

For every entry of :data:`tests.sim.bugs.BUGS`, seeds are tried in order until a run
breaks a promise; the test asserts one does within :data:`SEEDS_ALLOWED` and that
the promise broken is the one the bug breaks (so a bug is not "caught" by an
unrelated failure).  ``-s`` prints how many seeds each took.

Under ``-m sim``, Hypothesis also shrinks a failing plan for each bug, to show how
short a trace it gets to.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, find, settings

from .__main__ import replay_command
from .bugs import BUGS
from .checks import violations
from .plan import Plan
from .test_sim import plans
from .world import simulate

#: Seeds tried per bug before the test gives up on the checker.
SEEDS_ALLOWED = 60

#: What each bug must be caught as (substrings of the broken promise, any of them).
SYMPTOM = {
    "claim-without-lease": ("claims still running", "never ended"),
    "unknown-cursor-from-head": ("hostile past-the-head", "hostile unknown-epoch"),
    "lease-ignored": ("never ended", "claims still running"),
    # a session served to another principal; or clients that cannot work at all
    "identity-from-connection": ("ran in session", "of its"),
}


def test_every_bug_has_a_symptom() -> None:
    assert set(SYMPTOM) == set(BUGS)


def first_catch(bug: str, seeds: range) -> tuple[int, list[str]] | None:
    """The first seed whose run, with ``bug`` on, breaks a promise; and what broke."""
    for seed in seeds:
        broken = violations(simulate(Plan.from_seed(seed, (bug,))))
        if broken:
            return seed, broken
    return None


@pytest.mark.parametrize("bug", sorted(BUGS))
def test_the_simulator_catches(bug: str) -> None:
    caught = first_catch(bug, range(SEEDS_ALLOWED))
    assert caught is not None, f"{bug}: no seed of {SEEDS_ALLOWED} broke a promise"
    seed, broken = caught
    assert any(s in line for s in SYMPTOM[bug] for line in broken), (seed, broken)
    print(f"{bug}: caught by seed {seed} ({seed + 1} runs): {broken[0]}")


@pytest.mark.sim
@pytest.mark.parametrize("bug", sorted(BUGS))
def test_a_caught_bug_shrinks_to_a_short_trace(bug: str) -> None:
    def breaks(plan: Plan) -> bool:
        broken = violations(simulate(plan))
        return any(s in line for s in SYMPTOM[bug] for line in broken)

    smallest = find(
        plans((bug,)),
        breaks,
        settings=settings(max_examples=200, deadline=None, suppress_health_check=list(HealthCheck)),
    )
    out = simulate(smallest)
    print(f"\n{bug}: {len(out.trace)} trace lines, {replay_command(smallest)}")
    print("\n".join(out.trace))
    assert len(smallest.clients) <= 3
