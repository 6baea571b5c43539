"""The SessionStore contract, run against every store; then what only RedisStore promises.

The contract tests are parametrized over ``memory`` (:class:`MemoryStore`), ``sim``
(the cluster simulator's model of the Redis store, ``tests/sim/store.py``), ``redis``
(:class:`RedisStore` on a real valkey-server) and ``cluster`` (RedisStore through
``redis+cluster://`` on a one-node Valkey cluster, where a script touching keys of
two slots would fail with CROSSSLOT).  Every test uses fresh session ids, and every
RedisStore its own key prefix, so tests never see each other's data.
"""

from __future__ import annotations

import contextlib
import re
import secrets
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import replace
from typing import Any, cast

import coredis
import pytest
import trio

from tests.integration.conftest import ValkeyProcess
from tests.integration.valkey_cluster import ValkeyCluster
from tests.sim.store import SimStore
from weir.asyncio._redis_store import AsyncioRedisStore
from weir.engine._memory_store import MemoryStore
from weir.engine._redis_store import RedisStore
from weir.engine._session_store import SessionStore
from weir.engine._store_errors import (
    ChannelRejected,
    ReplicasBehind,
    SessionGone,
    StoreUnavailable,
)
from weir.engine._store_records import (
    MAX_CLIENT_RECORD,
    InternalId,
    Retention,
    SessionRecord,
    StoredEvent,
    StoredTask,
    StreamInfo,
    TaskWrite,
    client_of,
    client_record,
)
from weir.engine.asyncio_bridge import on_asyncio
from weir.protocol._event_ids import epoch_number, scramble_epoch
from weir.protocol.binding import ChannelVerdict
from weir.protocol.gate import CallOutcome, CallStart

EPOCH = re.compile(r"[0-9a-f]{8}")
P = "alice"
FP = b"fingerprint-1"


def new_id() -> str:
    return f"s-{uuid.uuid4().hex}"


def new_prefix() -> str:
    return f"weirtest-{uuid.uuid4().hex[:12]}"


def record(
    session_id: str,
    principal: str = P,
    *,
    secret: str = "secret-1",
    generation: int = 1,
    salt: str = "salt-1",
) -> SessionRecord:
    return SessionRecord(
        session_id=session_id,
        principal=principal,
        protocol_version="2025-06-18",
        created_at=12.5,
        generation=generation,
        secret=secret,
        salt=salt,
    )


async def new_session(store: SessionStore, principal: str = P) -> SessionRecord:
    rec = record(new_id(), principal)
    await store.create_session(rec)
    return rec


# ------------------------------------------------------------------- fixtures


class OnAsyncio:
    """An :class:`AsyncioRedisStore` living on an asyncio loop (the bridge's), driven
    from these Trio tests: every method call runs there, so the asyncio runtime's
    store (its owner task, its pipe) is held to the same contract."""

    shared = True

    def __init__(self, store: AsyncioRedisStore) -> None:
        self._store = store

    def __getattr__(self, name: str) -> Any:
        return on_asyncio(getattr(self._store, name))


@pytest.fixture(
    params=["memory", "sim", "redis", "cluster", "cluster6", "redis-asyncio", "cluster-asyncio"]
)
def store_url(request: pytest.FixtureRequest) -> str | None:
    """None for MemoryStore, ``sim`` for the cluster simulator's store model, else
    the URL a RedisStore connects to (ending in ``#asyncio``: the asyncio runtime's
    store); ``cluster6`` is a real 3-primary, 3-replica cluster."""
    if request.param == "memory":
        return None
    if request.param == "sim":
        return "sim"
    if request.param == "cluster6":
        cluster: ValkeyCluster = request.getfixturevalue("valkey_cluster6")
        return cluster.url
    fixture = "valkey_url" if request.param.startswith("redis") else "valkey_cluster_url"
    url: str = request.getfixturevalue(fixture)
    return url + ("#asyncio" if request.param.endswith("asyncio") else "")


@contextlib.asynccontextmanager
async def open_store(
    store_url: str | None, retention: Retention | None = None
) -> AsyncIterator[SessionStore]:
    """The store ``store_url`` names (see :func:`store_url`), keeping what ``retention``
    says (the simulator's model keeps the memory store's defaults)."""
    retention = retention or Retention()
    if store_url is None:
        yield MemoryStore(retention)
        return
    if store_url == "sim":
        yield SimStore()
        return
    if store_url.endswith("#asyncio"):
        url = store_url.removesuffix("#asyncio")
        connect = on_asyncio(AsyncioRedisStore.connect)
        on_loop = await connect(url, prefix=new_prefix(), retention=retention)
        assert isinstance(on_loop, AsyncioRedisStore)
        try:
            yield cast(SessionStore, OnAsyncio(on_loop))
        finally:
            await on_asyncio(on_loop.aclose)()
        return
    async with await RedisStore.connect(store_url, prefix=new_prefix(), retention=retention) as s:
        yield s


@pytest.fixture
async def store(store_url: str | None) -> AsyncIterator[SessionStore]:
    async with open_store(store_url) as s:
        yield s


@pytest.fixture(params=["redis", "cluster"])
def redis_url(request: pytest.FixtureRequest) -> str:
    fixture = "valkey_url" if request.param == "redis" else "valkey_cluster_url"
    url: str = request.getfixturevalue(fixture)
    return url


@pytest.fixture(params=["sim", "redis", "cluster", "cluster6"])
async def shared(request: pytest.FixtureRequest) -> AsyncIterator[SessionStore]:
    """A shared store: the simulator's model, or a RedisStore (single node, cluster).
    The tests on it are the semantics every shared store keeps (event logs, stream
    info, append order, fencing)."""
    if request.param == "sim":
        yield SimStore()
        return
    if request.param == "cluster6":
        cluster: ValkeyCluster = request.getfixturevalue("valkey_cluster6")
        async with await RedisStore.connect(cluster.url, prefix=new_prefix()) as s:
            yield s
        return
    fixture = "valkey_url" if request.param == "redis" else "valkey_cluster_url"
    url: str = request.getfixturevalue(fixture)
    async with await RedisStore.connect(url, prefix=new_prefix()) as s:
        yield s


@pytest.fixture
async def rstore(redis_url: str) -> AsyncIterator[RedisStore]:
    async with await RedisStore.connect(redis_url, prefix=new_prefix()) as s:
        yield s


