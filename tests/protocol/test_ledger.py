"""CallLedger: the in-process gate records, their answers and their bounds.

The state machine drives random claims, outcomes and sheds against a model of what
each key may answer, and checks the gate's promises after every step: a running
claim is never dropped; a finished call answers its own response, a tombstone
(``EVICTED``), or -- only once forgotten whole -- is claimable again; never another
call's response; a tombstone never turns back into a response.
"""

from __future__ import annotations

from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from weir.protocol._gate import ENTRY_OVERHEAD
from weir.protocol.gate import CallLedger, CallOutcome


def test_claim_run_record_replay() -> None:
    ledger = CallLedger()
    assert ledger.begin("k", b"fp") == (CallOutcome.EXECUTE, None)
    assert ledger.begin("k", b"fp") == (CallOutcome.RUNNING, None)
    assert ledger.begin("k", b"other") == (CallOutcome.MISMATCH, None)
    ledger.finish("k", b"response")
    assert ledger.begin("k", b"fp") == (CallOutcome.DONE, b"response")
    assert ledger.held == len("k") + ENTRY_OVERHEAD + len(b"response")


def test_a_released_claim_may_run_again_and_frees_its_bytes() -> None:
    ledger = CallLedger()
    ledger.begin("k", b"fp")
    ledger.finish("k", None)  # nothing ran to completion
    assert ledger.held == 0 and len(ledger) == 0
    assert ledger.begin("k", b"fp") == (CallOutcome.EXECUTE, None)


def test_finishing_an_unknown_key_changes_nothing() -> None:
    ledger = CallLedger()
    ledger.finish("never-claimed", b"x")
    assert ledger.held == 0 and len(ledger) == 0


def test_the_count_bound_forgets_the_oldest_finished_never_a_running_claim() -> None:
    ledger = CallLedger(max_calls=3)
    ledger.begin("running", b"fp")
    for n in range(5):
        ledger.begin(f"k{n}", b"fp")
        ledger.finish(f"k{n}", b"r")
    assert len(ledger) == 3
    assert ledger.begin("running", b"fp") == (CallOutcome.RUNNING, None)
    assert ledger.begin("k4", b"fp") == (CallOutcome.DONE, b"r")
    assert ledger.begin("k0", b"fp")[0] is CallOutcome.EXECUTE  # forgotten whole


def test_the_byte_bound_drops_responses_first_and_leaves_tombstones() -> None:
    big = b"x" * 1000
    ledger = CallLedger(max_bytes=3 * ENTRY_OVERHEAD + 1500)
    for key in ("a", "b", "c"):
        ledger.begin(key, b"fp")
        ledger.finish(key, big)
    assert ledger.held <= ledger.max_bytes
    assert ledger.begin("a", b"fp") == (CallOutcome.EVICTED, None)  # ran; result gone
    assert ledger.begin("c", b"fp") == (CallOutcome.DONE, big)  # the newest stays


def test_shed_frees_what_it_says_oldest_responses_first() -> None:
    ledger = CallLedger()
    for key in ("a", "b"):
        ledger.begin(key, b"fp")
        ledger.finish(key, b"y" * 100)
    before = ledger.held
    freed = ledger.shed(50)
    assert freed == 100 and ledger.held == before - 100
    assert ledger.begin("a", b"fp") == (CallOutcome.EVICTED, None)
    assert ledger.begin("b", b"fp") == (CallOutcome.DONE, b"y" * 100)
    assert ledger.recent(5) == [b"y" * 100]


def test_shed_never_forgets_a_key_however_much_is_asked() -> None:
    """Memory pressure leaves tombstones: a second shed, with only keys left, frees
    nothing rather than forget a finished call (whose retry would then run again)."""
    ledger = CallLedger()
    for key in ("a", "b"):
        ledger.begin(key, b"fp")
        ledger.finish(key, b"y" * 100)
    assert ledger.shed(10_000) == 200  # both responses, no more
    assert ledger.shed(10) == 0  # only tombstones left: they stay
    assert len(ledger) == 2 and ledger.held == 2 * (1 + ENTRY_OVERHEAD)
    assert ledger.begin("a", b"fp") == (CallOutcome.EVICTED, None)
    assert ledger.begin("b", b"fp") == (CallOutcome.EVICTED, None)


KEYS = st.sampled_from([f"k{n}" for n in range(6)])


class LedgerMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.ledger = CallLedger(max_calls=4, max_bytes=5 * ENTRY_OVERHEAD + 400)
        #: What the model knows: running keys, and what each finished key stored.
        self.running: set[str] = set()
        self.stored: dict[str, bytes] = {}
        self.evicted: set[str] = set()

    @rule(key=KEYS)
    def begin(self, key: str) -> None:
        outcome, payload = self.ledger.begin(key, b"fp")
        if key in self.running:
            assert outcome is CallOutcome.RUNNING
        elif outcome is CallOutcome.DONE:
            assert key in self.stored and key not in self.evicted
            assert payload == self.stored[key]
        elif outcome is CallOutcome.EVICTED:
            assert key in self.stored
            self.evicted.add(key)
        else:
            assert outcome is CallOutcome.EXECUTE, outcome
            self.stored.pop(key, None)
            self.evicted.discard(key)
            self.running.add(key)

    @precondition(lambda self: self.running)
    @rule(data=st.data(), size=st.integers(0, 300), completes=st.booleans())
    def finish(self, data: st.DataObject, size: int, completes: bool) -> None:
        key = data.draw(st.sampled_from(sorted(self.running)))
        self.running.discard(key)
        if completes:
            payload = key.encode() * (size // 2 + 1)
            self.ledger.finish(key, payload)
            self.stored[key] = payload
        else:
            self.ledger.finish(key, None)

    @rule(nbytes=st.integers(0, 2000))
    def shed(self, nbytes: int) -> None:
        before, keys = self.ledger.held, len(self.ledger)
        freed = self.ledger.shed(nbytes)
        assert freed == before - self.ledger.held >= 0
        assert len(self.ledger) == keys  # a shed only tombstones: no key is forgotten

    @invariant()
    def held_is_never_negative_and_zero_when_empty(self) -> None:
        assert self.ledger.held >= 0
        assert (self.ledger.held == 0) == (len(self.ledger) == 0)

    @invariant()
    def running_claims_are_all_still_there(self) -> None:
        assert len(self.ledger) >= len(self.running)


TestLedgerMachine = LedgerMachine.TestCase
