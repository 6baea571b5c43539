"""What a session store raises: the failures every caller maps to an answer.

Theory of operation
-------------------
Every :class:`~._session_store.SessionStore` operation either succeeds or raises
one of these, and each has one meaning for the caller:

* :class:`SessionGone` -- the session is unknown or was deleted: 404;
* :class:`ChannelRejected` -- a channel token was refused: 409 ``cursor_stale`` /
  ``channel_unbound`` (its ``verdict`` says which);
* :class:`StoreUnavailable` -- the store could not answer (an outage, a deadline,
  malformed data): fail closed, 503 ``store_unavailable``;
* :class:`RetentionFull` -- a new gate key found no room in the memory budget:
  503 ``overloaded``, nothing claimed.
"""

from __future__ import annotations

from weir.protocol.binding import ChannelVerdict


class StoreUnavailable(Exception):
    """The store could not be reached; callers fail closed (503 ``store_unavailable``)."""


class RetentionFull(Exception):
    """A new gate key was refused: the memory budget is full of keys that must stay
    (tombstones, running claims) even after shedding, and forgetting one could run
    its call again.  Nothing was claimed; callers answer 503 ``overloaded``."""


class SessionGone(Exception):
    """The session is unknown or was deleted (404)."""


class ChannelRejected(Exception):
    """A channel token was refused; ``verdict`` is STALE or UNBOUND."""

    def __init__(self, verdict: ChannelVerdict) -> None:
        super().__init__(verdict.value)
        self.verdict = verdict


class ReplicasBehind(StoreUnavailable):
    """A write the store applied, but fewer replicas confirmed it than the store's
    durability setting requires (``WAIT``): refused as the store being unavailable
    (503, nothing run on its strength), though it may stand on the primary."""
