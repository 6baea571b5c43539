"""What both of weir's runtimes share that is neither the sans-io core nor the app layer.

Theory of operation
-------------------
:mod:`weir.protocol` decides the order of every request's steps and does no I/O;
:mod:`weir.app` is the application API.  Between them and a runtime
(:mod:`weir.engine` on Trio, :mod:`weir.asyncio` on asyncio) sit a few pieces that
do no waiting of their own, and that both runtimes must do the same way for a
client to see the same server on either:

* **Sealed request state** (:class:`StateSealer`): the ``requestState`` of a
  sessionless ``input_required`` answer, AES-256-GCM under keys that rotate
  (``cryptography``; it reads the wall clock and draws nonces, which is why it is
  not in the core).
* **What the sessionless era answers** (:func:`discover_for`,
  :func:`era_capabilities`, :func:`server_identity`, :func:`caller_for`,
  :func:`handler_error`).
* **What a ``subscriptions/listen`` stream says** (:func:`honoured`,
  :func:`listen_ack`, :func:`listen_frame`, :func:`listen_closing`) and what one
  has yet to say (:class:`ListenMarks`).
* **Authorization** (:class:`Authorization`, :func:`authenticate`,
  :func:`metadata_answer`, :data:`REQUEST_ACCESS`): what a request must carry, the
  401/403/400/503 refusals and their ``WWW-Authenticate``, the RFC 9728 metadata,
  the principal; :class:`JwtVerifier` (PyJWT), which waits and fetches its JWKS URL
  with the :class:`Waits` of the runtime serving it; an SDK app's own verifier
  (:func:`declared_authorization`).
* **Inline execution** (:func:`runs_inline`, :func:`call_inline`,
  :func:`sessionless_inline`): a tool
  that never suspends, run in the task that read its request, counted and observed
  the same way on both runtimes.
* **Metrics** (:class:`Metrics`): the counters and the Prometheus text of
  ``GET /metrics``, over any runtime's sessions (:class:`Metered`).

It imports neither trio nor asyncio (a layering test keeps it so).
"""

from __future__ import annotations

from ._auth import (
    ANONYMOUS,
    METADATA_PATH,
    REQUEST_ACCESS,
    Authorization,
    InvalidToken,
    TokenExpired,
    TokenVerifier,
    authenticate,
    bearer_token,
    is_metadata_path,
    metadata_answer,
    principal_session_limit,
)
from ._clients import REQUEST_LOG, as_seen
from ._declared_auth import DeclaredVerifier, declared_authorization
from ._era import (
    VERSION,
    caller_for,
    discover_for,
    era_capabilities,
    handler_error,
    request_meta,
    server_identity,
)
from ._inline import call_inline, runs_inline, sessionless_inline
from ._jwks import MAX_JWKS_BYTES, JwksError
from ._jwt import DEFAULT_ALGORITHMS, Flag, JwtVerifier, Waits
from ._listen import (
    KINDS,
    MAX_URI,
    MAX_URIS,
    ListenMarks,
    honoured,
    listen_ack,
    listen_closing,
    listen_frame,
)
from ._metrics import Connections, Credit, Metered, Metrics, redact
from ._sealed import MAX_STATE, STATE_TTL, StateSealer, new_key, parse_key

__all__ = [
    "ANONYMOUS",
    "DEFAULT_ALGORITHMS",
    "KINDS",
    "MAX_JWKS_BYTES",
    "MAX_STATE",
    "MAX_URI",
    "MAX_URIS",
    "METADATA_PATH",
    "REQUEST_ACCESS",
    "REQUEST_LOG",
    "STATE_TTL",
    "VERSION",
    "Authorization",
    "Connections",
    "Credit",
    "DeclaredVerifier",
    "Flag",
    "InvalidToken",
    "JwksError",
    "JwtVerifier",
    "ListenMarks",
    "Metered",
    "Metrics",
    "StateSealer",
    "TokenExpired",
    "TokenVerifier",
    "Waits",
    "as_seen",
    "authenticate",
    "bearer_token",
    "call_inline",
    "caller_for",
    "declared_authorization",
    "discover_for",
    "era_capabilities",
    "handler_error",
    "honoured",
    "is_metadata_path",
    "listen_ack",
    "listen_closing",
    "listen_frame",
    "metadata_answer",
    "new_key",
    "parse_key",
    "principal_session_limit",
    "redact",
    "request_meta",
    "runs_inline",
    "server_identity",
    "sessionless_inline",
]
