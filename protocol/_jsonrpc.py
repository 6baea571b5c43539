"""JSON-RPC 2.0 messages, decoded and encoded with msgspec.

Theory of operation
-------------------
MCP speaks JSON-RPC 2.0.  This module turns one HTTP body into typed messages and
typed messages into bytes, and nothing else: it knows no sessions and no transport.

* Decoding is strict about the envelope and lax about ``params``/``result``, which
  are application data (plain JSON objects).  Syntax errors are ``-32700``
  (reason ``parse_error``), and so is JSON nested too deeply to decode; a
  well-formed body that is not a JSON-RPC message is
  ``-32600`` (reason ``invalid_request``).  Both surface as
  :class:`~weir.protocol.RemoteProtocolError` with ``http_status=400``.
* A body may be a batch (JSON array) only where the caller allows it (MCP
  2025-03-26); otherwise a batch is refused with reason ``batch_not_supported``.
* Encoding goes through one shared :class:`msgspec.json.Encoder`; outbound
  envelopes are Structs with ``omit_defaults`` so absent members are never written
  as ``null`` (MCP's wire schema rejects e.g. ``"error": null``).
"""

from __future__ import annotations

from typing import Any, Final, TypeAlias

import msgspec

from ._errors import INVALID_REQUEST, PARSE_ERROR, Reason, RemoteProtocolError

RequestId: TypeAlias = int | str


