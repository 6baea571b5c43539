"""Channel tokens (fencing): parsing, verdicts and refusals.  (Public; see :mod:`weir.protocol`.)"""

from __future__ import annotations

from ._binding import (
    ChannelVerdict,
    channel_refusal,
    channel_verdict,
    check_rebind,
    fenced,
    parse_channel_token,
    prove_channel,
)

__all__ = [
    "ChannelVerdict",
    "channel_refusal",
    "channel_verdict",
    "check_rebind",
    "fenced",
    "parse_channel_token",
    "prove_channel",
]
