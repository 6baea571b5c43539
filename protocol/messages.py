"""A POST's messages sorted for the driver; server-to-client request ids; the mail
replicas sharing a store exchange.

(Public; see :mod:`weir.protocol`.)
"""

from __future__ import annotations

from ._mail import (
    CANCEL_AFTER,
    CANCEL_BOX,
    POLL_INTERVAL,
    Post,
    Routed,
    answers_box,
    boxes_due,
    read_answer,
    read_cancel,
    renew_interval,
    route_mail,
)
from ._messages import Absorbed, absorb, answer_owner, server_request_id

__all__ = [
    "CANCEL_AFTER",
    "CANCEL_BOX",
    "POLL_INTERVAL",
    "Absorbed",
    "Post",
    "Routed",
    "absorb",
    "answer_owner",
    "answers_box",
    "boxes_due",
    "read_answer",
    "read_cancel",
    "renew_interval",
    "route_mail",
    "server_request_id",
]
