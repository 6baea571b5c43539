"""One simulated weir cluster, run from a :class:`~tests.sim.plan.Plan` on virtual time.

Theory of operation
-------------------
:func:`simulate` runs a whole cluster in one process and one ``trio.run``: the
replicas are real :class:`weir.engine.Server` objects serving the core's courses,
on a shared store model, behind the retrying gateway, driven by weir's own
clients, over the simulated network.  Nothing in it is left to the machine:

* **time** is Trio's ``MockClock`` jumping ahead whenever every task waits, so a
  minute of cluster time costs what its events cost, and no run depends on how
  loaded the machine is;
* **order**: Trio runs ready tasks in an order drawn from its own random source,
  which is seeded from the plan (Hypothesis' presence makes that order a
  function of the source alone);
* **every other choice** -- ids and secrets weir mints (``secrets`` is replaced for
  the run), latencies, the gateway's picks, store faults, idempotency keys, backoff
  jitter -- comes from generators split off the plan's seed, one per component, so
  a change in one component's draws does not shift another's.

So a plan replays exactly: same trace, same outcome (``tests.sim.test_sim`` checks
that by running one twice and comparing the traces' digests).

A **hard kill** fences the replica's store handle first (nothing it does afterwards
reaches the store), takes its name off the network (every connection is reset),
then cancels it: whatever cleanup code runs while it unwinds changes nothing
anyone else can see, which is what ``kill -9`` means.  A restart is a new
``Server`` with the same replica id on a new handle.  A **graceful stop** calls
``shutdown()`` and waits for it to drain.

The checks (:mod:`tests.sim.checks`) run on what the world recorded, at the end.
"""

from __future__ import annotations

import base64
import hashlib
import logging
import random
import secrets
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import trio
import trio.testing

from weir.engine import Authorization, Server, ServerConfig
from weir.engine._store_errors import StoreUnavailable
from weir.protocol import CreditLimits
from weir.protocol._credit import SessionCredit

from . import bugs as bug_switches
from .app import Ledger, SimVerifier, make_app
from .clients import CallRecord, HostileRecord, hostile, well_behaved
from .gateway import Gateway, GatewayConfig
from .net import NetFaults, Network
from .plan import KILL, OUTAGE, PARTITION, STOP, Fault, Plan
from .store import SimStore, StoreFaults, StoreHandle

#: Cluster time allowed for the clients' work (virtual seconds); then the run ends.
RUN_BOUND = 3600.0
#: After the clients finish: long enough for every lease and idle timeout to run out.
SETTLE = 300.0

#: Caps small enough that the clients' streams reach them (a call's stream carries
#: its progress and its answer, about 150 bytes a frame), so credit waits, and
#: retained history is shed, in ordinary runs.
CREDIT = CreditLimits(frames=2, bytes=512, drain_window=5.0, liveness_timeout=10.0)
REPLICA_CONFIG = dict(
    session_idle_timeout=120.0,
    claim_lease=5.0,
    in_progress_wait=2.0,
    shutdown_grace=2.0,
    retry_ms=200,
    sse_keepalive=5.0,
    credit=CREDIT,
    session_retain_bytes=1024,
    memory_budget=2048,
)
#: How often (virtual seconds) the caps watcher looks at every replica.
WATCH_EVERY = 0.1


@dataclass
class Replica:
    """One replica's current incarnation."""

    name: str
    server: Server | None = None
    handle: StoreHandle | None = None
    scope: trio.CancelScope = field(default_factory=trio.CancelScope)
    incarnation: int = 0


@dataclass
class Outcome:
    """What a run recorded, for the checks and the report."""

    plan: Plan
    trace: list[str]
    ledger: Ledger
    calls: list[CallRecord]
    hostile: list[HostileRecord]
    store: SimStore
    servers: list[Server]
    ended_at: float
    #: When replicas were hard-killed (virtual times).
    hard_kills: list[float]
    #: Every session's drain credit the watcher saw, named ``replica session``.
    credits: list[tuple[str, SessionCredit]]
    #: Over-cap retention the watcher saw while the run went on.
    retention_over: list[str]

    def digest(self) -> str:
        """A short hash of the trace: equal for two runs of one plan."""
        return hashlib.sha256("\n".join(self.trace).encode()).hexdigest()[:16]


