"""The retention budget: bytes per owner and in total, oldest evicted first."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from protocol import RetentionBudget, StreamKind, StreamLog


class Store:
    """Items held in a budget, as an owner would keep them (name -> bytes)."""

    def __init__(self, budget: RetentionBudget) -> None:
        self.budget = budget
        self.items: dict[tuple[str, str], int] = {}
        self.evicted: list[tuple[str, str]] = []
        self.keep: dict[tuple[str, str], int] = {}  # bytes an item cannot give up

    def put(self, owner: str, key: str, size: int) -> None:
        self.items[(owner, key)] = size
        self.budget.hold(owner, key, size, lambda: self._evict(owner, key))

    def _evict(self, owner: str, key: str) -> int:
        self.evicted.append((owner, key))
        left = min(self.keep.get((owner, key), 0), self.items[(owner, key)])
        if left:
            self.items[(owner, key)] = left
        else:
            del self.items[(owner, key)]
        return left


def test_the_owners_oldest_item_goes_first() -> None:
    store = Store(RetentionBudget(total=1000, per_owner=100))
    store.put("a", "1", 40)
    store.put("b", "1", 40)
    store.put("a", "2", 40)
    assert store.evicted == []
    store.put("a", "3", 40)  # a: 120 > 100
    assert store.evicted == [("a", "1")]
    assert store.budget.owner_held("a") == 80 and store.budget.held == 120


def test_the_total_evicts_the_oldest_anywhere() -> None:
    store = Store(RetentionBudget(total=100, per_owner=100))
    store.put("a", "1", 30)
    store.put("b", "1", 30)
    store.put("c", "1", 30)
    store.put("c", "2", 30)
    assert store.evicted == [("a", "1")]
    assert store.budget.held == 90


def test_holding_again_keeps_the_age_and_takes_the_new_size() -> None:
    store = Store(RetentionBudget(total=1000, per_owner=100))
    store.put("a", "old", 10)
    store.put("a", "new", 10)
    store.put("a", "old", 50)  # grown, still the oldest
    store.put("a", "x", 45)  # 105 > 100: "old" goes, not "new"
    assert store.evicted == [("a", "old")]


def test_an_item_that_must_keep_bytes_stays_as_the_newest_and_eviction_ends() -> None:
    store = Store(RetentionBudget(total=1000, per_owner=100))
    store.keep[("a", "live")] = 30
    store.put("a", "live", 60)
    store.put("a", "b", 60)  # 120: "live" gives up 30, then "b" is over on its own
    assert store.budget.owner_held("a") <= 100
    assert ("a", "live") in store.items and store.items[("a", "live")] == 30
    assert store.budget.evictions >= 1


def test_release_and_release_owner_return_what_was_held() -> None:
    budget = RetentionBudget(total=1000, per_owner=500)
    budget.hold("a", "1", 10, lambda: 0)
    budget.hold("a", "2", 20, lambda: 0)
    budget.hold("b", "1", 5, lambda: 0)
    assert budget.release("a", "1") == 10 and budget.release("a", "1") == 0
    assert budget.release_owner("a") == 20 and budget.owner_held("a") == 0
    assert budget.held == 5 and len(budget) == 1


def test_bad_limits_are_refused() -> None:
    with pytest.raises(ValueError):
        RetentionBudget(total=0, per_owner=0)
    with pytest.raises(ValueError):
        RetentionBudget(total=10, per_owner=11)
    with pytest.raises(ValueError):
        RetentionBudget(total=10, per_owner=5).hold("a", "k", -1, lambda: 0)


ops = st.lists(
    st.tuples(
        st.sampled_from(["hold", "release", "drop"]),
        st.sampled_from(["a", "b", "c"]),
        st.sampled_from(["1", "2", "3", "4"]),
        st.integers(min_value=0, max_value=120),
        st.integers(min_value=0, max_value=40),
    ),
    max_size=60,
)


@settings(max_examples=300, deadline=None)
@given(ops)
def test_accounting_matches_what_owners_keep_and_caps_hold(
    steps: list[tuple[str, str, str, int, int]],
) -> None:
    budget = RetentionBudget(total=200, per_owner=100)
    store = Store(budget)
    for op, owner, key, size, keep in steps:
        if op == "hold":
            store.keep[(owner, key)] = keep
            store.put(owner, key, size)
        elif op == "release" and (owner, key) in store.items:
            del store.items[(owner, key)]
            budget.release(owner, key)
        elif op == "drop":
            for k in [k for k in store.items if k[0] == owner]:
                del store.items[k]
            budget.release_owner(owner)
        # The ledger says exactly what the owners keep.
        assert budget.held == sum(store.items.values())
        for o in "abc":
            assert budget.owner_held(o) == sum(v for k, v in store.items.items() if k[0] == o)
        # Past every hold, the caps hold -- up to what items could not give up.
        stuck = {k: v for k, v in store.items.items() if store.keep.get(k, 0) >= v}
        for o in "abc":
            unmovable = sum(v for k, v in stuck.items() if k[0] == o)
            assert budget.owner_held(o) <= max(100, unmovable)
        assert budget.held <= max(200, sum(stuck.values()))


def test_stream_log_counts_retained_bytes_and_trims_only_acknowledged_frames() -> None:
    log = StreamLog("0000000a", StreamKind.STANDALONE, max_events=8)
    for i in range(5):
        log.append(f'{{"n":{i}}}')
    sizes = [len(f) for f in log.frames_from(0)]
    assert log.retained_bytes == sum(sizes)
    assert log.mark_drained(3) == (3, sum(sizes[:3]))
    assert log.undrained() == (2, sum(sizes[3:]))
    assert log.trim_drained() == sum(sizes[3:])
    assert log.first_retained() == 3
    assert log.retained_bytes == sum(sizes[3:])
    with pytest.raises(Exception, match="unacknowledged"):
        log.forget()
    log.drain_all()
    log.forget()
    assert log.retained_bytes == 0


def test_mark_drained_visits_only_the_newly_drained_frames() -> None:
    # With the oldest frames dropped by the count limit, seq and index differ.
    log = StreamLog("0000000b", StreamKind.STANDALONE, max_events=4)
    for i in range(10):
        log.append(str(i))
        log.mark_drained(i + 1)  # each acknowledged at once, so the count limit may drop
    assert log.first_retained() == 6
    for i in range(10, 13):
        log.append(str(i))
    frames = log.frames_from(10)
    assert log.mark_drained(12) == (2, len(frames[0]) + len(frames[1]))
    assert log.undrained() == (1, len(frames[2]))