async def raw_keys(url: str, prefix: str) -> list[bytes]:
    """Every key under ``prefix`` (through a plain client on the node)."""
    plain = url.replace("redis+cluster://", "redis://")
    async with coredis.Redis.from_url(plain, decode_responses=False) as raw:
        return sorted([k async for k in raw.scan_iter(match=f"{prefix}:*")])


def crc16(data: bytes) -> int:
    """CRC16-XMODEM, as Redis Cluster uses for key slots."""
    crc = 0
    for byte in data:
        crc ^= byte << 8
        for _ in range(8):
            crc = ((crc << 1) ^ 0x1021) if crc & 0x8000 else crc << 1
            crc &= 0xFFFF
    return crc


def key_slot(key: bytes) -> int:
    start = key.find(b"{")
    if start != -1:
        end = key.find(b"}", start + 1)
        if end > start + 1:
            key = key[start + 1 : end]
    return crc16(key) % 16384


# ------------------------------------------------------------- the contract


async def test_create_get_delete_scoped_by_principal(store: SessionStore) -> None:
    rec = await new_session(store)
    assert await store.get_session(P, rec.session_id) == rec
    # The same id under another principal is another (unknown) session.
    assert await store.get_session("mallory", rec.session_id) is None
    assert await store.delete_session("mallory", rec.session_id) is False
    other = record(rec.session_id, "mallory", secret="other")
    await store.create_session(other)
    assert await store.get_session("mallory", rec.session_id) == other
    assert await store.get_session(P, rec.session_id) == rec

    assert await store.delete_session(P, rec.session_id) is True
    assert await store.get_session(P, rec.session_id) is None
    assert await store.delete_session(P, rec.session_id) is False
    assert await store.get_session("mallory", rec.session_id) == other


async def test_what_the_client_declared_is_kept_with_the_session(store: SessionStore) -> None:
    declared = client_record({"elicitation": {}}, {"name": "c", "version": "1"})
    rec = replace(record(f"sess-{secrets.token_hex(4)}"), client=declared)
    await store.create_session(rec)
    found = await store.get_session(P, rec.session_id)
    assert found is not None and found == rec
    assert client_of(found) == ({"elicitation": {}}, {"name": "c", "version": "1"})
    assert client_record({"x": "y" * MAX_CLIENT_RECORD}, {}) == ""  # bounded: kept empty
    assert client_of(replace(rec, client="{not json")) == ({}, {})


async def test_internal_records_are_out_of_reach_of_client_ids(store: SessionStore) -> None:
    """A record named by an InternalId lives in its own keyspace: the equal plain
    string (what a client could send) names nothing, and deleting it leaves the
    internal record and its gate alone."""
    name = InternalId(f"~gate-{uuid.uuid4().hex[:8]}")
    await store.create_session(record(name))
    started = await store.begin_call(P, name, "k1", FP, None)
    assert started.outcome is CallOutcome.EXECUTE
    await store.finish_call(P, name, "k1", b"answer")
    plain = str(name)
    assert type(plain) is str
    assert await store.get_session(P, plain) is None
    assert await store.delete_session(P, plain) is False
    with pytest.raises(SessionGone):
        await store.begin_call(P, plain, "k1", FP, None)
    # The same plain id can even be created as a client session: still apart.
    await store.create_session(record(plain, secret="client"))
    assert await store.delete_session(P, plain) is True
    again = await store.begin_call(P, name, "k1", FP, None)
    assert (again.outcome, again.payload) == (CallOutcome.DONE, b"answer")
    assert await store.get_session(P, name) is not None


async def test_expire_idle_deletes_only_what_the_store_finds_idle(store: SessionStore) -> None:
    """``expire_idle`` is the store's verdict.  A shared store keeps last-seen by its
    own clock: a session touched just now is not idle for a minute-long timeout, and
    is for a 1 ms one; one never touched is expired by ``untouched``, a touched one
    is not.  The memory store (one process) deletes when asked."""
    rec = await new_session(store)
    if not store.shared:
        assert await store.touch_session(P, rec.session_id) is True
        assert await store.expire_idle(P, rec.session_id, 60.0, None) is True
        assert await store.get_session(P, rec.session_id) is None
        assert await store.touch_session(P, rec.session_id) is False
        return
    fresh = await new_session(store)
    assert await store.expire_idle(P, rec.session_id, 60.0, 60.0) is False
    assert await store.touch_session(P, rec.session_id) is True
    await trio.sleep(0.02)
    assert await store.expire_idle(P, rec.session_id, 60.0, 0.001) is False  # touched
    assert await store.expire_idle(P, fresh.session_id, None, 0.001) is True  # never touched
    assert await store.get_session(P, rec.session_id) is not None
    assert await store.expire_idle(P, rec.session_id, 0.001, None) is True
    assert await store.get_session(P, rec.session_id) is None
    assert await store.expire_idle(P, rec.session_id, 60.0, None) is True  # gone before
    assert await store.touch_session(P, rec.session_id) is False


async def test_a_live_verdict_leaves_the_deadline_on_the_ttl(rstore: RedisStore) -> None:
    """A session that lives on keeps the idle deadline itself: its record's TTL is
    cut to what is left of the window, so it expires even if no replica asks again."""
    rec = await new_session(rstore)
    record_key = rstore._keys(P, rec.session_id)[0]
    assert await rstore.expire_idle(P, rec.session_id, 30.0, None) is False
    ttl = await rstore._client.pttl(record_key)
    assert 0 < ttl <= 30_000
    assert await rstore.touch_session(P, rec.session_id) is True  # served: full TTL again
    assert await rstore._client.pttl(record_key) > 30_000


def test_internal_ids_lie_outside_the_minted_format() -> None:
    with pytest.raises(ValueError):
        InternalId("A" * 43)


async def test_duplicate_create_raises(store: SessionStore) -> None:
    rec = await new_session(store)
    with pytest.raises(ValueError, match="already exists"):
        await store.create_session(record(rec.session_id, secret="another"))
    assert await store.get_session(P, rec.session_id) == rec  # unchanged