class World:
    """The cluster of one run (see the module docstring)."""

    def __init__(self, plan: Plan, seeds: random.Random) -> None:
        self.plan = plan
        self.trace: list[str] = []
        self.ledger = Ledger()
        self.calls: list[CallRecord] = []
        self.hostile: list[HostileRecord] = []
        self.rng_chaos = random.Random(seeds.getrandbits(64))
        self.rng_clients = random.Random(seeds.getrandbits(64))
        self.net = Network(
            random.Random(seeds.getrandbits(64)),
            NetFaults(latency=plan.net_latency, cut=plan.net_cut, stall=plan.net_stall),
            self.note,
        )
        self.store = SimStore(clock=trio.current_time)
        self.store_faults = StoreFaults(
            latency=plan.store_latency,
            timeout_after_apply=plan.store_timeout_after_apply,
            lost_reply=plan.store_lost_reply,
        )
        self.rng_store = random.Random(seeds.getrandbits(64))
        self.replicas = [Replica(f"replica-{chr(97 + i)}") for i in range(plan.replicas)]
        self.gateway = Gateway(
            self.net,
            [r.name for r in self.replicas],
            random.Random(seeds.getrandbits(64)),
            GatewayConfig(),
            self.note,
        )
        self.app = make_app(self.ledger, self.store)
        self.all_servers: list[Server] = []
        self.hard_kills: list[float] = []
        self.credits: dict[int, tuple[str, SessionCredit]] = {}
        self.retention_over: list[str] = []
        self.nursery: trio.Nursery | None = None

    def note(self, what: str) -> None:
        """Add a line to the run's trace (with the virtual time)."""
        self.trace.append(f"{trio.current_time():10.3f} {what}")

    # ------------------------------------------------------------ replicas
    def _config(self, name: str) -> ServerConfig:
        auth = Authorization(verifier=SimVerifier(), resource="http://127.0.0.1:8000/mcp")
        return ServerConfig(replica_id=name, auth=auth, **REPLICA_CONFIG)  # type: ignore[arg-type]

    async def start(self, r: Replica) -> None:
        """Start a new incarnation of ``r``."""
        assert self.nursery is not None
        r.incarnation += 1
        r.handle = StoreHandle(
            self.store,
            random.Random(self.rng_store.getrandbits(64)),
            self.store_faults,
            name=f"{r.name}#{r.incarnation}",
        )
        for attempt in range(1, 1000):  # as a process manager restarts a failed start
            r.server = Server(self.app, self._config(r.name), store=r.handle)
            self.all_servers.append(r.server)
            r.scope = trio.CancelScope()
            failed = False
            try:
                await self.nursery.start(self._run_replica, r, r.server, r.scope)
            except* StoreUnavailable:
                failed = True
            if failed:
                self.note(f"{r.name} failed to start: store unavailable")
                await trio.sleep(min(30.0, 0.5 * attempt))
                continue
            self.note(f"{r.name} started (incarnation {r.incarnation})")
            return
        raise AssertionError(f"{r.name} never started")

    async def _run_replica(
        self,
        r: Replica,
        server: Server,
        scope: trio.CancelScope,
        task_status: trio.TaskStatus[None],
    ) -> None:
        with scope:
            async with trio.open_nursery() as conns:
                await conns.start(partial(server.run, listen=False))
                self.net.listen(r.name, server.serve_connection, conns)
                task_status.started()
                await server.stopped.wait()
                conns.cancel_scope.cancel()

    def kill(self, r: Replica) -> None:
        """``kill -9`` (see the module docstring)."""
        if r.handle is not None:
            r.handle.fence()
        self.net.down(r.name)
        r.scope.cancel()
        self.hard_kills.append(trio.current_time())
        self.note(f"{r.name} killed")

    async def stop(self, r: Replica) -> None:
        """A graceful shutdown: drain, then exit."""
        if r.server is None:
            return
        r.server.shutdown()
        self.note(f"{r.name} shutting down")
        with trio.move_on_after(60.0):
            await r.server.stopped.wait()
        self.net.down(r.name)
        r.scope.cancel()
        self.note(f"{r.name} stopped")

    # ------------------------------------------------------------ chaos
    async def chaos(self, start: float) -> None:
        """Inject the plan's faults at their times."""
        for fault in self.plan.faults:
            await trio.sleep_until(start + fault.at)
            self.nursery_start(self._fault, fault)

    def nursery_start(self, fn: Callable[..., object], *args: object) -> None:
        assert self.nursery is not None
        self.nursery.start_soon(fn, *args)  # type: ignore[arg-type]

    async def _fault(self, fault: Fault) -> None:
        r = self.replicas[fault.target % len(self.replicas)]
        if fault.kind == OUTAGE:
            self.note(f"store outage for {fault.length:g} s")
            self.store.outage(trio.current_time() + fault.length)
            return
        if fault.kind == PARTITION:
            self.note(f"{r.name} partitioned for {fault.length:g} s")
            self.net.partition(r.name, fault.length)
            return
        if r.server is None or r.server.stopped.is_set():
            return  # already down
        if fault.kind == KILL:
            self.kill(r)
        elif fault.kind == STOP:
            await self.stop(r)
        await trio.sleep(fault.length)
        await self.start(r)

    # ------------------------------------------------------------ caps
    async def watch_caps(self) -> None:
        """Keep every session's credit (its peaks are kept by the credit itself,
        exactly), and check each live replica's retention: it may be over its total
        only by the unacknowledged bytes its live streams hold, which cannot be shed."""
        while True:
            for server in self.all_servers:
                if server.stopped.is_set():
                    continue
                pinned = 0
                for sid, session in list(server.sessions.items()):
                    credit = session.credit
                    self.credits.setdefault(id(credit), (f"{server.replica_id} {sid}", credit))
                    pinned += credit.held_bytes
                budget = server.budget
                if budget.held > budget.total + pinned and len(self.retention_over) < 10:
                    self.retention_over.append(
                        f"{trio.current_time():.3f} {server.replica_id}: retention "
                        f"{budget.held} > {budget.total} + {pinned} pinned by live streams"
                    )
            await trio.sleep(WATCH_EVERY)

    # ------------------------------------------------------------ run
    def leaked(self) -> list[tuple[str, str, str]]:
        """What a hostile client could have learned: (principal, session id, cursor)."""
        out = []
        for rec in self.calls:
            events = rec.trace.observed_events
            if events:
                _, epoch, seq = events[-1]
                out.append((rec.client, "", f"{epoch}:{seq}"))
        for r in self.replicas:
            for sid, session in list(r.server.sessions.items()) if r.server else ():
                out.append((session.record.principal, sid, ""))
        return out

    async def main(self) -> None:
        async with trio.open_nursery() as nursery:
            self.nursery = nursery
            for r in self.replicas:
                await self.start(r)
            self.net.listen("gateway", self.gateway.serve, nursery)
            nursery.start_soon(self.watch_caps)
            start = trio.current_time()
            nursery.start_soon(self.chaos, start)
            with trio.move_on_after(RUN_BOUND):
                async with trio.open_nursery() as clients:
                    for plan in self.plan.clients:
                        rng = random.Random(self.rng_clients.getrandbits(64))
                        clients.start_soon(well_behaved, plan, rng, self.calls, self.note)
                    if self.plan.hostile_tries:
                        names = [r.name for r in self.replicas]
                        rng = random.Random(self.rng_clients.getrandbits(64))
                        clients.start_soon(
                            hostile,
                            self.net,
                            names,
                            self.leaked,
                            rng,
                            self.plan.hostile_tries,
                            self.hostile,
                        )
            self.note("clients done")
            # Every fault has ended and every replica is back; let leases and idle
            # timeouts run out.
            last = max((f.at + f.length for f in self.plan.faults), default=0.0)
            await trio.sleep_until(max(trio.current_time(), start + last + 60.0))
            await trio.sleep(SETTLE)
            self.note("settled")
            nursery.cancel_scope.cancel()


