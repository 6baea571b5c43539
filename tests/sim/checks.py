"""The promises a simulated run must keep, checked on what it recorded.

Theory of operation
-------------------
:func:`violations` reads an :class:`~tests.sim.world.Outcome` and lists every broken
promise, each as one line naming the call, session or stream:

* **at most once**: no tag of ``charge`` ran twice (the tool also notes it live);
* **no foreign result**: a call's answer names its own tag; a tool ran for the
  principal whose call it is; a hostile client got nothing but refusals;
* **streams**: within one stream (epoch) the events a client saw are contiguous and
  never repeated, across every resume -- a resume from the head, or past a gap,
  shows up here;
* **interrupted means it ran**: a call answered ``interrupted`` ran (and its owner
  was lost) -- unless a replica was hard-killed meanwhile, when a claim granted
  just before the kill can end ``interrupted`` without its tool having started;
* **bounded**: every call ended (answer or refusal) within the bound, and none was
  left waiting on ``in_progress`` forever;
* **caps**: no session's drain credit ever held more frames or bytes than its
  limits (the credit keeps its own peaks; every frame here is far smaller than the
  byte limit, so the one-oversized-frame allowance never applies), and a replica's
  retained bytes were over its budget only by what its live streams' unacknowledged
  frames pin (watched every 0.1 virtual seconds);
* **nothing held**: after the run settled, no claim is still running in the store, no
  replica holds a session, credit or a keyed call, and no retained byte is left
  over the budget.
"""

from __future__ import annotations

from collections import defaultdict
from typing import TYPE_CHECKING

from .clients import CALL_BOUND, CallRecord

if TYPE_CHECKING:
    from .world import Outcome

#: Refusals a call may end with (documented, and none of them ran the tool twice).
#: ``cursor_unknown`` is not one: every event is stored before it is sent, and no
#: stream is trimmed or session expired under a client's feet here, so a cursor a
#: client was given must always be honoured.
DOCUMENTED = frozenset(
    {
        "interrupted",
        "cancelled",
        "store_unavailable",
        "overloaded",
        "in_progress",
        "TransportError",
        "transport",
        "session_not_found",
        "SessionGone",
        "InProgress",
        "Overloaded",
        "shutting_down",
        "channel_unbound",
        "ChannelUnbound",
        "half_open",
        "HalfOpenError",
        "retention_full",
    }
)


def violations(out: Outcome) -> list[str]:
    """Every broken promise of the run (empty: it kept them all)."""
    found = list(out.ledger.violations)
    for tag, n in out.ledger.executions.items():
        if n > 1 and not any(tag in v for v in found):
            found.append(f"{tag} ran {n} times")
    made: defaultdict[str, int] = defaultdict(int)
    for rec in out.calls:
        made[rec.client] += 1
    for plan in out.plan.clients:
        if made[plan.name] != plan.calls:
            found.append(f"{plan.name} made {made[plan.name]} of its {plan.calls} calls")
    for rec in out.calls:
        if rec.ended < 0:
            found.append(f"{rec.tag}: never ended within {CALL_BOUND:g} s")
        elif _foreign(rec):
            found.append(f"{rec.tag}: got someone else's answer {rec.answer!r}")
        elif rec.refusal == "interrupted" and not out.ledger.executions[rec.tag]:
            if not any(rec.started <= t <= rec.ended for t in out.hard_kills):
                found.append(
                    f"{rec.tag}: answered interrupted, but it never ran and no replica died"
                )
        elif rec.refusal is not None and rec.refusal not in DOCUMENTED:
            found.append(f"{rec.tag}: ended with an undocumented refusal {rec.refusal!r}")
        found += _stream_gaps(rec.tag, rec.trace.observed_events)
    for h in out.hostile:
        if 200 <= h.status < 300:
            found.append(f"hostile {h.attempt}: answered {h.status} {h.body[:120]!r}")
    found += _caps(out)
    found += _leftovers(out)
    return found


def _caps(out: Outcome) -> list[str]:
    found = list(out.retention_over)
    for name, credit in out.credits:
        limits = credit.limits
        if credit.peak_frames > limits.frames or credit.peak_bytes > limits.bytes:
            found.append(
                f"{name}: credit peaked at {credit.peak_frames} frames / "
                f"{credit.peak_bytes} bytes, over {limits.frames} / {limits.bytes}"
            )
    return found


def _foreign(rec: CallRecord) -> bool:
    """The answer names another call (an error result names none: it is the tool's)."""
    if rec.answer is None:
        return False
    return "done " in rec.answer if rec.is_error else rec.answer != f"done {rec.tag}"


def _stream_gaps(tag: str, events: list[tuple[str | None, str, int]]) -> list[str]:
    last: dict[str, int] = {}
    out = []
    for _, epoch, seq in events:
        before = last.get(epoch)
        if before is not None and seq != before + 1:
            what = "repeated" if seq <= before else "skipped"
            out.append(f"{tag}: stream {epoch} {what} from seq {before} to {seq}")
        last[epoch] = seq
    return out


def _leftovers(out: Outcome) -> list[str]:
    found = []
    running = out.store.running_claims(out.ended_at)
    if running:
        found.append(f"after the run, claims still running in the store: {running}")
    for server in out.servers:
        if server.stopped.is_set():
            continue
        for sid, s in server.sessions.items():
            if s.inflight:
                found.append(f"after the run, {server.replica_id} runs a call of {sid}")
        if server.budget.held > server.budget.total:
            found.append(
                f"{server.replica_id}: retention {server.budget.held} > {server.budget.total}"
            )
    return found
