"""Bugs weir once had (or could have), switchable on for one simulated run.

Theory of operation
-------------------
A checker is only as good as the bugs it catches.  Each entry of :data:`BUGS`
re-introduces one known way to break weir's promises by replacing one function of
the engine for the length of a run (:func:`switched_on`); ``tests.sim.test_bugs``
runs the simulator with each switched on and asserts that the checks catch it, and
reports how many seeds it took.  Nothing here is ever on outside such a run.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from typing import Any

#: name -> a function that installs the bug and returns a function that removes it.
BUGS: dict[str, Callable[[], Callable[[], None]]] = {}


def _patch(owner: Any, name: str, value: Any) -> Callable[[], None]:
    saved = getattr(owner, name)
    setattr(owner, name, value)

    def undo() -> None:
        setattr(owner, name, saved)

    return undo


def _patch_item(owner: dict[str, Any], key: str, value: Any) -> Callable[[], None]:
    saved = owner[key]
    owner[key] = value

    def undo() -> None:
        owner[key] = saved

    return undo


@contextmanager
def switched_on(names: tuple[str, ...]) -> Iterator[None]:
    """Install the named bugs for the block (unknown names: ``KeyError``)."""
    with ExitStack() as stack:
        for name in names:
            stack.callback(BUGS[name]())
        yield


def _claims_without_a_lease() -> Callable[[], None]:
    """(a) A claim carries no lease that runs out (as before leases existed): a
    replica killed between claiming a key and starting its tool -- or mid-call --
    strands the key for good, and every retry waits in ``in_progress``."""
    from . import world

    return _patch_item(world.REPLICA_CONFIG, "claim_lease", 1e9)


def _identity_from_the_connection() -> Callable[[], None]:
    """(d) Who a request speaks for is taken from the first request on its
    connection: behind a gateway that pools connections, Bob's request is Alice's."""
    from weir.engine import _routing
    from weir.engine._requester import Requester

    first: dict[str, Requester] = {}

    def cached(principal: str, authorized: bool, connection: str) -> Requester:
        return first.setdefault(connection, Requester(principal, authorized, connection))

    return _patch(_routing, "Requester", cached)


def _unknown_cursor_from_the_head() -> Callable[[], None]:
    """(b) A cursor the store cannot honour (past the head, an epoch never allocated)
    is answered with the stream from its first event instead of a refusal."""
    from .store import SimStore

    honest = SimStore.read_events

    async def from_head(
        self: SimStore, principal: str, session_id: str, epoch: str, after_seq: int
    ) -> Any:
        got = await honest(self, principal, session_id, epoch, after_seq)
        if got is None and (principal, session_id) in self._sessions:
            return list(self.events.get((principal, session_id, epoch), []))
        return got

    return _patch(SimStore, "read_events", from_head)


def _lease_ignored() -> Callable[[], None]:
    """(c) The gate ignores a running claim's lease: a claim whose owner died is
    treated as running for ever, so its key is stranded and every retry waits."""
    from .store import SimStore

    return _patch(SimStore, "lease_ran_out", lambda self, claim, now=None: False)


BUGS.update(
    {
        "claim-without-lease": _claims_without_a_lease,
        "identity-from-connection": _identity_from_the_connection,
        "unknown-cursor-from-head": _unknown_cursor_from_the_head,
        "lease-ignored": _lease_ignored,
    }
)