async def test_epochs_unique_hex_increasing(store: SessionStore) -> None:
    rec = await new_session(store)
    epochs = []
    for i in range(20):
        if i % 2:
            epochs.append(await store.allocate_epoch(P, rec.session_id))
        else:
            start = await store.begin_call(P, rec.session_id, f"k{i}", FP, None)
            epochs.append(start.epoch)
    assert all(EPOCH.fullmatch(e) for e in epochs), epochs
    assert len(set(epochs)) == len(epochs) and epochs != sorted(epochs)  # order tells nothing
    if store.shared:
        # The session's counter under the SHA-1 Feistel permutation, computed in Lua:
        # it must agree with protocol.EpochPermutation (the replay side inverts it).
        assert [epoch_number(e, rec.salt) for e in epochs] == list(range(1, 21))
    # Epochs are per session: another session with the same salt starts the same
    # sequence; one with another salt cannot be told from this one's.
    other = await new_session(store)
    assert await store.allocate_epoch(P, other.session_id) == epochs[0]
    third = record(new_id(), salt="salt-2")
    await store.create_session(third)
    assert await store.allocate_epoch(P, third.session_id) != epochs[0]
    if store.shared:
        assert epochs[0] == scramble_epoch(1, "salt-1")


async def test_begin_call_outcomes(store: SessionStore) -> None:
    sid = (await new_session(store)).session_id
    first = await store.begin_call(P, sid, "call-1", FP, None)
    assert first.outcome is CallOutcome.EXECUTE and first.payload is None
    second = await store.begin_call(P, sid, "call-1", FP, None)
    assert second.outcome is CallOutcome.RUNNING
    await store.finish_call(P, sid, "call-1", b'{"result": 1}')
    third = await store.begin_call(P, sid, "call-1", FP, None)
    assert third == CallStart(CallOutcome.DONE, third.epoch, b'{"result": 1}')
    mismatch = await store.begin_call(P, sid, "call-1", b"another request", None)
    assert mismatch.outcome is CallOutcome.MISMATCH and mismatch.payload is None
    assert len({first.epoch, second.epoch, third.epoch, mismatch.epoch}) == 4
    # Keys are independent, and binary payloads survive.
    other = await store.begin_call(P, sid, "call-2", FP, None)
    assert other.outcome is CallOutcome.EXECUTE
    await store.finish_call(P, sid, "call-2", b"\x00\xff\r\n")
    done = await store.begin_call(P, sid, "call-2", FP, None)
    assert done.payload == b"\x00\xff\r\n"


def store_keeping(
    kind: str, request: pytest.FixtureRequest, retention: Retention
) -> contextlib.AbstractAsyncContextManager[SessionStore]:
    """A store of ``kind`` (``memory``, ``redis``, ``cluster``, ``redis-asyncio``) that
    keeps what ``retention`` says."""
    if kind == "memory":
        return open_store(None, retention)
    fixture = "valkey_cluster_url" if kind.startswith("cluster") else "valkey_url"
    url: str = request.getfixturevalue(fixture)
    return open_store(url + ("#asyncio" if kind.endswith("asyncio") else ""), retention)


async def _finish(store: SessionStore, sid: str, key: str, payload: bytes, *, event: bool) -> None:
    """Claim ``key`` and record its response: with ``finish_call``, or (``event``) as the
    final event of its stream, which records it in the same step."""
    start = await store.begin_call(P, sid, key, FP, None)
    assert start.outcome is CallOutcome.EXECUTE
    if event:
        await store.append_event(
            P, sid, start.epoch, 1, payload, final=True, generation=1, call_key=key
        )
    else:
        await store.finish_call(P, sid, key, payload)


GATE_KINDS = pytest.mark.parametrize("kind", ["memory", "redis", "cluster", "redis-asyncio"])


@GATE_KINDS
@pytest.mark.parametrize("event", [False, True], ids=["finish", "final-event"])
async def test_a_gate_holds_at_most_its_count_of_finished_calls(
    kind: str, event: bool, request: pytest.FixtureRequest
) -> None:
    async with store_keeping(kind, request, Retention(calls_per_session=3)) as store:
        sid = (await new_session(store)).session_id
        for key in ("a", "b", "c", "d"):
            await _finish(store, sid, key, b"r-" + key.encode(), event=event)
        for key in ("b", "c", "d"):  # the newest three are kept ...
            kept = await store.begin_call(P, sid, key, FP, None)
            assert kept.outcome is CallOutcome.DONE and kept.payload == b"r-" + key.encode()
        # ... and the oldest is forgotten whole: the only way a retry could run again,
        # reached only past the gate's count of distinct calls.
        assert (await store.begin_call(P, sid, "a", FP, None)).outcome is CallOutcome.EXECUTE


@GATE_KINDS
async def test_a_gate_over_its_bytes_keeps_the_keys_and_drops_the_oldest_responses(
    kind: str, request: pytest.FixtureRequest
) -> None:
    # Each finished call: its 1-character key at 129 bytes and a 100-byte response;
    # three are 687 bytes, over the 600 the gate may hold.
    retention = Retention(calls_per_session=100, call_bytes_per_session=600)
    async with store_keeping(kind, request, retention) as store:
        sid = (await new_session(store)).session_id
        for key in ("a", "b", "c"):
            await _finish(store, sid, key, key.encode() * 100, event=False)
        # The oldest response went; its key stayed: a retry is told so and runs nothing.
        assert (await store.begin_call(P, sid, "a", FP, None)).outcome is CallOutcome.EVICTED
        for key in ("b", "c"):
            kept = await store.begin_call(P, sid, key, FP, None)
            assert kept.outcome is CallOutcome.DONE and kept.payload == key.encode() * 100
        # A running claim is never dropped, however full the gate.
        assert (await store.begin_call(P, sid, "e", FP, None)).outcome is CallOutcome.EXECUTE
        await _finish(store, sid, "d", b"d" * 500, event=False)
        assert (await store.begin_call(P, sid, "e", FP, None)).outcome is CallOutcome.RUNNING
        assert (await store.begin_call(P, sid, "b", FP, None)).outcome is CallOutcome.EVICTED


async def test_cancelled_call_releases_the_key(store: SessionStore) -> None:
    sid = (await new_session(store)).session_id
    assert (await store.begin_call(P, sid, "k", FP, None)).outcome is CallOutcome.EXECUTE
    await store.finish_call(P, sid, "k", None)
    retry = await store.begin_call(P, sid, "k", b"a new request may reuse it", None)
    assert retry.outcome is CallOutcome.EXECUTE


