"""What a session store raises: the failures every caller maps to an answer.

Theory of operation
-------------------
Every :class:`~._session_store.SessionStore` operation either succeeds or raises
one of these, and each has one meaning for the caller:

* :class:`SessionGone` -- the session is unknown or was deleted: 404;
* :class:`ChannelRejected` -- a channel token was refused: 409 ``cursor_stale`` /
  ``channel_unbound`` (its ``verdict`` says which);
* :class:`StoreUnavailable` -- the store could not answer (an outage, a deadline,
  malformed data, or -- :func:`epoch_reissued` -- an answer that contradicts what it
  acknowledged before): fail closed, 503 ``store_unavailable``;
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


def epoch_reissued(epoch: str) -> StoreUnavailable:
    """The store handed out stream epoch ``epoch`` of a session a second time.

    It can only do so after losing writes it had acknowledged: a primary that died
    before its replica had the session's epoch counter (asynchronous replication;
    ``--store-replicas`` waits for them).  Opening a second stream under that epoch
    would mix two streams' events under one set of ids, so the request is refused,
    like any other failure of the store (503, nothing run); its retry is given the
    next epoch.
    """
    return StoreUnavailable(
        f"the store issued stream epoch {epoch} a second time in this session: it lost "
        "writes it had acknowledged (a primary lost before its replicas had them; "
        "--store-replicas makes the store wait for them)"
    )
