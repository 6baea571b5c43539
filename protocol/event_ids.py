"""Event ids: the ``<epoch>:<seq>`` grammar and the keyed epoch permutation.

(Public; see :mod:`weir.protocol`.)
"""

from __future__ import annotations

from ._event_ids import (
    EpochPermutation,
    EventId,
    epoch_number,
    format_epoch,
    parse_event_id,
    scramble_epoch,
)

__all__ = [
    "EpochPermutation",
    "EventId",
    "epoch_number",
    "format_epoch",
    "parse_event_id",
    "scramble_epoch",
]
