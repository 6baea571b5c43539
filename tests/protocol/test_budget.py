"""The retention budget: bytes per owner and in total, oldest evicted first."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from weir.protocol import Reason, RemoteProtocolError
from weir.protocol._budget import STUCK_RESCAN
from weir.protocol.budget import RetentionBudget
from weir.protocol.streams import StreamKind, StreamLog


class Owner:
    """An owner keeping items oldest first, some of which must keep some bytes."""

    def __init__(self, budget: RetentionBudget, name: str) -> None:
        self.budget = budget
        self.name = name
        self.items: dict[str, int] = {}  # insertion order = age
        self.keep: dict[str, int] = {}  # bytes an item cannot give up
        self.shed_calls = 0
        budget.register(name, self.shed)

    def put(self, key: str, size: int) -> None:
        old = self.items.pop(key, 0)
        self.items[key] = size
        self.budget.charge(self.name, size - old)

    def drop(self, key: str) -> None:
        self.budget.charge(self.name, -self.items.pop(key))

    def shed(self, nbytes: int) -> None:
        self.shed_calls += 1
        freed = 0
        for key in list(self.items):
            if freed >= nbytes:
                break
            size = self.items[key]
            left = min(self.keep.get(key, 0), size)
            if left:
                self.items[key] = left
            else:
                del self.items[key]
            freed += size - left
        self.budget.charge(self.name, -freed)


def test_the_owners_oldest_items_go_first() -> None:
    budget = RetentionBudget(total=1000, per_owner=100)
    a, b = Owner(budget, "a"), Owner(budget, "b")
    a.put("1", 40)
    b.put("1", 40)
    a.put("2", 40)
    assert a.shed_calls == 0
    a.put("3", 40)  # a: 120 > 100
    assert list(a.items) == ["2", "3"] and list(b.items) == ["1"]
    assert budget.owner_held("a") == 80 and budget.held == 120
    assert budget.evictions == 1 and budget.evicted_bytes == 40


def test_the_total_sheds_the_owner_charged_longest_ago_first() -> None:
    budget = RetentionBudget(total=100, per_owner=100)
    a, b, c = Owner(budget, "a"), Owner(budget, "b"), Owner(budget, "c")
    a.put("1", 30)
    b.put("1", 30)
    c.put("1", 30)
    c.put("2", 30)
    assert a.items == {} and list(b.items) == ["1"] and budget.held == 90


def test_an_owner_that_must_keep_bytes_frees_what_it_can() -> None:
    budget = RetentionBudget(total=1000, per_owner=100)
    a = Owner(budget, "a")
    a.keep["live"] = 30
    a.put("live", 60)
    a.put("b", 60)  # 120: "live" gives up 30 and that is enough
    assert a.items == {"live": 30, "b": 60} and budget.owner_held("a") == 90


def test_a_budget_full_of_what_must_stay_does_not_walk_every_owner_per_charge() -> None:
    budget = RetentionBudget(total=1000, per_owner=1000)
    keepers = [Owner(budget, f"k{i}") for i in range(100)]
    for i, owner in enumerate(keepers):  # 100 owners whose 10 bytes must stay
        owner.keep["key"] = 10
        owner.put("key", 10 + (i == 99) * 100)  # the last one goes over: all shed at once
    assert budget.held == 1000 + 100 - 100
    new = Owner(budget, "new")
    walks_before = sum(o.shed_calls for o in keepers)
    for n in range(STUCK_RESCAN * 4):  # (256 charges)
        new.put(f"r{n}", 5)  # each result is the new owner's, sheddable: it goes
    asked = sum(o.shed_calls for o in keepers) - walks_before
    # Stuck over the total: a walk over the 100 keepers only every 101 charges (one per
    # owner; before: a walk per charge, 25,600 asks), and the total still holds.
    assert asked <= 100 * 3 and budget.held <= budget.total
    # Bytes that became sheddable without a charge of their own are reached at the
    # next walk, within as many charges as there are owners.
    keepers[0].keep.clear()
    keepers[0].items["key"] = 10
    for n in range(len(budget) + 1):
        new.put(f"s{n}", 5)
    assert keepers[0].items == {}


def test_release_owner_returns_what_it_held() -> None:
    budget = RetentionBudget(total=1000, per_owner=500)
    a, b = Owner(budget, "a"), Owner(budget, "b")
    a.put("1", 10)
    a.put("2", 20)
    b.put("1", 5)
    a.drop("1")
    assert budget.release_owner("a") == 20 and budget.owner_held("a") == 0
    assert budget.release_owner("a") == 0
    assert budget.held == 5 and len(budget) == 1


def test_an_owner_without_a_shed_callback_is_counted_but_never_asked() -> None:
    budget = RetentionBudget(total=100, per_owner=50)
    budget.charge("x", 80)
    assert budget.owner_held("x") == 80 and budget.held == 80


def test_bad_limits_are_refused() -> None:
    with pytest.raises(ValueError):
        RetentionBudget(total=0, per_owner=0)
    with pytest.raises(ValueError):
        RetentionBudget(total=10, per_owner=11)


ops = st.lists(
    st.tuples(
        st.sampled_from(["put", "drop", "gone"]),
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
    owners = {name: Owner(budget, name) for name in "abc"}
    for op, name, key, size, keep in steps:
        owner = owners[name]
        if op == "put":
            owner.keep[key] = keep
            owner.put(key, size)
        elif op == "drop" and key in owner.items:
            owner.drop(key)
        elif op == "gone":
            budget.release_owner(name)
            owners[name] = Owner(budget, name)
        # The ledger says exactly what the owners keep ...
        assert budget.held == sum(sum(o.items.values()) for o in owners.values())
        for o in owners.values():
            assert budget.owner_held(o.name) == sum(o.items.values())
        # ... and after every charge the caps hold, up to what items could not give up.
        stuck = {
            (o.name, k): v
            for o in owners.values()
            for k, v in o.items.items()
            if o.keep.get(k, 0) >= v
        }
        for o in owners.values():
            unmovable = sum(v for (n, _), v in stuck.items() if n == o.name)
            assert budget.owner_held(o.name) <= max(100, unmovable)
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
    assert log.forget() == (2, sum(sizes[3:]))  # what was still pending
    assert log.retained_bytes == 0 and log.undrained() == (0, 0)
    assert log.next_seq == 5 and log.frames_from(5) == []
    with pytest.raises(RemoteProtocolError) as refused:  # a cursor into it: unknown
        log.frames_from(3)
    assert refused.value.reason is Reason.CURSOR_UNKNOWN


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
