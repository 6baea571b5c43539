"""What a POST's messages ask of a session, sorted once for every driver.

Theory of operation
-------------------
A POST to the endpoint may carry requests, notifications and the client's answers to
the server's own requests, in any mix.  :func:`absorb` sorts them into what a driver
does with each kind: requests go through admission and the gate; answers resolve
the server-to-client request they name; ``notifications/cancelled`` names a request
to cancel (ids of the wrong type are dropped here, so no driver looks them up);
``notifications/initialized`` moves the session to ACTIVE.  Other notifications need
nothing from the transport; they are kept, in order, for the application.

Server-to-client request ids are ``weir:<replica>:<n>`` (:func:`server_request_id`):
they name the process that waits for the answer, so an answer that reaches another
replica can be forwarded there (:func:`answer_owner`).

Mail between replicas
---------------------
What replicas sharing a store tell each other, and when they look.  Behind a load
balancer, a session's POSTs reach any replica, but a running call, and a
server-to-client request waiting for the client's answer, live in the one process
that started them.  Two things must therefore travel between replicas, through
mailboxes the store keeps per session:

* a client's **answer** to a server-to-client request: the request's id names the
  replica waiting (:func:`answer_owner`), so the answer goes to that replica's box,
  :func:`answers_box`;
* a **cancellation** of a request running elsewhere: the replica does not know
  who runs it, so it goes to the session's shared :data:`CANCEL_BOX`, which every
  replica reads without emptying.

:func:`route_mail` sorts what a POST absorbed into what this replica does itself and
what it posts.  :func:`boxes_due` says which boxes a replica reads on a poll: only
sessions that wait for an answer, or run a request for longer than
:data:`CANCEL_AFTER` (a client rarely cancels a request it just sent, and a short
one is over before the mail would arrive), so idle and fast traffic cost no
store round trip.  :func:`read_answer` and :func:`read_cancel` decode mail,
dropping what does not parse (mail is written by replicas, but a store is no
place to trust blindly).

Announced changes travel on the store's one bus instead (every replica reads all
of it): :func:`encode_change` names the change and the replica that announced it,
:func:`read_change` decodes one another replica announced (its own, and anything
that does not parse, are dropped); a replica reads the bus every
:data:`CHANGE_POLL` s while anyone there may hear a change, its first read going
:data:`CHANGE_LOOKBACK` s back (:func:`first_change_cursor`).

The leases of running calls are renewed every :func:`renew_interval`: a third of
the lease, so two renewals can be lost before a live call's claim runs out.
"""

from __future__ import annotations

from collections.abc import Container, Iterable
from dataclasses import dataclass, field
from typing import Final

import msgspec

from ._errors import RemoteProtocolError
from ._jsonrpc import (
    ErrorResponse,
    Message,
    Notification,
    Request,
    RequestId,
    Response,
    decode_message,
    encode,
)

_PREFIX = "weir:"


@dataclass(slots=True)
class Absorbed:
    """A POST's messages by what the driver does with them (each in arrival order)."""

    requests: list[Request] = field(default_factory=list)
    #: The client's answers to server-to-client requests (``id`` never None).
    answers: list[Response | ErrorResponse] = field(default_factory=list)
    #: Request ids the client cancelled (``notifications/cancelled``, valid ids only).
    cancels: list[RequestId] = field(default_factory=list)
    #: ``notifications/initialized`` was among them.
    initialized: bool = False
    #: Every other notification (the application's: ``notifications/roots/list_changed``,
    #: custom ones), in arrival order.
    notes: list[Notification] = field(default_factory=list)


def absorb(messages: list[Message]) -> Absorbed:
    """Sort one POST's messages (see the module docstring)."""
    out = Absorbed()
    for msg in messages:
        if isinstance(msg, Request):
            out.requests.append(msg)
        elif isinstance(msg, Notification):
            if msg.method == "notifications/initialized":
                out.initialized = True
            elif msg.method == "notifications/cancelled":
                rid = (msg.params or {}).get("requestId")
                if isinstance(rid, int | str) and not isinstance(rid, bool):
                    out.cancels.append(rid)
            else:
                out.notes.append(msg)
        elif msg.id is not None:
            out.answers.append(msg)
    return out


def server_request_id(replica: str, n: int) -> str:
    """The id of the server's ``n``-th request to a client, waited for by ``replica``."""
    return f"{_PREFIX}{replica}:{n}"


def answer_owner(request_id: RequestId | None) -> str | None:
    """The replica waiting for the answer to ``request_id``, if weir made that id."""
    if not isinstance(request_id, str) or not request_id.startswith(_PREFIX):
        return None
    replica, sep, n = request_id[len(_PREFIX) :].rpartition(":")
    return replica if sep and replica and n.isdigit() else None


