"""What the server's mixins share: the attributes and the methods each may use.

Theory of operation
-------------------
:class:`~weir.engine._server.Server` is composed of one mixin per concern
(``engine._connections``, ``engine._calls``, ``engine._execution``,
``engine._streams``, ``engine._legacy``, ``engine._replicas``).  At run time they
are plain classes whose methods all end up on the one ``Server`` object, and one
concern calls another with an ordinary ``self._method(...)``.

:class:`_ServerBase` makes that checkable.  Every mixin derives from it, and it
declares -- as annotations, with no values and no code at run time -- the server's
attributes the mixins use (``Server.__init__`` sets them) and, under
``TYPE_CHECKING``, a stub of every method one concern calls on another.  mypy checks
each real definition against its stub like any override, so a stub cannot drift
from the method it stands for.  The mixin modules import this module, never
``engine._server`` nor each other, so there are no import cycles.

Also here: the refusal for an unavailable store; and the server's one logger,
still named ``weir.engine._server``.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import TYPE_CHECKING, Any

import trio

from weir.app import App
from weir.common import StateSealer
from weir.protocol import (
    SERVER_ERROR,
    DeleteSession,
    EndpointConfig,
    HeadCache,
    OpenStream,
    PostMessages,
    ReadTimeouts,
    Reason,
    RemoteProtocolError,
)
from weir.protocol.budget import RetentionBudget
from weir.protocol.course import CallCourse, ClaimCall, HoldCall, WaitForCall
from weir.protocol.get import StreamRules
from weir.protocol.jsonrpc import Request, RequestId
from weir.protocol.legacy import LegacyMessages
from weir.protocol.post import (
    AdmitRequests,
    Effect,
    PostRules,
)
from weir.protocol.sessionless import SessionlessMessage
from weir.protocol.sessionless_post import SessionlessRules
from weir.protocol.streams import StreamKind

from ._acks import AckPoller
from ._config import ServerConfig
from ._connection import Connection
from ._listen import AcceptGate
from ._metrics import Metrics
from ._requester import Requester
from ._session import Session, StreamHandle
from ._store import SessionStore
from ._subscriptions import Listener
from ._timers import Deadlines

#: The server's logger, for every one of its modules (the name it had before the split).
log = logging.getLogger(f"{__package__}._server")


class _ServerBase:
    """Declarations of what :class:`~weir.engine._server.Server` offers its mixins.

    Attributes are set in ``Server.__init__``; methods are defined in the module
    named above each group of stubs.
    """

    app: App
    config: ServerConfig
    store: SessionStore
    post_rules: PostRules
    sessionless_rules: SessionlessRules
    stream_rules: StreamRules
    budget: RetentionBudget
    replica_id: str
    sessions: dict[str, Session]
    metrics: Metrics
    _read_timeouts: ReadTimeouts
    gate: AcceptGate
    state: Any
    inbound: int
    open_connections: set[Connection]
    _endpoint: EndpointConfig
    _heads: HeadCache
    acks: AckPoller
    _closing: bool
    _handlers: trio.Nursery | None
    deadlines: Deadlines
    read_deadlines: Deadlines
    #: False once the read-deadline heap's task has stopped (reads then arm Trio deadlines).
    _reads_on_heap: bool
    owners: set[Session]
    principal_owners: dict[str, Session]
    _owner_refs: dict[Session, int]
    _last_seen: dict[str, float]
    _last_touch: dict[str, float]
    keyed_calls: dict[tuple[str, str], trio.Event | None]
    _known_namespaces: OrderedDict[str, None]
    subscribers: set[Listener]
    sealer: StateSealer
    #: Client notifications the app's hooks are handling right now.
    notes_running: int
    #: An app's described ``serverInfo``, read once (the stamp on 2026-07-28 results).
    described_info: dict[str, Any] | None

    if TYPE_CHECKING:
        # lifecycle and sessions (engine._server)
        def _handlers_start(self, fn: Callable[..., Any], *args: Any) -> None: ...
        async def _end_session(self, session: Session, *, forget: bool = False) -> None: ...
        async def _new_session(
            self,
            version: str,
            principal: str,
            request_id: RequestId | None = None,
            *,
            client: str = "",
        ) -> Session: ...
        async def _session(
            self,
            principal: str,
            session_id: str | None,
            request_id: RequestId | None = None,
            *,
            verify: bool = True,
        ) -> Session: ...

        # POST, admission and the gate (engine._calls)
        async def _post(self, conn: Connection, post: PostMessages, who: Requester) -> None: ...
        async def _post_effect(
            self, conn: Connection, session: Session, effect: Effect
        ) -> object: ...
        async def _admit(self, session: Session, effect: AdmitRequests) -> bool: ...
        async def _gate_effect(
            self, session: Session, effect: ClaimCall | WaitForCall | HoldCall
        ) -> object: ...
        async def _admit_each(
            self,
            session: Session,
            requests: list[Request],
            token: tuple[int, str] | None,
            run: Callable[[int, CallCourse], Any],
            lane: Hashable,
        ) -> None: ...
        async def _release_unstarted(self, session: Session, plans: list[CallCourse]) -> None: ...
        async def _initialize_session(
            self, req: Request, session: Session | None, principal: str
        ) -> Session: ...
        def _initialize_result(self, session: Session) -> dict[str, Any]: ...

        # execution (engine._execution)
        def _runs_now(self, plan: CallCourse) -> bool: ...
        async def _answer_now(
            self, session: Session, plan: CallCourse, handle: StreamHandle | None
        ) -> bytes: ...
        async def _run_now(
            self, session: Session, plan: CallCourse, handle: StreamHandle, *, primes: bool
        ) -> bool: ...
        async def _execute(
            self, session: Session, plan: CallCourse, handle: StreamHandle | None
        ) -> bytes | None: ...
        async def _finish_call(
            self, session: Session, key: str, payload: bytes | None, *, stored: bool = False
        ) -> None: ...
        async def _prime_then_run(
            self, session: Session, handle: StreamHandle, plans: list[CallCourse]
        ) -> None: ...
        async def _run_request(
            self, session: Session, plan: CallCourse, handle: StreamHandle
        ) -> None: ...

        # streams (engine._streams)
        def _open_stream(
            self, session: Session, epoch: str, kind: StreamKind, token: tuple[int, str] | None
        ) -> StreamHandle: ...
        async def _get(self, conn: Connection, get: OpenStream, who: Requester) -> None: ...
        async def _delete(
            self, conn: Connection, delete: DeleteSession, who: Requester
        ) -> None: ...
        async def _mark_bound(self, session: Session) -> None: ...

        # the sessionless era (engine._sessionless)
        async def _sessionless(
            self, conn: Connection, msg: SessionlessMessage, who: Requester
        ) -> None: ...
        def _capabilities(self) -> dict[str, Any]: ...
        def _open_answer_stream(self, owner: Session) -> StreamHandle: ...

        # listen and the change bus (engine._changes)
        async def _listen(
            self, conn: Connection, owner: Session, req: Request, lane: Hashable
        ) -> None: ...
        def _changed(self, method: str, uri: str | None = None) -> None: ...
        async def _relay_changes(self) -> None: ...
        def _end_subscriptions(self) -> None: ...

        # sessionless credit owners (engine._owners)
        def _owner(self, conn: Connection, who: Requester) -> Session: ...
        def _release_owner(self, conn: Connection) -> None: ...

        # the sessionless gate (engine._keyed)
        async def _keyed_effect(
            self, principal: str, effect: ClaimCall | WaitForCall | HoldCall
        ) -> object: ...
        async def _keyed_record(self, principal: str, key: str, payload: bytes | None) -> None: ...

        # JSON mode (engine._calls) and result size (engine._execution)
        async def _send_json(
            self,
            conn: Connection,
            session: Session,
            headers: list[tuple[str, str]],
            body: bytes,
            lane: Hashable | None = None,
        ) -> None: ...
        def _fit(self, req: Request, payload: bytes, handle: StreamHandle | None) -> bytes: ...
        def _note_activity(self) -> None: ...

        # the legacy transport (engine._legacy)
        async def _legacy_stream(self, conn: Connection, who: Requester) -> None: ...
        async def _legacy_post(
            self, conn: Connection, post: LegacyMessages, who: Requester
        ) -> None: ...


async def wait_for_claim(
    running: dict[Any, trio.Event | None], key: Any, until: float, local: bool
) -> None:
    """Wait, until ``until`` at most, for the delivery running a claimed call: its end
    (``running[key]``'s event, made on first need) when it runs in this process,
    else just the instant (another replica runs it: the caller asks the store again)."""
    with trio.move_on_at(until):
        if local:
            done = running.get(key)
            if done is None:
                done = running[key] = trio.Event()
            await done.wait()
        else:
            await trio.sleep_forever()


def retention_full(config: ServerConfig, request_id: RequestId) -> RemoteProtocolError:
    """The refusal of a call whose key the memory budget has no room for (see
    :class:`~._store.RetentionFull`): 503 ``overloaded``, nothing executed."""
    return RemoteProtocolError(
        "the server's memory budget is full of finished calls' keys; nothing was executed",
        http_status=503,
        reason=Reason.OVERLOADED,
        code=SERVER_ERROR,
        request_id=request_id,
        retry_after_ms=config.retry_ms,
    )


def _store_unavailable(config: ServerConfig) -> RemoteProtocolError:
    return RemoteProtocolError(
        "the session store is unavailable; nothing was executed",
        http_status=503,
        reason=Reason.STORE_UNAVAILABLE,
        code=SERVER_ERROR,
        retry_after_ms=config.retry_ms,
    )