async def test_a_claim_is_given_back_only_to_its_own_claim_id(store: SessionStore) -> None:
    """``release_claim``: a delivery that never heard its claim's answer gives back
    exactly its own claim -- not another delivery's, not a call that finished."""
    sid = (await new_session(store)).session_id
    first = await store.begin_call(P, sid, "k", FP, None, owner="r1", lease=30.0, claim="c-1")
    assert first.outcome is CallOutcome.EXECUTE
    assert not await store.release_claim(P, sid, "k", "c-2")  # another claim id
    assert not await store.release_claim(P, sid, "k", "")
    assert not await store.release_claim("mallory", sid, "k", "c-1")  # another principal
    assert (await store.begin_call(P, sid, "k", FP, None)).outcome is CallOutcome.RUNNING
    assert await store.release_claim(P, sid, "k", "c-1")
    assert not await store.release_claim(P, sid, "k", "c-1")  # once
    retry = await store.begin_call(P, sid, "k", FP, None, owner="r2", lease=30.0, claim="c-3")
    assert retry.outcome is CallOutcome.EXECUTE  # the retry runs the call
    await store.finish_call(P, sid, "k", b'{"result": 1}')
    assert not await store.release_claim(P, sid, "k", "c-3")  # it ran: never given back
    done = await store.begin_call(P, sid, "k", FP, None)
    assert done.outcome is CallOutcome.DONE and done.payload == b'{"result": 1}'
    assert not await store.release_claim(P, "no-such-session", "k", "c-3")


async def test_calls_are_scoped_by_principal_and_session(store: SessionStore) -> None:
    rec = await new_session(store)
    await store.create_session(record(rec.session_id, "mallory"))
    other = await new_session(store)
    assert (await store.begin_call(P, rec.session_id, "k", FP, None)).outcome is (
        CallOutcome.EXECUTE
    )
    await store.finish_call(P, rec.session_id, "k", b"alice's result")
    for principal, sid in (("mallory", rec.session_id), (P, other.session_id)):
        start = await store.begin_call(principal, sid, "k", FP, None)
        assert start.outcome is CallOutcome.EXECUTE and start.payload is None


async def test_channel_checks(store: SessionStore) -> None:
    rec = await new_session(store)
    sid = rec.session_id
    assert (await store.begin_call(P, sid, "a", FP, None)).outcome is CallOutcome.EXECUTE
    ok = await store.begin_call(P, sid, "b", FP, (1, "secret-1"))
    assert ok.outcome is CallOutcome.EXECUTE

    rebound = await store.rebind(P, sid, "secret-2")
    assert rebound.generation == 2
    cases = [
        ((1, "secret-1"), ChannelVerdict.STALE),  # the old generation, even with its secret
        ((1, "secret-2"), ChannelVerdict.STALE),
        ((2, "secret-1"), ChannelVerdict.UNBOUND),  # right generation, wrong secret
        ((2, ""), ChannelVerdict.UNBOUND),
        ((3, "secret-2"), ChannelVerdict.UNBOUND),  # a future generation
        ((10**30, "secret-2"), ChannelVerdict.UNBOUND),
        ((0, "secret-2"), ChannelVerdict.STALE),
    ]
    for token, verdict in cases:
        with pytest.raises(ChannelRejected) as caught:
            await store.begin_call(P, sid, "c", FP, token)
        assert caught.value.verdict is verdict, token
    # Nothing was claimed by the refused attempts.
    assert (await store.begin_call(P, sid, "c", FP, (2, "secret-2"))).outcome is (
        CallOutcome.EXECUTE
    )
    # No token is still served (standard SDK clients).
    assert (await store.begin_call(P, sid, "d", FP, None)).outcome is CallOutcome.EXECUTE


async def test_rebind_bumps_generation_and_rotates_secret(store: SessionStore) -> None:
    rec = await new_session(store)
    first = await store.rebind(P, rec.session_id, "s2")
    second = await store.rebind(P, rec.session_id, "s3")
    assert (first.generation, first.secret) == (2, "s2")
    assert (second.generation, second.secret) == (3, "s3")
    assert second.channel_token == "3.s3"
    stored = await store.get_session(P, rec.session_id)
    assert stored == second
    assert (stored.protocol_version, stored.created_at) == (rec.protocol_version, rec.created_at)


async def test_rebinds_are_atomic(store: SessionStore) -> None:
    rec = await new_session(store)
    results: list[SessionRecord] = []

    async def rebind(i: int) -> None:
        results.append(await store.rebind(P, rec.session_id, f"secret-{i}"))

    async with trio.open_nursery() as nursery:
        for i in range(30):
            nursery.start_soon(rebind, i)
    assert sorted(r.generation for r in results) == list(range(2, 32))
    final = await store.get_session(P, rec.session_id)
    assert final is not None and final.generation == 31
    assert final == max(results, key=lambda r: r.generation)  # secret matches its generation


async def test_append_event_after_rebind_is_stale(store: SessionStore) -> None:
    sid = (await new_session(store)).session_id
    epoch = await store.allocate_epoch(P, sid)
    await store.append_event(P, sid, epoch, 0, b"e0", final=False, generation=1)
    await store.rebind(P, sid, "new")
    with pytest.raises(ChannelRejected) as caught:
        await store.append_event(P, sid, epoch, 1, b"e1", final=False, generation=1)
    assert caught.value.verdict is ChannelVerdict.STALE
    await store.append_event(P, sid, epoch, 1, b"e1", final=True, generation=2)


async def test_unknown_sessions_are_gone(store: SessionStore) -> None:
    sid = new_id()
    assert await store.get_session(P, sid) is None
    assert await store.delete_session(P, sid) is False
    with pytest.raises(SessionGone):
        await store.rebind(P, sid, "x")
    with pytest.raises(SessionGone):
        await store.allocate_epoch(P, sid)
    with pytest.raises(SessionGone):
        await store.begin_call(P, sid, "k", FP, None)
    with pytest.raises(SessionGone):
        await store.begin_call(P, sid, "k", FP, (1, "secret-1"))
    with pytest.raises(SessionGone):
        await store.append_event(P, sid, "00000001", 0, b"x", final=False, generation=1)
    await store.finish_call(P, sid, "k", b"late result")  # a no-op, not an error
    await store.finish_call(P, sid, "k", None)
    assert await store.read_events(P, sid, "00000001", -1) is None
    assert await store.get_session(P, sid) is None  # nothing was created on the way


async def test_delete_forgets_everything(store: SessionStore) -> None:
    rec = await new_session(store)
    sid = rec.session_id
    await store.begin_call(P, sid, "k", FP, None)
    await store.finish_call(P, sid, "k", b"result")
    assert await store.delete_session(P, sid)
    with pytest.raises(SessionGone):
        await store.begin_call(P, sid, "k", FP, None)
    await store.finish_call(P, sid, "k", b"a late finish must not resurrect anything")
    assert await store.get_session(P, sid) is None
    # Re-created under the same id: a new session, with no calls of the old one.
    await store.create_session(rec)
    again = await store.begin_call(P, sid, "k", FP, None)
    assert again.outcome is CallOutcome.EXECUTE


