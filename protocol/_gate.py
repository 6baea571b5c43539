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
"""

from __future__ import annotations

import enum
import hashlib
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
