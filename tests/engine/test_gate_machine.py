"""The idempotency gate as a state machine: the core's decisions over a real store.

Hypothesis drives deliveries of keyed calls (same or different request), their
completions and their releases against :class:`~weir.engine.MemoryStore` (the
atomic claim) and :func:`~weir.protocol._gate.gate_decision` (what a delivery does),
and checks them against a model of the guarantee: a key executes at most once at
a time, a finished call is replayed with exactly its stored response and never
runs again, a released call may run again, and another request under a used key
is refused 422, never answered with the wrong response.

The memory store's methods never suspend, so each coroutine is run to completion
in place (:func:`_now`) -- no event loop, no clock.
"""

from __future__ import annotations

from collections.abc import Coroutine
from typing import Any, TypeVar

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from weir.engine import MemoryStore, SessionRecord
from weir.protocol import Reason
from weir.protocol._gate import Execute, Refuse, Replay, Wait, call_key, gate_decision
from weir.protocol.gate import CallStart

T = TypeVar("T")
KEYS = st.sampled_from(["pay-1", "pay-2", "pay-3"])
REQUESTS = st.sampled_from([b"fp-A", b"fp-B"])  # the fingerprints of two different calls


def _now(coro: Coroutine[Any, Any, T]) -> T:
    """Run a coroutine that never suspends; its result."""
    try:
        coro.send(None)
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]
    coro.close()
    raise AssertionError("the memory store suspended")


class GateMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.store = MemoryStore()
        record = SessionRecord(
            session_id="s", principal="p", protocol_version="2025-11-25", created_at=0.0
        )
        _now(self.store.create_session(record))
        # The model: per key, ("running", fp) or ("done", fp, payload).
        self.model: dict[str, tuple[Any, ...]] = {}
        self.executions: dict[str, int] = {}
        self.n = 0

    def _running(self) -> list[str]:
        return sorted(k for k, v in self.model.items() if v[0] == "running")

    def _begin(self, header: str, fp: bytes) -> tuple[str, CallStart]:
        key = call_key(header, 1)
        return key, _now(self.store.begin_call("p", "s", key, fp, None))

    @rule(header=KEYS, fp=REQUESTS, late=st.booleans())
    def deliver(self, header: str, fp: bytes, late: bool) -> None:
        key, start = self._begin(header, fp)
        now, give_up_at = (2.0, 1.0) if late else (0.0, 1.0)
        decision = gate_decision(start, key, 7, now=now, give_up_at=give_up_at, retry_ms=100)
        known = self.model.get(key)
        if known is None:
            assert isinstance(decision, Execute)
            self.model[key] = ("running", fp)
            self.executions[key] = self.executions.get(key, 0) + 1
        elif known[1] != fp:
            assert isinstance(decision, Refuse)
            assert decision.error.reason is Reason.IDEMPOTENCY_KEY_REUSED
        elif known[0] == "running":
            if late:
                assert isinstance(decision, Refuse)
                assert decision.error.reason is Reason.IN_PROGRESS
            else:
                assert isinstance(decision, Wait)
        else:
            assert isinstance(decision, Replay) and decision.payload == known[2]

    @precondition(lambda self: any(v[0] == "running" for v in self.model.values()))
    @rule(data=st.data())
    def finish(self, data: st.DataObject) -> None:
        key = data.draw(
            st.sampled_from(sorted(k for k, v in self.model.items() if v[0] == "running"))
        )
        self.n += 1
        payload = b'{"jsonrpc":"2.0","id":1,"result":{"n":%d}}' % self.n
        _now(self.store.finish_call("p", "s", key, payload))
        self.model[key] = ("done", self.model[key][1], payload)

    @precondition(lambda self: any(v[0] == "running" for v in self.model.values()))
    @rule(data=st.data())
    def release(self, data: st.DataObject) -> None:
        # The delivery never started its tool (a kill before it, say): the key goes back.
        key = data.draw(
            st.sampled_from(sorted(k for k, v in self.model.items() if v[0] == "running"))
        )
        _now(self.store.finish_call("p", "s", key, None))
        del self.model[key]
        self.executions[key] -= 1  # it never ran

    @invariant()
    def a_key_runs_at_most_once(self) -> None:
        assert all(count <= 1 for count in self.executions.values()), self.executions


GateMachine.TestCase.settings = settings(max_examples=200, stateful_step_count=30, deadline=None)
TestGateMachine = GateMachine.TestCase
