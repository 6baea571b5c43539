"""The 2024-11-05 HTTP+SSE transport: its endpoint rules, and the course of its POST.

Theory of operation
-------------------
The legacy transport has two URLs: ``GET <sse path>`` opens a session whose one
stream carries every response (its first event names the URL to POST to), and
``POST <messages path>?session_id=<id>`` delivers the client's messages, answered
202.  :func:`route_legacy` checks everything about such a request that needs no
state, with the same refusals as the current endpoint -- Host/Origin (403),
the method for the path (405 with ``Allow``), ``Accept: text/event-stream`` for
the stream (406), ``Content-Type: application/json`` for messages (415), the
``session_id`` parameter (400 ``session_required``) and the JSON-RPC body (400,
batches allowed: 2024-11-05 has them) -- and returns :class:`LegacyOpen` or
:class:`LegacyMessages`.  Whether the session exists is the driver's question.

The course of its POST
----------------------
``POST <messages path>?session_id=`` delivers messages for a session whose one
LEGACY stream (opened by ``GET <sse path>``) carries every response; the POST
itself is answered 202.  :class:`LegacyPostCourse` owns its order, exactly as
:class:`~._post.PostCourse` owns a session-era POST's, and asks for the same
effects where the steps are the same:

1. :class:`~._post.LoadSession` -- the principal's live session (re-read from a
   shared store); a session without a LEGACY stream (it is not a legacy session,
   or its stream is gone) is 404, like an unknown one.
2. :class:`~._post.Mail` -- notifications, the client's answers and cancellations
   are handled at once (routed here or, with a shared store, forwarded).
3. A lone request: :class:`~._post.AdmitRequests` (429 ``stream_half_open`` once
   the session's credit is half-open, 404 if the session ends meanwhile), then the
   idempotency gate for a ``tools/call`` (:func:`~._course.gate`: ``ClaimCall``,
   ``HoldCall``, ``WaitForCall``), then :class:`RunOnLegacy`.  A refusal on the way is the
   POST's answer (nothing runs); after admission the course first asks for
   :class:`~._post.Finished` and :class:`~._post.GiveBack` (a key claimed but
   never started), then re-raises.
4. A batch (2024-11-05 has them): :class:`AdmitLegacyBatch` -- its entries are
   admitted, gated and run one by one in the background, each refusal becoming
   that entry's error on the stream.
5. :data:`~._post.ACCEPTED` (202); the course is over.

Every request is admitted and accounted for under the LEGACY stream's epoch (its
*lane*): its result is enqueued on that stream.  ``initialize`` arrives as one of
these requests, on the session the stream already opened; running it is the
runtime's (it initializes the session instead of calling a handler).

The course of its stream
------------------------
``GET <sse path>`` is :class:`LegacyStreamCourse`: a new session
(:data:`NEW_LEGACY_SESSION`, answered with its id), a stream epoch
(:class:`~._post.AllocateEpoch`), the LEGACY stream opened with its first event
naming the URL to POST to (:class:`OpenLegacyStream`), the writer attached
(:data:`~._post.ATTACH_WRITER`, answered when the stream ends) -- and then,
however the writer ended, :class:`~._lifecycle.ForgetSession`: a legacy session
lives exactly as long as its stream (2024-11-05 has no resumption, so nothing
could ever reach it again).

The courses do no I/O, read no clock (``now`` comes with every answer) and
hold nothing global.
"""

from __future__ import annotations

from collections.abc import Container, Generator
from dataclasses import dataclass
from typing import Final, Protocol, cast
from urllib.parse import parse_qs

from ._course import CallCourse, ClaimCall, HoldCall, WaitForCall, gate
from ._endpoint import (
    EndpointConfig,
    _refuse,
    accepts,
    check_host_and_origin,
    check_json_body,
    check_method,
    session_refusal,
)
from ._errors import Reason
from ._http_events import Headers, HttpRequest
from ._jsonrpc import Message, Request, RequestId, decode_body, refusal_id
from ._lifecycle import ForgetSession
from ._messages import absorb, route_mail
from ._post import (
    ACCEPTED,
    ATTACH_WRITER,
    Accepted,
    AdmitRequests,
    AllocateEpoch,
    AttachWriter,
    Finished,
    GiveBack,
    LoadSession,
    Mail,
    PostRules,
)
from ._steps import Singleton, Steps
from ._streams import StreamKind, StreamTable


@dataclass(frozen=True, slots=True)
class LegacyOpen:
    """``GET <sse path>``: open a legacy session and its stream."""

    headers: Headers


@dataclass(frozen=True, slots=True)
class LegacyMessages:
    """``POST <messages path>?session_id=``: messages for an open legacy session."""

    session_id: str
    messages: list[Message]
    is_batch: bool
    headers: Headers


def route_legacy(
    request: HttpRequest,
    config: EndpointConfig,
    *,
    sse_path: str | None,
    messages_path: str,
) -> LegacyOpen | LegacyMessages:
    """Classify and validate one request for the legacy transport's two paths.

    ``sse_path`` None: no new legacy sessions are opened (messages still route).

    Raises:
        RemoteProtocolError: the refusal to send (see the module docstring);
            404 for any other path.
    """
    headers = request.headers
    if request.path != messages_path and (sse_path is None or request.path != sse_path):
        raise _refuse(404, Reason.NOT_FOUND, f"no legacy endpoint at {request.path!r}")
    check_host_and_origin(headers, config)
    if request.path == sse_path:
        check_method(request.method, "GET")
        if not accepts(headers.get("accept"), "text/event-stream"):
            raise _refuse(406, Reason.NOT_ACCEPTABLE, "GET must accept text/event-stream")
        return LegacyOpen(headers)
    check_method(request.method, "POST")
    check_json_body(headers)
    sid = parse_qs(request.query).get("session_id", [None])[0]
    if sid is None:
        raise _refuse(400, Reason.SESSION_REQUIRED, "session_id query parameter is required")
    messages, is_batch = decode_body(request.body, allow_batch=True, max_batch=config.max_batch)
    return LegacyMessages(sid, messages, is_batch, headers)


