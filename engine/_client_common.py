"""What both of weir's clients share: errors, retry bounds, call traces, answers.

Theory of operation
-------------------
The session-era client (:mod:`weir.engine.client`) and the sessionless one
(:mod:`engine._client_sessionless`) meet the same server refusals and read the same
JSON-RPC answers, so they raise the same :class:`WeirError` subclasses -- chosen by
the refusal's ``error.data.reason`` (:func:`refusal_of`), so a caller can tell a
half-open refusal from an unavailable store without reading status codes -- and
take the same :class:`RetryPolicy`.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Final, TypeAlias

import msgspec

from ._client_http import Response, ResponseTooLarge

JsonObject: TypeAlias = dict[str, Any]
#: ``on_progress(progress, total, message)`` for one call.
ProgressCallback: TypeAlias = Callable[[float, float | None, str | None], Awaitable[None]]
#: Answers one server-to-client request: its ``params`` in, its ``result`` out.
ServerRequestHandler: TypeAlias = Callable[[JsonObject], Awaitable[JsonObject]]
#: ``on_notification(method, params)`` for notifications other than our progress.
NotificationHandler: TypeAlias = Callable[[str, JsonObject], Awaitable[None]]
#: One observed event: ``(replica or None, epoch, seq)``.
ObservedEvent: TypeAlias = tuple[str | None, str, int]

REBIND_METHOD: Final = "weir/rebind"
_EVENT_ID: Final = re.compile(r"([0-9a-f]{8}):(0|[1-9][0-9]{0,17})")
_MAX_BODY: Final = 16 << 20
_ACCEPT_BOTH: Final = "application/json, text/event-stream"
_DRAIN_SECONDS: Final = 2.0  # reading the rest of a stream after its final response


# ---------------------------------------------------------------------------- errors
class WeirError(Exception):
    """A request failed.  Branch on the subclass (or ``reason``), not on ``status``.

    Attributes:
        status: the HTTP status of the refusal, or None when no HTTP answer applies
            (a transport failure, a contiguity violation).
        reason: ``error.data.reason`` (e.g. ``"channel_unbound"``), or None.
        message: human-readable text (the JSON-RPC ``error.message`` when there is one).
        data: the JSON-RPC ``error.data`` object, or None.
        code: the JSON-RPC error code, or None.
        retry_after: seconds the server asked us to wait (``data.retryAfterMs`` or
            ``Retry-After``), or None.
    """

    def __init__(
        self,
        status: int | None,
        reason: str | None,
        message: str,
        data: JsonObject | None = None,
        *,
        code: int | None = None,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(f"{message} (status {status}, reason {reason})")
        self.status = status
        self.reason = reason
        self.message = message
        self.data = data
        self.code = code
        self.retry_after = retry_after


class RpcError(WeirError):
    """The server answered our request with a JSON-RPC error (e.g. -32601)."""


class Overloaded(WeirError):
    """429 or 503: nothing ran; retried with backoff, raised once attempts run out."""


class HalfOpenError(Overloaded):
    """429 ``stream_half_open``: the session's streams are not draining."""


class Unavailable(Overloaded):
    """503 ``store_unavailable`` or ``shutting_down``."""


class InProgress(WeirError):
    """409 ``in_progress``: a duplicate of a call that is still running."""


class ChannelUnbound(WeirError):
    """409 ``channel_unbound``: our channel token (or cursor) is not bound; rebind."""


class CursorStale(WeirError):
    """409 ``cursor_stale``: our generation was fenced by a newer rebind.  Never retried."""


class CursorUnknown(WeirError):
    """409 ``cursor_unknown``: the server does not hold the stream or event we named."""


class CursorInvalid(WeirError):
    """400 ``cursor_invalid``: the cursor is not in the ``<epoch>:<seq>`` namespace."""


class SessionGone(WeirError):
    """404 ``session_not_found``: the session is unknown, deleted or expired."""


class IdempotencyKeyReused(WeirError):
    """422 ``idempotency_key_reused``: the key was used for a different request."""


class TransportError(WeirError):
    """The connection failed or timed out and the request could not be completed."""


