"""A second driver for weir's sans-io core, on stdlib asyncio instead of Trio.

Theory of operation
-------------------
:mod:`weir.protocol` does no I/O and reads no clock, and :mod:`weir.app` awaits
nothing but what its driver gives it, so any event loop can drive them.  This
package is such a driver: an asyncio server around the same core and the same app
layer the Trio engine drives, with the same guarantees about a client that stops
reading.  It imports neither trio nor :mod:`weir.engine`.

* **HTTP and the endpoint** (:mod:`._connection`).  The core's
  :class:`~weir.protocol.HttpConnection`, :func:`~weir.protocol.route`,
  :func:`~weir.protocol.refusal`, ``initialize`` checks and result, and read
  deadlines; GET streams, ``Last-Event-ID`` resumption, the newest reader wins.
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
  the core's rules over a :class:`~weir.protocol.gate.CallLedger`, as in the Trio engine's
  memory store -- so a retry replays its response and never runs it twice.
* **Limits** (:mod:`._driver`).  Sessions (503 ``session_limit``), connections (503
  ``overloaded``), idle sessions (forgotten after ``idle_timeout`` unless busy), each
  session's credit and replay history (a live stream's last 256 frames; a closed
  stream keeps only its unacknowledged ones; at most 16 closed streams), and its gate
  records (256 finished calls, 256 KiB of keys and results; beyond, the oldest
  results become tombstones).  What ``initialize`` declares and what
  ``resources/subscribe`` asks are bounded by the core and the app layer.

Not here (the Trio engine has them): session stores (replicas, shared replay),
channel binding, authorization, inline execution, metrics and graceful shutdown.
"""

from __future__ import annotations

from ._driver import AsyncioDriver, main, serve

__all__ = ["AsyncioDriver", "main", "serve"]
