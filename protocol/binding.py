"""Channel tokens (fencing): parsing, verdicts and refusals.  (Public; see :mod:`weir.protocol`.)"""

from __future__ import annotations

from ._binding import ChannelVerdict, channel_refusal, channel_verdict, parse_channel_token

__all__ = [
    "ChannelVerdict",
    "channel_refusal",
    "channel_verdict",
    "parse_channel_token",
]