async def test_concurrent_deliveries_execute_once(store: SessionStore) -> None:
    sid = (await new_session(store)).session_id
    starts: list[CallStart] = []

    async def deliver() -> None:
        starts.append(await store.begin_call(P, sid, "same-key", FP, (1, "secret-1")))

    async with trio.open_nursery() as nursery:
        for _ in range(50):
            nursery.start_soon(deliver)
    outcomes = [s.outcome for s in starts]
    assert outcomes.count(CallOutcome.EXECUTE) == 1
    assert outcomes.count(CallOutcome.RUNNING) == 49
    assert len({s.epoch for s in starts}) == 50


# ------------------------------------------------------------ RedisStore only


async def test_store_is_shared_and_a_session_store(rstore: RedisStore) -> None:
    as_protocol: SessionStore = rstore
    assert as_protocol.shared is True
    assert MemoryStore.shared is False


async def append_all(
    store: SessionStore, sid: str, epoch: str, count: int, *, generation: int = 1
) -> None:
    for seq in range(count):
        await store.append_event(
            P, sid, epoch, seq, f"event {seq}".encode(), final=seq == count - 1,
            generation=generation, binding=generation,
        )  # fmt: skip


async def test_read_events_replays_exactly_after_the_cursor(shared: SessionStore) -> None:
    sid = (await new_session(shared)).session_id
    epoch = await shared.allocate_epoch(P, sid)
    await append_all(shared, sid, epoch, 10)
    everything = await shared.read_events(P, sid, epoch, -1)
    assert everything == [
        StoredEvent(seq, f"event {seq}".encode(), seq == 9, 1) for seq in range(10)
    ]
    assert await shared.read_events(P, sid, epoch, 6) == everything[7:]
    assert await shared.read_events(P, sid, epoch, 8) == everything[9:]
    assert await shared.read_events(P, sid, epoch, 9) == []  # at the head: nothing yet
    assert await shared.read_events(P, sid, epoch, 10) is None  # beyond the head
    assert await shared.read_events(P, sid, epoch, -2) is None
    # Unknown epochs, another session's epochs, another principal: no such stream.
    assert await shared.read_events(P, sid, "0000ffff", -1) is None
    assert await shared.read_events(P, sid, "not an epoch}{", -1) is None
    other = await new_session(shared)
    assert await shared.read_events(P, other.session_id, epoch, -1) is None
    assert await shared.read_events("mallory", sid, epoch, -1) is None
    # Live continuation: a reader at the head sees the next event.
    await shared.append_event(P, sid, epoch, 10, b"late", final=True, generation=1)
    assert await shared.read_events(P, sid, epoch, 9) == [StoredEvent(10, b"late", True, 0)]


async def test_stream_info_binding_head_and_replica(shared: SessionStore) -> None:
    """What a replica needs before replaying someone else's stream (fencing, event ids)."""
    sid = (await new_session(shared)).session_id
    assert await shared.stream_info(P, sid, "00000001") is None  # never allocated
    plain = await shared.allocate_epoch(P, sid)
    assert await shared.stream_info(P, sid, plain) == StreamInfo(0, -1, False)
    bound = await shared.allocate_epoch(P, sid, binding=3)
    assert (await shared.stream_info(P, sid, bound)) == StreamInfo(3, -1, False)
    start = await shared.begin_call(P, sid, "k", b"fp", None)
    assert (await shared.stream_info(P, sid, start.epoch)) == StreamInfo(0, -1, False)
    await shared.append_event(P, sid, bound, 1, b"a", final=False, generation=1, replica="r9")
    assert await shared.stream_info(P, sid, bound) == StreamInfo(3, 1, False)
    await shared.append_event(P, sid, bound, 2, b"b", final=True, generation=1, binding=3)
    assert await shared.stream_info(P, sid, bound) == StreamInfo(3, 2, True)
    events = await shared.read_events(P, sid, bound, 0)
    assert events is not None and [e.replica for e in events] == ["r9", ""]
    assert await shared.stream_info("mallory", sid, bound) is None
    assert await shared.stream_info(P, sid, "zz") is None


async def test_append_is_contiguous_and_idempotent(shared: SessionStore) -> None:
    sid = (await new_session(shared)).session_id
    epoch = await shared.allocate_epoch(P, sid)
    await append_all(shared, sid, epoch, 3)
    # A retry of an event already stored (its reply was lost) is accepted...
    await shared.append_event(P, sid, epoch, 2, b"event 2", final=True, generation=1, binding=1)
    # ...a different event under a used seq, or a gap, is not.
    with pytest.raises(ValueError, match="out of order"):
        await shared.append_event(P, sid, epoch, 2, b"other", final=True, generation=1)
    with pytest.raises(ValueError, match="out of order"):
        await shared.append_event(P, sid, epoch, 5, b"gap", final=False, generation=1)
    with pytest.raises(ValueError):
        await shared.append_event(P, sid, epoch, -1, b"negative", final=False, generation=1)
    events = await shared.read_events(P, sid, epoch, -1)
    assert events is not None and [e.seq for e in events] == [0, 1, 2]


async def test_append_with_a_future_generation_is_stale(shared: SessionStore) -> None:
    # Only possible when the session was deleted and re-created under the same id
    # (generation back to 1) while a writer of the old one still runs: fence it.
    sid = (await new_session(shared)).session_id
    epoch = await shared.allocate_epoch(P, sid)
    with pytest.raises(ChannelRejected) as caught:
        await shared.append_event(P, sid, epoch, 0, b"x", final=False, generation=2)
    assert caught.value.verdict is ChannelVerdict.STALE


