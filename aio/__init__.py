"""weir's asyncio runtime: the sans-io core and the app layer on stdlib ``asyncio``.

``weir serve --runtime asyncio APP`` serves an app with it; :func:`run` is the same
thing as a function, :func:`serve` starts a server inside a running loop, and
:class:`AsyncioDriver` is the ``asyncio.start_server`` callback for embedding.

Theory of operation
-------------------
:mod:`weir.protocol` does no I/O and reads no clock, and :mod:`weir.app` awaits
nothing but what its driver gives it, so any event loop can drive them.  This
package is such a driver: an asyncio server around the same core and the same app
layer the Trio engine (:mod:`weir.engine`) drives, with the same guarantees about a
client that stops reading.  It imports neither trio nor :mod:`weir.engine`, so an
app's tools run as plain asyncio tasks: ``asyncio.sleep``, ``asyncio.Event``,
``loop.run_in_executor`` and asyncio-only libraries work in them unchanged, as do
apps written with the official MCP SDK (through :mod:`weir.app.sdk`; its anyio code
runs on asyncio here).

* **Process** (:mod:`._run`).  :func:`run` picks the loop (``uvloop`` when it can be
  imported, else the standard library's), enters the app's lifespan within its
  start-up timeout, listens, and on SIGINT/SIGTERM stops listening and drains as
  the Trio engine does (:mod:`._drain`: new requests 503 ``shutting_down``, running
  calls get the grace period, listen streams their final result, SSE streams a
  ``retry:``), ends every session (what is left is cancelled), runs the
  session-close hooks and exits the lifespan.
* **HTTP and the endpoint** (:mod:`._connection`).  The core's
  :class:`~weir.protocol.HttpConnection` (with its size limits),
  :func:`~weir.protocol.route`, :func:`~weir.protocol.refusal`, ``initialize`` checks
  and result, and read deadlines; GET streams, ``Last-Event-ID`` resumption from this
  process's own logs or from a shared store, the newest reader wins.
* **The sessionless revision** (2026-07-28, :mod:`._sessionless`).  The core's
  :class:`~weir.protocol.sessionless_post.SessionlessCourse` and its handler run,
  carried out as the Trio engine does: ``server/discover``, ``Mcp-Param-*`` checks,
  input-required rounds with sealed request state (:class:`weir.common.StateSealer`),
  the ``Idempotency-Key`` gate in the principal's namespace of the store, answers as
  JSON or SSE under the connection's credit owner, ``subscriptions/listen``.
* **Credit and timers** (:mod:`._session`).  Each session has one
  :class:`~weir.protocol.SessionFlow`; credit comes back when the *peer's kernel has
  acknowledged* a frame's last byte (``ioctl(SIOCOUTQ)``, Linux).  A JSON body holds
  credit the same way.  One ``loop.call_at`` per session: half-open means 429
  ``stream_half_open`` for new requests, and past the liveness timeout teardown.
* **Calls** (:mod:`._calls`).  Every MCP method is :func:`weir.app.dispatch`'s;
  handlers get a :class:`weir.app.Context` (progress, logging, sampling, elicitation,
  roots, ``close_stream``) backed by this driver, run as tasks owned by the session
  (a dropped connection does not cancel a call) and stop on
  ``notifications/cancelled``.  A ``tools/call`` passes the idempotency gate first --
  the core's rules over the session store's claims, as on the Trio engine -- so a
  retry replays its response and never runs it twice.
* **Session stores** (:mod:`._shared`, :mod:`._redis_store`, :mod:`._resp`).  Session
  records, the gate's claims (leased, renewed while a call runs) and outcomes, and
  (``resume="shared"``) every stream event live in a
  :class:`~weir.engine._session_store.SessionStore`: the memory store by default, or a
  Redis-protocol server shared with other replicas, Trio or asyncio, which then serve
  one cluster (a session, a retry, a resumption, a cancellation, an announced change
  cross runtimes).  The
  store not answering is 503 ``store_unavailable``, with nothing run.
* **Limits** (:mod:`._driver`).  Sessions (503 ``session_limit``), connections (503
  ``overloaded``), request bytes buffered by all connections together (503
  ``overloaded`` past ``max_inbound_bytes``), response bytes every session's credit
  holds unacknowledged (new requests get 503 ``overloaded`` past
  ``max_outbound_bytes``), idle sessions (forgotten after
  ``idle_timeout`` unless busy; one that saw nothing after its ``initialize``, after
  ``initialize_timeout``), each session's credit, its replay history (a stream's
  last 256 frames; at most 16 closed streams) and its gate records (256 finished
  calls, 256 KiB of keys and results; beyond, the oldest results become
  tombstones), and in bytes, as on the Trio engine, the history and results each
  session (``session_retain_bytes``) and all of them (``memory_budget``) keep: the
  oldest go first (:mod:`._session`).  What ``initialize`` declares and what
  ``resources/subscribe`` asks are bounded by the core and the app layer.
* **Authorization** (:mod:`._auth`).  :mod:`weir.common`'s rules, as on the Trio
  engine (bearer tokens, 401/403/400/503 with ``WWW-Authenticate``, the RFC 9728
  metadata, an SDK app's own verifier), applied per request: each request's
  principal comes from its own token, never from its connection; it owns the
  sessions it opens (another principal's is 404; 429 past its share).  A
  :class:`weir.common.JwtVerifier` fetches its JWKS URL with asyncio here
  (:mod:`._jwks`).
* **Channel tokens** (fencing; :mod:`._shared`, :mod:`._connection`).  As on the
  Trio engine: ``initialize`` answers the record's ``Mcp-Channel-Token``; the core's
  courses check a presented token against the record as last read (re-read per
  request with a shared store), a lone call's claim checks it in the store; the
  first token that proves the channel binds the session; ``weir/rebind`` starts a new
  generation, and this process's streams of an older one end once it sees it (an
  event appended under an older generation is refused by the store).
* **Metrics** (:mod:`._metrics`).  ``GET /metrics``: :class:`weir.common.Metrics`'s
  Prometheus text, the same counters bumped where this runtime does the same things
  (no shed or accept-error series: it has no accept loop of its own).
* **The 2024-11-05 HTTP+SSE transport** (:mod:`._legacy`).  ``GET /sse`` opens a
  session with its one LEGACY stream; ``POST /messages`` follows the core's
  :class:`~weir.protocol.legacy.LegacyPostCourse`.

* **Inline execution** (:func:`._calls.runs_now`).  As on the Trio engine, a lone
  ``tools/call`` of a tool that never suspends, with the process-local store, runs in
  the connection's task and its answer goes into the stream at once (both eras).

Every ``weir serve`` option is served.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ._driver import AsyncioDriver
from ._run import STARTUP_TIMEOUT, AsyncioConfig, StartupFailed, event_loop_name, run, serve
from ._shared import open_store

if TYPE_CHECKING:
    from ._redis_store import AsyncioRedisStore


def __getattr__(name: str) -> Any:
    # AsyncioRedisStore pulls in the Redis client library: imported on first use only.
    if name == "AsyncioRedisStore":
        from ._redis_store import AsyncioRedisStore

        return AsyncioRedisStore
    raise AttributeError(f"module 'weir.asyncio' has no attribute {name!r}")


__all__ = [
    "STARTUP_TIMEOUT",
    "AsyncioConfig",
    "AsyncioDriver",
    "AsyncioRedisStore",
    "StartupFailed",
    "event_loop_name",
    "open_store",
    "run",
    "serve",
]
