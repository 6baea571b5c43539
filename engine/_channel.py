"""Channel tokens (fencing): parsing ``Mcp-Channel-Token`` and the 409 refusals."""

from __future__ import annotations

from weir.protocol import SERVER_ERROR, Reason, RemoteProtocolError, RequestId

from ._store import ChannelVerdict


def parse_token(raw: str | None, request_id: RequestId | None = None) -> tuple[int, str] | None:
    """``Mcp-Channel-Token: <generation>.<secret>``; malformed is ``channel_unbound``."""
    if raw is None:
        return None
    gen, sep, secret = raw.strip().partition(".")
    if not sep or not gen.isdigit() or len(gen) > 18 or not secret:
        raise channel_refusal(ChannelVerdict.UNBOUND, request_id, "malformed Mcp-Channel-Token")
    return int(gen), secret


def channel_refusal(
    verdict: ChannelVerdict, request_id: RequestId | None, message: str | None = None
) -> RemoteProtocolError:
    reason = Reason.CURSOR_STALE if verdict is ChannelVerdict.STALE else Reason.CHANNEL_UNBOUND
    text = message or (
        "this channel token belongs to an older generation of the session"
        if verdict is ChannelVerdict.STALE
        else "this channel token is not bound to the session; rebind first"
    )
    return RemoteProtocolError(
        text, http_status=409, reason=reason, code=SERVER_ERROR, request_id=request_id
    )


def raise_channel(verdict: ChannelVerdict, request_id: RequestId | None = None) -> None:
    if verdict is not ChannelVerdict.OK:
        raise channel_refusal(verdict, request_id)