class GatewayError(TransportError):
    """502 or 504 from a proxy between us and the server, with no answer of the
    server's in it: the request may or may not have reached the server.  A keyed
    ``tools/call`` is re-sent under its key (the gate replays or waits, never runs it
    twice), at most ``max_reconnects`` times; anything else is raised."""


class BadResponse(WeirError):
    """The server's answer was not what MCP allows (wrong type, bad JSON, bad SSE)."""


class StreamResumeViolation(WeirError):
    """The events of a stream were not contiguous across reconnects (event ids).

    Attributes:
        observed: every ``(replica, epoch, seq)`` received on the stream, the
            offending one last.
    """

    def __init__(self, message: str, observed: list[ObservedEvent]) -> None:
        super().__init__(None, "stream_resume_violation", message, {"observed": observed})
        self.observed = observed


_BY_REASON: Final[dict[str, type[WeirError]]] = {
    "stream_half_open": HalfOpenError,
    "store_unavailable": Unavailable,
    "shutting_down": Unavailable,
    "in_progress": InProgress,
    "channel_unbound": ChannelUnbound,
    "cursor_stale": CursorStale,
    "cursor_unknown": CursorUnknown,
    "cursor_invalid": CursorInvalid,
    "session_not_found": SessionGone,
    "idempotency_key_reused": IdempotencyKeyReused,
    # 2026-07-28 answers an unknown method 404: no session is gone, the method is.
    "method_not_found": RpcError,
}


# ---------------------------------------------------------------------------- public records
@dataclass(frozen=True, slots=True, kw_only=True)
class RetryPolicy:
    """How hard one request tries (every count bounds a loop).

    Attributes:
        max_attempts: re-sends after refusals (429, 503, 409 ``in_progress``).
        max_reconnects: resumes in a row that bring no new event, and re-POSTs of a
            keyed call whose connection died before any event id.
        max_rebinds: rebinds after 409 ``channel_unbound``.
        base_delay: first backoff delay in seconds; doubles with each attempt.
        max_delay: backoff cap; a server asking for a longer wait is not retried.
        jitter: each delay is multiplied by ``1 + jitter * rng()``, never shortened.
    """

    max_attempts: int = 5
    max_reconnects: int = 5
    max_rebinds: int = 1
    base_delay: float = 0.1
    max_delay: float = 30.0
    jitter: float = 0.5

    def delay(self, attempt: int, floor: float | None, rng: Callable[[], float]) -> float:
        """Seconds before retry ``attempt``: doubling from ``base_delay`` up to
        ``max_delay``, at least ``floor`` (the server's hint), plus jitter."""
        base = min(self.max_delay, self.base_delay * 2.0**attempt)
        return float(max(base, floor or 0.0) * (1.0 + self.jitter * rng()))


@dataclass(slots=True)
class CallTrace:
    """What one request went through; pass one as ``trace=`` to inspect a call.

    Attributes:
        request_ids: the JSON-RPC id of every POST sent for it.
        idempotency_keys: the distinct keys used, in order (a new one after a rebind).
        observed_events: ``(replica, epoch, seq)`` of every event received, in order,
            across reconnects.  Each POST opens a stream with a new epoch starting at
            seq 0; within an epoch the seqs are contiguous (or the call raised).
        resume_cursors: the ``Last-Event-ID`` of every resume GET, in order.
        refusals: the refusals that were retried (429, 503, 409).
        rebinds: how many ``channel_unbound`` recoveries the call went through.
        reposts: re-POSTs of the same request after its connection died unread.
        replayed_by_rebind: the response came from a rebind's ``results``.
        task_id: the task the server answered the call with (the tasks extension),
            if it did: its handle, for ``tasks/get`` and ``tasks/cancel`` of your own.
    """

    request_ids: list[int] = field(default_factory=list)
    idempotency_keys: list[str] = field(default_factory=list)
    observed_events: list[ObservedEvent] = field(default_factory=list)
    resume_cursors: list[str] = field(default_factory=list)
    refusals: list[WeirError] = field(default_factory=list)
    rebinds: int = 0
    reposts: int = 0
    replayed_by_rebind: bool = False
    task_id: str | None = None


