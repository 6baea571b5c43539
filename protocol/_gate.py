"""The idempotency gate's rules: one implementation for every driver.

Theory of operation
-------------------
A ``tools/call`` may have effects, so a delivery of it runs only after passing the
gate: a record in the session store, keyed by the call's *key*, that says whether
the call is unclaimed, running, or done (and with what response).  The atomic
part -- "claim the key unless someone has" -- is the store's (one round trip, the
store's own locking); everything around it is here, and pure:

* :func:`call_key` derives the key: the client's ``Idempotency-Key`` header when
  it sent one (``h:`` prefix; at most :data:`MAX_IDEMPOTENCY_KEY` characters,
  else a 400 refusal), else the JSON-RPC id (``i:`` prefix) -- a retry of the
  same request over a new connection keeps its id.
* :func:`fingerprint` says what the call *is* (method and params, object keys
  in sorted order): the same key with another fingerprint is a client bug,
  refused 422, never a replay of the wrong response.
* :func:`gate_decision` turns the store's :class:`CallStart` into one of
  :class:`Execute`, :class:`Replay`, :class:`Wait` or :class:`Refuse`.  ``Wait``
  means "ask the store again"; the driver chooses how (wake on the local delivery
  finishing, or poll another replica's claim), and ``now``/``give_up_at`` bound
  it: past ``give_up_at`` the decision is 409 ``in_progress`` with a retry hint.
* :func:`replay_as` re-addresses a stored response to the id of the request
  that is replaying it.

A call that ran but whose response the store has since dropped is
:attr:`CallOutcome.EVICTED`: refused 409 ``outcome_evicted``, never run again.

The in-process records
----------------------
The idempotency gate's records for one session, in memory and bounded.

The gate needs somewhere to remember, per call key, what the call
was (its fingerprint) and how it ended (its response).  A shared store keeps that in
Redis; a single process keeps it here.  :class:`CallLedger` is that record, with the
one atomic step the gate relies on -- :meth:`CallLedger.begin`: "claim the key unless
someone has; else say what is known" -- and :meth:`CallLedger.finish` to record an
outcome.  Both drivers' in-process gates are this one object.

Everything a client can make it hold is bounded, and eviction is never silent:

* at most ``max_calls`` finished calls: the oldest is forgotten whole (its key too,
  so a retry of it *could* run again -- which is why the limit is on count, large,
  and reached only by a client that makes very many distinct calls);
* at most ``max_bytes`` of keys (each charged ``len(key) + ENTRY_OVERHEAD``) and
  stored responses: first the oldest responses are dropped, leaving a *tombstone*
  (the call is known to have run; a retry is told ``outcome_evicted`` and does not
  run it again), and only if the keys alone are over, the oldest finished calls are
  forgotten whole;
* a running claim is never dropped.

A wider budget's :meth:`CallLedger.shed` (memory pressure from other owners) only
ever turns stored responses into tombstones: it never forgets a key, so what is
left of an evicted outcome is its key and fingerprint, charged at
``len(key) + ENTRY_OVERHEAD``.  Only the two bounds above, this ledger's own
client's volume, forget keys.

:attr:`CallLedger.held` is exact after every operation, so an owner can charge the
difference to a wider budget.  No clock, no I/O: a claim lives until its owner
finishes it (a single process's claims die with it, so they need no lease).
"""

from __future__ import annotations

import enum
import hashlib
from collections import OrderedDict
from dataclasses import dataclass
from typing import Final

import msgspec

from ._errors import Reason, RemoteProtocolError
from ._jsonrpc import Request, RequestId

#: The longest ``Idempotency-Key`` accepted (the gate keeps every key for a while).
MAX_IDEMPOTENCY_KEY: Final = 256


class CallOutcome(enum.Enum):
    """What the store's gate record said when a delivery tried to claim a call."""

    EXECUTE = "execute"  # the key is ours now: run the call
    RUNNING = "running"  # another delivery is running it
    DONE = "done"  # it ran; ``payload`` is the stored response
    MISMATCH = "mismatch"  # same key, different request fingerprint
    EVICTED = "evicted"  # it ran, but its response is no longer held (never re-run)


@dataclass(frozen=True, slots=True)
class CallStart:
    """A store's answer to a claim: the outcome, the call's stream epoch, the response."""

    outcome: CallOutcome
    epoch: str
    payload: bytes | None = None


@dataclass(frozen=True, slots=True)
class Execute:
    """The key is this delivery's: run the call, then record its outcome."""

    epoch: str


@dataclass(frozen=True, slots=True)
class Replay:
    """It ran already: answer with ``payload`` (re-addressed), execute nothing."""

    payload: bytes
    epoch: str


@dataclass(frozen=True, slots=True)
class Wait:
    """Another delivery is running it: ask the store again, no later than ``until``."""

    until: float


@dataclass(frozen=True, slots=True)
class Refuse:
    """Answer the request with ``error`` (its HTTP status and JSON-RPC error)."""

    error: RemoteProtocolError


