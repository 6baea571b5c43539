"""What one simulated run does: its clients, its faults, its seed -- a :class:`Plan`.

Theory of operation
-------------------
A plan is plain data, printable as one line of JSON, so any run can be replayed
exactly (``python -m tests.sim --plan '<json>'``).  It fixes the coarse choices --
how many clients of each era, how many calls each, which replica is killed or shut
down when, when the store goes away -- and a ``seed`` from which every fine choice is
drawn as the run goes (latencies, which replica the gateway picks, store faults,
idempotency keys, backoff jitter, the order Trio runs ready tasks in).

:meth:`Plan.from_seed` draws a whole plan from one integer: the fixed seeds CI runs
and the thousands the ``sim`` marker runs.  Hypothesis builds plans too
(``tests.sim.test_sim``), and shrinks a failing one to fewer clients, calls and
faults, which is what makes a failure's trace short.
"""

from __future__ import annotations

import json
import random
from dataclasses import asdict, dataclass, field

from .clients import ClientPlan

#: Kinds of fault the chaos schedule injects.
KILL = "kill"  # hard: the replica stops mid-instruction, no code of it runs again
STOP = "stop"  # graceful: shutdown(), drain, then exit
OUTAGE = "outage"  # the store refuses every operation for ``length`` seconds
PARTITION = "partition"  # the gateway cannot reach the replica for ``length`` seconds


@dataclass(frozen=True)
class Fault:
    """At ``at`` seconds, do ``kind`` to replica ``target`` for ``length`` seconds
    (a killed or stopped replica restarts after ``length``)."""

    at: float
    kind: str
    target: int
    length: float


@dataclass(frozen=True)
class Plan:
    """One run (see the module docstring)."""

    seed: int
    replicas: int = 3
    clients: tuple[ClientPlan, ...] = ()
    faults: tuple[Fault, ...] = ()
    #: Probability knobs of the store model and the network (0: never).
    store_latency: float = 0.0
    store_timeout_after_apply: float = 0.0
    store_lost_reply: float = 0.0
    net_latency: float = 0.0
    net_cut: float = 0.0
    #: Chance per connection that its client stops reading for 30 s (half-open).
    net_stall: float = 0.0
    hostile_tries: int = 0
    #: Bugs deliberately switched on (``tests.sim.bugs``), to show the checks catch them.
    bugs: tuple[str, ...] = field(default=())

    def to_json(self) -> str:
        """One line that :meth:`from_json` turns back into this plan."""
        return json.dumps(asdict(self), separators=(",", ":"), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> Plan:
        raw = json.loads(text)
        raw["clients"] = tuple(ClientPlan(**c) for c in raw.get("clients", ()))
        raw["faults"] = tuple(Fault(**f) for f in raw.get("faults", ()))
        raw["bugs"] = tuple(raw.get("bugs", ()))
        return cls(**raw)

    @classmethod
    def from_seed(cls, seed: int, bugs: tuple[str, ...] = ()) -> Plan:
        """A whole plan drawn from ``seed`` (see the module docstring)."""
        rng = random.Random(seed)
        replicas = rng.choice((2, 3, 3, 4))
        clients = tuple(
            ClientPlan(f"c{i}", rng.choice(("session", "sessionless")), rng.randint(1, 6))
            for i in range(rng.randint(2, 6))
        )
        faults = []
        for _ in range(rng.randint(0, 4)):
            kind = rng.choice((KILL, KILL, STOP, OUTAGE, PARTITION))
            faults.append(
                Fault(
                    round(rng.uniform(0.0, 20.0), 3),
                    kind,
                    rng.randrange(replicas),
                    round(rng.uniform(0.5, 8.0), 3),
                )
            )
        return cls(
            seed=seed,
            replicas=replicas,
            clients=clients,
            faults=tuple(sorted(faults, key=lambda f: f.at)),
            store_latency=rng.choice((0.0, 0.002, 0.02)),
            store_timeout_after_apply=rng.choice((0.0, 0.0, 0.01)),
            store_lost_reply=rng.choice((0.0, 0.0, 0.01)),
            net_latency=rng.choice((0.0, 0.001, 0.01)),
            net_cut=rng.choice((0.0, 0.0, 0.002, 0.01)),
            net_stall=rng.choice((0.0, 0.0, 0.02)),
            hostile_tries=rng.choice((0, 3)),
            bugs=bugs,
        )
