"""Channel tokens (fencing): parsing, verdicts and refusals.  (Public; see :mod:`weir.protocol`.)"""

from __future__ import annotations

from ._binding import (
    ChannelVerdict,
    channel_refusal,
    channel_verdict,
    fenced,
)

__all__ = [
    "ChannelVerdict",
    "channel_refusal",
    "channel_verdict",
    "fenced",
]
