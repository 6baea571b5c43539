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
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ._jsonrpc import ErrorResponse, Message, Notification, Request, RequestId, Response

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
