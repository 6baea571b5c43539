"""The session-era lifecycle rules: the protocol revisions served, what ``initialize``
must carry and what it answers.

Theory of operation
-------------------
The revisions are named here once: :data:`SUPPORTED_VERSIONS` (the session era,
newest first), :data:`ALL_VERSIONS` (both eras), the revision a request without an
``MCP-Protocol-Version`` header is taken to speak (:data:`DEFAULT_VERSION`) and the
ones ``initialize`` may negotiate (:func:`negotiate_version`).

``initialize`` is the one request that needs no session; the driver creates the
session (it owns the store and the id generator) between the two halves here:

* :func:`parse_initialize` checks the request's shape -- ``protocolVersion`` a
  string, ``capabilities`` and ``clientInfo`` objects when present -- and
  negotiates the revision (the client's, if served; else the newest).  A bad
  shape is 400 with JSON-RPC ``-32602`` and ``data.reason`` ``invalid_request``.
  A session keeps what its client declared for its whole life, so that is
  bounded: capabilities over 8 KiB of JSON are refused the same way, and only
  ``clientInfo``'s name, version and title are kept (cut to 256 characters).
* :func:`initialize_result` builds the result object from what the application
  declares; the driver adds nothing the core does not know about except the
  capabilities it computes from the app.
* :class:`InitializeCourse` is the order of an ``initialize`` POST, for runtimes
  (driven like every course, see :mod:`weir.protocol._steps`): check it
  (:func:`parse_initialize`), ask for the session (:class:`OpenSession`: the
  runtime checks its session limit, mints the id and keeps what the client
  declared), answer 200 with the session id and channel token
  (:class:`AnswerInitialize`) -- and if that answer cannot be sent, the client
  never learnt the id, so nobody can use the session: :class:`ForgetSession`
  ends it at once instead of leaving it to the idle timeout.
* :func:`primes_streams` says whether a session's SSE streams begin with a
  priming event (an id and empty data): a 2025-11-25 feature, which older
  clients may not expect.  The negotiated revision decides, or the request's own
  ``MCP-Protocol-Version`` header if that is newer.
"""

from __future__ import annotations

from collections.abc import Generator, Mapping
from dataclasses import dataclass
from typing import Any, Final

import msgspec

from ._errors import INVALID_PARAMS, Reason, RemoteProtocolError
from ._jsonrpc import Request, RequestId
from ._sessionless import SESSIONLESS_VERSIONS
from ._steps import Steps

#: Revisions served on the Streamable HTTP endpoint, newest first.
SUPPORTED_VERSIONS: Final = ("2025-11-25", "2025-06-18", "2025-03-26")
#: The revision assumed when a request has no ``MCP-Protocol-Version`` header.
DEFAULT_VERSION: Final = "2025-03-26"
LATEST_VERSION: Final = SUPPORTED_VERSIONS[0]
#: Revisions an ``initialize`` may ask for and get echoed back.
NEGOTIABLE_VERSIONS: Final = (*SUPPORTED_VERSIONS, "2024-11-05")
#: Every revision the endpoint serves, either era, newest first.
ALL_VERSIONS: Final = (*SESSIONLESS_VERSIONS, *SUPPORTED_VERSIONS)


def negotiate_version(requested: object) -> str:
    """Echo the client's revision if served, else answer with the latest."""
    if isinstance(requested, str) and requested in NEGOTIABLE_VERSIONS:
        return requested
    return LATEST_VERSION


def version_at_least(version: str, minimum: str) -> bool:
    """True if revision ``version`` is ``minimum`` or newer (dates compare as text)."""
    return version >= minimum


#: The first revision whose SSE streams open with a priming event.
PRIMING_SINCE = "2025-11-25"


@dataclass(frozen=True, slots=True)
class InitializeParams:
    """A well-formed ``initialize``: the negotiated revision and what the client said."""

    version: str
    capabilities: dict[str, Any]
    client_info: dict[str, Any]


#: The most ``capabilities`` a session keeps, in bytes of JSON: a session holds them
#: for its whole life, so their size is bounded like everything else it holds (real
#: clients send a few hundred bytes).
MAX_CLIENT_CAPABILITIES: Final = 8 * 1024
#: What a session keeps of ``clientInfo``: these members, strings of at most
#: ``MAX_CLIENT_INFO_FIELD`` characters (longer ones are cut; icons, URLs and other
#: members are not kept -- they are for display, and could be large).
CLIENT_INFO_KEPT: Final = ("name", "version", "title")
MAX_CLIENT_INFO_FIELD: Final = 256


