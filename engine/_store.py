"""Session stores: where session records live, behind one interface.

Theory of operation
-------------------
The server keeps *live* per-session machinery (open streams, running handlers) in
process; the :class:`SessionStore` holds what must be agreed on by every process
that can serve a session: that it exists, who owns it, the negotiated revision,
and the allocation of stream epochs (unique within a session, never reused, so
``<epoch>:<seq>`` cursors mean the same thing everywhere).

:class:`MemoryStore` is the embedded default: one process, nothing survives a
restart.  A shared Redis-protocol store implements the same interface.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Protocol

from protocol import format_epoch


@dataclass(frozen=True, slots=True, kw_only=True)
class SessionRecord:
    """What the store knows about a session.

    Attributes:
        session_id: the ``Mcp-Session-Id``.
        principal: who owns it (``"anonymous"`` without authentication); every
            lookup is scoped by ``(principal, session_id)``.
        protocol_version: the revision negotiated at ``initialize``.
        created_at: engine clock time of creation.
        generation: starts at 1 and only grows (channel rebinds).
    """

    session_id: str
    principal: str
    protocol_version: str
    created_at: float
    generation: int = 1


class StoreUnavailable(Exception):
    """The store could not be reached; callers fail closed (503 ``store_unavailable``)."""


class SessionStore(Protocol):
    """The interface every store implements."""

    async def create_session(self, record: SessionRecord) -> None:
        """Persist a new session.  Raises ``ValueError`` if the id is taken."""

    async def get_session(self, principal: str, session_id: str) -> SessionRecord | None:
        """The record, or ``None`` if unknown or deleted."""

    async def delete_session(self, principal: str, session_id: str) -> bool:
        """Forget a session; ``True`` if it existed."""

    async def allocate_epoch(self, principal: str, session_id: str) -> str:
        """A fresh epoch (8 lowercase hex digits) never used before in this session."""

    async def aclose(self) -> None:
        """Release connections."""


class MemoryStore:
    """Process-local store: the embedded default."""

    def __init__(self) -> None:
        self._sessions: dict[tuple[str, str], SessionRecord] = {}
        self._epochs: dict[tuple[str, str], int] = {}

    async def create_session(self, record: SessionRecord) -> None:
        key = (record.principal, record.session_id)
        if key in self._sessions:
            raise ValueError(f"session {record.session_id!r} already exists")
        self._sessions[key] = record
        self._epochs[key] = 0

    async def get_session(self, principal: str, session_id: str) -> SessionRecord | None:
        return self._sessions.get((principal, session_id))

    async def delete_session(self, principal: str, session_id: str) -> bool:
        key = (principal, session_id)
        self._epochs.pop(key, None)
        return self._sessions.pop(key, None) is not None

    async def allocate_epoch(self, principal: str, session_id: str) -> str:
        key = (principal, session_id)
        if key not in self._sessions:
            raise KeyError(session_id)
        n = self._epochs[key] + 1
        self._epochs[key] = n
        return format_epoch(n)

    async def bump_generation(self, principal: str, session_id: str) -> SessionRecord:
        """Increment the session's generation (used by rebinds)."""
        key = (principal, session_id)
        rec = replace(self._sessions[key], generation=self._sessions[key].generation + 1)
        self._sessions[key] = rec
        return rec

    async def aclose(self) -> None:
        return None

    def __len__(self) -> int:
        return len(self._sessions)
