"""A GET tailing from the shared store a call that runs on the other runtime.

Both runtimes serve a cursor another replica issued from the store
(:class:`weir.protocol.resume.StoreTail`): they replay the stored events, then poll
for the live ones until the final event.  Two of the tail's effects change nothing
in what the client reads while the producer is healthy, so these tests look
elsewhere:

* **Pacing** (``TailPause``): while the store has nothing new the tail waits between
  reads (10 ms doubling to 250 ms).  Without the wait it reads the store in a busy
  loop -- the answer is the same, the store takes thousands of reads.  Counted
  here with Valkey's own ``INFO commandstats``: every read of a stored stream runs
  ``XRANGE`` in its script, and nothing else the replicas do then does.
* **A dead producer is noticed** (``ExpireClaim``): the producing replica is
  SIGKILLed mid-call; once its claim's lease (``--claim-lease 2``) has run out,
  the tail asks the store to expire it, and the call's ``interrupted`` outcome
  arrives as the stream's final event -- seconds after the kill, not at the
  tail's give-up (ten liveness timeouts: 600 s).

Real ``weir serve`` processes (one per runtime) on one Valkey, real sockets; the
stream's cursor is its priming event (2025-11-25), so the call needs to say nothing
before its response.  Every wait is bounded.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import coredis
import h11
import pytest
import trio

from weir.protocol._resume import StoreTail

from .rawhttp import Client, raw_request
from .test_channel_runtimes import HDR, INIT
from .test_mixed_replicas import charge, initialize, ledger, replicas

#: How long the tailed call runs (the tail's reads are counted over it).
CALL_SECONDS = 1.5
#: Seconds from the SIGKILL within which the tail ends: the lease (2 s), the tail's
#: first check after a lease of silence and the next, half a lease later, and slack.
KILL_BOUND = 10.0


async def open_session(c: Client) -> str:
    """A 2025-11-25 session on ``c`` (its streams open with a priming event)."""
    return await initialize(c, INIT, HDR)


def events_of(body: bytes) -> list[dict[str, str]]:
    """The complete events of an SSE body (their ``id`` and ``data`` fields; a
    priming event has an id and empty data)."""
    found = []
    for block in body.decode().replace("\r\n", "\n").split("\n\n")[:-1]:
        fields: dict[str, str] = {}
        for line in block.split("\n"):
            name, _, value = line.partition(":")
            if name in ("id", "data", "retry"):
                fields[name] = value.removeprefix(" ")
        if fields:
            found.append(fields)
    return found


async def _call_started(c: Client, sid: str, rid: int, key: str, seconds: float) -> str:
    """POST ``charge`` on ``c`` (streamed) and read until its stream's priming event:
    that event's id (the cursor of a stream that said nothing yet)."""
    body = json.dumps(charge(rid, key, seconds)).encode()
    await c.send_raw(raw_request("POST", "/mcp", body=body, headers={"mcp-session-id": sid, **HDR}))
    conn = c.h11
    conn.send(h11.Request(method="POST", target="/", headers=[("host", "x")]))
    conn.send(h11.EndOfMessage())
    buf = b""
    for _ in range(10_000):
        with_id = [e for e in events_of(buf) if e.get("id")]
        if with_id:
            return with_id[0]["id"]
        event = conn.next_event()
        if event is h11.NEED_DATA:
            conn.receive_data(bytes(await c.stream.receive_some(65536)))
        elif isinstance(event, h11.Response):
            assert event.status_code == 200, event
            headers = {k.decode().lower(): v.decode() for k, v in event.headers}
            assert headers["content-type"].startswith("text/event-stream"), headers
        elif isinstance(event, h11.Data):
            buf += bytes(event.data)
        elif isinstance(event, h11.EndOfMessage | h11.ConnectionClosed):
            break
    raise AssertionError(f"the call's stream ended before its priming event: {buf!r}")


async def _store_reads(valkey_url: str) -> int:
    """``XRANGE`` commands Valkey has run so far (one or two per read of a stored
    stream, inside its script; nothing else the replicas do runs it)."""
    async with coredis.Redis.from_url(valkey_url, decode_responses=True) as raw:
        stats: dict[str, Any] = await raw.info("commandstats")
    entry = stats.get("cmdstat_xrange")
    return int(entry["calls"]) if entry else 0


