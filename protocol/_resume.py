"""Which stream a GET attaches to, and who may resume what.

Theory of operation
-------------------
A GET either opens the session's standalone stream or, with ``Last-Event-ID``,
resumes the stream its cursor names.  The rules, the same for every driver:

* **Policy.**  With resumption ``off`` a cursor is 409 ``cursor_unknown``: the
  server keeps no history to resume from, and says so instead of replaying from
  the head (:func:`check_resume_policy`).
* **One live standalone stream.**  A GET without a cursor attaches to the
  session's standalone stream; if one is already being written, the second is
  409 ``stream_conflict`` -- two readers of one live stream would each miss what
  the other read.  A standalone stream that ended (fenced by a rebind, say) is
  replaced by a new one (:func:`standalone_plan`).
* **A cursor is bound to its channel.**  A stream opened under one channel
  generation can be resumed only under the same one, so a client fenced by a
  rebind cannot read what was sent to its successor (:func:`check_cursor_channel`).
* **The newest reader wins.**  A resumption of a stream that is still attached
  to an older connection means the client gave up on that connection (it is
  half-open or gone): the old writer is displaced, not the new reader refused
  (:func:`displaces_writer`).
"""

from __future__ import annotations

from typing import Final

from ._binding import ChannelVerdict, channel_refusal
from ._errors import Reason, RemoteProtocolError
from ._event_ids import EventId
from ._states import StreamState
from ._streams import StreamLog

#: Resumption policies: also from a shared store (any replica), only from the
#: process that holds the stream (``pinned``), or none.
RESUME_POLICIES: Final = ("shared", "pinned", "off")

_ATTACHED: Final = (StreamState.LIVE_ATTACHED, StreamState.FINAL_ATTACHED)


def check_resume_policy(cursor: EventId | None, policy: str) -> None:
    """Refuse a cursor when resumption is ``off``.

    Raises:
        RemoteProtocolError: 409 ``cursor_unknown``.
    """
    if cursor is not None and policy == "off":
        raise RemoteProtocolError(
            "this server does not resume streams (resumption policy 'off')",
            http_status=409,
            reason=Reason.CURSOR_UNKNOWN,
        )


def standalone_plan(stream: StreamLog | None) -> bool:
    """For a GET without a cursor: True to open a new standalone stream, False to
    attach to ``stream``.

    Raises:
        RemoteProtocolError: 409 ``stream_conflict`` if ``stream`` is being written.
    """
    if stream is None or stream.state is StreamState.CLOSED:
        return True
    if stream.state is StreamState.LIVE_ATTACHED:
        raise RemoteProtocolError(
            "this session already has an open GET stream",
            http_status=409,
            reason=Reason.STREAM_CONFLICT,
        )
    return False


def check_cursor_channel(binding: int, token: tuple[int, str] | None) -> None:
    """A stream opened under channel generation ``binding`` resumes only under it.

    Raises:
        RemoteProtocolError: 409 ``channel_unbound``.
    """
    if binding != (token[0] if token else 0):
        raise channel_refusal(
            ChannelVerdict.UNBOUND,
            None,
            "this cursor was issued on another channel; rebind to resume it",
        )


def displaces_writer(stream: StreamLog) -> bool:
    """Is a writer still attached that a resumption must displace (newest reader wins)?"""
    return stream.state in _ATTACHED
