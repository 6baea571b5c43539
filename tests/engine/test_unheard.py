"""Claims whose answer the store lost are given back: kept while the store is down,
bounded in number, and only ever the delivery's own claim."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from tests.sim.store import SimStore
from weir.engine._store_errors import StoreUnavailable
from weir.engine._store_records import SessionRecord
from weir.engine._unheard import UnheardClaims
from weir.protocol.gate import CallOutcome

P = "alice"


class DownStore(SimStore):
    """Refuses ``release_claim`` while ``down``."""

    down = True

    async def release_claim(self, *args: Any) -> bool:
        if self.down:
            raise StoreUnavailable("down")
        return await super().release_claim(*args)


async def claimed(store: SimStore, sid: str, key: str, claim: str) -> None:
    if await store.get_session(P, sid) is None:
        record = SessionRecord(
            session_id=sid, principal=P, protocol_version="2025-11-25", created_at=0.0
        )
        await store.create_session(record)
    start = await store.begin_call(P, sid, key, b"fp", None, owner="r", lease=30.0, claim=claim)
    assert start.outcome is CallOutcome.EXECUTE


async def test_kept_while_the_store_is_down_then_given_back() -> None:
    store, unheard = DownStore(), UnheardClaims()
    await claimed(store, "s-1", "k", "mine")
    unheard.note(P, "s-1", "k", "mine")
    assert await unheard.give_back(store) == 0 and len(unheard) == 1  # not asked: kept
    store.down = False
    assert await unheard.give_back(store) == 1 and len(unheard) == 0
    assert (await store.begin_call(P, "s-1", "k", b"fp", None)).outcome is CallOutcome.EXECUTE


async def test_another_delivery_s_claim_and_a_gone_session_are_left_alone() -> None:
    store, unheard = SimStore(), UnheardClaims()
    await claimed(store, "s-1", "k", "theirs")
    unheard.note(P, "s-1", "k", "mine")  # our claim never applied; theirs did
    unheard.note(P, "s-gone", "k", "mine")
    assert await unheard.give_back(store) == 0 and len(unheard) == 0  # answered: final
    assert (await store.begin_call(P, "s-1", "k", b"fp", None)).outcome is CallOutcome.RUNNING


async def test_bounded_the_oldest_is_left_to_its_lease(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="weir")
    unheard = UnheardClaims(limit=3)
    for i in range(5):
        unheard.note(P, "s-1", f"k{i}", f"c{i}")
    assert len(unheard) == 3 and unheard.dropped == 2
    # One warning for the first drop, then one per thousand: a long outage floods nothing.
    assert sum("unheard claims" in r.getMessage() for r in caplog.records) == 1
    for i in range(5, 1003):
        unheard.note(P, "s-1", f"k{i}", f"c{i}")
    assert unheard.dropped == 1000 and len(unheard) == 3
    assert sum("unheard claims" in r.getMessage() for r in caplog.records) == 2