def parse_initialize(req: Request) -> InitializeParams:
    """Check an ``initialize`` request and negotiate its revision.

    The result keeps at most :data:`MAX_CLIENT_CAPABILITIES` bytes of capabilities
    and a trimmed ``clientInfo`` (:data:`CLIENT_INFO_KEPT`), whatever the request's
    size: a session holds them for its life.

    Raises:
        RemoteProtocolError: 400, ``-32602``, ``invalid_request`` if
            ``protocolVersion`` is not a string or ``capabilities``/``clientInfo``
            are not objects, or if ``capabilities`` is larger than the limit
            (``data.limit``).
    """
    params = req.params or {}
    caps = params.get("capabilities", {})
    info = params.get("clientInfo", {})
    requested = params.get("protocolVersion")
    if not isinstance(requested, str) or not isinstance(caps, dict) or not isinstance(info, dict):
        raise RemoteProtocolError(
            "initialize needs params.protocolVersion (a string), "
            "and capabilities and clientInfo (objects)",
            reason=Reason.INVALID_REQUEST,
            code=INVALID_PARAMS,
            request_id=req.id,
        )
    if caps and len(msgspec.json.encode(caps)) > MAX_CLIENT_CAPABILITIES:
        raise RemoteProtocolError(
            f"initialize: capabilities larger than {MAX_CLIENT_CAPABILITIES} bytes",
            reason=Reason.INVALID_REQUEST,
            code=INVALID_PARAMS,
            request_id=req.id,
            data={"limit": MAX_CLIENT_CAPABILITIES},
        )
    kept = {
        k: v[:MAX_CLIENT_INFO_FIELD] for k in CLIENT_INFO_KEPT if isinstance(v := info.get(k), str)
    }
    return InitializeParams(negotiate_version(requested), caps, kept)


def initialize_result(
    version: str,
    capabilities: Mapping[str, Any],
    *,
    name: str = "",
    server_version: str = "",
    server_info: Mapping[str, Any] | None = None,
    instructions: str | None = None,
) -> dict[str, Any]:
    """The ``initialize`` result: revision, capabilities, ``serverInfo``, instructions.

    ``serverInfo`` is ``server_info`` when given (title, icons, …), else ``name``
    and ``server_version``.
    """
    info = (
        dict(server_info) if server_info is not None else {"name": name, "version": server_version}
    )
    result: dict[str, Any] = {
        "protocolVersion": version,
        "capabilities": dict(capabilities),
        "serverInfo": info,
    }
    if instructions:
        result["instructions"] = instructions
    return result


def primes_streams(negotiated: str, header_version: str) -> bool:
    """Do this request's SSE streams start with a priming event?"""
    return version_at_least(negotiated, PRIMING_SINCE) or version_at_least(
        header_version, PRIMING_SINCE
    )


@dataclass(frozen=True, slots=True)
class OpenSession:
    """Create the session ``initialize`` asks for, keeping what its client declared.

    Answer: ``(session_id, channel_token)`` -- the token ``None`` where the runtime
    binds no channels.  A refusal raised here (the session limit: 503
    ``session_limit``) ends the course; nothing was created.
    """

    asked: InitializeParams
    request_id: RequestId


@dataclass(frozen=True, slots=True)
class AnswerInitialize:
    """Send 200 with ``headers`` and the ``initialize`` result for revision ``version``
    (the runtime describes its app: :func:`initialize_result`).  Answer: None."""

    headers: list[tuple[str, str]]
    request_id: RequestId
    version: str


@dataclass(frozen=True, slots=True)
class ForgetSession:
    """End session ``session_id`` now: its id never reached the client (answer: None)."""

    session_id: str


InitializeEffect = OpenSession | AnswerInitialize | ForgetSession


class InitializeCourse(Steps[InitializeEffect]):
    """One ``initialize`` POST's course (see the module docstring).

    :meth:`start` raises the 400 of a malformed ``initialize`` before any effect:
    nothing is created for it.
    """

    __slots__ = ("request",)

    def __init__(self, request: Request) -> None:
        if request.method != "initialize":
            raise ValueError(f"not an initialize request: {request.method!r}")
        self.now = 0.0
        self.request = request
        self._begin(_initialize(self))


def _initialize(c: InitializeCourse) -> Generator[InitializeEffect, Any, None]:
    req = c.request
    asked = parse_initialize(req)
    opened: tuple[str, str | None] = yield OpenSession(asked, req.id)
    session_id, token = opened
    headers = [("content-type", "application/json"), ("mcp-session-id", session_id)]
    if token is not None:
        headers.append(("mcp-channel-token", token))
    try:
        yield AnswerInitialize(headers, req.id, asked.version)
    except GeneratorExit:
        raise  # abandoned by its runtime: nothing more may be asked
    except BaseException:
        yield ForgetSession(session_id)
        raise