# ---------------------------------------------------------------- the course of a POST
class LegacySession(Protocol):
    """What the course reads of the session a runtime loaded (:class:`LoadSession`)."""

    @property
    def running(self) -> Container[RequestId]:
        """Ids of the session's requests running in this process."""

    @property
    def pending(self) -> Container[RequestId]:
        """Ids of this process's server-to-client requests awaiting an answer."""

    @property
    def streams(self) -> StreamTable:
        """The session's streams held in this process (its LEGACY one among them)."""


@dataclass(frozen=True, slots=True)
class RunOnLegacy:
    """Run ``course`` in the background, its answer going out on the LEGACY stream
    ``epoch``; an ``initialize`` that is not a replay initializes the session
    (answer: None).  The runtime accounts for the request from here."""

    course: CallCourse
    epoch: str


@dataclass(frozen=True, slots=True)
class AdmitLegacyBatch:
    """Admit, gate and run ``requests`` one by one in the background, their answers
    going out on the LEGACY stream ``epoch`` (answer: None)."""

    requests: list[Request]
    epoch: str


LegacyEffect = (
    LoadSession
    | Mail
    | AdmitRequests
    | ClaimCall
    | HoldCall
    | WaitForCall
    | Finished
    | GiveBack
    | RunOnLegacy
    | AdmitLegacyBatch
    | Accepted
)

_Steps = Generator[LegacyEffect, object, None]


class LegacyPostCourse(Steps[LegacyEffect]):
    """One legacy POST's course (see the module docstring)."""

    __slots__ = ("post", "rules")

    def __init__(self, post: LegacyMessages, rules: PostRules) -> None:
        super().__init__()
        self.post = post
        #: What the course reads of them: ``shared``, ``in_progress_wait``, ``retry_ms``.
        self.rules = rules
        self._begin(_course(self))


def _course(c: LegacyPostCourse) -> _Steps:
    post, rules = c.post, c.rules
    rid = refusal_id(post.messages, post.is_batch)
    # A legacy POST loads its session like any request that is not a lone call.
    session = cast(LegacySession, (yield LoadSession(verify=True, request_id=rid)))
    epoch = next((log.epoch for log in session.streams if log.kind is StreamKind.LEGACY), None)
    if epoch is None:
        raise session_refusal(post.session_id, rid)
    absorbed = absorb(post.messages)
    if absorbed.cancels or absorbed.answers or absorbed.notes or absorbed.initialized:
        routed = route_mail(
            absorbed, running=session.running, pending=session.pending, shared=rules.shared
        )
        yield Mail(
            absorbed.initialized,
            absorbed.notes,
            routed.cancel_here,
            routed.answer_here,
            routed.post,
        )
    del session
    requests = absorbed.requests
    if len(requests) == 1:
        req = requests[0]
        if not (yield AdmitRequests(1, req.id, epoch)):
            raise session_refusal(post.session_id, req.id)  # the session ended meanwhile
        try:
            course = CallCourse(
                req,
                post.headers.get("idempotency-key"),
                now=c.now,
                wait=rules.in_progress_wait,
                retry_ms=rules.retry_ms,
            )
        except GeneratorExit:
            raise  # abandoned by its runtime: nothing more may be asked
        except BaseException:
            yield Finished(1, epoch)
            raise
        try:
            yield from gate(course, None, c)
        except GeneratorExit:
            raise
        except BaseException:
            yield Finished(1, epoch)
            given = course.give_back()
            if given is not None:
                yield GiveBack(given.key)
            raise
        run = RunOnLegacy(course, epoch)
        del course, req
        yield run
        del run
    elif requests:
        yield AdmitLegacyBatch(requests, epoch)
    del requests, absorbed
    yield ACCEPTED


# ---------------------------------------------------------------- the course of its stream
#: Create a legacy (2024-11-05) session for the requester; answer: its id.
NEW_LEGACY_SESSION: Final = Singleton("NEW_LEGACY_SESSION")


@dataclass(frozen=True, slots=True)
class OpenLegacyStream:
    """Open the session's LEGACY stream ``epoch`` (events carry no ids) with a first
    ``endpoint`` event whose data is ``endpoint`` (answer: None)."""

    epoch: str
    endpoint: str


LegacyStreamEffect = Singleton | AllocateEpoch | OpenLegacyStream | AttachWriter | ForgetSession


class LegacyStreamCourse(Steps[LegacyStreamEffect]):
    """One ``GET <sse path>``'s course (see the module docstring): the session, its
    one stream, and the session's end with the stream's."""

    __slots__ = ("messages_path",)

    def __init__(self, messages_path: str) -> None:
        super().__init__()
        #: Where the client is told to POST (``?session_id=`` is added).
        self.messages_path = messages_path
        self._begin(_stream_course(self))


def _stream_course(c: LegacyStreamCourse) -> Generator[LegacyStreamEffect, object, None]:
    session_id = cast(str, (yield NEW_LEGACY_SESSION))
    try:
        epoch = cast(str, (yield AllocateEpoch(0)))
        yield OpenLegacyStream(epoch, f"{c.messages_path}?session_id={session_id}")
        yield ATTACH_WRITER
    except GeneratorExit:
        raise  # abandoned by its runtime: nothing more may be asked
    except BaseException:
        yield ForgetSession(session_id)
        raise
    yield ForgetSession(session_id)
