"""A POST's messages sorted for the driver; server-to-client request ids; the mail
replicas sharing a store exchange.

(Public; see :mod:`weir.protocol`.)
"""

from __future__ import annotations

from ._messages import (
    CANCEL_BOX,
    CHANGE_POLL,
    POLL_INTERVAL,
    boxes_due,
    encode_change,
    first_change_cursor,
    read_answer,
    read_cancel,
    read_change,
    renew_interval,
    server_request_id,
)

__all__ = [
    "CANCEL_BOX",
    "CHANGE_POLL",
    "POLL_INTERVAL",
    "boxes_due",
    "encode_change",
    "first_change_cursor",
    "read_answer",
    "read_cancel",
    "read_change",
    "renew_interval",
    "server_request_id",
]