@dataclass(frozen=True, slots=True)
class RebindResult:
    """The answer of ``weir/rebind``.

    Attributes:
        generation: the session's new generation.
        channel_token: the new ``Mcp-Channel-Token``.
        results: JSON-RPC responses the server had already produced for the session.
    """

    generation: int
    channel_token: str
    results: list[JsonObject]


# ---------------------------------------------------------------------------- groups
def _leaves(group: BaseExceptionGroup[BaseException]) -> list[BaseException]:
    out: list[BaseException] = []
    for exc in group.exceptions:
        out.extend(_leaves(exc) if isinstance(exc, BaseExceptionGroup) else [exc])
    return out


@contextmanager
def unwrap_single() -> Iterator[None]:
    """Let an exception group out of a Trio nursery as its only exception.

    Trio wraps whatever crosses a nursery -- even the one error of the one task, or an
    error of the code inside ``async with`` -- in an exception group.  A caller of the
    client should catch :class:`TransportError`, not ``except*``: a group holding one
    exception (at any depth) is re-raised as that exception, with its own traceback
    and cause.  A group of several is re-raised as it is.
    """
    try:
        yield
    except BaseExceptionGroup as group:
        leaves = _leaves(group)
        if len(leaves) != 1:
            raise
        only = leaves[0]
        raise only from only.__cause__


# ---------------------------------------------------------------------------- answers
async def _read_body(resp: Response) -> bytes:
    """The whole body of ``resp`` (its connection then goes back to the pool).

    Raises:
        ConnectionDropped: the connection failed.
        BadResponse: the body is too large.
    """
    try:
        return await resp.body(_MAX_BODY)
    except ResponseTooLarge as exc:
        raise BadResponse(resp.status, None, str(exc)) from None
    finally:
        await resp.aclose()


def _decode(raw: bytes | str, status: int | None) -> Any:
    try:
        return msgspec.json.decode(raw)
    except msgspec.DecodeError as exc:
        raise BadResponse(status, None, f"invalid JSON from the server: {exc}") from exc


def _retry_after(headers: dict[str, str], data: JsonObject | None) -> float | None:
    if data is not None and isinstance(data.get("retryAfterMs"), int | float):
        return max(0.0, float(data["retryAfterMs"]) / 1000)
    raw = headers.get("retry-after", "").strip()
    return float(raw) if raw.isdigit() else None


def _refusal(status: int, headers: dict[str, str], body: bytes) -> WeirError:
    """The :class:`WeirError` for a non-2xx answer, chosen by ``error.data.reason``."""
    message, reason, data, code = f"HTTP {status}", None, None, None
    try:
        doc = msgspec.json.decode(body) if body else None
    except msgspec.DecodeError:
        doc = None
    err = doc.get("error") if isinstance(doc, dict) else None
    if isinstance(err, dict):
        message = str(err.get("message", message))
        code = err["code"] if isinstance(err.get("code"), int) else None
        data = err["data"] if isinstance(err.get("data"), dict) else None
        if data is not None and isinstance(data.get("reason"), str):
            reason = data["reason"]
    cls = _BY_REASON.get(reason or "")
    if cls is None:
        cls = {
            404: SessionGone,
            429: Overloaded,
            502: GatewayError,
            503: Overloaded,
            504: GatewayError,
        }.get(status, WeirError)
    return cls(status, reason, message, data, code=code, retry_after=_retry_after(headers, data))


def _rpc_result(msg: JsonObject, status: int | None) -> JsonObject:
    if "error" in msg:
        err = msg["error"] if isinstance(msg["error"], dict) else {}
        data = err.get("data") if isinstance(err.get("data"), dict) else None
        reason = data.get("reason") if data is not None else None
        raise RpcError(
            status,
            reason if isinstance(reason, str) else None,
            str(err.get("message", "JSON-RPC error")),
            data,
            code=err.get("code") if isinstance(err.get("code"), int) else None,
        )
    result = msg.get("result")
    if not isinstance(result, dict):
        raise BadResponse(status, None, f"response without a result object: {msg!r}")
    return result
