"""Simulated clients: weir's own client in both eras, and a hostile one.

Theory of operation
-------------------
A well-behaved client is weir's real client (:func:`weir.engine.client.open_session`
for the session era, :func:`~weir.engine.client.open_client` sessionless), dialing
the simulated gateway -- the network stands in for TCP -- with its idempotency keys
and backoff jitter drawn from the world's seeded source.  It resumes with
``Last-Event-ID``, re-sends a keyed call after a dropped connection, backs off on 429
and 503 and rebinds on ``channel_unbound`` exactly as it does for a user.  It makes
``calls`` calls of ``charge`` one after another, each with a run-unique tag (a fifth
of them it abandons after a short wait, as a user's own timeout does, and re-issues
with the same idempotency key), and records for each how it ended
(:class:`CallRecord`): the answer, or the refusal's reason.  A session that is gone
(404) is replaced by a new one, as the official
SDK's client re-initializes.

A hostile client (:func:`hostile`) dials replicas directly and tries what the world
lets it see: another principal's session ids and stream cursors under its own
token, and forged tokens.  Every answer it gets is recorded; anything but a refusal
is a violation.

The run's checks (``tests.sim.checks``) read the records afterwards.
"""

from __future__ import annotations

import contextlib
import random
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field

import h11
import trio

from weir.engine.client import (
    CallTrace,
    RetryPolicy,
    SessionClient,
    SessionlessClient,
    WeirError,
    open_client,
    open_session,
)

from .net import DIALER, Network

URL = "http://127.0.0.1:8000/mcp"
#: A call must end (answer or refusal) within this many virtual seconds.
CALL_BOUND = 600.0
#: How often a client abandons a call after a short wait, then re-issues it.
IMPATIENT = 0.2


@dataclass
class CallRecord:
    """How one call ended."""

    client: str
    tag: str
    started: float
    ended: float = -1.0
    answer: str | None = None
    is_error: bool = False
    refusal: str | None = None
    trace: CallTrace = field(default_factory=CallTrace)


@dataclass
class ClientPlan:
    """One client: its name (also its principal), era and number of calls."""

    name: str
    era: str  # "session" or "sessionless"
    calls: int


async def well_behaved(
    plan: ClientPlan,
    rng: random.Random,
    records: list[CallRecord],
    note: Callable[[str], None],
) -> None:
    """Run ``plan`` with weir's client (see the module docstring)."""
    DIALER.set(plan.name)
    keys = random.Random(rng.getrandbits(64))
    jitter = random.Random(rng.getrandbits(64))
    impatience = random.Random(rng.getrandbits(64))

    def key() -> str:
        return f"{plan.name}-{keys.getrandbits(64):016x}"

    retry = RetryPolicy(max_attempts=8, base_delay=0.2, max_delay=5.0)
    done = 0
    sessions = 0
    while done < plan.calls and sessions < plan.calls + 3:
        sessions += 1
        try:
            opened: AbstractAsyncContextManager[SessionClient | SessionlessClient]
            if plan.era == "session":
                opened = open_session(
                    URL, timeout=20.0, retry=retry, key_factory=key, rng=jitter.random
                )
            else:
                opened = open_client(
                    URL,
                    mode="sessionless",
                    timeout=20.0,
                    retry=retry,
                    key_factory=key,
                    rng=jitter.random,
                )
            async with opened as client:
                while done < plan.calls:
                    tag = f"{plan.name}:{done}"
                    rec = CallRecord(plan.name, tag, trio.current_time())
                    records.append(rec)
                    done += 1
                    k = key()
                    if impatience.random() < IMPATIENT:
                        # A user's own timeout, shorter than the call: abandon it
                        # (the connection goes), then re-issue it with the same key.
                        # Half of them go at once (a client cut right after sending).
                        patience = impatience.choice((0.05, 2.0)) * impatience.random()
                        with trio.move_on_after(patience) as waited:
                            with contextlib.suppress(WeirError):
                                await client.call_tool("charge", {"tag": tag}, idempotency_key=k)
                        if waited.cancelled_caught:
                            note(f"{tag}: abandoned by its client, re-issued")
                    with trio.move_on_after(CALL_BOUND):
                        try:
                            result = await client.call_tool(
                                "charge", {"tag": tag}, idempotency_key=k, trace=rec.trace
                            )
                            texts = [getattr(c, "text", "") for c in result.content]
                            rec.answer = " ".join(texts)
                            rec.is_error = bool(result.is_error)
                        except WeirError as exc:
                            rec.refusal = exc.reason or type(exc).__name__
                            note(f"{tag}: refused {rec.refusal}")
                        rec.ended = trio.current_time()
                    if rec.refusal in ("session_not_found", "SessionGone"):
                        break  # a new session, as the SDK's client re-initializes
        except WeirError as exc:
            note(f"{plan.name}: session ended: {exc.reason or type(exc).__name__} {exc}")
            await trio.sleep(1.0)


