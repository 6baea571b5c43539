"""Read deadlines by what the peer owes: idle, a request head, a request body.

Theory of operation
-------------------
A client that sends nothing, or one byte a minute, must not hold a connection
for ever; but a client that is simply idle between requests deserves the long
keep-alive timeout, not the short one meant for a head being trickled.  So the
deadline of each read depends on :attr:`HttpConnection.inbound`:

* ``IDLE`` (nothing owed): ``keepalive`` seconds from *now* -- each quiet wait
  starts afresh;
* ``HEAD``: ``head`` seconds from the head's *first* byte, however many reads
  it takes (a trickle does not reset it);
* ``BODY``: ``body`` seconds from the moment the head was complete.

:class:`ReadClock` keeps the phase and when it began; the driver asks
:meth:`ReadClock.deadline` before every read, tells it :meth:`request_done`
when a request is complete, and on a missed deadline sends
:meth:`ReadClock.refusal` (408, then close) -- unless the connection was idle,
when it simply closes.

A connection closed on a refusal while its peer is still sending (a 408, a 413 for
a body declared too large, a 503 for too many bytes in flight) should not simply
close: a socket closed with unread bytes in it answers with a TCP reset, which can
destroy the refusal before the peer reads it, so the peer sees "connection reset"
instead of a status it could act on.  The driver half-closes instead and reads and
discards whatever still arrives for at most ``linger`` seconds (``0``: close at
once); nothing read then is kept, so lingering costs no memory, only the
connection's slot for that long.
"""

from __future__ import annotations

from dataclasses import dataclass

from ._errors import Reason, RemoteProtocolError
from ._http_events import Inbound


@dataclass(frozen=True, slots=True, kw_only=True)
class ReadTimeouts:
    """Seconds a connection may wait: idle between requests, for a head, for a body;
    and how long a refused connection lingers, discarding, before it closes."""

    keepalive: float = 75.0
    head: float = 30.0
    body: float = 60.0
    linger: float = 2.0

    def __post_init__(self) -> None:
        if min(self.keepalive, self.head, self.body) <= 0:
            raise ValueError("read timeouts must be positive")
        if not 0 <= self.linger <= 60:
            raise ValueError(f"linger must be 0 (off) to 60 seconds, not {self.linger}")


class ReadClock:
    """The current read phase of one connection and its deadline."""

    __slots__ = ("phase", "since", "timeouts")

    def __init__(self, timeouts: ReadTimeouts) -> None:
        self.timeouts = timeouts
        self.phase = Inbound.IDLE
        self.since = 0.0

    def deadline(self, inbound: Inbound, now: float) -> float:
        """The instant the next read must complete by (see the module docstring)."""
        if inbound is Inbound.IDLE:
            self.phase = inbound
            return now + self.timeouts.keepalive
        if inbound is not self.phase:
            self.phase, self.since = inbound, now
        limit = self.timeouts.head if inbound is Inbound.HEAD else self.timeouts.body
        return self.since + limit

    def request_done(self) -> None:
        """A whole request arrived: the next wait is an idle one."""
        self.phase = Inbound.IDLE

    @property
    def owed(self) -> bool:
        """Was a request under way (a missed deadline gets 408), not merely idle?"""
        return self.phase is not Inbound.IDLE

    def refusal(self) -> RemoteProtocolError:
        """The 408 for a missed head or body deadline."""
        head = self.phase is Inbound.HEAD
        what, limit = (
            ("request head", self.timeouts.head)
            if head
            else (
                "request body",
                self.timeouts.body,
            )
        )
        return RemoteProtocolError(
            f"the {what} did not arrive within {limit:g} s",
            http_status=408,
            reason=Reason.REQUEST_TIMEOUT,
        )