class Request(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """A JSON-RPC request: expects exactly one response with the same ``id``."""

    id: RequestId
    method: str
    params: dict[str, Any] | None = None

    def without_params(self) -> Request:
        """This request as what answers it still reads (its id and method): what a
        course keeps once the handler has the params, which can be as large as a
        request may be and must not stay while a slow peer takes the answer."""
        return self if self.params is None else Request(id=self.id, method=self.method)


class Notification(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """A JSON-RPC notification: no ``id``, never answered."""

    method: str
    params: dict[str, Any] | None = None


class Response(msgspec.Struct, frozen=True, kw_only=True):
    """A successful JSON-RPC response."""

    id: RequestId
    result: dict[str, Any]


class ErrorObject(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """The ``error`` member of an error response."""

    code: int
    message: str
    data: Any = None


class ErrorResponse(msgspec.Struct, frozen=True, kw_only=True):
    """A JSON-RPC error response; ``id`` is ``None`` when the request id is unknown."""

    id: RequestId | None
    error: ErrorObject


Message: TypeAlias = Request | Notification | Response | ErrorResponse


class _Envelope(msgspec.Struct, kw_only=True):
    # Every member optional: which ones are present decides the message kind.
    jsonrpc: str | None = None
    id: int | str | msgspec.UnsetType | None = msgspec.UNSET
    method: str | msgspec.UnsetType = msgspec.UNSET
    params: dict[str, Any] | None = None
    result: dict[str, Any] | msgspec.UnsetType = msgspec.UNSET
    error: ErrorObject | msgspec.UnsetType = msgspec.UNSET


_single_decoder: Final = msgspec.json.Decoder(_Envelope)
_batch_decoder: Final = msgspec.json.Decoder(list[_Envelope])
_any_decoder: Final = msgspec.json.Decoder()
_encoder: Final = msgspec.json.Encoder()


#: The longest string id a message may carry, in characters.  Every answer repeats
#: its request's id, and the server keeps ids while the request runs (and in the
#: gate's records): an id near the per-session byte credit could never be answered.
MAX_ID_LENGTH: Final = 1024


def _invalid(message: str, request_id: RequestId | None = None) -> RemoteProtocolError:
    return RemoteProtocolError(
        message, reason=Reason.INVALID_REQUEST, code=INVALID_REQUEST, request_id=request_id
    )


def _classify(env: _Envelope) -> Message:
    if isinstance(env.id, str) and len(env.id) > MAX_ID_LENGTH:
        # (answered with no id: repeating this one is what must not happen)
        raise _invalid(f"an id is at most {MAX_ID_LENGTH} characters")
    if env.jsonrpc != "2.0":
        rid = env.id if isinstance(env.id, int | str) else None
        raise _invalid('"jsonrpc" must be exactly "2.0"', rid)
    has_id = env.id is not msgspec.UNSET
    if env.method is not msgspec.UNSET:
        if env.result is not msgspec.UNSET or env.error is not msgspec.UNSET:
            raise _invalid("a message cannot carry both method and result/error")
        if not has_id:
            return Notification(method=env.method, params=env.params)
        if env.id is None:
            raise _invalid("a request id must be a string or an integer, not null")
        assert not isinstance(env.id, msgspec.UnsetType)
        return Request(id=env.id, method=env.method, params=env.params)
    if env.result is not msgspec.UNSET:
        if env.error is not msgspec.UNSET or not isinstance(env.id, int | str):
            raise _invalid("a response needs an id and exactly one of result/error")
        return Response(id=env.id, result=env.result)
    if env.error is not msgspec.UNSET:
        rid = env.id if isinstance(env.id, int | str) else None
        return ErrorResponse(id=rid, error=env.error)
    raise _invalid("not a JSON-RPC message: no method, result or error")


def decode_message(body: bytes) -> Message:
    """Decode one JSON-RPC message (not a batch).

    Raises:
        RemoteProtocolError: ``-32700``/``parse_error`` for malformed JSON,
            ``-32600``/``invalid_request`` for JSON that is not a JSON-RPC message.
    """
    messages, _ = decode_body(body, allow_batch=False)
    return messages[0]


def decode_body(
    body: bytes, *, allow_batch: bool, max_batch: int | None = None
) -> tuple[list[Message], bool]:
    """Decode an HTTP body into messages.

    Args:
        body: the raw request body.
        allow_batch: whether a JSON array (a JSON-RPC batch) is acceptable.
        max_batch: most entries a batch may have (``None``: no limit); a larger
            one is refused whole (reason ``batch_too_large``) before any entry is
            looked at.

    Returns:
        ``(messages, is_batch)``; a single message gives a one-element list.

    Raises:
        RemoteProtocolError: parse errors, invalid messages, an empty batch, or a
            batch where none is allowed (reason ``batch_not_supported``), or one
            larger than ``max_batch`` (reason ``batch_too_large``).
    """
    stripped = body.lstrip()
    if stripped[:1] == b"[":
        if not allow_batch:
            _check_json(body)
            raise RemoteProtocolError(
                "JSON-RPC batches are not supported by this protocol revision",
                reason=Reason.BATCH_NOT_SUPPORTED,
                code=INVALID_REQUEST,
            )
        try:
            envs = _batch_decoder.decode(body)
        except msgspec.ValidationError as exc:
            _check_json(body)
            raise _invalid(f"invalid JSON-RPC batch: {exc}") from None
        except (msgspec.DecodeError, RecursionError) as exc:
            raise _parse_error(exc) from None
        if not envs:
            raise _invalid("an empty JSON-RPC batch is not allowed")
        if max_batch is not None and len(envs) > max_batch:
            raise RemoteProtocolError(
                f"a batch of {len(envs)} messages is larger than this server's limit ({max_batch})",
                reason=Reason.BATCH_TOO_LARGE,
                code=INVALID_REQUEST,
                data={"limit": max_batch},
            )
        return [_classify(e) for e in envs], True
    try:
        env = _single_decoder.decode(body)
    except msgspec.ValidationError as exc:
        _check_json(body)
        raise _invalid(f"invalid JSON-RPC message: {exc}") from None
    except (msgspec.DecodeError, RecursionError) as exc:
        raise _parse_error(exc) from None
    return [_classify(env)], False


def refusal_id(messages: list[Message], is_batch: bool) -> RequestId | None:
    """The id a refusal of a whole POST body answers: its request's when the body is
    one request; None for a batch (no entry speaks for the others), a notification or
    a response.  Every course that refuses a body before its entries are served uses
    this one rule."""
    if is_batch or len(messages) != 1:
        return None
    first = messages[0]
    return first.id if isinstance(first, Request) else None


def _parse_error(exc: Exception) -> RemoteProtocolError:
    return RemoteProtocolError(f"parse error: {exc}", reason=Reason.PARSE_ERROR, code=PARSE_ERROR)


def _check_json(body: bytes) -> None:
    # A ValidationError from a typed decoder can hide a syntax error later in the
    # body; JSON-RPC wants -32700 for any syntax error, so check syntax first.
    try:
        _any_decoder.decode(body)
    except (msgspec.DecodeError, RecursionError) as exc:
        raise _parse_error(exc) from None


def encode(message: Message | list[Message]) -> bytes:
    """Encode one message (or a batch) with the ``"jsonrpc": "2.0"`` member."""
    if isinstance(message, list):
        return b"[" + b",".join(encode(m) for m in message) + b"]"
    body = _encoder.encode(message)
    # Structs encode as {"id":..., ...}; splice the constant member in front.
    return b'{"jsonrpc":"2.0",' + body[1:]


def encode_result(request_id: RequestId, result: Any) -> bytes:
    """Encode a success response whose ``result`` is any msgspec-encodable value."""
    return (
        b'{"jsonrpc":"2.0","id":'
        + _encoder.encode(request_id)
        + b',"result":'
        + (_encoder.encode(result) + b"}")
    )


def encode_error(request_id: RequestId | None, code: int, message: str, data: Any = None) -> bytes:
    """Encode an error response (``id`` null when the request id is unknown)."""
    return encode(
        ErrorResponse(id=request_id, error=ErrorObject(code=code, message=message, data=data))
    )


def encode_request(request_id: RequestId, method: str, params: Any = None) -> bytes:
    """Encode a request (used for server-to-client requests and by clients)."""
    out = b'{"jsonrpc":"2.0","id":' + _encoder.encode(request_id) + b',"method":'
    out += _encoder.encode(method)
    if params is not None:
        out += b',"params":' + _encoder.encode(params)
    return out + b"}"


def encode_notification(method: str, params: Any = None) -> bytes:
    """Encode a notification."""
    out = b'{"jsonrpc":"2.0","method":' + _encoder.encode(method)
    if params is not None:
        out += b',"params":' + _encoder.encode(params)
    return out + b"}"


def error_body(exc: RemoteProtocolError) -> bytes:
    """Encode the JSON-RPC error body for a refusal."""
    return encode_error(exc.request_id, exc.code, exc.message, exc.error_data())