@dataclass
class HostileRecord:
    """What the hostile client tried and what it got."""

    attempt: str
    status: int
    body: bytes


async def _raw(
    net: Network, replica: str, method: str, headers: list[tuple[str, str]], body: bytes = b""
) -> tuple[int, bytes]:
    """One request straight to ``replica``; (status, body), (0, b"") if it failed."""
    try:
        stream = await net.connect(replica, "mallory")
    except OSError:
        return 0, b""
    conn = h11.Connection(h11.CLIENT)
    hdrs = [("host", "127.0.0.1:8000"), ("content-length", str(len(body))), *headers]
    status, got = 0, bytearray()
    with trio.move_on_after(5.0):
        try:
            await stream.send_all(
                conn.send(h11.Request(method=method, target="/mcp", headers=hdrs)) or b""
            )
            await stream.send_all((conn.send(h11.Data(data=body)) or b"") if body else b"")
            await stream.send_all(conn.send(h11.EndOfMessage()) or b"")
            while True:
                event = conn.next_event()
                if event is h11.NEED_DATA:
                    conn.receive_data(await stream.receive_some(65536))
                elif isinstance(event, h11.Response):
                    status = event.status_code
                elif isinstance(event, h11.Data):
                    got += event.data
                else:
                    break
        except (trio.BrokenResourceError, trio.ClosedResourceError, h11.ProtocolError):
            pass
    await stream.aclose()
    return status, bytes(got)


async def hostile(
    net: Network,
    replicas: list[str],
    targets: Callable[[], list[tuple[str, str, str]]],
    rng: random.Random,
    tries: int,
    out: list[HostileRecord],
) -> None:
    """Mallory: a session of her own, then ``tries`` attempts at what she should not
    get -- cursors of her own stream that do not exist (past its head, an epoch never
    allocated), other principals' session ids and cursors under her token, forged
    tokens.  ``targets()`` is what leaked: (principal, session id, cursor)."""
    DIALER.set("mallory")
    own: tuple[str, str, str | None] | None = None  # (epoch, session id, channel token)
    head = 0
    try:
        async with open_session(
            URL,
            timeout=20.0,
            key_factory=lambda: f"mallory-{rng.getrandbits(64):016x}",
            rng=rng.random,
        ) as mine:
            trace = CallTrace()
            await mine.call_tool("charge", {"tag": "mallory:0"}, trace=trace)
            if trace.observed_events and mine.session_id:
                _, epoch, head = trace.observed_events[-1]
                own = (epoch, mine.session_id, mine.channel_token)
            for _ in range(tries):
                await trio.sleep(rng.uniform(0.5, 5.0))
                kinds = ["their-session", "their-cursor", "forged-token"]
                kinds += ["past-the-head", "unknown-epoch"] if own else []
                kind = rng.choice(kinds)
                leaked = [t for t in targets() if t[0] != "mallory"]
                victim, sid, cursor = rng.choice(leaked) if leaked else ("nobody", "", "")
                token = f"forged-{victim}" if kind == "forged-token" else "tok-mallory"
                headers = [
                    ("mcp-protocol-version", "2025-11-25"),
                    ("accept", "text/event-stream"),
                    ("authorization", f"Bearer {token}"),
                ]
                if own and kind in ("past-the-head", "unknown-epoch"):
                    epoch, sid, channel = own
                    if channel:
                        headers.append(("mcp-channel-token", channel))
                    forged = f"{epoch}:{head + 7}"
                    if kind == "unknown-epoch":
                        forged = f"{int(epoch, 16) ^ 0x5A5A5A5A:08x}:1"
                    cursor = forged
                if not sid:
                    continue
                headers.append(("mcp-session-id", sid))
                if cursor:
                    headers.append(("last-event-id", cursor))
                replica = rng.choice(replicas)
                status, body = await _raw(net, replica, "GET", headers)
                out.append(HostileRecord(f"{kind} ({victim}) on {replica}", status, body))
    except WeirError:
        pass  # her own session failed (a fault): nothing to try
