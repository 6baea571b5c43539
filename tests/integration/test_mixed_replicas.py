"""One cluster, two runtimes: a Trio replica and an asyncio replica on one Valkey.

Both are real ``weir serve`` processes (``--runtime trio`` and ``--runtime asyncio``)
serving the same app (``mixed_app``, which names no event loop) on one shared
``--store``, behind the round-robin balancer of ``test_replicas`` (every request of a
client connection goes to the other replica than the one before).  What one runtime
writes to the store, the other reads:

* a session begun on either is served by both, and deleted on one it is 404 on both;
* a call's retry on the other runtime replays its outcome (the tool ran once), in
  both directions, also while the call still runs there (the retry waits for it);
* a call whose replica is SIGKILLed mid-run is answered ``interrupted`` by the other
  runtime once the claim's lease (``--claim-lease 2``) runs out, and never runs again;
* a channel token issued by one is checked by the other, and a rebind on one fences
  the old token (409 ``cursor_stale``) and the old generation's streams on both.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any

import coredis
import h11
import pytest
import trio

from .rawhttp import Client, Reply, call, raw_request
from .serverproc import WeirProcess
from .test_channel_runtimes import HDR as CHANNEL_HDR
from .test_channel_runtimes import INIT as CHANNEL_INIT
from .test_channel_runtimes import REBIND, TOKEN, open_stream, refused, rpc, send
from .test_replicas import Balancer

APP = "tests.integration.mixed_app:app"
HDR = {"mcp-protocol-version": "2025-06-18", "accept": "application/json, text/event-stream"}
INIT = {
    "jsonrpc": "2.0",
    "id": 0,
    "method": "initialize",
    "params": {
        "protocolVersion": "2025-06-18",
        "capabilities": {},
        "clientInfo": {"name": "mixed", "version": "0"},
    },
}
NOTE = {"jsonrpc": "2.0", "method": "notifications/initialized"}


@contextmanager
def replicas(
    valkey_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[dict[str, WeirProcess]]:
    """A Trio and an asyncio ``weir serve`` on one Valkey (by runtime name)."""
    monkeypatch.setenv("WEIR_TEST_LEDGER", str(tmp_path / "ledger"))
    (tmp_path / "ledger").write_text("")
    args = ["--store", valkey_url, "--claim-lease", "2"]
    files = [(tmp_path / f"{n}.out").open("w+b") for n in range(4)]
    procs: dict[str, WeirProcess] = {}
    try:
        for n, runtime in enumerate(("trio", "asyncio")):
            extra = [*args, "--replica-id", runtime]
            procs[runtime] = WeirProcess(APP, files[2 * n], files[2 * n + 1], extra, driver=runtime)
        yield procs
    finally:
        for p in procs.values():
            p.stop()
        for f in files:
            f.close()


@asynccontextmanager
async def balanced(procs: dict[str, WeirProcess]) -> AsyncIterator[Balancer]:
    async with trio.open_nursery() as nursery:
        balancer = Balancer([procs["trio"].port, procs["asyncio"].port])
        await balancer.start(nursery)
        try:
            yield balancer
        finally:
            nursery.cancel_scope.cancel()


def runtime_of(reply: Reply, procs: dict[str, WeirProcess]) -> str:
    """Which replica the balancer sent a request to (its ``X-Upstream`` port)."""
    port = int(reply.headers["x-upstream"])
    return next(name for name, p in procs.items() if p.port == port)


def answer_of(reply: Reply) -> dict[str, Any]:
    """The JSON-RPC response in a reply (a JSON body, or an SSE stream's last message)."""
    if reply.headers.get("content-type", "").startswith("text/event-stream"):
        messages = [
            json.loads(line[5:])
            for line in reply.body.decode().splitlines()
            if line.startswith("data:") and line[5:].strip()
        ]
        found: dict[str, Any] = next(m for m in reversed(messages) if "id" in m)
        return found
    decoded: dict[str, Any] = json.loads(reply.body)
    return decoded


def ledger(tmp_path: Path) -> list[str]:
    return (tmp_path / "ledger").read_text().splitlines()


def charge(rid: int, key: str, seconds: float = 0.0) -> dict[str, Any]:
    return call(rid, "charge", {"key": key, "seconds": seconds})


async def test_a_session_and_a_call_are_one_across_runtimes(
    valkey_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Through the balancer, each request on the other runtime: the session begun on
    one is served by the other, a retry on the other runtime replays (in both
    directions: the tool ran once per key), a DELETE on one is 404 on both."""
    with replicas(valkey_url, tmp_path, monkeypatch) as procs, trio.fail_after(60):
        async with balanced(procs) as balancer:
            c = await Client.connect(balancer.port)
            init = await c.request("POST", "/mcp", INIT, headers=HDR)
            assert init.status == 200, init
            sid = init.headers["mcp-session-id"]
            began = runtime_of(init, procs)
            note = await c.request("POST", "/mcp", NOTE, session=sid, headers=HDR)
            assert note.status == 202 and runtime_of(note, procs) != began
            firsts = set()
            for n, key in enumerate(("k1", "k2")):
                hdr = {**HDR, "idempotency-key": key}
                first = await c.request(
                    "POST", "/mcp", charge(10 + n, key), session=sid, headers=hdr
                )
                retry = await c.request(
                    "POST", "/mcp", charge(10 + n, key), session=sid, headers=hdr
                )
                assert first.status == retry.status == 200, (first, retry)
                assert runtime_of(first, procs) != runtime_of(retry, procs)
                firsts.add(runtime_of(first, procs))
                assert answer_of(first) == answer_of(retry), (first.body, retry.body)
                text = answer_of(retry)["result"]["content"][0]["text"]
                assert text == f"charged {key}"
                ping = {"jsonrpc": "2.0", "id": 90 + n, "method": "ping"}  # (shifts the turn)
                assert (
                    await c.request("POST", "/mcp", ping, session=sid, headers=HDR)
                ).status == 200
            assert firsts == {"trio", "asyncio"}  # one key first ran on each runtime
            starts = [line.split()[1] for line in ledger(tmp_path) if line.startswith("start")]
            assert sorted(starts) == ["k1", "k2"]  # each ran once

            gone = await c.request("DELETE", "/mcp", session=sid, headers=HDR)
            assert gone.status == 200, gone
            for _ in range(2):  # the next request lands on one runtime, then the other
                after = await c.request("POST", "/mcp", charge(20, "k3"), session=sid, headers=HDR)
                assert after.status == 404, after
            await c.aclose()


@pytest.mark.parametrize("runs_on", ["trio", "asyncio"])
async def test_a_retry_waits_for_the_call_running_on_the_other_runtime(
    runs_on: str, valkey_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A retry arriving at the other runtime while the call runs waits for it (it is
    RUNNING in the store, owned by the other replica) and replays its outcome.  The
    call outlives its claim's lease (3 s against 2): the replica running it renews
    the lease, so the retry is not told ``interrupted``."""
    other = "asyncio" if runs_on == "trio" else "trio"
    with replicas(valkey_url, tmp_path, monkeypatch) as procs, trio.fail_after(60):
        c = await Client.connect(procs[runs_on].port)
        sid = await initialize(c)
        hdr = {**HDR, "idempotency-key": "slow"}
        body = json.dumps(charge(5, "slow", 3.0)).encode()
        await c.send_raw(
            raw_request("POST", "/mcp", body=body, headers={"mcp-session-id": sid, **hdr})
        )
        while not any(line.startswith("start slow") for line in ledger(tmp_path)):
            await trio.sleep(0.02)
        r = await Client.connect(procs[other].port)
        retried = await r.request(
            "POST", "/mcp", charge(5, "slow", 3.0), session=sid, headers=hdr, timeout=15
        )
        first = await c.read_reply(15)
        assert retried.status == first.status == 200, (first, retried)
        assert answer_of(retried) == answer_of(first)
        assert answer_of(retried)["result"]["content"][0]["text"] == "charged slow"
        assert [line.split()[0] for line in ledger(tmp_path)] == ["start", "done"]
        await c.aclose()
        await r.aclose()


@pytest.mark.parametrize("killed", ["trio", "asyncio"])
async def test_a_sigkilled_replicas_call_is_answered_interrupted_by_the_other_runtime(
    killed: str, valkey_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SIGKILL the replica running a call: nothing records an outcome there, so only
    the lease says it is gone.  The retry on the other runtime is answered
    ``interrupted`` (not 409, not a second run) once the lease has run out."""
    survivor = "asyncio" if killed == "trio" else "trio"
    with replicas(valkey_url, tmp_path, monkeypatch) as procs, trio.fail_after(60):
        c = await Client.connect(procs[killed].port)
        sid = await initialize(c)
        hdr = {**HDR, "idempotency-key": "doomed"}
        body = json.dumps(charge(7, "doomed", 30.0)).encode()
        await c.send_raw(
            raw_request("POST", "/mcp", body=body, headers={"mcp-session-id": sid, **hdr})
        )
        while not any(line.startswith("start doomed") for line in ledger(tmp_path)):
            await trio.sleep(0.02)
        procs[killed].proc.kill()  # SIGKILL: no cleanup, no outcome recorded
        procs[killed].proc.wait()
        await c.aclose()
        killed_at = trio.current_time()
        answer: Reply | None = None
        for _ in range(20):  # (a 409 in_progress within the lease: retry after it)
            r = await Client.connect(procs[survivor].port)
            answer = await r.request(
                "POST", "/mcp", charge(7, "doomed", 30.0), session=sid, headers=hdr, timeout=15
            )
            await r.aclose()
            if answer.status != 409:
                break
            await trio.sleep(0.5)
        assert answer is not None and answer.status == 200, answer
        assert answer_of(answer)["error"]["data"]["reason"] == "interrupted", answer.body
        assert trio.current_time() - killed_at < 2 + 10  # the lease, plus the waits
        assert [line.split()[:2] for line in ledger(tmp_path)] == [["start", "doomed"]]


async def initialize(c: Client, init: dict[str, Any] = INIT, headers: dict[str, str] = HDR) -> str:
    """Open a session on ``c`` (``initialize``, then the initialized notification)."""
    opened = await c.request("POST", "/mcp", init, headers=headers)
    assert opened.status == 200, opened
    sid = opened.headers["mcp-session-id"]
    assert (await c.request("POST", "/mcp", NOTE, session=sid, headers=headers)).status == 202
    return sid


@pytest.mark.parametrize("producer", ["trio", "asyncio"])
async def test_a_stream_cut_on_one_runtime_resumes_on_the_other_with_exact_event_ids(
    producer: str, valkey_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A call's stream is cut after three of its log messages; a GET with the last
    event id seen, on the other runtime, replays from the store exactly the events
    after it -- the same epoch, every seq once, in order -- then tails the call still
    running on the producer until its response, the final event."""
    resumer = "asyncio" if producer == "trio" else "trio"
    with replicas(valkey_url, tmp_path, monkeypatch) as procs, trio.fail_after(60):
        c = await Client.connect(procs[producer].port)
        sid = await initialize(c)
        body = json.dumps(call(3, "chatter", {"count": 10})).encode()
        await c.send_raw(
            raw_request("POST", "/mcp", body=body, headers={"mcp-session-id": sid, **HDR})
        )
        seen = await _sse_events(c, 3)
        await c.aclose()  # the cut: the call runs on, its events go to the store
        cursor = seen[-1][0]
        epoch, _, seq = cursor.rpartition(":")
        r = await Client.connect(procs[resumer].port)
        headers = {**HDR, "accept": "text/event-stream", "last-event-id": cursor}
        resumed = await r.request("GET", "/mcp", session=sid, headers=headers, timeout=20)
        await r.aclose()
        assert resumed.status == 200, resumed
        events = _parse_sse(resumed.body)
        ids = [event_id for event_id, _ in events]
        assert ids == [f"{epoch}:{n}" for n in range(int(seq) + 1, int(seq) + 1 + len(ids))], ids
        messages = [json.loads(data) for _, data in events]
        lines = [
            m["params"]["data"] for m in messages if m.get("method") == "notifications/message"
        ]
        said = [json.loads(d)["params"]["data"] for _, d in seen]
        assert said + lines == [f"line {i}" for i in range(10)], (said, lines)
        assert messages[-1]["id"] == 3 and messages[-1]["result"]["content"][0]["text"] == "said 10"


async def _response_head(c: Client) -> bytes:
    """The bytes of a streamed response up to the end of its head, at least (a stream's
    head is sent once the server has opened it)."""
    got = b""
    for _ in range(1_000):
        if b"\r\n\r\n" in got:
            return got
        data = await c.stream.receive_some(65536)
        assert data, f"the connection closed before a response head: {got!r}"
        got += data
    raise AssertionError(f"no response head: {got!r}")


async def _sse_events(c: Client, n: int, head: bytes = b"") -> list[tuple[str, str]]:
    """Read a streamed response until ``n`` events with data have come: (id, data)
    (``head``: its bytes read already)."""
    conn = c.h11
    conn.send(h11.Request(method="POST", target="/", headers=[("host", "x")]))
    conn.send(h11.EndOfMessage())
    if head:  # (b"" would tell h11 the connection closed)
        conn.receive_data(head)
    buf = b""
    for _ in range(10_000):
        events = _parse_sse(buf)
        if len(events) >= n:
            return events[:n]
        event = conn.next_event()
        if event is h11.NEED_DATA:
            conn.receive_data(bytes(await c.stream.receive_some(65536)))
        elif isinstance(event, h11.Data):
            buf += bytes(event.data)
        elif isinstance(event, h11.EndOfMessage | h11.ConnectionClosed):
            break
    raise AssertionError(f"the stream ended before {n} events: {buf!r}")


def _parse_sse(body: bytes) -> list[tuple[str, str]]:
    """The complete events of an SSE body that carry data: (id, data)."""
    found = []
    for block in body.decode().replace("\r\n", "\n").split("\n\n")[:-1]:
        fields: dict[str, str] = {}
        for line in block.split("\n"):
            name, _, value = line.partition(":")
            if name in ("id", "data"):
                fields[name] = value.removeprefix(" ")
        if fields.get("data"):
            found.append((fields.get("id", ""), fields["data"]))
    return found


@pytest.mark.parametrize("runs_on", ["trio", "asyncio"])
async def test_a_cancellation_sent_to_the_other_runtime_stops_the_call(
    runs_on: str, valkey_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``notifications/cancelled`` for a call running on one runtime, POSTed to the
    other: it is forwarded through the store's mailbox, the call stops (its stream
    ends with no response) and, its key given back, it never finished."""
    other = "asyncio" if runs_on == "trio" else "trio"
    with replicas(valkey_url, tmp_path, monkeypatch) as procs, trio.fail_after(60):
        c = await Client.connect(procs[runs_on].port)
        sid = await initialize(c)
        hdr = {**HDR, "idempotency-key": "long", "mcp-session-id": sid}
        body = json.dumps(charge(4, "long", 30.0)).encode()
        await c.send_raw(raw_request("POST", "/mcp", body=body, headers=hdr))
        while not any(line.startswith("start long") for line in ledger(tmp_path)):
            await trio.sleep(0.02)
        r = await Client.connect(procs[other].port)
        cancel = {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 4}}
        assert (await r.request("POST", "/mcp", cancel, session=sid, headers=HDR)).status == 202
        await r.aclose()
        ended = await c.read_reply(15)  # far sooner than the call's 30 s
        assert ended.status == 200
        assert all("result" not in m for m in map(json.loads, _datas(ended.body))), ended.body
        await c.aclose()
        assert [line.split()[0] for line in ledger(tmp_path)] == ["start"]


def _datas(body: bytes) -> list[str]:
    return [data for _, data in _parse_sse(body)]


@pytest.mark.parametrize("listening", ["asyncio", "trio"])
async def test_announced_changes_cross_runtimes_on_the_stores_bus(
    listening: str, valkey_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A tool on each replica announces that the tool list changed: a session's GET
    stream open on either replica hears ``notifications/tools/list_changed`` twice
    (the other's through the store's bus, its own at once).
    Both runtimes' announcements go on the same bus, in the same encoding."""
    with replicas(valkey_url, tmp_path, monkeypatch) as procs, trio.fail_after(60):
        g = await Client.connect(procs[listening].port)
        sid = await initialize(g)
        headers = {**HDR, "accept": "text/event-stream", "mcp-session-id": sid}
        await g.send_raw(raw_request("GET", "/mcp", headers=headers))
        head = await _response_head(g)  # the stream is open: a change now reaches it
        for rid, runtime in ((6, "trio"), (7, "asyncio")):
            a = await Client.connect(procs[runtime].port)
            said = await a.request(
                "POST", "/mcp", call(rid, "announce", {}), session=sid, headers=HDR
            )
            assert said.status == 200 and "announced" in said.body.decode(), said
            await a.aclose()
        heard = await _sse_events(g, 2, head)
        assert [json.loads(data)["method"] for _, data in heard] == [
            "notifications/tools/list_changed"
        ] * 2
        await g.aclose()
        async with coredis.Redis.from_url(valkey_url, decode_responses=False) as raw:
            bus = await raw.xrevrange("weir:bus", count=10)
        published = [json.loads(entry.field_values[b"c"]) for entry in bus]
        for replica in ("trio", "asyncio"):
            assert {"m": "notifications/tools/list_changed", "u": None, "r": replica} in published


@pytest.mark.parametrize("first", ["trio", "asyncio"])
async def test_a_keyed_sessionless_call_replays_on_the_other_runtime(
    first: str, valkey_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The sessionless revision (2026-07-28): a ``tools/call`` with an
    ``Idempotency-Key`` answered by one runtime is replayed by the other (the gate's
    records are in the principal's namespace of the shared store); it ran once."""
    other = "asyncio" if first == "trio" else "trio"
    meta = {
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": {},
    }
    params = {"name": "charge", "arguments": {"key": "stateless"}, "_meta": meta}
    message = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": params}
    headers = {
        "mcp-protocol-version": "2026-07-28",
        "mcp-method": "tools/call",
        "mcp-name": "charge",
        "idempotency-key": f"stateless-{first}",
        "accept": "application/json, text/event-stream",
    }
    with replicas(valkey_url, tmp_path, monkeypatch) as procs, trio.fail_after(60):
        answers = []
        for runtime in (first, other):
            c = await Client.connect(procs[runtime].port)
            answers.append(await c.request("POST", "/mcp", message, headers=headers))
            await c.aclose()
        assert [a.status for a in answers] == [200, 200], answers
        assert answer_of(answers[0]) == answer_of(answers[1]), answers
        assert answer_of(answers[1])["result"]["content"][0]["text"] == "charged stateless"
        assert [line.split()[0] for line in ledger(tmp_path)] == ["start", "done"]


@pytest.mark.parametrize("first", ["trio", "asyncio"])
async def test_an_input_round_begun_on_one_runtime_continues_on_the_other(
    first: str, valkey_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """2026-07-28 with no request-state key configured (no ``--state-key-file``): a
    ``tools/call`` answered ``input_required`` by one runtime carries a
    ``requestState`` the other runtime opens -- both seal with the one key the
    replicas agree on in the store -- so round two, sent there, runs the tool with
    the answer."""
    monkeypatch.delenv("WEIR_STATE_KEYS", raising=False)
    other = "asyncio" if first == "trio" else "trio"
    meta = {
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": {"elicitation": {}},
    }
    headers = {
        "mcp-protocol-version": "2026-07-28",
        "mcp-method": "tools/call",
        "mcp-name": "confirm",
        "accept": "application/json, text/event-stream",
    }
    params: dict[str, Any] = {"name": "confirm", "arguments": {"key": first}, "_meta": meta}
    with replicas(valkey_url, tmp_path, monkeypatch) as procs, trio.fail_after(60):
        c = await Client.connect(procs[first].port)
        one = await c.request(
            "POST", "/mcp", call(1, "confirm", {}) | {"params": params}, headers=headers
        )
        await c.aclose()
        asked = answer_of(one)["result"]
        assert asked["resultType"] == "input_required", asked
        params |= {
            "inputResponses": {"ok": {"action": "accept", "content": {}}},
            "requestState": asked["requestState"],
        }
        c = await Client.connect(procs[other].port)
        two = await c.request(
            "POST", "/mcp", call(2, "confirm", {}) | {"params": params}, headers=headers
        )
        await c.aclose()
        assert two.status == 200, two
        assert answer_of(two)["result"]["content"][0]["text"] == f"{first}: accept", two


def inline_count(metrics: Reply, tool: str) -> float:
    """``weir_inline_calls_total`` of ``tool`` in a ``/metrics`` reply (0 if absent)."""
    for line in metrics.body.decode().splitlines():
        if line.startswith(f'weir_inline_calls_total{{tool="{tool}"}} '):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


@pytest.mark.parametrize("runtime", ["trio", "asyncio"])
async def test_on_a_shared_store_only_an_unkeyed_sessionless_call_runs_inline(
    runtime: str, valkey_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With Valkey as the store, a 2026-07-28 call that records nothing runs in the
    connection's task; a keyed one, whose outcome is recorded in the store, runs in a
    task of its own -- and is replayed by the other runtime without running again."""
    meta = {
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": {},
    }
    headers = {
        "mcp-protocol-version": "2026-07-28",
        "mcp-method": "tools/call",
        "mcp-name": "stamp",
        "accept": "application/json, text/event-stream",
    }

    def stamp(rid: int, key: str) -> dict[str, Any]:
        params = {"name": "stamp", "arguments": {"key": key}, "_meta": meta}
        return {"jsonrpc": "2.0", "id": rid, "method": "tools/call", "params": params}

    other = "asyncio" if runtime == "trio" else "trio"
    with replicas(valkey_url, tmp_path, monkeypatch) as procs, trio.fail_after(60):
        c = await Client.connect(procs[runtime].port)
        plain = await c.request("POST", "/mcp", stamp(1, "plain"), headers=headers)
        assert answer_of(plain)["result"]["content"][0]["text"] == "stamped plain"
        assert inline_count(await c.request("GET", "/metrics"), "stamp") == 1
        keyed = {**headers, "idempotency-key": f"inline-{runtime}"}
        first = await c.request("POST", "/mcp", stamp(2, "keyed"), headers=keyed)
        assert answer_of(first)["result"]["content"][0]["text"] == "stamped keyed"
        assert inline_count(await c.request("GET", "/metrics"), "stamp") == 1  # a task
        await c.aclose()
        c = await Client.connect(procs[other].port)
        again = await c.request("POST", "/mcp", stamp(2, "keyed"), headers=keyed)
        await c.aclose()
        assert answer_of(again) == answer_of(first)
        assert [line.split()[:2] for line in ledger(tmp_path)] == [
            ["stamp", "plain"],
            ["stamp", "keyed"],
        ]


@pytest.mark.parametrize("rebinder", ["trio", "asyncio"])
async def test_a_rebind_on_one_runtime_fences_the_old_token_on_the_other(
    rebinder: str, valkey_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Channel tokens are the store's: the token one runtime issued at ``initialize``
    is accepted by the other (the first use binds the session for both: a DELETE
    without it is refused on either); ``weir/rebind`` on one runtime fences the old
    token on both -- 409 ``cursor_stale`` on POST (the course's check and a lone
    call's claim), GET, DELETE and another rebind, and nothing runs -- while a foreign
    secret is 409 ``channel_unbound`` on both; the old generation's open stream on
    the other runtime ends (at the latest at its next event, whose append the store
    refuses); the new token is served by both."""
    other = "asyncio" if rebinder == "trio" else "trio"
    with replicas(valkey_url, tmp_path, monkeypatch) as procs, trio.fail_after(60):
        port = {name: p.port for name, p in procs.items()}
        c = await Client.connect(port[other])
        init = await c.request("POST", "/mcp", CHANNEL_INIT, headers=CHANNEL_HDR)
        assert init.status == 200, init
        sid, old = init.headers["mcp-session-id"], init.headers[TOKEN]
        note = await c.request("POST", "/mcp", NOTE, session=sid, headers=CHANNEL_HDR)
        assert note.status == 202, note
        await c.aclose()

        used = await send(port[rebinder], "POST", sid, charge(1, "gen1"), old)
        assert used.status == 200, used
        refused(await send(port[other], "DELETE", sid), "channel_unbound")  # bound for both
        stream = await open_stream(port[other], sid, old)

        rebound = await send(port[rebinder], "POST", sid, rpc(2, REBIND), old)
        assert rebound.status == 200, rebound
        new = rebound.headers[TOKEN]
        result = rebound.json()["result"]
        assert result["generation"] == 2 and new.startswith("2.")
        texts = [r["result"]["content"][0]["text"] for r in result["results"]]
        assert texts == ["charged gen1"], result  # the call it finished itself
        foreign = "2." + old.partition(".")[2]  # the new generation, the old secret
        for runtime in (rebinder, other):
            for method, message in (
                ("POST", charge(3, f"stale-{runtime}")),
                ("POST", rpc(4, "tools/list")),
                ("POST", rpc(5, REBIND)),
                ("GET", None),
                ("DELETE", None),
            ):
                refused(await send(port[runtime], method, sid, message, old), "cursor_stale")
            refused(
                await send(port[runtime], "POST", sid, charge(6, "forged"), foreign),
                "channel_unbound",
            )
            refused(
                await send(port[runtime], "POST", sid, rpc(7, "tools/list"), foreign),
                "channel_unbound",
            )
        assert [line.split()[1] for line in ledger(tmp_path)] == [
            "gen1",
            "gen1",
        ]  # nothing else ran

        told = await send(port[rebinder], "POST", sid, call(8, "announce", {}), new)
        assert told.status == 200, told
        await stream.read_reply(10, method="GET")  # its body ends (the head was read before)
        await stream.aclose()
        for n, runtime in enumerate((rebinder, other)):
            served = await send(port[runtime], "POST", sid, charge(10 + n, f"gen2-{runtime}"), new)
            assert served.status == 200, served
        assert (await send(port[other], "DELETE", sid, token=new)).status == 200


@pytest.mark.parametrize("created_on", ["trio", "asyncio"])
async def test_a_task_from_one_runtime_is_cancelled_and_declared_lost_by_the_other(
    created_on: str, valkey_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The tasks extension across runtimes, on one store: a task created on one is
    read on the other at once, cancelled there (its run stops where it runs, at its
    next lease renewal), and a task whose replica is SIGKILLed is answered ``failed``
    (``interrupted``) by the other once the lease (2 s) has run out -- never run again."""
    from .test_tasks import get, result
    from .test_tasks import rpc as task_rpc

    other = "asyncio" if created_on == "trio" else "trio"

    def runs(key: str) -> list[str]:
        return [line.split()[0] for line in ledger(tmp_path) if line.split()[1] == key]

    with replicas(valkey_url, tmp_path, monkeypatch) as procs, trio.fail_after(60):
        home, away = procs[created_on].port, procs[other].port
        call = task_rpc(1, "tools/call", {"name": "charge_task", "arguments": {"key": "c"}})
        tid = (await result(home, call))["taskId"]
        assert (await get(away, tid))["status"] == "working"  # stored before the handle
        while runs("c") != ["start"]:
            await trio.sleep(0.02)
        await result(away, task_rpc(2, "tasks/cancel", {"taskId": tid}))
        while runs("c") != ["start", "stop"]:  # (its run hears it at the next renewal)
            await trio.sleep(0.05)
        assert (await get(home, tid))["status"] == "cancelled"

        call = task_rpc(3, "tools/call", {"name": "charge_task", "arguments": {"key": "k"}})
        doomed = (await result(home, call))["taskId"]
        while runs("k") != ["start"]:
            await trio.sleep(0.02)
        procs[created_on].proc.kill()  # SIGKILL: nothing recorded, only the lease tells
        procs[created_on].proc.wait()
        while (task := await get(away, doomed))["status"] == "working":
            await trio.sleep(0.1)
        assert task["status"] == "failed" and task["error"]["data"]["reason"] == "interrupted"
        assert runs("k") == ["start"]  # never run again