#: The session's mailbox of cancellations (read by every replica, never emptied).
CANCEL_BOX: Final = "cancel"
#: Seconds between two polls of the mailboxes.
POLL_INTERVAL: Final = 0.1
#: A request running longer than this is worth checking for a cancellation.
CANCEL_AFTER: Final = 1.0


def answers_box(replica: str) -> str:
    """The mailbox of answers for ``replica``'s server-to-client requests."""
    return f"answers:{replica}"


def renew_interval(lease: float) -> float:
    """How often a replica renews the leases of the calls it runs."""
    return lease / 3


@dataclass(frozen=True, slots=True)
class Post:
    """Leave ``data`` in the session's mailbox ``box``."""

    box: str
    data: bytes


@dataclass(slots=True)
class Routed:
    """A POST's answers and cancellations: handled here, or posted for another replica."""

    cancel_here: list[RequestId] = field(default_factory=list)
    answer_here: list[Response | ErrorResponse] = field(default_factory=list)
    post: list[Post] = field(default_factory=list)


def route_mail(
    absorbed: Absorbed,
    *,
    running: Container[RequestId],
    pending: Container[RequestId],
    shared: bool,
) -> Routed:
    """Sort ``absorbed``'s cancellations and answers (see the module docstring).

    ``running``: request ids running in this process; ``pending``: ids of this
    process's server-to-client requests awaiting an answer; ``shared``: other
    replicas may exist (without a shared store, what is not here is dropped).
    """
    out = Routed()
    for rid in absorbed.cancels:
        if rid in running:
            out.cancel_here.append(rid)
        elif shared:  # perhaps running on another replica
            out.post.append(Post(CANCEL_BOX, msgspec.json.encode(rid)))
    for answer in absorbed.answers:
        if answer.id in pending:
            out.answer_here.append(answer)
        elif shared and (replica := answer_owner(answer.id)) is not None:
            out.post.append(Post(answers_box(replica), encode(answer)))
    return out


def boxes_due(
    replica: str, *, awaiting_answers: bool, started: Iterable[float], now: float
) -> list[str]:
    """The mailboxes one session's poll reads on ``replica`` (often none).

    ``started``: when this replica's running requests of the session started.
    """
    boxes = [answers_box(replica)] if awaiting_answers else []
    if any(now - t > CANCEL_AFTER for t in started):
        boxes.append(CANCEL_BOX)
    return boxes


def read_answer(raw: bytes) -> Response | ErrorResponse | None:
    """A forwarded answer, or ``None`` if ``raw`` is not one."""
    try:
        msg = decode_message(raw)
    except RemoteProtocolError:  # mail that does not parse is dropped
        return None
    if isinstance(msg, Response | ErrorResponse) and msg.id is not None:
        return msg
    return None


def read_cancel(raw: bytes) -> RequestId | None:
    """A forwarded cancellation's request id, or ``None`` if ``raw`` is not one."""
    try:
        rid = msgspec.json.decode(raw)
    except msgspec.DecodeError:
        return None
    return rid if isinstance(rid, int | str) and not isinstance(rid, bool) else None


#: Seconds between a replica's reads of the store's change bus.
CHANGE_POLL: Final = 0.1
#: How far back (seconds) a replica's first read of the bus goes.
CHANGE_LOOKBACK: Final = 5.0


def encode_change(method: str, uri: str | None, replica: str) -> bytes:
    """An announced change (a list's, or resource ``uri``'s) for the store's bus."""
    return msgspec.json.encode({"m": method, "u": uri, "r": replica})


def read_change(raw: bytes, replica: str) -> tuple[str, str | None] | None:
    """``(method, uri)`` of a change another replica announced; ``None`` for this
    ``replica``'s own, and for anything that is not a change."""
    try:
        change = msgspec.json.decode(raw)
    except msgspec.DecodeError:
        return None
    if not isinstance(change, dict) or change.get("r") == replica:
        return None
    method, uri = change.get("m"), change.get("u")
    if isinstance(method, str) and (uri is None or isinstance(uri, str)):
        return method, uri
    return None


def first_change_cursor(wall_now: float) -> str:
    """Where a replica's first read of the bus starts, at wall-clock time
    ``wall_now`` (seconds): :data:`CHANGE_LOOKBACK` before it (bus ids are
    milliseconds of the store's clock)."""
    return f"{int((wall_now - CHANGE_LOOKBACK) * 1000)}-0"
