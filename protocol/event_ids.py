"""Event ids: a parsed ``<epoch>:<seq>`` id (:class:`EventId`) and an epoch's text form.

(Public; see :mod:`weir.protocol`.)
"""

from __future__ import annotations

from ._event_ids import (
    EventId,
    format_epoch,
)

__all__ = [
    "EventId",
    "format_epoch",
]
