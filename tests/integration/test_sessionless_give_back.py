"""A keyed sessionless call that did not finish gives its ``Idempotency-Key`` back.

On the sessionless revision (2026-07-28) a ``tools/call`` with an ``Idempotency-Key``
claims the key in its principal's namespace before it runs; its outcome is recorded
under the key, and a retry replays it.  When nothing finished, the key is given back
(:class:`~weir.protocol.post.GiveBack`), so the next request under it runs:

* the handler's answer is ``input_required`` -- the next round, sent under the same
  key with the answers and the sealed ``requestState``, runs the handler again (a
  key still held would refuse it 422 ``idempotency_key_reused``: another request
  under a claimed key);
* the handler was refused (400 -32021: it asked for a capability the request did
  not declare) -- the identical retry runs again and is refused again (a key still
  held would make it wait for a call that never ends, then 409 ``in_progress``);
* the answer's stream could not be opened, after the claim and before the handler
  ran -- the retry runs the call.  Only a store that handed a stream's epoch out
  twice (it lost acknowledged writes) fails there, and a sessionless answer's epoch
  is drawn by the process itself, so the failure is injected: the runtime's
  function that opens the stream refuses once, 503 ``store_unavailable``.

Both runtimes, in this process with their memory store (:mod:`.runtimes`); and on a
shared Valkey, a round whose key one runtime gave back continues on the other
(``weir serve`` processes of :mod:`.test_mixed_replicas`).  Real loopback sockets.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio

from weir.engine import App, Context
from weir.protocol import SERVER_ERROR, Reason, RemoteProtocolError
from weir.protocol.streams import StreamKind

from .rawhttp import Client, Reply
from .runtimes import RUNTIMES, serving
from .test_mixed_replicas import answer_of, ledger, replicas

V = "2026-07-28"
BOTH = "application/json, text/event-stream"
#: A retried call that finds its key claimed waits this long before 409 (a key
#: wrongly kept costs the test no more).
IN_PROGRESS_WAIT = 0.5


def _meta(*capabilities: str) -> dict[str, Any]:
    return {
        "io.modelcontextprotocol/protocolVersion": V,
        "io.modelcontextprotocol/clientCapabilities": {c: {} for c in capabilities},
    }


def _app() -> tuple[App, list[str]]:
    """An app whose tools note each run (at entry, before they ask anything)."""
    app = App("give-back")
    runs: list[str] = []

    @app.tool()
    async def confirm(ctx: Context, item: str) -> str:
        """Ask the user to confirm ``item``; say what they answered."""
        runs.append(item)
        answer = await ctx.elicit(f"Delete {item}?", {"type": "object"}, key="ok")
        return f"{item}: {answer.get('action')}"

    @app.tool()
    async def echo(text: str) -> str:
        """Echo ``text``."""
        runs.append(text)
        return text

    return app, runs


async def _call(
    port: int,
    rid: int,
    name: str,
    arguments: dict[str, Any],
    key: str,
    meta: dict[str, Any],
    **round_: Any,
) -> Reply:
    """One keyed 2026-07-28 ``tools/call`` on a fresh connection (accepting SSE)."""
    params = {"name": name, "arguments": arguments, "_meta": meta, **round_}
    message = {"jsonrpc": "2.0", "id": rid, "method": "tools/call", "params": params}
    headers = {
        "mcp-protocol-version": V,
        "mcp-method": "tools/call",
        "mcp-name": name,
        "idempotency-key": key,
        "accept": BOTH,
    }
    c = await Client.connect(port)
    try:
        return await c.request("POST", "/mcp", message, headers=headers)
    finally:
        await c.aclose()


def _input_required(reply: Reply) -> dict[str, Any]:
    assert reply.status == 200, reply
    asked: dict[str, Any] = reply.json()["result"]
    assert asked["resultType"] == "input_required", asked
    assert list(asked["inputRequests"]) == ["ok"], asked
    return asked


ANSWER = {"ok": {"action": "accept", "content": {}}}


@RUNTIMES
async def test_a_keyed_round_answered_input_required_gives_its_key_back(runtime: str) -> None:
    """Round one of a keyed call is answered ``input_required``: nothing finished, so
    its key is free, and round two -- the same key, the answer, the sealed state -- runs
    the handler again and is answered with its result."""
    app, runs = _app()
    meta = _meta("elicitation")
    with serving(runtime, app, in_progress_wait=IN_PROGRESS_WAIT) as served, trio.fail_after(20):
        asked = _input_required(await _call(served.port, 1, "confirm", {"item": "x"}, "k", meta))
        second = await _call(
            served.port,
            2,
            "confirm",
            {"item": "x"},
            "k",
            meta,
            inputResponses=ANSWER,
            requestState=asked["requestState"],
        )
        assert second.status == 200, second
        assert second.json()["result"]["content"][0]["text"] == "x: accept", second
    assert runs == ["x", "x"]


@RUNTIMES
async def test_a_keyed_call_its_handler_refused_gives_its_key_back(runtime: str) -> None:
    """A keyed call whose handler asks for a capability the request did not declare is
    refused 400 -32021: nothing finished, the key is free, and the identical retry
    runs the handler again (refused again) -- it does not wait on a claim nobody
    holds any more."""
    app, runs = _app()
    with serving(runtime, app, in_progress_wait=IN_PROGRESS_WAIT) as served, trio.fail_after(20):
        for rid in (1, 1):
            refused = await _call(served.port, rid, "confirm", {"item": "y"}, "k", _meta())
            assert refused.status == 400, refused
            error = refused.json()["error"]
            assert error["code"] == -32021, error
            assert error["data"]["requiredCapabilities"] == {"elicitation": {}}, error
    assert runs == ["y", "y"]


def _lost_writes() -> RemoteProtocolError:
    """503 ``store_unavailable``, nothing run: how a request is refused whose stream's
    epoch a store handed out twice (it lost writes it had acknowledged)."""
    return RemoteProtocolError(
        "the store issued this stream's epoch a second time",
        http_status=503,
        reason=Reason.STORE_UNAVAILABLE,
        code=SERVER_ERROR,
    )


def _fail_the_next_answer_stream(runtime: str, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Make the next sessionless answer stream fail to open (:func:`_lost_writes`); the
    list is emptied when it has."""
    armed = ["armed"]
    if runtime == "trio":
        import weir.engine._owners
        import weir.engine._sessionless as trio_sessionless

        opens = weir.engine._owners.open_answer_stream  # (what the engine calls, by name)

        def open_answer_stream(owner: Any, max_events: int) -> Any:
            if armed:
                armed.clear()
                raise _lost_writes()
            return opens(owner, max_events)

        monkeypatch.setattr(trio_sessionless, "open_answer_stream", open_answer_stream)
    else:
        from weir.asyncio._session import Session

        open_stream = Session.open_stream

        def failing(self: Session, kind: StreamKind, *args: Any, **kwargs: Any) -> Any:
            if armed and kind is StreamKind.REQUEST and kwargs.get("emit_ids") is False:
                armed.clear()
                raise _lost_writes()
            return open_stream(self, kind, *args, **kwargs)

        monkeypatch.setattr(Session, "open_stream", failing)
    return armed