async def test_trimmed_cursor_cannot_be_honoured(redis_url: str) -> None:
    retention = Retention(events_per_stream=5)
    async with await RedisStore.connect(redis_url, prefix=new_prefix(), retention=retention) as s:
        sid = (await new_session(s)).session_id
        epoch = await s.allocate_epoch(P, sid)
        await append_all(s, sid, epoch, 400)  # MAXLEN ~ trims whole nodes (100 entries)
        assert await s.read_events(P, sid, epoch, -1) is None
        assert await s.read_events(P, sid, epoch, 0) is None
        tail = await s.read_events(P, sid, epoch, 394)
        assert tail is not None and [e.seq for e in tail] == [395, 396, 397, 398, 399]
        assert await s.read_events(P, sid, epoch, 399) == []
        # The boundary: the oldest retained event is replayable from just before it.
        oldest = 0
        while await s.read_events(P, sid, epoch, oldest - 1) is None:
            oldest += 1
            assert oldest <= 400
        assert 5 <= 400 - oldest <= 400 - 100  # kept at least 5, trimmed at least a node
        assert await s.read_events(P, sid, epoch, oldest - 2) is None


async def test_data_survives_a_new_connection(redis_url: str) -> None:
    prefix = new_prefix()
    async with await RedisStore.connect(redis_url, prefix=prefix) as first:
        rec = await new_session(first)
        sid = rec.session_id
        epoch = (await first.begin_call(P, sid, "k", FP, None)).epoch
        await append_all(first, sid, epoch, 3)
        await first.finish_call(P, sid, "k", b"result")
        await first.begin_call(P, sid, "running", FP, None)
    async with await RedisStore.connect(redis_url, prefix=prefix) as second:
        assert await second.get_session(P, sid) == rec
        events = await second.read_events(P, sid, epoch, 0)
        assert events is not None and [e.data for e in events] == [b"event 1", b"event 2"]
        done = await second.begin_call(P, sid, "k", FP, None)
        assert (done.outcome, done.payload) == (CallOutcome.DONE, b"result")
        assert (await second.begin_call(P, sid, "running", FP, None)).outcome is (
            CallOutcome.RUNNING
        )
        # the epoch counter is shared too
        assert epoch_number(done.epoch, rec.salt) > epoch_number(epoch, rec.salt)


async def test_keys_share_one_slot_and_cannot_be_injected(
    rstore: RedisStore, redis_url: str
) -> None:
    assert key_slot(b"foo") == 12182 and key_slot(b"{user1000}.following") == 3443  # docs
    tricky = [
        ("a:b", "c"),
        ("a", "b:c"),
        ("}{", "x"),
        ("x", "}{"),
        ("%7D", "x"),
        ("p\x1fq", "\u00e9\u2603"),
    ]
    epoch_of: dict[tuple[str, str], str] = {}
    for principal, sid in tricky:
        await rstore.create_session(record(sid, principal))
        start = await rstore.begin_call(principal, sid, "k:{x}", FP, None)
        epoch_of[principal, sid] = start.epoch
        await rstore.append_event(principal, sid, start.epoch, 0, b"e", final=True, generation=1)
        await rstore.finish_call(principal, sid, "k:{x}", principal.encode() + b"/" + sid.encode())
    # Every pair is its own session (no separator injection).
    for principal, sid in tricky:
        done = await rstore.begin_call(principal, sid, "k:{x}", FP, None)
        assert done.payload == principal.encode() + b"/" + sid.encode()

    keys = await raw_keys(redis_url, rstore.prefix)
    by_tag: dict[bytes, list[bytes]] = {}
    for key in keys:
        by_tag.setdefault(key[: key.index(b"}") + 1], []).append(key)
    assert len(by_tag) == len(tricky)
    plain = redis_url.replace("redis+cluster://", "redis://")
    cluster = redis_url.startswith("redis+cluster://")
    async with coredis.Redis.from_url(plain, decode_responses=False) as raw:
        for tag, group in by_tag.items():
            first = b":e:" + scramble_epoch(1, "salt-1").encode()
            assert {k[len(tag) :] for k in group} == {b":s", b":c", b":x", b":k", first}
            assert len({key_slot(k) for k in group}) == 1, group
            if cluster:  # the server agrees with our CRC16
                for key in group:
                    assert await raw.cluster_keyslot(key) == key_slot(key)


async def test_every_key_has_a_ttl(redis_url: str) -> None:
    retention = Retention(ttl=600.0, idempotency_ttl=30.0)
    async with await RedisStore.connect(redis_url, prefix=new_prefix(), retention=retention) as s:
        sid = (await new_session(s)).session_id
        start = await s.begin_call(P, sid, "k", FP, None)
        await s.append_event(P, sid, start.epoch, 0, b"e", final=True, generation=1)
        await s.finish_call(P, sid, "k", b"r")
        keys = await raw_keys(redis_url, s.prefix)
        assert len(keys) == 5
        plain = redis_url.replace("redis+cluster://", "redis://")
        async with coredis.Redis.from_url(plain, decode_responses=False) as raw:
            for key in keys:
                assert 0 < await raw.pttl(key) <= 600_000, key
        assert await s.delete_session(P, sid)
        assert await raw_keys(redis_url, s.prefix) == []  # delete leaves nothing behind


async def test_finished_calls_expire_after_the_idempotency_ttl(redis_url: str) -> None:
    retention = Retention(idempotency_ttl=0.2)
    async with await RedisStore.connect(redis_url, prefix=new_prefix(), retention=retention) as s:
        sid = (await new_session(s)).session_id
        await s.begin_call(P, sid, "k", FP, None)
        await s.finish_call(P, sid, "k", b"r")
        assert (await s.begin_call(P, sid, "k", FP, None)).outcome is CallOutcome.DONE
        await trio.sleep(0.3)
        assert (await s.begin_call(P, sid, "k", FP, None)).outcome is CallOutcome.EXECUTE


async def test_bad_urls_and_prefixes_are_refused() -> None:
    bad = [
        "http://127.0.0.1:6379",
        "memory",
        "unix:///tmp/valkey.sock",
        "redis://",
        "redis://127.0.0.1:notaport",
        "redis+cluster://",
        "redis+cluster://127.0.0.1:7000/3",
        "redis+cluster://127.0.0.1:7000?protocol_version=2",
    ]
    for url in bad:
        with pytest.raises(ValueError, match="store URL"):
            await RedisStore.connect(url)
    with pytest.raises(ValueError) as caught:
        await RedisStore.connect("http://user:hunter2@127.0.0.1")
    assert "hunter2" not in str(caught.value)
    for prefix in ("", "we{ir", "we}ir"):
        with pytest.raises(ValueError, match="prefix"):
            await RedisStore.connect("redis://127.0.0.1", prefix=prefix)


