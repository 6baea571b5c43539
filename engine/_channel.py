"""Channel tokens (fencing): the driver's side of the rules in :mod:`weir.protocol`."""

from __future__ import annotations

from weir.protocol.binding import ChannelVerdict, channel_refusal
from weir.protocol.jsonrpc import RequestId


def raise_channel(verdict: ChannelVerdict, request_id: RequestId | None = None) -> None:
    """Raise the refusal for a STALE or UNBOUND verdict; nothing for OK."""
    if verdict is not ChannelVerdict.OK:
        raise channel_refusal(verdict, request_id)
