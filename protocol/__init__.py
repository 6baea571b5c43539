"""weir's sans-io core for MCP over HTTP.

No I/O, no clock, no randomness: bytes, events and ``now`` go in; bytes, events
and deadlines come out.

This module exports what a driver of the endpoint needs on every request and every
connection: HTTP framing (:class:`HttpConnection`, its limits and head cache), the
endpoint's routing, single checks and refusals (:func:`route`, :func:`refusal`),
the error every refusal is (:class:`RemoteProtocolError`, its :class:`Reason` and the
JSON-RPC error codes), read deadlines, and a session's drain credit and admission
(:class:`SessionFlow`).  Everything else public lives in one module per topic, each
with its own ``__all__`` and each drawing from one private module.  The order of
each kind of request's decisions is a *course* the runtime drives, performing the
effects it asks for:

* :mod:`weir.protocol.post` -- a session-era POST's course (and a batch's entries);
* :mod:`weir.protocol.sessionless_post` -- a 2026-07-28 request's course;

and the pieces the courses and runtimes share:

* :mod:`weir.protocol.jsonrpc` -- JSON-RPC messages, their encoders, a refusal's body;
* :mod:`weir.protocol.streams` -- a session's SSE stream logs, the writer's next move;
* :mod:`weir.protocol.states` -- the states of sessions, streams and credit;
* :mod:`weir.protocol.lifecycle` -- protocol revisions, ``initialize``, priming;
* :mod:`weir.protocol.messages` -- a POST's messages sorted; server-request ids;
  mail between replicas;
* :mod:`weir.protocol.gate` -- idempotency records: what a store implementer needs;
* :mod:`weir.protocol.course` -- one call's course through the gate (claim, run, record);
* :mod:`weir.protocol.binding` -- channel tokens (fencing);
* :mod:`weir.protocol.resume` -- GET streams and resumption, also from a shared store;
* :mod:`weir.protocol.budget` -- byte budgets for retained history and results;
* :mod:`weir.protocol.event_ids` -- the ``<epoch>:<seq>`` event id;
* :mod:`weir.protocol.sse` -- Server-Sent Events framing and a client-side decoder;
* :mod:`weir.protocol.sessionless` -- the sessionless era's checks and fields;
* :mod:`weir.protocol.legacy` -- the 2024-11-05 HTTP+SSE transport's two endpoints;
* :mod:`weir.protocol.forwarded` -- trusted proxies and the client a request speaks for.

Every public name has exactly one home.  Names that start with ``_`` (modules
included) are private; ``engine`` and ``app`` import nothing from them.
"""

from __future__ import annotations

from ._credit import (
    CreditLimits,
    CreditPool,
    DrainTracker,
)
from ._deadlines import (
    ReadClock,
    ReadTimeouts,
)
from ._endpoint import (
    LOOPBACK_HOSTS,
    DeleteSession,
    EndpointConfig,
    OpenStream,
    PostMessages,
    check_host_and_origin,
    check_method,
    closing_refusal,
    refusal,
    route,
    session_refusal,
)
from ._errors import (
    INTERNAL_ERROR,
    INVALID_PARAMS,
    INVALID_REQUEST,
    METHOD_NOT_FOUND,
    RESOURCE_NOT_FOUND,
    SERVER_ERROR,
    Reason,
    RemoteProtocolError,
)
from ._flow import (
    Admit,
    SessionFlow,
)
from ._http import HttpConnection
from ._http_events import (
    NEED_DATA,
    ConnectionClosed,
    HttpError,
    HttpLimits,
    HttpRequest,
    Inbound,
)
from ._http_response import HeadCache, raw_error_response

__all__ = [
    "INTERNAL_ERROR",
    "INVALID_PARAMS",
    "INVALID_REQUEST",
    "LOOPBACK_HOSTS",
    "METHOD_NOT_FOUND",
    "NEED_DATA",
    "RESOURCE_NOT_FOUND",
    "SERVER_ERROR",
    "Admit",
    "ConnectionClosed",
    "CreditLimits",
    "CreditPool",
    "DeleteSession",
    "DrainTracker",
    "EndpointConfig",
    "HeadCache",
    "HttpConnection",
    "HttpError",
    "HttpLimits",
    "HttpRequest",
    "Inbound",
    "OpenStream",
    "PostMessages",
    "ReadClock",
    "ReadTimeouts",
    "Reason",
    "RemoteProtocolError",
    "SessionFlow",
    "check_host_and_origin",
    "check_method",
    "closing_refusal",
    "raw_error_response",
    "refusal",
    "route",
    "session_refusal",
]