async def _until_started(tmp_path: Path, key: str) -> None:
    for _ in range(1_000):
        if any(line.startswith(f"start {key} ") for line in ledger(tmp_path)):
            return
        await trio.sleep(0.02)
    raise AssertionError(f"{key} never started: {ledger(tmp_path)}")


def _other(runtime: str) -> str:
    return "asyncio" if runtime == "trio" else "trio"


@pytest.mark.parametrize("producer", ["trio", "asyncio"])
async def test_a_tail_waits_between_its_reads_of_the_store(
    producer: str, valkey_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A GET on the other runtime tails a call that stays silent for 1.5 s: it is
    answered with the call's response as the final event, and it read the store a
    few times over those seconds -- at most as often as the backoff allows (10 ms
    doubling to 250 ms: 5 reads in the first 310 ms, then one per 250 ms), never in
    a busy loop."""
    resumer = _other(producer)
    with replicas(valkey_url, tmp_path, monkeypatch) as procs, trio.fail_after(60):
        c = await Client.connect(procs[producer].port)
        sid = await open_session(c)
        cursor = await _call_started(c, sid, 3, "paced", CALL_SECONDS)
        await _until_started(tmp_path, "paced")
        await c.aclose()  # the call runs on; its response goes to the store
        r = await Client.connect(procs[resumer].port)
        headers = {**HDR, "accept": "text/event-stream", "last-event-id": cursor}
        before, began = await _store_reads(valkey_url), trio.current_time()
        tailed = await r.request("GET", "/mcp", session=sid, headers=headers, timeout=20)
        elapsed = trio.current_time() - began
        reads = await _store_reads(valkey_url) - before
        await r.aclose()
        assert tailed.status == 200, tailed
        final = json.loads(events_of(tailed.body)[-1]["data"])
        assert final["id"] == 3 and final["result"]["content"][0]["text"] == "charged paced"
        # The reads the backoff allows over ``elapsed`` seconds: the first, one after
        # each pause shorter than the longest (10, 20, 40, 80, 160 ms), one per longest
        # pause, and the last -- each one XRANGE, two when it finds events -- plus
        # slack.  (A busy loop reads thousands of times in as long.)
        short = math.ceil(math.log2(StoreTail.MAX_POLL / StoreTail.FIRST_POLL))
        bound = 2 * (1 + short + math.ceil(elapsed / StoreTail.MAX_POLL) + 1) + 4
        assert reads <= bound, (reads, bound, elapsed)


@pytest.mark.parametrize("killed", ["trio", "asyncio"])
async def test_a_tail_ends_interrupted_once_the_dead_producers_lease_ran_out(
    killed: str, valkey_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SIGKILL the replica running a call (30 s long) whose stream a GET on the other
    runtime then tails: once the claim's lease (2 s) has run out, the tail expires it
    and ends with the call's ``interrupted`` error as its final event -- within
    seconds of the kill, far below the tail's give-up (600 s) -- and the call never
    ran again."""
    survivor = _other(killed)
    with replicas(valkey_url, tmp_path, monkeypatch) as procs, trio.fail_after(60):
        c = await Client.connect(procs[killed].port)
        sid = await open_session(c)
        cursor = await _call_started(c, sid, 7, "doomed", 30.0)
        await _until_started(tmp_path, "doomed")
        procs[killed].proc.kill()  # SIGKILL: no outcome recorded, only the lease tells
        procs[killed].proc.wait()
        await c.aclose()
        killed_at = trio.current_time()
        r = await Client.connect(procs[survivor].port)
        headers = {**HDR, "accept": "text/event-stream", "last-event-id": cursor}
        tailed = None
        with trio.move_on_after(KILL_BOUND):  # (the give-up is 600 s away)
            tailed = await r.request("GET", "/mcp", session=sid, headers=headers, timeout=60)
        await r.aclose()
        assert tailed is not None, f"the tail did not end within {KILL_BOUND} s of the kill"
        assert tailed.status == 200, tailed
        final = json.loads(events_of(tailed.body)[-1]["data"])
        assert final["id"] == 7 and final["error"]["data"]["reason"] == "interrupted", final
        assert trio.current_time() - killed_at < KILL_BOUND
        assert [line.split()[:2] for line in ledger(tmp_path)] == [["start", "doomed"]]
