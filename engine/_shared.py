"""What the server's components share: its setup and the state more than one reads.

Theory of operation
-------------------
:class:`~weir.engine._server.Server` is a composition of components, one per
concern (the session table, connections, routing, POST calls, execution, streams,
the legacy transport, replicas, the sessionless era, changes, credit owners, keyed
calls).  Each is a plain class that gets, in its constructor, this module's
:class:`Shared` and the other components it calls; none reaches another through it.

:class:`Shared` holds what is the server's rather than any one component's: the
app, the configuration, the store, the retention budget, the metrics, the endpoint,
the POST rules (read by the session era's and the legacy transport's POSTs), the
replica id, the request-state sealer, the live session table's dict (read by
several components, written only by the session table), the handler nursery once
the server runs, and the shutdown flag.  Its only methods are about its own
state: starting a guarded background task in the handler nursery, and the
activity signal the drain waits on.

Also here: the refusals for an unavailable store and a full retention budget, the
wait for a claimed call, and the server's one logger, still named
``weir.engine._server``.
"""

from __future__ import annotations

import dataclasses
import logging
import secrets
from collections.abc import Callable
from typing import Any

import trio

from weir.app import App
from weir.common import StateSealer, new_key
from weir.common._metrics_share import MetricsShare
from weir.protocol import (
    SERVER_ERROR,
    CreditPool,
    EndpointConfig,
    HeadCache,
    Reason,
    RemoteProtocolError,
)
from weir.protocol.budget import RetentionBudget
from weir.protocol.jsonrpc import RequestId
from weir.protocol.post import PostRules

from ._acks import AckPoller
from ._config import ServerConfig
from ._declared_auth import declared_authorization
from ._memory_store import MemoryStore
from ._metrics import Metrics
from ._session import Session, StreamLost
from ._session_store import SessionStore
from ._unheard import UnheardClaims

#: The server's logger, for every one of its modules (the name it had before the split).
log = logging.getLogger(f"{__package__}._server")


class Shared:
    """The server's setup and the state several components read (see the module
    docstring).

    Guarantees: every attribute but :attr:`handlers`, :attr:`state`,
    :attr:`sealer`, :attr:`closing` and the activity event is set here once and
    never rebound, so a component may keep its own reference to it.
    """

    def __init__(self, app: App, config: ServerConfig, store: SessionStore | None) -> None:
        self.app = app
        self.config = config
        self.store: SessionStore = store if store is not None else MemoryStore()
        #: Replay history and kept results, in bytes, per session and in total.
        self.budget = RetentionBudget(
            total=config.memory_budget, per_owner=config.session_retain_bytes
        )
        if isinstance(self.store, MemoryStore) and self.store.budget is None:
            self.store.budget = self.budget
        #: Unacknowledged response bytes of every credit owner (admission's 503 past it).
        self.credit_pool = CreditPool(config.max_outbound_bytes)
        #: The endpoint's routing rules (path, Host and Origin checks).
        self.endpoint: EndpointConfig = config.endpoint()
        self.replica_id = config.replica_id or secrets.token_hex(4)
        self.metrics = Metrics(runtime="trio", tools=app.tools)
        self.metrics.share = MetricsShare.from_environment(self.replica_id)
        #: Validated response heads, shared by every connection of this server.
        self.heads = HeadCache()
        #: Every connection's unacknowledged bytes, polled by one task.
        self.acks = AckPoller()
        #: The live sessions by id (written only by the session table).
        self.sessions: dict[str, Session] = {}
        #: The request-state sealer (replaced by the store's shared key at start).
        self.sealer = StateSealer(config.state_keys or (new_key(),))
        #: What the app's lifespan yielded (``Context.state``); None without one.
        self.state: Any = None
        #: The handler nursery, once the server runs.
        self.handlers: trio.Nursery | None = None
        #: True once the drain began: new requests are refused 503 ``shutting_down``.
        self.closing = False
        #: Shared-store claims whose answer was lost, to give back (``engine._unheard``).
        self.unheard = UnheardClaims()
        self._activity_event: trio.Event | None = None
        #: What a session-era POST's course needs to know of this server's setup.
        self.post_rules = PostRules(
            json_response=config.json_response,
            shared=self.store.shared,
            priming=config.resume != "off",
            authorized=config.auth is not None,
            in_progress_wait=config.in_progress_wait,
            retry_ms=config.retry_ms,
        )

    def start(self, fn: Callable[..., Any], *args: Any) -> None:
        """Run ``fn(*args)`` in the handler nursery; its failure is logged, never raised
        (a lost stream is not a failure)."""

        async def guarded() -> None:
            try:
                await fn(*args)
            except StreamLost:
                pass
            except Exception:
                log.exception("background task %s failed", getattr(fn, "__qualname__", fn))

        assert self.handlers is not None
        self.handlers.start_soon(guarded)

    async def activity(self) -> None:
        """Wait until some session's handler ends or a writer detaches."""
        event = self._activity_event = trio.Event()
        await event.wait()

    def note_activity(self) -> None:
        """Wake :meth:`activity`'s waiter (a handler ended, a writer detached)."""
        event = self._activity_event
        if event is not None:
            self._activity_event = None
            event.set()


def with_declared_auth(app: App, config: ServerConfig) -> ServerConfig:
    """``config``, with the app's own declared authorization when it sets none.

    An app that declares its own authorization (an SDK app's token verifier) is
    served with it, embedded by hand as by ``weir serve``: never open.

    Raises:
        ValueError: the declared authorization cannot be enforced.
    """
    if config.auth is None:
        declared = declared_authorization(app)
        if declared is not None:
            return dataclasses.replace(config, auth=declared)
    return config


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
    :class:`~._store_errors.RetentionFull`): 503 ``overloaded``, nothing executed."""
    return RemoteProtocolError(
        "the server's memory budget is full of finished calls' keys; nothing was executed",
        http_status=503,
        reason=Reason.OVERLOADED,
        code=SERVER_ERROR,
        request_id=request_id,
        retry_after_ms=config.retry_ms,
    )


def store_unavailable(
    config: ServerConfig, request_id: RequestId | None = None
) -> RemoteProtocolError:
    """The refusal of a request the store could not serve: 503 ``store_unavailable``
    (``request_id``: the JSON-RPC error answers that request, as on its stream)."""
    return RemoteProtocolError(
        "the session store is unavailable; nothing was executed",
        http_status=503,
        reason=Reason.STORE_UNAVAILABLE,
        code=SERVER_ERROR,
        request_id=request_id,
        retry_after_ms=config.retry_ms,
    )