GateDecision = Execute | Replay | Wait | Refuse


class WindowKey(str):
    """A gate key the server made itself for an unkeyed request (a retry window's).

    :func:`call_key` keeps it in a space of its own, so no ``Idempotency-Key`` a
    client sends -- whatever its text -- names the server's record.
    """

    __slots__ = ()


def call_key(header: str | None, request_id: RequestId) -> str:
    """The gate key of a ``tools/call``: its ``Idempotency-Key``, else its JSON-RPC id
    (or a :class:`WindowKey` the server made); the three never share a key.

    Raises:
        RemoteProtocolError: 400 ``invalid_request`` for an empty key or one longer
            than :data:`MAX_IDEMPOTENCY_KEY` characters (``data.limit`` says so).
    """
    if header is None:
        return "i:" + msgspec.json.encode(request_id).decode()
    if isinstance(header, WindowKey):
        return "w:" + header
    if not 0 < len(header) <= MAX_IDEMPOTENCY_KEY:
        raise RemoteProtocolError(
            f"Idempotency-Key must be 1 to {MAX_IDEMPOTENCY_KEY} characters",
            reason=Reason.INVALID_REQUEST,
            request_id=request_id,
            data={"limit": MAX_IDEMPOTENCY_KEY},
        )
    return "h:" + header


def fingerprint(req: Request) -> bytes:
    """A digest of what the call is (method and params), independent of its id.

    Object keys are sorted first: a retry re-serialised by another client library
    or a proxy (same members, another order) is the same call, not a 422.
    """
    canonical = msgspec.json.encode([req.method, req.params], order="sorted")
    return hashlib.sha256(canonical).digest()


def gate_decision(
    start: CallStart,
    key: str,
    request_id: RequestId,
    *,
    now: float,
    give_up_at: float,
    retry_ms: int,
) -> GateDecision:
    """What a delivery of ``request_id`` does, given the store's answer ``start``.

    ``RUNNING`` (or ``DONE`` without a held response) is :class:`Wait` until
    ``give_up_at``, then 409 ``in_progress`` with ``retry_ms`` as the hint.
    """
    shown = key[2:]
    if start.outcome is CallOutcome.EXECUTE:
        return Execute(start.epoch)
    if start.outcome is CallOutcome.MISMATCH:
        return Refuse(
            RemoteProtocolError(
                f"idempotency key {shown!r} was used for a different request",
                http_status=422,
                reason=Reason.IDEMPOTENCY_KEY_REUSED,
                request_id=request_id,
            )
        )
    if start.outcome is CallOutcome.EVICTED:
        return Refuse(
            RemoteProtocolError(
                f"request {shown!r} already ran; its result is no longer held, and "
                "it is not run again",
                http_status=409,
                reason=Reason.OUTCOME_EVICTED,
                request_id=request_id,
            )
        )
    if start.outcome is CallOutcome.DONE and start.payload is not None:
        return Replay(start.payload, start.epoch)
    if now >= give_up_at:
        return Refuse(
            RemoteProtocolError(
                f"request {shown!r} is still running",
                http_status=409,
                reason=Reason.IN_PROGRESS,
                request_id=request_id,
                retry_after_ms=retry_ms,
            )
        )
    return Wait(give_up_at)


def replay_as(payload: bytes, request_id: RequestId) -> bytes:
    """A stored response, re-addressed to the JSON-RPC id of the request replaying it."""
    msg = msgspec.json.decode(payload)
    msg["id"] = request_id
    return msgspec.json.encode(msg)


class GatePass:
    """One delivery of a ``tools/call`` on its way through the gate: the sequencing
    both drivers share, with the store's round trips left to them.

    Construct it when the request is admitted; ask the store to claim
    :attr:`key` with :attr:`fingerprint`; hand the answer to :meth:`decide`.  On
    :class:`Wait`, wait until ``until`` -- or until the local delivery running the
    call finishes, if ``local`` -- and ask the store again.  The pass bounds the whole
    wait (``wait`` seconds from ``now``, then 409 ``in_progress``) and backs off the
    re-asking of a claim held elsewhere (10 ms doubling to 250 ms), where no wake-up
    will come.
    """

    __slots__ = ("_delay", "fingerprint", "give_up_at", "key", "request_id", "retry_ms")

    #: Re-asking a claim held by another process: first after this long, then doubling.
    FIRST_POLL: Final = 0.01
    MAX_POLL: Final = 0.25

    def __init__(
        self, req: Request, header_key: str | None, *, now: float, wait: float, retry_ms: int
    ) -> None:
        """Raises: RemoteProtocolError: 400 for a malformed ``Idempotency-Key``."""
        self.key = call_key(header_key, req.id)
        self.fingerprint = fingerprint(req)
        self.request_id = req.id
        self.give_up_at = now + wait
        self.retry_ms = retry_ms
        self._delay = self.FIRST_POLL

    def decide(self, start: CallStart, now: float, *, local: bool) -> GateDecision:
        """The next step given the store's answer; ``local``: the delivery running the
        call (if it is running) is in this process, so its end can be awaited."""
        decision = gate_decision(
            start,
            self.key,
            self.request_id,
            now=now,
            give_up_at=self.give_up_at,
            retry_ms=self.retry_ms,
        )
        if not isinstance(decision, Wait) or local:
            return decision
        until = min(self.give_up_at, now + self._delay)
        self._delay = min(self._delay * 2, self.MAX_POLL)
        return Wait(until)


