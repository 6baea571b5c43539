"""A byte budget for what the server keeps after it is needed: per owner, and in total.

Theory of operation
-------------------
Finished work leaves things behind that are worth keeping for a while -- a
stream's frames for replay after a reconnect, a call's result for the
idempotency gate and for a rebind -- but never at any cost.  A
:class:`RetentionBudget` accounts every such *item* in bytes, charged to its
*owner* (a session) and to one process-wide total, and enforces two caps:

* ``per_owner``: one owner never keeps more than this;
* ``total``: all owners together never keep more than this.

An item is held with :meth:`~RetentionBudget.hold` (which sets its current size;
holding it again updates the size but not its age) and let go with
:meth:`~RetentionBudget.release`.  Whenever a hold puts a cap over its limit, the
budget evicts the **oldest** items first -- the owner's own oldest for the
per-owner cap, the oldest anywhere for the total -- by calling the item's
``evict`` callback.  The callback frees what it can and returns the bytes the item
still holds: ``0`` when it is gone, more when part of it must stay (a live
stream's unacknowledged frames, which hold drain credit and are bounded by it);
such an item is kept with its new size and counted as the newest, so eviction
always makes progress and ends.

What an eviction costs the client is decided by the owner of the item, never by
the budget: a dropped replay history makes a later cursor into it ``409
cursor_unknown`` (never a resume from somewhere else); a dropped call result
leaves a tombstone, so a retry is told the outcome is gone instead of running
again.

Everything is O(1) per hold or release (ordered dictionaries), plus O(1) per
evicted item.  No clock, no I/O.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable

#: Frees what it can of an item; returns the bytes the item still holds.
Evict = Callable[[], int]


class _Item:
    __slots__ = ("evict", "owner", "size")

    def __init__(self, owner: str, size: int, evict: Evict) -> None:
        self.owner = owner
        self.size = size
        self.evict = evict


class RetentionBudget:
    """Retained bytes per owner and in total, oldest evicted first (see the module doc).

    Args:
        total: most bytes all owners together may hold.
        per_owner: most bytes one owner may hold.

    Raises:
        ValueError: a limit below 1, or ``per_owner > total``.
    """

    __slots__ = ("_items", "_owners", "evicted_bytes", "evictions", "held", "per_owner", "total")

    def __init__(self, *, total: int, per_owner: int) -> None:
        if total < 1 or per_owner < 1:
            raise ValueError("retention limits must be >= 1 byte")
        if per_owner > total:
            raise ValueError(f"per_owner ({per_owner}) must be <= total ({total})")
        self.total = total
        self.per_owner = per_owner
        #: Bytes held now, all owners.
        self.held = 0
        #: Items evicted so far, and the bytes that freed.
        self.evictions = 0
        self.evicted_bytes = 0
        self._items: OrderedDict[tuple[str, Hashable], _Item] = OrderedDict()
        # Per owner: its items oldest first, and the bytes they hold.
        self._owners: dict[str, tuple[OrderedDict[Hashable, None], list[int]]] = {}

    def owner_held(self, owner: str) -> int:
        """Bytes ``owner`` holds now."""
        entry = self._owners.get(owner)
        return entry[1][0] if entry is not None else 0

    def __len__(self) -> int:
        return len(self._items)

    def hold(self, owner: str, key: Hashable, size: int, evict: Evict) -> None:
        """Hold item ``key`` of ``owner`` at ``size`` bytes, then enforce both caps.

        A new item is the owner's (and the process's) newest; an item held again
        keeps its age and takes the new size and callback.  May call ``evict`` of
        any item, this one included, before it returns.
        """
        if size < 0:
            raise ValueError("an item's size cannot be negative")
        full = (owner, key)
        item = self._items.get(full)
        entry = self._owners.get(owner)
        if entry is None:
            entry = self._owners[owner] = (OrderedDict(), [0])
        if item is None:
            item = self._items[full] = _Item(owner, size, evict)
            entry[0][key] = None
            delta = size
        else:
            delta = size - item.size
            item.size = size
            item.evict = evict
        entry[1][0] += delta
        self.held += delta
        if delta > 0:
            self._enforce(owner)

    def release(self, owner: str, key: Hashable) -> int:
        """Stop accounting item ``key`` (its owner freed it); return the bytes it held."""
        item = self._items.pop((owner, key), None)
        if item is None:
            return 0
        entry = self._owners[owner]
        del entry[0][key]
        entry[1][0] -= item.size
        self.held -= item.size
        if not entry[0]:
            del self._owners[owner]
        return item.size

    def release_owner(self, owner: str) -> int:
        """Stop accounting everything of ``owner`` (it is gone); return the bytes freed."""
        entry = self._owners.pop(owner, None)
        if entry is None:
            return 0
        for key in entry[0]:
            del self._items[(owner, key)]
        self.held -= entry[1][0]
        return entry[1][0]

    def _enforce(self, owner: str) -> None:
        entry = self._owners.get(owner)
        if entry is not None and entry[1][0] > self.per_owner:
            for _ in range(len(entry[0])):
                if entry[1][0] <= self.per_owner or not entry[0]:
                    break
                self._evict((owner, next(iter(entry[0]))))
                entry = self._owners.get(owner)
                if entry is None:
                    break
        if self.held > self.total:
            for _ in range(len(self._items)):
                if self.held <= self.total or not self._items:
                    break
                self._evict(next(iter(self._items)))

    def _evict(self, full: tuple[str, Hashable]) -> None:
        item = self._items[full]
        before = item.size
        left = max(0, item.evict())
        if full not in self._items:  # the callback released the item itself
            freed = before
        else:
            freed = before - min(left, before)
            owner, key = full
            entry = self._owners[owner]
            if left <= 0:
                self.release(owner, key)
            else:
                # Part of it must stay: keep it, as the newest, at what it still holds.
                item.size = min(left, before)
                entry[1][0] -= freed
                self.held -= freed
                self._items.move_to_end(full)
                entry[0].move_to_end(key)
        if freed:
            self.evictions += 1
            self.evicted_bytes += freed


__all__ = ["Evict", "RetentionBudget"]
