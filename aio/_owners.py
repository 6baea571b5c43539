"""Credit owners of the sessionless era on the asyncio runtime.

Theory of operation
-------------------
A sessionless answer takes the credit of an owner, a private
:class:`~._session.Session` that is never in the session table: an authorized
principal's, shared by every connection that carried its requests
(:class:`SharedOwners`), or an anonymous request's connection's own
(:func:`new_owner`).  A shared owner ends with the last connection holding it, or
when it is torn down because its peer stalled -- then its principal's next request
gets a new one.
"""

from __future__ import annotations

import secrets
from typing import TYPE_CHECKING

from weir.app import Caller
from weir.common import VERSION

from ._session import Session

if TYPE_CHECKING:
    from ._driver import AsyncioDriver


def new_owner(driver: AsyncioDriver, principal: str) -> Session:
    owner = Session(f"owner-{secrets.token_hex(8)}", VERSION, driver.credit, driver, Caller({}, {}))
    owner.sessionless, owner.principal = True, principal
    driver.owners.add(owner)
    return owner


class SharedOwners:
    """The credit owners of authorized principals: one per principal, shared by every
    connection that carried its requests, ended with the last connection holding it
    (or torn down when a peer of it stops reading: then every connection writing its
    streams goes with it, and the principal's next request gets a new one)."""

    def __init__(self) -> None:
        self.by_principal: dict[str, Session] = {}
        self.refs: dict[Session, int] = {}

    def take(self, driver: AsyncioDriver, principal: str) -> Session:
        """``principal``'s owner, one more connection holding it."""
        owner = self.by_principal.get(principal)
        if owner is None or owner.closed:
            owner = self.by_principal[principal] = new_owner(driver, principal)
        self.refs[owner] = self.refs.get(owner, 0) + 1
        return owner

    def give_back(self, driver: AsyncioDriver, owner: Session) -> None:
        """One connection fewer holds ``owner``; the last one ends it."""
        left = self.refs.pop(owner, 1) - 1
        if left > 0:
            self.refs[owner] = left
            return
        owner.close()
        driver.owners.discard(owner)
        if self.by_principal.get(owner.principal) is owner:
            del self.by_principal[owner.principal]
