"""What an asyncio replica does in the background with a shared store.

Theory of operation
-------------------
Three loops, each started on first need by :class:`~._shared.SharedState` and ending
with the driver (the rules and intervals are the core's, :mod:`weir.protocol.messages`,
as on the Trio runtime):

* :func:`relay_mail` reads the mailboxes of the sessions that wait for a client's
  answer or run a request for over a second: answers another replica received for a
  request of this one, and cancellations of requests running here;
* :func:`relay_changes` reads the store's change bus while anyone here may hear a
  change, and delivers what other replicas announced (for a task change, a listener
  here that follows the task makes it read the record again and tell);
* :func:`renew_leases` renews the claims of the calls running here, session-era and
  sessionless, while there are any; if this process dies the renewals stop, and
  after one lease any replica answers a retry ``interrupted``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import TYPE_CHECKING

import msgspec

from weir.common._listen import TASK_NOTIFICATION, task_change_read
from weir.engine._store_errors import SessionGone, StoreUnavailable
from weir.engine._store_records import SESSIONLESS_NAMESPACE
from weir.protocol.messages import (
    CANCEL_BOX,
    CHANGE_POLL,
    POLL_INTERVAL,
    boxes_due,
    first_change_cursor,
    read_answer,
    read_cancel,
    read_change,
    renew_interval,
)
from weir.protocol.tasks import decode_record

from ._session import Session

if TYPE_CHECKING:
    from ._shared import SharedState

log = logging.getLogger("weir.asyncio")


async def relay_changes(shared: SharedState) -> None:
    """Deliver the changes other replicas announced (Trio's rules: the bus is
    read every :data:`CHANGE_POLL` s while anyone here may hear them, the first
    read going :data:`CHANGE_LOOKBACK` s back)."""
    driver = shared.driver
    cursor: str | None = None
    while True:
        await asyncio.sleep(CHANGE_POLL)
        if not driver.listeners and not driver.sessions:
            cursor = None
            continue
        if cursor is None:
            cursor = first_change_cursor(time.time())
        try:
            cursor, changes = await shared.store.read_changes(cursor)
        except StoreUnavailable:
            continue
        for raw in changes:
            change = read_change(raw, shared.replica_id)
            if change is None:
                continue
            method, where = change
            if method != TASK_NOTIFICATION:
                driver.deliver_change(method, where)
                continue  # (a task's change is never a list change: not for GET streams)
            followed = task_change_read(where) if where is not None else None
            if followed is not None and driver.follows(followed[1]):
                driver.spawn(_relay_task(shared, *followed))


async def _relay_task(shared: SharedState, principal: str, task_id: str) -> None:
    """Another replica changed a task someone here follows: read it and tell."""
    try:
        stored = await shared.store.get_task(principal, task_id)
    except StoreUnavailable:
        return
    if stored is not None:
        with contextlib.suppress(msgspec.DecodeError):
            shared.driver.deliver_task(principal, decode_record(stored.data))


async def relay_mail(shared: SharedState) -> None:
    """Deliver the answers and cancellations other replicas received for requests
    of this one (``weir.protocol.messages``: polled every 100 ms, and only for
    sessions that wait for an answer or run a request for over a second)."""
    loop = asyncio.get_running_loop()
    while True:
        await asyncio.sleep(POLL_INTERVAL)
        now = loop.time()
        for session in list(shared.driver.sessions.values()):
            if session.closed:
                continue
            boxes = boxes_due(
                shared.replica_id,
                awaiting_answers=bool(session.pending),
                started=session.started.values(),
                now=now,
            )
            try:
                for box in boxes:
                    await _take_mail(shared, session, box)
            except (StoreUnavailable, SessionGone):
                continue


async def _take_mail(shared: SharedState, session: Session, box: str) -> None:
    if box == CANCEL_BOX:  # every replica reads it: kept, each acts on its own
        for raw in await shared.store.take_messages(session.principal, session.sid, box, keep=True):
            rid = read_cancel(raw)
            if rid is not None and rid in session.running:
                session.cancel(rid)
        return
    for raw in await shared.store.take_messages(session.principal, session.sid, box):
        answer = read_answer(raw)
        if answer is not None:
            session.answer(answer)


async def renew_leases(shared: SharedState) -> None:
    """Renew the leases of the calls running here while there are any."""
    lease = shared.claim_lease
    while True:
        await asyncio.sleep(renew_interval(lease))
        if len(shared.unheard):  # claims whose answer was lost (engine._unheard)
            await shared.unheard.give_back(shared.store)
        held = [s for s in list(shared.driver.sessions.values()) if s.holding and not s.closed]
        keyed: dict[str, list[str]] = {}
        for principal, key in list(shared.driver.keyed.held):
            keyed.setdefault(principal, []).append(key)
        if not held and not keyed and not len(shared.unheard):
            return
        claims = [(s.principal, s.sid, list(s.holding)) for s in held]
        claims += [(principal, SESSIONLESS_NAMESPACE, keys) for principal, keys in keyed.items()]
        for principal, sid, keys in claims:
            try:
                await shared.store.renew_claims(principal, sid, keys, shared.replica_id, lease)
            except (StoreUnavailable, SessionGone):
                continue