@contextmanager
def _deterministic(seed: int, net: Network) -> Iterator[None]:
    """Seed Trio's scheduler, replace ``secrets`` and ``trio.open_tcp_stream`` for the run."""
    rng = random.Random(seed)
    saved = (secrets.token_bytes, secrets.token_hex, secrets.token_urlsafe, trio.open_tcp_stream)

    def token_bytes(nbytes: int | None = None) -> bytes:
        return rng.randbytes(32 if nbytes is None else nbytes)

    def token_hex(nbytes: int | None = None) -> str:
        return token_bytes(nbytes).hex()

    def token_urlsafe(nbytes: int | None = None) -> str:
        return base64.urlsafe_b64encode(token_bytes(nbytes)).rstrip(b"=").decode("ascii")

    run: Any = trio._core._run
    deterministic = run._ALLOW_DETERMINISTIC_SCHEDULING
    # Ready tasks run in an order drawn from ``_r`` alone (not from the order in
    # which they were woken, which can follow object addresses); Hypothesis turns
    # the same switch on when it is imported.
    run._ALLOW_DETERMINISTIC_SCHEDULING = True
    run._r.seed(seed)
    secrets.token_bytes, secrets.token_hex, secrets.token_urlsafe = (
        token_bytes,
        token_hex,
        token_urlsafe,
    )
    trio.open_tcp_stream = net.open_tcp_stream  # type: ignore[assignment]
    try:
        yield
    finally:
        secrets.token_bytes, secrets.token_hex, secrets.token_urlsafe, trio.open_tcp_stream = saved
        run._ALLOW_DETERMINISTIC_SCHEDULING = deterministic


