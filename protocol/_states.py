"""Session and stream state machines: every transition lives in this file.

Theory of operation
-------------------
Rule (after h11's ``_state.py``): everything that changes the state of a session or
of one of its SSE streams goes through :func:`session_transition` or
:func:`stream_transition`, which look the change up in :data:`SESSION_TRANSITIONS`
or :data:`STREAM_TRANSITIONS`.  A pair missing from a table is illegal: the
functions raise :class:`~weir.protocol._errors.LocalProtocolError` and the state is unchanged.

A stream is two facts at once -- is its final message written to the log yet
(LIVE vs FINAL), and is a writer attached to a connection (ATTACHED vs
DETACHED) -- plus CLOSED.  A standalone (GET) stream never becomes FINAL.

* ATTACH on an ATTACHED stream is the "second GET stream" conflict: refused.
* A CLOSED stream may still be attached for *replay only* (its log is kept until
  retention drops it), which is how a client that lost the final event of a
  POST stream gets it back; it goes on being CLOSED.
* ABORT (session teardown, DELETE, cancellation) closes from any state.

A session's drain credit (``protocol._credit``) has its own small machine,
:data:`CREDIT_TRANSITIONS`: OPEN -> EXHAUSTED (a frame waits) -> HALF_OPEN (no
progress for the drain window) -> DEAD (no progress for the liveness timeout).

A session is NEW until the client's ``notifications/initialized``; requests are
served in NEW too (as the official SDKs do); CLOSED is terminal and every later
request for it gets 404.

The states and inputs are looked up in the tables for every frame a stream
carries, so they hash by identity (C code) rather than by :class:`enum.Enum`'s
hash of the member's name (a Python call per lookup): each member is a
singleton, so identity is what equality already means for them.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from types import MappingProxyType
from typing import Final, TypeVar

from ._errors import LocalProtocolError


class _Member(enum.Enum):
    """An enum whose members hash by identity (see the module docstring)."""

    __hash__ = object.__hash__


class StreamState(_Member):
    """States of one SSE stream."""

    LIVE_ATTACHED = "LIVE_ATTACHED"
    LIVE_DETACHED = "LIVE_DETACHED"
    FINAL_ATTACHED = "FINAL_ATTACHED"
    FINAL_DETACHED = "FINAL_DETACHED"
    CLOSED = "CLOSED"


class StreamInput(_Member):
    """What can happen to a stream."""

    ATTACH = "ATTACH"  # a connection starts writing this stream
    DETACH = "DETACH"  # that connection went away, or the server closed it early
    FINISH = "FINISH"  # the final message (the response) was appended
    DELIVERED = "DELIVERED"  # the attached writer wrote the final message
    ABORT = "ABORT"  # session ended or request cancelled


class SessionState(_Member):
    """States of one session."""

    NEW = "NEW"
    ACTIVE = "ACTIVE"
    CLOSED = "CLOSED"


class SessionInput(_Member):
    """What can happen to a session."""

    INITIALIZED = "INITIALIZED"  # notifications/initialized received
    REQUEST = "REQUEST"  # any other message admitted
    DELETE = "DELETE"  # client DELETE
    TEARDOWN = "TEARDOWN"  # server ended it (liveness timeout, shutdown)


_K = TypeVar("_K")
_I = TypeVar("_I")


def _frozen(table: dict[_K, dict[_I, _K]]) -> Mapping[_K, Mapping[_I, _K]]:
    """A transition table nobody can change after import (read-only views all the way)."""
    return MappingProxyType({state: MappingProxyType(row) for state, row in table.items()})


S, In = StreamState, StreamInput
STREAM_TRANSITIONS: Final[Mapping[StreamState, Mapping[StreamInput, StreamState]]] = _frozen(
    {
        S.LIVE_DETACHED: {
            In.ATTACH: S.LIVE_ATTACHED,
            In.FINISH: S.FINAL_DETACHED,
            In.ABORT: S.CLOSED,
        },
        S.LIVE_ATTACHED: {
            In.DETACH: S.LIVE_DETACHED,
            In.FINISH: S.FINAL_ATTACHED,
            In.ABORT: S.CLOSED,
        },
        S.FINAL_DETACHED: {
            In.ATTACH: S.FINAL_ATTACHED,
            In.ABORT: S.CLOSED,
        },
        S.FINAL_ATTACHED: {
            In.DETACH: S.FINAL_DETACHED,
            In.DELIVERED: S.CLOSED,
            In.ABORT: S.CLOSED,
        },
        S.CLOSED: {
            In.ATTACH: S.CLOSED,  # replay only
            In.DETACH: S.CLOSED,
            In.DELIVERED: S.CLOSED,
            In.ABORT: S.CLOSED,
        },
    }
)
del S, In

SS, SI = SessionState, SessionInput
SESSION_TRANSITIONS: Final[Mapping[SessionState, Mapping[SessionInput, SessionState]]] = _frozen(
    {
        SS.NEW: {
            SI.INITIALIZED: SS.ACTIVE,
            SI.REQUEST: SS.NEW,
            SI.DELETE: SS.CLOSED,
            SI.TEARDOWN: SS.CLOSED,
        },
        SS.ACTIVE: {
            SI.INITIALIZED: SS.ACTIVE,
            SI.REQUEST: SS.ACTIVE,
            SI.DELETE: SS.CLOSED,
            SI.TEARDOWN: SS.CLOSED,
        },
        SS.CLOSED: {},
    }
)
del SS, SI


class CreditState(_Member):
    """States of one session's drain credit (see :mod:`protocol._credit`)."""

    OPEN = "OPEN"
    EXHAUSTED = "EXHAUSTED"
    HALF_OPEN = "HALF_OPEN"
    DEAD = "DEAD"


