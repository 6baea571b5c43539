"""The store's cluster pipe (one pipelined connection per primary, routed by slot),
on both runtimes, against a real 3-primary, 3-replica Valkey Cluster.

What is promised (``weir.engine._slots``): a command goes straight to the primary
serving its key's slot (no redirection on a known layout); ``MOVED`` and ``ASK`` are
followed and a redirection loop ends in an error, not a hang; a primary that dies
is replaced in the layout as soon as the cluster has promoted its replica; the
durable write's ``WAIT`` runs on the node that ran the script.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import Awaitable, Callable
from typing import Any

import coredis.exceptions as cx
import pytest
import trio

from weir.asyncio._resp_cluster import AsyncioClusterPipe
from weir.engine._resp import script_sha
from weir.engine._resp_cluster import TrioClusterPipe
from weir.engine._slots import SLOTS, ClusterPipe, SlotTable, key_slot, parse_redirect

from .valkey_cluster import ValkeyCluster

Scenario = Callable[[ClusterPipe], Awaitable[Any]]
RUNTIMES = ["trio", "asyncio"]


def _drive(runtime: str, cluster: ValkeyCluster, scenario: Scenario, *, limit: float = 60) -> Any:
    """Run ``scenario(pipe)`` with a cluster pipe seeded by the first primary, on
    ``runtime``, the pipe running beside it; bounded by ``limit`` seconds."""
    seeds = [("127.0.0.1", cluster.primaries[0].port)]
    if runtime == "trio":

        async def on_trio() -> Any:
            pipe = TrioClusterPipe(seeds, timeout=1.0)
            with trio.fail_after(limit):
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(pipe.run)
                    await pipe.wait_up()
                    out = await scenario(pipe)
                    nursery.cancel_scope.cancel()
            return out

        return trio.run(on_trio)

    async def on_asyncio() -> Any:
        pipe = AsyncioClusterPipe(seeds, timeout=1.0)
        runner = asyncio.get_running_loop().create_task(pipe.run())
        try:
            async with asyncio.timeout(limit):
                await pipe.wait_up()
                return await scenario(pipe)
        finally:
            runner.cancel()
            await asyncio.gather(runner, return_exceptions=True)

    return asyncio.run(on_asyncio())


async def _sleep(seconds: float) -> None:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        await trio.sleep(seconds)
    else:
        await asyncio.sleep(seconds)


async def _together(calls: list[Awaitable[Any]]) -> list[Any]:
    """Await ``calls`` concurrently on whichever loop runs; their results in order."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        results: list[Any] = [None] * len(calls)

        async def one(i: int, call: Awaitable[Any]) -> None:
            results[i] = await call

        async with trio.open_nursery() as nursery:
            for i, call in enumerate(calls):
                nursery.start_soon(one, i, call)
        return results
    return list(await asyncio.gather(*calls))


def _keyslot(cluster: ValkeyCluster, key: str | bytes) -> int:
    return int(cluster.primaries[0].command("CLUSTER", "KEYSLOT", key).lstrip(b":"))


# -- slots and redirections, as the cluster computes them


def test_a_keys_slot_is_the_one_the_cluster_computes(valkey_cluster6: ValkeyCluster) -> None:
    keys: list[str | bytes] = [
        "weir:{alice:s-1}:s",
        "weir:i:{~anon:%7Esessionless}:c",
        "weir:{alice:~tasks}:t",
        "{}",
        "{}{a}",
        "a{}b{c}",
        "{a",
        "a}b{",
        "}{a}",
        "{a}}",
        "",
        b"\xff\x00{\xfe}",
    ]
    keys += [secrets.token_urlsafe(n) for n in (1, 5, 17, 40) for _ in range(10)]
    keys += [f"x{{{secrets.token_hex(3)}}}y" for _ in range(20)]
    for key in keys:
        assert key_slot(key) == _keyslot(valkey_cluster6, key), key


def test_redirections_are_read_and_anything_else_is_not() -> None:
    assert parse_redirect("MOVED 3999 127.0.0.1:6381") == ("MOVED", 3999, ("127.0.0.1", 6381))
    assert parse_redirect("ASK 12 node-a.example:7000") == ("ASK", 12, ("node-a.example", 7000))
    assert parse_redirect("MOVED 1 [::1]:7000") == ("MOVED", 1, ("::1", 7000))
    for other in ("ERR unknown", "MOVED 3999", "MOVED x 1.2.3.4:5", "ASK 1 host", "MOVED 1 h:p"):
        assert parse_redirect(other) is None, other


def test_a_malformed_layout_is_refused_and_the_old_one_kept() -> None:
    table = SlotTable()
    table.load([[0, SLOTS - 1, [b"10.0.0.1", 7000, b"id"]]], ("seed", 1))
    for bad in (
        b"oops",
        [[0, SLOTS, [b"h", 1]]],  # past the last slot
        [[5, 4, [b"h", 1]]],
        [[0, 10]],
        [[0, 10, [b"h"]]],
    ):
        with pytest.raises(ValueError):
            table.load(bad, ("seed", 1))
        assert table.owner(SLOTS - 1) == ("10.0.0.1", 7000)
    table.load([[0, 9, [b"", 7001]], [10, SLOTS - 1, [b"?", 7002]]], ("seed", 1))
    assert (table.owner(0), table.owner(10)) == (("seed", 7001), ("seed", 7002))