class _Crashes(logging.Handler):
    """Keeps what weir logged at ERROR: a traceback in a run is a broken promise."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.seen: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        kind = record.exc_info[1].__class__.__name__ if record.exc_info else ""
        self.seen.append(f"weir logged an error: {record.getMessage()} {kind}".rstrip())


@contextmanager
def _logs() -> Iterator[list[str]]:
    """weir's log records stay in the run (not on stderr); errors are kept."""
    logger = logging.getLogger("weir")
    handler = _Crashes()
    saved = logger.propagate, logger.handlers[:], logger.level
    logger.handlers, logger.propagate = [handler], False
    logger.setLevel(logging.WARNING)
    try:
        yield handler.seen
    finally:
        logger.propagate, logger.handlers = saved[0], saved[1]
        logger.setLevel(saved[2])


def simulate(plan: Plan) -> Outcome:
    """Run ``plan`` to its end on virtual time; what it recorded."""
    seeds = random.Random(plan.seed)
    holder: list[World] = []

    async def main() -> None:
        world = World(plan, seeds)
        holder.append(world)
        with bug_switches.switched_on(plan.bugs):
            await world.main()

    clock = trio.testing.MockClock(autojump_threshold=0)
    with _deterministic(seeds.getrandbits(64), _LazyNet(holder)), _logs() as crashes:
        trio.run(main, clock=clock)
    world = holder[0]
    world.ledger.violations += crashes
    return Outcome(
        plan,
        world.trace,
        world.ledger,
        world.calls,
        world.hostile,
        world.store,
        world.all_servers,
        clock.current_time(),
        world.hard_kills,
        list(world.credits.values()),
        world.retention_over,
    )


class _LazyNet(Network):
    """The network of the world being built (``trio.open_tcp_stream`` is replaced
    before the world exists)."""

    def __init__(self, holder: list[World]) -> None:
        self._holder = holder

    async def open_tcp_stream(self, host: str | bytes, port: int, **_: object) -> trio.abc.Stream:
        return await self._holder[0].net.open_tcp_stream(host, port)