async def test_nothing_listening_is_unavailable_not_a_hang() -> None:
    with trio.socket.socket() as sock:  # a port nobody listens on
        await sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with trio.fail_after(5):
        with pytest.raises(StoreUnavailable):
            await RedisStore.connect(f"redis://127.0.0.1:{port}", timeout=0.5)


# ---------------------------------------------------------------- outages

OUTAGE_TIMEOUT = 0.5
SLACK = 1.0  # scheduling slack on top of the store's own deadline


def operations(
    store_: SessionStore, sid: str, epoch: str
) -> dict[str, Callable[[], Awaitable[Any]]]:
    """One call of every SessionStore method on session ``sid``."""
    return {
        "create_session": lambda: store_.create_session(record(new_id())),
        "get_session": lambda: store_.get_session(P, sid),
        "delete_session": lambda: store_.delete_session(P, new_id()),
        "rebind": lambda: store_.rebind(P, sid, "x"),
        "allocate_epoch": lambda: store_.allocate_epoch(P, sid),
        "begin_call": lambda: store_.begin_call(P, sid, "outage", FP, None),
        "finish_call": lambda: store_.finish_call(P, sid, "k", b"r"),
        "append_event": lambda: store_.append_event(
            P, sid, epoch, 1, b"x", final=False, generation=1
        ),
        "read_events": lambda: store_.read_events(P, sid, epoch, -1),
    }


async def assert_unavailable(name: str, op: Callable[[], Awaitable[Any]]) -> None:
    started = trio.current_time()
    with trio.fail_after(OUTAGE_TIMEOUT + SLACK):  # a hang fails here, as TooSlowError
        with pytest.raises(StoreUnavailable) as caught:
            await op()
    assert caught.value.__cause__ is not None, name
    assert trio.current_time() - started <= OUTAGE_TIMEOUT + SLACK, name


async def test_outage_fails_closed_then_recovers(
    private_valkey: ValkeyProcess,
) -> None:
    server = private_valkey
    async with await RedisStore.connect(server.url, timeout=OUTAGE_TIMEOUT) as s:
        rec = await new_session(s)
        sid = rec.session_id
        epoch = (await s.begin_call(P, sid, "k", FP, None)).epoch
        await s.append_event(P, sid, epoch, 0, b"e0", final=False, generation=1)

        server.stop()
        for name, op in operations(s, sid, epoch).items():
            await assert_unavailable(name, op)

        server.start()  # same port, empty: nothing was persisted
        assert await s.get_session(P, sid) is None
        # The cursor cannot be honoured any more: None (409), never "resume from head".
        assert await s.read_events(P, sid, epoch, 0) is None
        with pytest.raises(SessionGone):
            await s.begin_call(P, sid, "k", FP, None)
        with pytest.raises(SessionGone):
            await s.append_event(P, sid, epoch, 1, b"e1", final=False, generation=1)
        fresh = await new_session(s)  # and the store works again
        assert (await s.begin_call(P, fresh.session_id, "k", FP, None)).outcome is (
            CallOutcome.EXECUTE
        )


async def test_a_frozen_server_times_out_instead_of_hanging(
    private_valkey: ValkeyProcess,
) -> None:
    server = private_valkey
    async with await RedisStore.connect(server.url, timeout=OUTAGE_TIMEOUT) as s:
        sid = (await new_session(s)).session_id
        epoch = await s.allocate_epoch(P, sid)
        server.pause()
        try:
            ops = operations(s, sid, epoch)
            for name in ("get_session", "begin_call", "read_events"):
                await assert_unavailable(name, ops[name])
        finally:
            server.resume()
        # The timed-out begin_call may still have run once the server woke up: its
        # claim then reads RUNNING (at-most-once wins; it expires after retention.ttl).
        with trio.fail_after(5):
            start = await s.begin_call(P, sid, "outage", FP, None)
        assert start.outcome in (CallOutcome.RUNNING, CallOutcome.EXECUTE)
        assert await s.get_session(P, sid) is not None


async def test_a_server_refusing_writes_is_unavailable(private_valkey: ValkeyProcess) -> None:
    async with await RedisStore.connect(private_valkey.url, timeout=OUTAGE_TIMEOUT) as s:
        rec = await new_session(s)
        # Out of memory (maxmemory reached, noeviction).
        assert private_valkey.command("CONFIG", "SET", "maxmemory", "1") == b"+OK"
        with pytest.raises(StoreUnavailable) as caught:
            await s.begin_call(P, rec.session_id, "k", FP, None)
        assert "OOM" in str(caught.value.__cause__)
        assert await s.get_session(P, rec.session_id) == rec  # reads still work
        assert private_valkey.command("CONFIG", "SET", "maxmemory", "0") == b"+OK"
        # Demoted to a replica (a failover in progress): READONLY.
        assert private_valkey.command("REPLICAOF", "127.0.0.1", "1") == b"+OK"
        with pytest.raises(StoreUnavailable) as caught:
            await s.rebind(P, rec.session_id, "x")
        assert isinstance(caught.value.__cause__, coredis.exceptions.ReadOnlyError)
        assert private_valkey.command("REPLICAOF", "NO", "ONE") == b"+OK"
        assert (await s.rebind(P, rec.session_id, "x")).generation == 2


async def test_a_closed_store_is_unavailable(redis_url: str) -> None:
    s = await RedisStore.connect(redis_url, prefix=new_prefix())
    await s.aclose()
    await s.aclose()  # idempotent
    with pytest.raises(StoreUnavailable, match="closed"):
        await s.get_session(P, new_id())


async def test_mark_bound_is_recorded(store: SessionStore) -> None:
    rec = await new_session(store)
    assert (await store.get_session(P, rec.session_id)) == rec and not rec.bound
    await store.mark_bound(P, rec.session_id)
    got = await store.get_session(P, rec.session_id)
    assert got is not None and got.bound and got.salt == rec.salt
    with pytest.raises(SessionGone):
        await store.mark_bound(P, "no-such-session")


# ------------------------------------------------------------------------ tasks


