"""How a session-era POST's requests reach the asyncio runtime's runner, in order.

Theory of operation
-------------------
A POST's requests are started by a :data:`Feed`: ``await feed(start, lane)`` calls
``start(course)`` once per request, each admitted (room reserved for its result in
``lane``) and past the idempotency gate.  A lone request was admitted and gated by
the POST's course before its response began (:func:`given`); a batch's entries are
admitted and gated one by one by the core's :class:`~weir.protocol.post.BatchEntries`,
whose effects :func:`entries` performs.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Hashable

from weir.protocol.course import GATE_STEPS, CallCourse
from weir.protocol.jsonrpc import Request
from weir.protocol.post import (
    AdmitRequests,
    BatchEntries,
    CountIn,
    PostRules,
    StartEntry,
)

from ._calls import gate_step, give_back
from ._session import Gone, Session

#: How a POST's requests reach the runner: ``await feed(start, lane)`` calls
#: ``start(plan)`` once per request, in order, each admitted (reserving room for its
#: result in ``lane``) and past the gate.
Feed = Callable[[Callable[[CallCourse], object], Hashable], Awaitable[None]]


def given(courses: list[CallCourse]) -> Feed:
    """The feed of a lone request, admitted and gated before the response began."""

    async def feed(start: Callable[[CallCourse], object], lane: Hashable) -> None:
        for course in courses:
            start(course)

    return feed


def entries(
    session: Session,
    requests: list[Request],
    token: tuple[int, str] | None,
    rules: PostRules,
) -> Feed:
    """The feed of a batch (2025-03-26): the core's :class:`BatchEntries` admits,
    gates and starts each entry in order (each claim checking the POST's channel
    ``token``); this performs its effects."""

    async def feed(start: Callable[[CallCourse], object], lane: Hashable) -> None:
        entries = BatchEntries(requests, token, lane, rules)
        clock = session.loop.time
        effect = entries.start(clock())
        while effect is not None:
            answer: object = None
            try:
                if isinstance(effect, StartEntry):
                    start(effect.course)
                elif isinstance(effect, AdmitRequests):
                    try:
                        await session.admit(1, effect.request_id, effect.lane)
                        session.driver.metrics.admissions += 1
                        answer = True
                    except Gone:
                        answer = False
                elif isinstance(effect, CountIn):
                    session.flow.count_in(1, effect.lane)
                else:
                    assert isinstance(effect, GATE_STEPS)
                    answer = await gate_step(session, effect)
            except BaseException as exc:
                effect = entries.fail(exc, clock())
            else:
                effect = entries.deliver(answer, clock())

    return feed


def never_run(session: Session, planned: CallCourse, lane: Hashable) -> None:
    """Account for an admitted request that will never run (its session ended); its
    key goes back to the store in a task of the driver's (the session's are over)."""
    session.done(lane)
    session.driver.spawn(give_back(session, planned))
