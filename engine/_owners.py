"""Credit owners of the sessionless era: whose credit a request's responses take.

Theory of operation
-------------------
A 2026-07-28 request has no session, yet what it makes the server hold must be
bounded and a peer that stops reading must be noticed.  So its responses take the
credit of an *owner*: a private :class:`Session` (never in the session table, never
in the store), looked up from the request's own
:class:`~weir.engine._requester.Requester`:

* **authorized**: the principal's owner, shared by every connection that carried
  that principal's requests, so a principal that stalls one of them is refused 429
  ``stream_half_open`` on the others -- and nobody else is;
* **anonymous**: the connection's own (anonymous clients are told apart only by
  their connections).

A connection keeps a reference to each owner its requests used, by the requester's
scope, at most :data:`MAX_OWNERS` of them (a gateway's connection carries many
principals; the least recently used is given back first).  An owner ends -- its
handlers cancelled -- with the last reference, as a session ends with its last
stream; a stalled one is torn down after the liveness timeout like a session.

:class:`Owners` keeps the owners and their references; it equips each new owner
like a session (credit timers, activity, change bus) through the session table's
:meth:`~weir.engine._session_table.SessionTable.equip`.  Also here:
:func:`open_answer_stream`, the stream one sessionless request's answer (or a
``subscriptions/listen``) is written on.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable
from typing import Final

import trio

from weir.protocol.sessionless import SESSIONLESS_VERSIONS
from weir.protocol.streams import StreamKind

from ._connection import Connection
from ._requester import Requester
from ._session import Session, StreamHandle
from ._shared import Shared
from ._store_records import SessionRecord

#: The most credit owners one connection holds at once.
MAX_OWNERS: Final = 16


class Owners:
    """Sessionless credit owners (see the module docstring).

    Guarantees: an owner lives while a connection holds a reference to it, and ends
    (:meth:`Session.close`) with the last; each connection holds at most
    :data:`MAX_OWNERS`; a principal has at most one shared owner at a time.

    Args:
        shared: the server's shared state.
        equip: connects a new owner to the server (credit timers, activity, changes).
    """

    def __init__(self, shared: Shared, equip: Callable[[Session], None]) -> None:
        self.config = shared.config
        self.budget = shared.budget
        self.credit_pool = shared.credit_pool
        self._equip = equip
        #: Every live owner.
        self.owners: set[Session] = set()
        #: Each authorized principal's shared owner.
        self.principal_owners: dict[str, Session] = {}
        self._refs: dict[Session, int] = {}

    def owner(self, conn: Connection, who: Requester) -> Session:
        """The credit owner of ``who``'s sessionless requests on ``conn``: the
        principal's, when requests are authorized (shared by every connection that
        carried that principal's requests, so one it stalls holds back the others --
        and only those), else the connection's own (anonymous clients are told
        apart only by their connections).

        ``conn`` keeps a reference to the owners its requests used (at most
        :data:`MAX_OWNERS` of them, the least recently used given back first): an
        owner ends with the last connection that holds it.
        """
        scope = who.scope
        held = conn.owners.pop(scope, None)
        if held is not None and not held.closed:
            conn.owners[scope] = held  # (now the most recently used)
            return held
        if held is not None:
            self._unref_owner(held)
        shared = self.principal_owners.get(who.principal) if who.authorized else None
        if shared is not None and not shared.closed:
            owner = shared
            self._refs[owner] = self._refs.get(owner, 0) + 1
        else:
            owner = self._new_owner(who)
            self._refs[owner] = 1
            if who.authorized:
                self.principal_owners[who.principal] = owner
        conn.owners[scope] = owner
        while len(conn.owners) > MAX_OWNERS:
            self._unref_owner(conn.owners.pop(next(iter(conn.owners))))
        return owner

    def release(self, conn: Connection) -> None:
        """``conn`` is gone: it gives back every owner it holds."""
        held, conn.owners = conn.owners, {}
        for owner in held.values():
            self._unref_owner(owner)

    def _unref_owner(self, owner: Session) -> None:
        """One connection fewer holds ``owner``; the last one ends it."""
        left = self._refs.pop(owner, 1) - 1
        if left > 0:
            self._refs[owner] = left
            return
        owner.close()  # its handlers end with its last connection
        self.owners.discard(owner)
        principal = owner.record.principal
        if self.principal_owners.get(principal) is owner:
            del self.principal_owners[principal]

    def _new_owner(self, who: Requester) -> Session:
        now = trio.current_time()
        record = SessionRecord(
            session_id=f"connection-{secrets.token_hex(8)}",
            principal=who.principal,
            protocol_version=SESSIONLESS_VERSIONS[-1],
            created_at=now,
            secret="",
            salt=secrets.token_hex(8),
        )
        owner = Session(
            record, credit=self.config.credit, now=now, budget=self.budget, pool=self.credit_pool
        )
        self._equip(owner)
        self.owners.add(owner)
        return owner


def open_answer_stream(owner: Session, max_events: int) -> StreamHandle:
    """A stream of ``owner`` for one request's answer: no event ids (nothing
    resumes).  Its epoch is drawn afresh until it names none of the owner's streams
    (open or kept): four random bytes meet again over a busy principal's life."""
    epoch = secrets.token_hex(4)
    while epoch in owner.handles:
        epoch = secrets.token_hex(4)
    handle = owner.open_stream(epoch, StreamKind.REQUEST, max_events=max_events, emit_ids=False)
    handle.outstanding = 1
    return handle
