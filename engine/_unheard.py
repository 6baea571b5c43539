"""Claims a delivery may hold without knowing it, given back once the store answers.

Theory of operation
-------------------
A shared store's ``begin_call`` can apply and still fail to answer: the script ran,
then the connection dropped or the reply timed out.  The replica then answers 503
``store_unavailable`` ("nothing was executed", which is true) -- but the key may be
claimed in the store under this replica, with a lease nobody renews.  Left alone,
every retry would wait in ``in_progress`` until the lease ran out and then be told
``interrupted`` ("it may have had effects") about a call that never ran.

So every shared-store claim carries a random *claim id* drawn for that delivery,
and a claim whose answer was not heard is noted here (:meth:`UnheardClaims.note`).
The server's lease loop gives them back (:meth:`UnheardClaims.give_back`) through
``release_claim``, which forgets the key only if it is still claimed under exactly
that id with nothing stored for it -- never another delivery's claim, never a call
that ran -- so the retry runs the call, once.  A release the store did not answer
is tried again next time; one that found nothing (the claim never applied) is done.

Bounded: at most :data:`MAX_UNHEARD` are kept; past that the oldest is dropped (a
warning for the first, then one per thousand), and its lease ends it as before
(``interrupted``).  Nothing here depends
on the event loop: both runtimes use it.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from typing import Final

from ._session_store import SessionStore
from ._store_errors import SessionGone, StoreUnavailable

log = logging.getLogger(__name__)

#: Most unheard claims a replica keeps to give back.
MAX_UNHEARD: Final = 1024


class UnheardClaims:
    """Claims to give back (see the module docstring)."""

    def __init__(self, limit: int = MAX_UNHEARD) -> None:
        self.limit = limit
        self._claims: OrderedDict[tuple[str, str, str, str], None] = OrderedDict()
        #: Claims dropped past the limit, left to their leases.
        self.dropped = 0

    def __len__(self) -> int:
        return len(self._claims)

    def note(self, principal: str, session_id: str, key: str, claim: str) -> None:
        """The delivery holding ``claim`` on ``key`` never heard the store's answer."""
        self._claims[principal, session_id, key, claim] = None
        while len(self._claims) > self.limit:
            (_, _, dropped, _), _ = self._claims.popitem(last=False)
            self.dropped += 1
            if self.dropped == 1 or self.dropped % 1000 == 0:  # (a long outage: no flood)
                log.warning(
                    "more than %d unheard claims: %s left to its lease (%d so far)",
                    self.limit,
                    dropped,
                    self.dropped,
                )

    async def give_back(self, store: SessionStore) -> int:
        """Try to release every noted claim; how many the store gave back.  A claim the
        store could not be asked about stays for the next try."""
        released = 0
        for entry in list(self._claims):
            principal, session_id, key, claim = entry
            try:
                if await store.release_claim(principal, session_id, key, claim):
                    released += 1
            except StoreUnavailable:
                continue  # not asked: next time
            except SessionGone:
                pass  # nothing left to give back
            self._claims.pop(entry, None)
        if released:
            log.info("gave back %d claim(s) whose answer was lost", released)
        return released
