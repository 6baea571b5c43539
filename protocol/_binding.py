"""Session binding (fencing): channel tokens, and how a presented one compares.

Theory of operation
-------------------
A session id names a session; it proves nothing (it travels in logs, proxies and
URLs).  What binds a client to a session is the *channel token*
``<generation>.<secret>`` the server hands out at ``initialize`` and at every
rebind, sent back as ``Mcp-Channel-Token``.  A rebind starts a new generation
with a new secret, which fences every holder of the old one:

* :func:`parse_channel_token` reads the header; anything but digits, a dot and a
  non-empty secret is refused as ``channel_unbound`` (409).
* :func:`channel_verdict` compares a presented ``(generation, secret)`` with the
  session's current one: an older generation is :attr:`ChannelVerdict.STALE`
  (409 ``cursor_stale``: the client was fenced by a rebind), the current
  generation with another secret, or a generation from the future, is
  :attr:`ChannelVerdict.UNBOUND` (409 ``channel_unbound``).  No token at all is
  OK here: whether a session demands one is the driver's policy.
* :func:`channel_refusal` renders a verdict as the refusal every driver sends.
* :func:`check_rebind` says who may start a new generation; :func:`prove_channel`
  that a session whose client presented a token needs it from then on (to be read
  or ended); :func:`fenced` which streams a rebind ends.

The comparison must also be made *inside* a shared store's atomic operations
(a rebind on another replica may land between a check and a write); stores do
that with the same rule, and report the verdict back.
"""

from __future__ import annotations

import enum
import hmac

from ._errors import SERVER_ERROR, Reason, RemoteProtocolError
from ._jsonrpc import RequestId

#: The most digits a generation may have (it fits a 64-bit signed integer).
MAX_GENERATION_DIGITS = 18


class ChannelVerdict(enum.Enum):
    """How a presented channel token compares with the session's."""

    OK = "ok"
    STALE = "cursor_stale"  # an older generation
    UNBOUND = "channel_unbound"  # the current generation with the wrong secret (or a future one)


def parse_channel_token(
    raw: str | None, request_id: RequestId | None = None
) -> tuple[int, str] | None:
    """``Mcp-Channel-Token: <generation>.<secret>`` as ``(generation, secret)``.

    Raises:
        RemoteProtocolError: 409 ``channel_unbound`` for a malformed token.
    """
    if raw is None:
        return None
    gen, sep, secret = raw.strip().partition(".")
    if not sep or not gen.isdigit() or len(gen) > MAX_GENERATION_DIGITS or not secret:
        raise channel_refusal(ChannelVerdict.UNBOUND, request_id, "malformed Mcp-Channel-Token")
    return int(gen), secret


def channel_verdict(generation: int, secret: str, token: tuple[int, str] | None) -> ChannelVerdict:
    """Compare a presented token with the session's ``(generation, secret)``.

    The secrets are compared in constant time (:func:`hmac.compare_digest`), so how
    long a refusal takes says nothing about how much of a guessed secret was right.
    """
    if token is None:
        return ChannelVerdict.OK
    presented, presented_secret = token
    if presented < generation:
        return ChannelVerdict.STALE
    same = hmac.compare_digest(
        presented_secret.encode("utf-8", "surrogatepass"), secret.encode("utf-8", "surrogatepass")
    )
    if presented > generation or not same:
        return ChannelVerdict.UNBOUND
    return ChannelVerdict.OK


def channel_refusal(
    verdict: ChannelVerdict, request_id: RequestId | None, message: str | None = None
) -> RemoteProtocolError:
    """The 409 refusal for a STALE or UNBOUND verdict."""
    reason = Reason.CURSOR_STALE if verdict is ChannelVerdict.STALE else Reason.CHANNEL_UNBOUND
    text = message or (
        "this channel token belongs to an older generation of the session"
        if verdict is ChannelVerdict.STALE
        else "this channel token is not bound to the session; rebind first"
    )
    return RemoteProtocolError(
        text, http_status=409, reason=reason, code=SERVER_ERROR, request_id=request_id
    )


def check_rebind(
    verdict: ChannelVerdict, presented: bool, *, authorized: bool, request_id: RequestId | None
) -> None:
    """May this request rebind the session (start a new channel generation)?

    Whoever proves the channel (its current token) may; with authorization on, so
    may the session's principal, token or not.  Without authorization, a client
    that knows only the session id must not fence the owner (whose next request
    would be ``cursor_stale``) or read the results a rebind hands back.  A token of
    an older generation is always refused: that client has been fenced.

    ``verdict`` compares the presented token (UNBOUND if it did not parse);
    ``presented``: the request carried one at all.

    Raises:
        RemoteProtocolError: 409 ``cursor_stale`` or ``channel_unbound``.
    """
    if verdict is ChannelVerdict.STALE:
        raise channel_refusal(ChannelVerdict.STALE, request_id)
    if authorized:
        return
    if not presented or verdict is not ChannelVerdict.OK:
        raise channel_refusal(
            ChannelVerdict.UNBOUND,
            request_id,
            "weir/rebind needs the session's current Mcp-Channel-Token",
        )


def prove_channel(*, bound: bool, presented: bool, authorized: bool, what: str) -> bool:
    """A session whose client has presented its token needs it from then on.

    For requests that end or read a session (``DELETE``, GET streams) and carry a
    token already checked (:func:`channel_verdict` said OK): without
    authorization, a session id alone must not end or read a session whose client
    uses a channel token.  Sessions of token-less clients (standard SDK clients)
    are served as before; with authorization on, the principal is the proof.

    Returns True when this request's token is the first the session sees: from
    now on the session is *bound* (the driver records that).

    Raises:
        RemoteProtocolError: 409 ``channel_unbound`` (``what`` says what needed it).
    """
    if presented:
        return not bound
    if bound and not authorized:
        raise channel_refusal(
            ChannelVerdict.UNBOUND,
            None,
            f"this session's client uses a channel token: {what} needs it",
        )
    return False


def fenced(stream_generation: int, generation: int) -> bool:
    """Is a stream opened under ``stream_generation`` fenced by the session's rebind to
    ``generation``?  (An older generation's streams are ended, never inherited.)"""
    return stream_generation < generation
