"""While the shared store does not answer, every request is still answered, the same
on both runtimes.

Real ``weir serve`` processes (``--runtime trio`` and ``--runtime asyncio``) on a
Valkey of the test's own, frozen (``SIGSTOP``) while the request is served, so the
store's operations fail by their deadline (about 2 s).  A probe of both runtimes
under such outages found three places where one of them did not answer as it must:

* a sessionless ``tasks/get`` escaped the asyncio runtime's error handling (the
  connection dropped, a traceback logged), where Trio answered 503;
* a ``tools/call`` that must create a task opened its stream (its head waits 1 s for
  output, less than the store takes to fail) and then, when the task's record could
  not be written, sent nothing more on either runtime: a stream left open and
  unanswered;
* on the asyncio runtime the replicas' request-state key was fetched from the store
  only when the first request needed it, so a round answered ``input_required``
  while the store was down was never answered; ``weir serve`` now fetches it at
  start-up, as the Trio engine does.

What a client gets instead: 503 ``store_unavailable``, or that error, for the
call's id, as the final event of a stream already begun.  weir logs the outage as a
warning, never an error (the store's client library may log its own reconnection).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import trio

from tests.engine.helpers import H11Client, SseReply
from tests.engine.helpers import Reply as EngineReply

from .configured import RUNTIMES
from .conftest import ValkeyProcess
from .rawhttp import Reply
from .serverproc import WeirProcess
from .test_mixed_replicas import APP, answer_of
from .test_tasks import post, result, rpc


@contextmanager
def served(
    runtime: str, valkey: ValkeyProcess, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[WeirProcess]:
    """``weir serve`` of the mixed-replica app on ``runtime``, its store ``valkey``."""
    monkeypatch.setenv("WEIR_TEST_LEDGER", str(tmp_path / "ledger"))
    with (tmp_path / "out").open("w+b") as out, (tmp_path / "err").open("w+b") as err:
        proc = WeirProcess(APP, out, err, ["--store", valkey.url], driver=runtime)
        try:
            yield proc
        finally:
            proc.stop()


async def while_frozen(valkey: ValkeyProcess, port: int, message: dict[str, Any]) -> Reply:
    """POST ``message`` (2026-07-28) while ``valkey`` is frozen; its reply."""
    valkey.pause()
    try:
        with trio.fail_after(30):
            return await post(port, message)
    finally:
        valkey.resume()


def ping(rid: int) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": rid, "method": "ping"}


def no_error_logged(proc: WeirProcess) -> None:
    assert "ERROR weir" not in proc.stderr(), proc.stderr()[-3000:]


@RUNTIMES
async def test_a_task_read_while_the_store_is_down_is_refused_503(
    runtime: str, private_valkey: ValkeyProcess, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``tasks/get``: 503 ``store_unavailable`` (retry later), as for any other
    request -- not a dropped connection."""
    with served(runtime, private_valkey, tmp_path, monkeypatch) as proc:
        call = rpc(1, "tools/call", {"name": "charge_task", "arguments": {"key": "down"}})
        task_id = (await result(proc.port, call))["taskId"]
        reply = await while_frozen(
            private_valkey, proc.port, rpc(2, "tasks/get", {"taskId": task_id})
        )
        assert reply.status == 503 and reply.reason == "store_unavailable", reply
        no_error_logged(proc)


@RUNTIMES
async def test_a_task_the_store_could_not_record_is_answered_store_unavailable(
    runtime: str, private_valkey: ValkeyProcess, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A ``tools/call`` that must create a task: answered ``store_unavailable`` for
    its id -- 503, or the final event of its stream once that has begun -- never a
    stream that stays open unanswered."""
    with served(runtime, private_valkey, tmp_path, monkeypatch) as proc:
        call = rpc(3, "tools/call", {"name": "charge_task", "arguments": {"key": "unrecorded"}})
        reply = await while_frozen(private_valkey, proc.port, call)
        assert reply.status in (200, 503), reply
        answer = answer_of(reply)
        assert answer["id"] == 3, answer
        assert answer["error"]["data"]["reason"] == "store_unavailable", answer
        no_error_logged(proc)


@RUNTIMES
async def test_a_round_is_sealed_while_the_store_is_down(
    runtime: str, private_valkey: ValkeyProcess, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A call answered ``input_required`` needs no store but the replicas' sealing
    key, which ``weir serve`` holds from its start: the round is answered with its
    ``requestState`` while the store is down."""
    with served(runtime, private_valkey, tmp_path, monkeypatch) as proc:
        call = rpc(4, "tools/call", {"name": "confirm", "arguments": {"key": "sealed"}})
        reply = await while_frozen(private_valkey, proc.port, call)
        assert reply.status == 200, reply
        asked = answer_of(reply)["result"]
        assert asked["resultType"] == "input_required" and asked["requestState"], asked
        no_error_logged(proc)


@RUNTIMES
async def test_a_session_refused_while_the_store_is_down_answers_the_requests_id(
    runtime: str, private_valkey: ValkeyProcess, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A session-era POST and a 2024-11-05 ``/messages`` POST whose session the store
    cannot look up: 503 ``store_unavailable`` whose JSON-RPC error carries the
    request's id (the Trio runtime answered ``null`` for both, asyncio for the
    legacy one), so a client can tell which of its calls was not run."""
    with served(runtime, private_valkey, tmp_path, monkeypatch) as proc:
        session = H11Client(await trio.open_tcp_stream("127.0.0.1", proc.port))
        await session.initialize()
        legacy = H11Client(await trio.open_tcp_stream("127.0.0.1", proc.port))
        legacy.protocol_version = None  # (the legacy transport has no version header)
        stream = await legacy.send("GET", target="/sse", headers={"accept": "text/event-stream"})
        assert isinstance(stream, SseReply), stream
        [endpoint] = await stream.next_batch()
        poster = H11Client(await trio.open_tcp_stream("127.0.0.1", proc.port))
        poster.protocol_version = None
        private_valkey.pause()
        try:
            with trio.fail_after(30):
                replies = {
                    5: await session.post(ping(5)),
                    6: await poster.send(
                        "POST", json.dumps(ping(6)).encode(), target=endpoint.data
                    ),
                }
        finally:
            private_valkey.resume()
        for rid, reply in replies.items():
            assert isinstance(reply, EngineReply) and reply.status == 503, reply
            error = reply.json()
            assert error["id"] == rid, error
            assert error["error"]["data"]["reason"] == "store_unavailable", error
        no_error_logged(proc)