@RUNTIMES
async def test_a_keyed_call_whose_answer_stream_did_not_open_gives_its_key_back(
    runtime: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A keyed call whose answer stream cannot be opened (after its key was claimed,
    before its handler ran) is refused 503 with nothing run; its key is given back,
    so the retry runs the call and is answered."""
    app, runs = _app()
    armed = _fail_the_next_answer_stream(runtime, monkeypatch)
    with serving(runtime, app, in_progress_wait=IN_PROGRESS_WAIT) as served, trio.fail_after(20):
        failed = await _call(served.port, 1, "echo", {"text": "hello"}, "k", _meta())
        assert not armed, "the answer stream was not opened"
        assert failed.status == 503 and failed.reason == "store_unavailable", failed
        assert runs == []
        retried = await _call(served.port, 1, "echo", {"text": "hello"}, "k", _meta())
        assert retried.status == 200, retried
        assert retried.json()["result"]["content"][0]["text"] == "hello", retried
    assert runs == ["hello"]


@pytest.mark.parametrize("first", ["trio", "asyncio"])
async def test_a_key_one_runtime_gave_back_serves_the_next_round_on_the_other(
    first: str, valkey_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a shared Valkey: round one of a keyed call, answered ``input_required`` by one
    runtime, gives the key back in the store; round two under the same key, on the
    other runtime, runs the handler there and is answered."""
    other = "asyncio" if first == "trio" else "trio"
    meta = _meta("elicitation")
    key = f"round-{first}"
    with replicas(valkey_url, tmp_path, monkeypatch) as procs, trio.fail_after(60):
        asked = _input_required(
            await _call(procs[first].port, 1, "confirm", {"key": key}, key, meta)
        )
        second = await _call(
            procs[other].port,
            2,
            "confirm",
            {"key": key},
            key,
            meta,
            inputResponses=ANSWER,
            requestState=asked["requestState"],
        )
        assert second.status == 200, second
        assert answer_of(second)["result"]["content"][0]["text"] == f"{key}: accept", second
        pids = {name: str(p.proc.pid) for name, p in procs.items()}
        assert [line.split() for line in ledger(tmp_path)] == [
            ["ask", key, pids[first]],
            ["ask", key, pids[other]],
            ["confirmed", key, pids[other]],
        ]