class CreditInput(_Member):
    """What can happen to a session's credit."""

    EXHAUST = "EXHAUST"  # a frame had to wait for credit
    REPLENISH = "REPLENISH"  # no frame waits any more
    PROGRESS = "PROGRESS"  # the peer acknowledged bytes
    STALL = "STALL"  # exhausted with no progress for the drain window
    EXPIRE = "EXPIRE"  # frames pending, no progress for the liveness timeout


CS, CI = CreditState, CreditInput
CREDIT_TRANSITIONS: Final[Mapping[CreditState, Mapping[CreditInput, CreditState]]] = _frozen(
    {
        CS.OPEN: {
            CI.EXHAUST: CS.EXHAUSTED,
            CI.REPLENISH: CS.OPEN,
            CI.PROGRESS: CS.OPEN,
            CI.EXPIRE: CS.DEAD,
        },
        CS.EXHAUSTED: {
            CI.EXHAUST: CS.EXHAUSTED,
            CI.REPLENISH: CS.OPEN,
            CI.PROGRESS: CS.EXHAUSTED,
            CI.STALL: CS.HALF_OPEN,
            CI.EXPIRE: CS.DEAD,
        },
        CS.HALF_OPEN: {
            CI.EXHAUST: CS.HALF_OPEN,
            CI.REPLENISH: CS.OPEN,
            CI.PROGRESS: CS.EXHAUSTED,
            CI.EXPIRE: CS.DEAD,
        },
        CS.DEAD: {},
    }
)
del CS, CI


def credit_transition(state: CreditState, event: CreditInput) -> CreditState:
    """The credit state after ``event``.

    Raises:
        LocalProtocolError: ``event`` is not allowed in ``state``.
    """
    try:
        return CREDIT_TRANSITIONS[state][event]
    except KeyError:
        raise LocalProtocolError(f"credit cannot {event.value} in state {state.value}") from None


def stream_transition(state: StreamState, event: StreamInput) -> StreamState:
    """The stream state after ``event``.

    Raises:
        LocalProtocolError: ``event`` is not allowed in ``state``.
    """
    try:
        return STREAM_TRANSITIONS[state][event]
    except KeyError:
        raise LocalProtocolError(f"stream cannot {event.value} in state {state.value}") from None


def session_transition(state: SessionState, event: SessionInput) -> SessionState:
    """The session state after ``event``.

    Raises:
        LocalProtocolError: ``event`` is not allowed in ``state``.
    """
    try:
        return SESSION_TRANSITIONS[state][event]
    except KeyError:
        raise LocalProtocolError(f"session cannot {event.value} in state {state.value}") from None
