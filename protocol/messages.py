"""A POST's messages sorted for the driver; server-to-client request ids; the mail
replicas sharing a store exchange.

(Public; see :mod:`weir.protocol`.)
"""

from __future__ import annotations

from ._messages import (
    CANCEL_BOX,
    POLL_INTERVAL,
    boxes_due,
    read_answer,
    read_cancel,
    renew_interval,
    server_request_id,
)

__all__ = [
    "CANCEL_BOX",
    "POLL_INTERVAL",
    "boxes_due",
    "read_answer",
    "read_cancel",
    "renew_interval",
    "server_request_id",
]
