"""A byte budget for what the server keeps after it is needed: per owner, and in total.

Theory of operation
-------------------
Finished work leaves things behind that are worth keeping for a while -- a
stream's frames for replay after a reconnect, a call's result for the
idempotency gate and for a rebind -- but never at any cost.  A
:class:`RetentionBudget` accounts such bytes per *owner* (a session) and in one
process-wide total, and enforces two caps:

* ``per_owner``: one owner never keeps more than this;
* ``total``: all owners together never keep more than this.

Owners report every change of what they keep with :meth:`~RetentionBudget.charge`
(a negative amount when they let something go).  When a charge puts a cap over
its limit, the budget asks owners to shed: the owner itself for its own cap,
then -- for the total -- the owners that were charged longest ago first, so the
history of sessions that have been quiet the longest goes first.  An owner's
``shed(n)`` callback frees what it can, *oldest first within the owner*, and
reports every byte it frees through the same :meth:`~RetentionBudget.charge`; it
may free less than asked when the rest must stay (a live stream's unacknowledged
frames, which hold drain credit and are bounded by it).

What an eviction costs the client is decided by the owner, never by the budget:
dropped replay history makes a later cursor into it ``409 cursor_unknown`` (never
a resume from somewhere else); a dropped call result leaves a tombstone, so a
retry is told the outcome is gone instead of running again.

Tombstones and running claims are never shed: a shed frees results and history
only, so under pressure an owner may free less than asked and ``held`` may stay
over ``total`` by what such keys hold.  That excess is bounded by the owner: one
that keeps such keys charges a new one, and if the budget is still over ``total``
after the sheds that charge caused, gives it back and refuses the new call (the
memory store answers 503 ``overloaded``; nothing runs).  So a key is never
forgotten to make room, and ``held`` goes over ``total`` only by what cannot be
shed at all: the unacknowledged frames of live streams.

The bookkeeping is per owner, not per item: one small record and one ordered
dictionary entry per session, O(1) per charge.  No clock, no I/O.

A budget full of what cannot be shed
------------------------------------
Asking every owner to shed is a walk over all of them.  Once one such walk reaches
the charging owner still over ``total``, the budget is *stuck*: everything else that
could go has gone.
From then on a charge over it asks only the charging owner (the one whose new bytes
may be sheddable) and walks everyone again only after as many charges as there are
owners (at least :data:`STUCK_RESCAN`), so a walk costs O(1) per charge, amortized:
bytes that became sheddable without a charge over the total (frames acknowledged
since, results kept while there was room) wait at most that long.  So a client that fills the
budget with keys cannot make every later response pay for a walk over every session.

A result larger than credit
---------------------------
A response bigger than a session's whole byte credit could never be sent within
it, so :func:`fit_result` replaces it with a ``result_too_large`` error (sizes in
``data``); a JSON body is measured with :data:`HEAD_ALLOWANCE` bytes for its head.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from typing import TYPE_CHECKING, Final

from ._errors import INTERNAL_ERROR, Reason
from ._jsonrpc import RequestId, encode_error

if TYPE_CHECKING:
    from ._streams import StreamLog

#: Asked to free at least ``n`` bytes, oldest first; reports what it frees by charging.
Shed = Callable[[int], object]

#: While the budget is stuck over its total, the fewest charges between two walks over
#: every owner (more when there are more owners than this).
STUCK_RESCAN: Final = 64


class _Owner:
    __slots__ = ("held", "shed")

    def __init__(self, shed: Shed | None) -> None:
        self.held = 0
        self.shed = shed


class RetentionBudget:
    """Retained bytes per owner and in total, shed oldest first (see the module doc).

    Args:
        total: most bytes all owners together may hold.
        per_owner: most bytes one owner may hold.

    Raises:
        ValueError: a limit below 1, or ``per_owner > total``.
    """

    __slots__ = (
        "_owners",
        "_shedding",
        "_stuck",
        "evicted_bytes",
        "evictions",
        "held",
        "per_owner",
        "total",
    )

    def __init__(self, *, total: int, per_owner: int) -> None:
        if total < 1 or per_owner < 1:
            raise ValueError("retention limits must be >= 1 byte")
        if per_owner > total:
            raise ValueError(f"per_owner ({per_owner}) must be <= total ({total})")
        self.total = total
        self.per_owner = per_owner
        #: Bytes held now, all owners.
        self.held = 0
        #: Times an owner was made to shed (and freed something), and the bytes freed.
        self.evictions = 0
        self.evicted_bytes = 0
        self._owners: OrderedDict[str, _Owner] = OrderedDict()
        self._shedding = False
        #: Stuck over ``total`` (see the module doc): charges left before the next walk.
        self._stuck = 0

    def register(self, owner: str, shed: Shed) -> None:
        """Say how ``owner`` frees bytes when asked (before or after its first charge)."""
        entry = self._owners.get(owner)
        if entry is None:
            self._owners[owner] = _Owner(shed)
        else:
            entry.shed = shed

    def owner_held(self, owner: str) -> int:
        """Bytes ``owner`` holds now."""
        entry = self._owners.get(owner)
        return entry.held if entry is not None else 0

    def __len__(self) -> int:
        return len(self._owners)

    def charge(self, owner: str, nbytes: int) -> None:
        """``owner`` now keeps ``nbytes`` more (fewer, if negative); then enforce the caps.

        A positive charge makes ``owner`` the most recently charged, and may ask
        any owner (this one included) to shed before it returns.
        """
        if not nbytes:
            return
        entry = self._owners.get(owner)
        if entry is None:
            entry = self._owners[owner] = _Owner(None)
        entry.held += nbytes
        self.held += nbytes
        if nbytes < 0 or self._shedding:
            return
        self._owners.move_to_end(owner)
        if entry.held > self.per_owner or self.held > self.total:
            self._enforce(owner, entry)

    def release_owner(self, owner: str) -> int:
        """Forget ``owner`` (it is gone, and so is all it kept); return the bytes freed."""
        entry = self._owners.pop(owner, None)
        if entry is None:
            return 0
        self.held -= entry.held
        return entry.held

    def _enforce(self, owner: str, entry: _Owner) -> None:
        self._shedding = True  # sheds report frees (negative charges) only
        try:
            if entry.held > self.per_owner:
                self._shed(entry, entry.held - self.per_owner)
            if self.held <= self.total:
                self._stuck = 0
            elif self._stuck:
                self._stuck -= 1  # all else was shed at the last walk: only the new bytes
                self._shed(entry, self.held - self.total)
            else:
                for other in list(self._owners.values()):  # least recently charged first
                    if self.held <= self.total:
                        break
                    if other is entry:  # (the last: every other owner shed what it could)
                        self._stuck = max(STUCK_RESCAN, len(self._owners))
                    if other.held > 0:
                        self._shed(other, self.held - self.total)
        finally:
            self._shedding = False

    def _shed(self, entry: _Owner, nbytes: int) -> None:
        if entry.shed is None:
            return
        before = entry.held
        entry.shed(nbytes)
        freed = before - entry.held
        if freed > 0:
            self.evictions += 1
            self.evicted_bytes += freed


#: Bytes set aside for a JSON response's HTTP head when fitting its body into credit.
HEAD_ALLOWANCE: Final = 256


def fit_result(request_id: RequestId, payload: bytes, size: int, limit: int) -> bytes:
    """``payload``, if its response -- ``size`` bytes as sent: the SSE frame, or the
    JSON body plus :data:`HEAD_ALLOWANCE` -- fits a byte credit of ``limit``; else
    the ``result_too_large`` error answering ``request_id`` (``data`` has both sizes).
    """
    if size <= limit:
        return payload
    return encode_error(
        request_id,
        INTERNAL_ERROR,
        f"the result ({size} bytes) is larger than this server's per-session credit "
        f"({limit} bytes); the server's operator can raise --credit-bytes",
        {"reason": str(Reason.RESULT_TOO_LARGE), "size": size, "limit": limit},
    )


#: The most a response's framing adds to its payload: an SSE frame's ``id:``,
#: ``event:`` and ``data:`` lines (event ids are bounded well under 200 bytes), or
#: :data:`HEAD_ALLOWANCE` for a JSON body's head.  A payload this far under the
#: credit fits whatever its framing, so it is not measured.
FRAMING_ALLOWANCE: Final = 512


def fit_response(
    request_id: RequestId, payload: bytes, limit: int, stream: StreamLog | None
) -> bytes:
    """``payload`` if its response fits a byte credit of ``limit`` -- as the next
    frame of ``stream``, or as a JSON body when ``stream`` is ``None`` -- else the
    ``result_too_large`` error answering ``request_id`` (:func:`fit_result`).

    Both runtimes call this on every result: the common case (a payload more than
    :data:`FRAMING_ALLOWANCE` under the credit) costs one comparison.
    """
    if len(payload) + FRAMING_ALLOWANCE <= limit:
        return payload
    size = len(payload) + HEAD_ALLOWANCE if stream is None else stream.size_of(payload.decode())
    return fit_result(request_id, payload, size, limit)


__all__ = [
    "FRAMING_ALLOWANCE",
    "HEAD_ALLOWANCE",
    "RetentionBudget",
    "Shed",
    "fit_response",
    "fit_result",
]
