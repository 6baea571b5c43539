"""weir's sans-io core for MCP over HTTP.

No I/O, no clock, no randomness: bytes, events and ``now`` go in; bytes, events
and deadlines come out.

This module exports what a driver of the session-era endpoint needs on every
request: HTTP framing (:class:`HttpConnection`), the endpoint's routing and
refusals (:func:`route`, :func:`refusal`), JSON-RPC messages and their encoders,
the errors, stream logs and the writer's next move, drain credit and admission,
and read deadlines.  Everything else public lives in a module named for its topic,
each with its own ``__all__``:

* :mod:`weir.protocol.gate` -- idempotency: the gate's rules and in-process records;
* :mod:`weir.protocol.binding` -- channel tokens (fencing);
* :mod:`weir.protocol.resume` -- GET streams and resumption;
* :mod:`weir.protocol.lifecycle` -- ``initialize``, protocol revisions, priming;
* :mod:`weir.protocol.legacy` -- the 2024-11-05 HTTP+SSE transport's two endpoints;
* :mod:`weir.protocol.messages` -- a POST's messages sorted; server-request ids;
* :mod:`weir.protocol.states` -- the transition tables of sessions, streams, credit;
* :mod:`weir.protocol.event_ids` -- the ``<epoch>:<seq>`` grammar, epoch permutation;
* :mod:`weir.protocol.budget` -- byte budgets for retained history and results;
* :mod:`weir.protocol.sse` -- Server-Sent Events framing and a client-side decoder;
* :mod:`weir.protocol.jsonrpc` -- JSON-RPC error codes, decoding, generic encoding;
* :mod:`weir.protocol.endpoint` -- the endpoint's single checks (Host/Origin, …);
* :mod:`weir.protocol.http` -- HTTP framing extras (the head cache).

Names that start with ``_`` (modules included) are private; ``engine`` imports
nothing from them.
"""

from __future__ import annotations

from ._credit import (
    CreditLimits,
    DrainTracker,
    SessionCredit,
)
from ._deadlines import (
    ReadClock,
    ReadTimeouts,
)
from ._endpoint import (
    LOOPBACK_HOSTS,
    DeleteSession,
    EndpointConfig,
    McpRequest,
    OpenStream,
    PostMessages,
    RequestContext,
    accepts,
    closing_refusal,
    refusal,
    route,
    session_refusal,
)
from ._errors import (
    LocalProtocolError,
    ProtocolError,
    Reason,
    RemoteProtocolError,
)
from ._flow import (
    Admit,
    SessionFlow,
)
from ._http import (
    NEED_DATA,
    ConnectionClosed,
    Headers,
    HttpConnection,
    HttpError,
    HttpEvent,
    HttpLimits,
    HttpRequest,
    Inbound,
    raw_error_response,
)
from ._jsonrpc import (
    ErrorObject,
    ErrorResponse,
    Message,
    Notification,
    Request,
    RequestId,
    Response,
    encode_error,
    encode_notification,
    encode_request,
    encode_result,
)
from ._streams import (
    StreamKind,
    StreamLog,
    StreamTable,
    WriterStep,
    completes,
    writer_step,
)

__all__ = [
    "LOOPBACK_HOSTS",
    "NEED_DATA",
    "Admit",
    "ConnectionClosed",
    "CreditLimits",
    "DeleteSession",
    "DrainTracker",
    "EndpointConfig",
    "ErrorObject",
    "ErrorResponse",
    "Headers",
    "HttpConnection",
    "HttpError",
    "HttpEvent",
    "HttpLimits",
    "HttpRequest",
    "Inbound",
    "LocalProtocolError",
    "McpRequest",
    "Message",
    "Notification",
    "OpenStream",
    "PostMessages",
    "ProtocolError",
    "ReadClock",
    "ReadTimeouts",
    "Reason",
    "RemoteProtocolError",
    "Request",
    "RequestContext",
    "RequestId",
    "Response",
    "SessionCredit",
    "SessionFlow",
    "StreamKind",
    "StreamLog",
    "StreamTable",
    "WriterStep",
    "accepts",
    "closing_refusal",
    "completes",
    "encode_error",
    "encode_notification",
    "encode_request",
    "encode_result",
    "raw_error_response",
    "refusal",
    "route",
    "session_refusal",
    "writer_step",
]