async def test_a_task_is_written_over_the_version_its_writer_read(store: SessionStore) -> None:
    tid = f"t-{uuid.uuid4().hex}"
    assert await store.get_task(P, tid) is None
    created = await store.put_task(P, tid, b"working", version=0, ttl=60, cap=10)
    assert created is TaskWrite.WRITTEN
    assert await store.get_task(P, tid) == StoredTask(1, b"working")
    # A second creation, or a write over a version nobody stored, changes nothing.
    assert await store.put_task(P, tid, b"again", version=0, ttl=60, cap=10) is (TaskWrite.CONFLICT)
    assert await store.put_task(P, tid, b"ahead", version=2, ttl=60, cap=10) is (TaskWrite.CONFLICT)
    # Two replicas read version 1: the first write wins, the second must read again.
    first = await store.put_task(P, tid, b"completed", version=1, ttl=60, cap=10)
    second = await store.put_task(P, tid, b"cancelled", version=1, ttl=60, cap=10)
    assert (first, second) == (TaskWrite.WRITTEN, TaskWrite.CONFLICT)
    assert await store.get_task(P, tid) == StoredTask(2, b"completed")
    # Another principal's task is not found, exactly as an unknown one.
    assert await store.get_task("mallory", tid) is None
    assert await store.put_task("mallory", tid, b"x", version=2, ttl=60, cap=10) is (
        TaskWrite.CONFLICT
    )
    assert await store.get_task(P, tid) == StoredTask(2, b"completed")


async def test_a_principal_holds_at_most_its_cap_of_tasks(store: SessionStore) -> None:
    who = f"p-{uuid.uuid4().hex}"
    for i in range(3):
        assert await store.put_task(who, f"t{i}", b"w", version=0, ttl=60, cap=3) is (
            TaskWrite.WRITTEN
        )
    assert await store.put_task(who, "t3", b"w", version=0, ttl=60, cap=3) is TaskWrite.FULL
    assert await store.get_task(who, "t3") is None
    # Updates of held tasks are not creations; other principals have caps of their own.
    assert await store.put_task(who, "t0", b"done", version=1, ttl=60, cap=3) is (TaskWrite.WRITTEN)
    assert await store.put_task(P + who, "t0", b"w", version=0, ttl=60, cap=3) is (
        TaskWrite.WRITTEN
    )


async def test_the_memory_store_forgets_expired_tasks_of_principals_that_never_return() -> None:
    from weir.protocol.budget import RetentionBudget

    now = [0.0]
    budget = RetentionBudget(total=10_000, per_owner=10_000)
    store = MemoryStore(clock=lambda: now[0], budget=budget)
    for i in range(50):  # fifty principals, one task each, never read again
        assert await store.put_task(f"p{i}", "t", b"x" * 100, version=0, ttl=10, cap=5) is (
            TaskWrite.WRITTEN
        )
    assert budget.held == 5000
    await store.put_task("p0", "t", b"y" * 100, version=1, ttl=30, cap=5)  # p0's lives on
    now[0] = 11.0
    assert await store.put_task("late", "t", b"z", version=0, ttl=10, cap=5) is (TaskWrite.WRITTEN)
    assert budget.held == 100 + 1  # the others' bytes are given back on the next write
    assert await store.get_task("p0", "t") == StoredTask(2, b"y" * 100)
    assert await store.get_task("p7", "t") is None


async def test_an_expired_task_is_gone_and_frees_its_place(
    store_url: str | None,
) -> None:
    now = [100.0]
    if store_url is None or store_url == "sim":
        store: SessionStore = MemoryStore(clock=lambda: now[0])
        who = "alice"
        assert await store.put_task(who, "a", b"w", version=0, ttl=5, cap=1) is TaskWrite.WRITTEN
        now[0] += 4.999
        assert await store.get_task(who, "a") == StoredTask(1, b"w")  # never before its ttl
        assert await store.put_task(who, "b", b"w", version=0, ttl=5, cap=1) is TaskWrite.FULL
        now[0] += 0.001
        assert await store.get_task(who, "a") is None
        assert await store.put_task(who, "a", b"w2", version=1, ttl=5, cap=1) is (
            TaskWrite.CONFLICT
        )
        assert await store.put_task(who, "b", b"w", version=0, ttl=5, cap=1) is TaskWrite.WRITTEN
        return
    async with await RedisStore.connect(
        store_url.removesuffix("#asyncio"), prefix=new_prefix()
    ) as r:
        assert await r.put_task("alice", "a", b"w", version=0, ttl=0.05, cap=1) is (
            TaskWrite.WRITTEN
        )
        with trio.fail_after(5):  # the server expires it; poll (bounded) until it has
            while await r.get_task("alice", "a") is not None:
                await trio.sleep(0.01)
        assert await r.put_task("alice", "b", b"w", version=0, ttl=60, cap=1) is (TaskWrite.WRITTEN)


# ------------------------------------------------------------------------ durability
async def test_a_durable_write_needs_its_replicas(
    valkey_url: str, valkey_cluster6: ValkeyCluster
) -> None:
    """``replicas=1``: a session, a stream epoch, a claim, an outcome, an event or a
    task counts only once a replica holds it.  On a cluster whose primaries each have
    one, writes go through; on a lone node (no replica) each is refused -- though it
    may stand on the node."""
    async with await RedisStore.connect(
        valkey_cluster6.url, prefix=new_prefix(), replicas=1
    ) as durable:
        sid = (await new_session(durable)).session_id
        start = await durable.begin_call(P, sid, "k", FP, None, owner="r", lease=5)
        assert start.outcome is CallOutcome.EXECUTE
        await durable.finish_call(P, sid, "k", b"ok")
        assert await durable.put_task(P, "t", b"w", version=0, ttl=60, cap=5) is (TaskWrite.WRITTEN)
    prefix = new_prefix()
    async with (
        await RedisStore.connect(valkey_url, prefix=prefix) as plain,
        await RedisStore.connect(
            valkey_url, prefix=prefix, replicas=1, replica_timeout=0.05
        ) as alone,
    ):
        with pytest.raises(ReplicasBehind):  # a session id told to a client, an epoch
            await new_session(alone)
        sid = (await new_session(plain)).session_id
        with pytest.raises(ReplicasBehind):
            await alone.allocate_epoch(P, sid)
        with pytest.raises(ReplicasBehind):
            await alone.begin_call(P, sid, "k", FP, None, owner="r", lease=5)
        with pytest.raises(ReplicasBehind):
            await alone.put_task(P, "t", b"w", version=0, ttl=60, cap=5)
        # The store itself is up: reads and non-durable writes go on.
        assert await alone.get_session(P, sid) is not None
    with pytest.raises(ValueError):
        await RedisStore.connect(valkey_url, replicas=-1)
    # WAIT holds the pipelined connection: it must end within the store's deadline.
    with pytest.raises(ValueError, match="shorter than the store timeout"):
        await RedisStore.connect(valkey_url, replicas=1, replica_timeout=2.0, timeout=2.0)