#: Bytes charged for each remembered key, besides the key itself.
ENTRY_OVERHEAD: Final = 128

#: A stored response that was dropped: the call ran, its result is gone.
_EVICTED: Final = b""


def _entry_size(key: str) -> int:
    return len(key) + ENTRY_OVERHEAD


class CallLedger:
    """One session's gate records: key -> (fingerprint, response or running)."""

    __slots__ = ("_calls", "held", "max_bytes", "max_calls")

    def __init__(self, *, max_calls: int = 1024, max_bytes: int = 1024 * 1024) -> None:
        self.max_calls = max(1, max_calls)
        self.max_bytes = max_bytes
        #: Bytes held: every key (with its overhead) and every stored response.
        self.held = 0
        self._calls: OrderedDict[str, tuple[bytes, bytes | None]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._calls)

    def begin(self, key: str, fingerprint: bytes) -> tuple[CallOutcome, bytes | None]:
        """Claim ``key`` for a call with ``fingerprint`` unless it is known already.

        Returns ``(EXECUTE, None)`` when the key is now claimed (run the call, then
        :meth:`finish`); ``(RUNNING, None)``, ``(DONE, response)``, ``(EVICTED,
        None)`` or ``(MISMATCH, None)`` otherwise.
        """
        found = self._calls.get(key)
        if found is None:
            self._calls[key] = (fingerprint, None)
            self.held += _entry_size(key)
            return CallOutcome.EXECUTE, None
        fp, payload = found
        if fp != fingerprint:
            return CallOutcome.MISMATCH, None
        if payload is None:
            return CallOutcome.RUNNING, None
        if payload is _EVICTED:
            return CallOutcome.EVICTED, None
        return CallOutcome.DONE, payload

    def finish(self, key: str, payload: bytes | None) -> None:
        """Record claim ``key``'s response, or release the claim (``None``: nothing ran
        to completion, so a retry may run it).  Then enforce the bounds; the call just
        recorded is the last to go.  A key not claimed is ignored."""
        if not self._set(key, payload):
            return
        if payload is not None:
            self._calls.move_to_end(key)
        while len(self._calls) > self.max_calls and self._forget_oldest_finished():
            pass  # (running claims are skipped, never forgotten)
        if self.held > self.max_bytes:
            for oldest, (_, stored) in list(self._calls.items()):
                if self.held <= self.max_bytes or oldest == key:
                    break
                if stored:
                    self._tombstone(oldest)
            self._forget_for(self.held - self.max_bytes)

    def shed(self, nbytes: int) -> int:
        """Free about ``nbytes`` (a wider budget asks): stored responses, oldest first,
        each leaving a tombstone.  Returns the bytes freed, which may be less than
        asked: keys -- running claims and tombstones alike -- are never forgotten
        here, so memory pressure never lets a retry run a finished call again."""
        before = self.held
        for key, (_, stored) in list(self._calls.items()):
            if before - self.held >= nbytes:
                break
            if stored:
                self._tombstone(key)
        return before - self.held

    def recent(self, n: int) -> list[bytes]:
        """The stored responses of the ``n`` most recently finished calls, oldest first."""
        out = [p for _, p in reversed(self._calls.values()) if p]
        return out[:n][::-1]

    # ---------------------------------------------------------------- internals
    def _set(self, key: str, payload: bytes | None) -> bool:
        found = self._calls.get(key)
        if found is None:
            return False
        if found[1] is not None:
            self.held -= len(found[1])  # finished twice: the newer outcome replaces it
        if payload is None:
            del self._calls[key]
            self.held -= _entry_size(key)
        else:
            self._calls[key] = (found[0], payload)
            self.held += len(payload)
        return True

    def _tombstone(self, key: str) -> None:
        found = self._calls.get(key)
        if found is not None and found[1]:
            self.held -= len(found[1])
            self._calls[key] = (found[0], _EVICTED)

    def _forget_for(self, wanted: int) -> None:
        # Forgetting keys weakens the gate; do it only if the finished keys can cover
        # what is wanted (when running claims hold the bytes, it would free nothing).
        if wanted <= 0:
            return
        finished = sum(_entry_size(k) for k, (_, p) in self._calls.items() if p is not None)
        if finished < wanted:
            return
        target = self.held - wanted
        while self.held > target and self._forget_oldest_finished():
            pass

    def _forget_oldest_finished(self) -> bool:
        for key, (_, stored) in self._calls.items():
            if stored is not None:
                self._set(key, None)
                return True
        return False