# -- routing


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_each_command_goes_straight_to_its_slots_primary(
    runtime: str, valkey_cluster6: ValkeyCluster
) -> None:
    tag = secrets.token_hex(4)
    keys = [f"pipe:{tag}:{{{i}}}" for i in range(120)]

    async def scenario(pipe: ClusterPipe) -> int:
        before = pipe.commands
        for key in keys:
            assert await pipe.call("SET", key, key) == b"OK"
        with pytest.raises(ValueError, match="routes by key"):
            await pipe.call("PING")
        return pipe.commands - before

    sent = _drive(runtime, valkey_cluster6, scenario)
    assert sent == len(keys)  # one command each: no redirection
    for key in keys:  # and each landed on the node that serves its slot
        owner = valkey_cluster6.slot_owner(key_slot(key))
        assert owner.command("GET", key) == key.encode()


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_a_durable_script_waits_on_the_node_that_ran_it(
    runtime: str, valkey_cluster6: ValkeyCluster
) -> None:
    source = "return redis.call('INCR', KEYS[1])"
    keys = [f"pipe:durable:{{{secrets.token_hex(4)}}}" for _ in range(9)]
    many = [f"pipe:group:{{{secrets.token_hex(4)}}}" for _ in range(60)]

    async def scenario(pipe: ClusterPipe) -> tuple[list[tuple[Any, int]], list[Any], int]:
        one_by_one = [
            await pipe.evalsha_durable(source, script_sha(source), [key], [], 1, 2000)
            for key in keys
        ]
        before = pipe.commands
        together = await _together(
            [pipe.evalsha_durable(source, script_sha(source), [k], [], 1, 2000) for k in many]
        )
        return one_by_one, together, pipe.commands - before

    one_by_one, together, sent = _drive(runtime, valkey_cluster6, scenario)
    assert one_by_one == [(1, 1)] * len(keys)  # each primary's one replica confirmed
    assert together == [(1, 1)] * len(many)
    # Sixty concurrent durable writes: sixty scripts and a shared WAIT per flush, far
    # fewer than one WAIT each.
    assert len(many) < sent < 1.5 * len(many), sent


# -- topology changes


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_a_killed_primary_is_replaced_in_the_layout_once_promoted(
    runtime: str, private_cluster6: ValkeyCluster
) -> None:
    cluster = private_cluster6
    key = f"pipe:failover:{{{secrets.token_hex(4)}}}"
    victim = cluster.slot_owner(key_slot(key))
    replica = cluster.replicas[cluster.primaries.index(victim)]

    async def scenario(pipe: ClusterPipe) -> tuple[float, int, int]:
        assert await pipe.call("SET", key, "before") == b"OK"
        for _ in range(200):  # until the replica holds it
            if replica.command("GET", key) == b"before":
                break
            await _sleep(0.02)
        cluster.kill(victim)
        killed = time.monotonic()
        refused = 0
        for _ in range(600):
            try:
                assert await pipe.call("SET", key, "after") == b"OK"
                break
            except (cx.ConnectionError, TimeoutError, cx.ResponseError):
                refused += 1
                await _sleep(0.05)
        else:
            raise AssertionError("never served again")
        victim_address = ("127.0.0.1", victim.port)
        assert victim_address not in pipe._nodes  # its pipe was stopped
        return time.monotonic() - killed, refused, pipe.refreshes

    took, refused, refreshes = _drive(runtime, cluster, scenario)
    print(f"\n{runtime}: served again {took:.2f} s after the kill ({refused} refusals)")
    assert cluster.role(replica) == "master"
    assert replica.command("GET", key) == b"after"
    assert refreshes >= 2  # the first read, and at least one on the error
    assert refused >= 1  # the kill was felt (and nothing hung)


def test_a_redirection_loop_ends_in_an_error_not_a_hang(
    private_cluster6: ValkeyCluster,
) -> None:
    """Two primaries that each say the other serves a slot (a broken cluster): the
    pipe follows at most a few ``MOVED`` and fails, as an outage."""
    cluster = private_cluster6
    key = f"pipe:loop:{{{secrets.token_hex(4)}}}"
    slot = key_slot(key)
    first = cluster.slot_owner(slot)
    second = next(p for p in cluster.primaries if p is not first)
    first_id = first.command("CLUSTER", "MYID").decode()
    second_id = second.command("CLUSTER", "MYID").decode()

    async def scenario(pipe: ClusterPipe) -> str:
        assert await pipe.call("GET", key) is None  # (a slot that holds no key can move)
        assert first.command("CLUSTER", "SETSLOT", str(slot), "NODE", second_id) == b"+OK"
        assert second.command("CLUSTER", "SETSLOT", str(slot), "NODE", first_id) == b"+OK"
        try:
            await pipe.call("GET", key)
        except cx.ResponseError as exc:
            return str(exc)
        raise AssertionError("a redirection loop was answered")

    message = _drive("trio", cluster, scenario, limit=20)
    assert message.startswith("MOVED"), message
