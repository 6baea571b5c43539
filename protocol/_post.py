"""The course of a session-era POST: every decision, in order, as effects.

Theory of operation
-------------------
A POST to a session (not ``initialize``) is decided in one order, whatever runtime
carries it.  :class:`PostCourse` owns that order; the runtime performs each
*effect* it asks for and delivers the answer back, until the course says it is
over (``None``)::

    effect = course.start(now)
    while effect is not None:
        try:
            answer = await perform(effect)          # the runtime's own I/O
        except BaseException as exc:
            effect = course.fail(exc, now)          # cleanup effects, or re-raised
        else:
            effect = course.deliver(answer, now)

The order, and what each step may refuse:

1. :class:`LoadSession` -- the principal's live session (the runtime answers with
   it, or raises the 404).  A lone ``tools/call`` needs no fresh read of a shared
   record: its claim in the store checks the session in the same round trip.
2. The channel token (fencing), when the runtime binds channels: a malformed,
   stale or foreign token is refused 409 before anything is absorbed; the first
   token that proves the channel binds the session (:data:`MARK_BOUND`).  The
   rebind handshake is checked here too (who may fence whom).
3. :class:`Mail` -- notifications and the client's answers and cancellations are
   handled at once, routed here or, with a shared store, to the replica that waits
   for them.  A POST with no request ends here: :data:`ACCEPTED` (202).
4. :class:`Rebind` (the handshake) ends the course; otherwise
   :data:`ENTER_REQUEST` moves the session's lifecycle, and a batch of several
   requests is handed over whole (:class:`RunBatch`: its entries are admitted one
   by one while its response is open).
5. :class:`AdmitRequests` -- admission for the lone request, which reserves room for its
   result under the POST's own :attr:`PostCourse.lane` (429 once half-open).
6. The idempotency gate, for a ``tools/call``: :class:`ClaimCall` (the store's
   :class:`~._gate.CallStart`), :class:`HoldCall` once the key is this delivery's,
   :class:`WaitForCall` while another delivery runs it.  The rules are
   :class:`~._course.CallCourse`'s; the loop around them lives only here.
7. The answer: :class:`AnswerJson` in JSON response mode; otherwise the stream --
   :class:`AllocateEpoch` (unless the claim brought one), :class:`OpenRequestStream`
   (which takes over the lane's reservation), :class:`RunCalls` (the runtime runs
   the handler, in a task or inline) and :data:`ATTACH_WRITER`.

If a step fails between admission and the stream's opening -- a refusal of the
gate, a store outage, the connection dropping -- the course first asks for
:class:`Finished` (the admitted request is accounted for: its reservation ends)
and :class:`GiveBack` for a key it claimed but never started (nothing ran, so a
retry may run it), then re-raises.  After :class:`OpenRequestStream` the handler owns
the request and the runtime accounts for it.

The course does no I/O, reads no clock (``now`` comes with every answer) and
holds nothing global.  Effects without fields are preallocated singletons.
"""

from __future__ import annotations

from collections.abc import Container, Generator
from dataclasses import dataclass
from typing import Any, Final, Protocol

from ._binding import (
    ChannelVerdict,
    channel_refusal,
    channel_verdict,
    check_rebind,
    parse_channel_token,
)
from ._course import CallCourse, ClaimCall, HoldCall, WaitForCall, gate
from ._endpoint import PostMessages, accepts, session_refusal
from ._errors import RemoteProtocolError
from ._jsonrpc import ErrorResponse, Notification, Request, RequestId, Response, encode_error
from ._lifecycle import primes_streams
from ._messages import Absorbed, Post, absorb, route_mail
from ._steps import Singleton, Steps

#: The explicit rebind handshake (fencing), advertised in ``capabilities.experimental``.
REBIND_METHOD: Final = "weir/rebind"


class ChannelRecord(Protocol):
    """What the course reads of a session's channel binding (fencing)."""

    @property
    def generation(self) -> int: ...
    @property
    def secret(self) -> str: ...
    @property
    def bound(self) -> bool: ...


class PostSession(Protocol):
    """What the course reads of the session a runtime loaded (:class:`LoadSession`)."""

    @property
    def running(self) -> Container[RequestId]:
        """Ids of the session's requests running in this process."""

    @property
    def pending(self) -> Container[RequestId]:
        """Ids of this process's server-to-client requests awaiting an answer."""

    @property
    def channel(self) -> ChannelRecord | None:
        """The session's channel binding; None where the runtime binds no channels."""

    @property
    def protocol_version(self) -> str:
        """The revision ``initialize`` negotiated."""


@dataclass(frozen=True, slots=True)
class PostRules:
    """How a runtime is configured, as far as the course's decisions go (one per server)."""

    #: Answer requests with one ``application/json`` body instead of an SSE stream.
    json_response: bool = False
    #: Answer with JSON a client whose ``Accept`` does not list ``text/event-stream``
    #: (where the endpoint admits such clients at all).
    json_unless_sse: bool = False
    #: Other replicas may exist (a shared store): mail not for here is forwarded.
    shared: bool = False
    #: Request streams start with a priming event where the revision asks for one.
    priming: bool = True
    #: Authorization is on (the principal may rebind without the channel token).
    authorized: bool = False
    #: How long a duplicate delivery waits for a running call before 409 ``in_progress``.
    in_progress_wait: float = 10.0
    #: The ``Retry-After`` (ms) a gate refusal suggests.
    retry_ms: int = 1000


# ---------------------------------------------------------------- effects
@dataclass(slots=True)
class LoadSession:
    """Answer with the request's session (a :class:`PostSession`), or raise its 404.

    ``verify``: with a shared store, re-read the record (a lone ``tools/call`` does
    not need to: its claim checks the session)."""

    verify: bool
    #: The id a refusal answers (the POST's first message's, if a request).
    request_id: RequestId | None


class MarkBound(Singleton):
    """Record that the session is bound to its channel token (answer: None)."""


class Accepted(Singleton):
    """Answer the POST ``202 Accepted`` with no body; the course is over."""


class EnterRequest(Singleton):
    """The session's lifecycle takes a request (``SessionInput.REQUEST``; answer: None)."""


class AttachWriter(Singleton):
    """Write the opened stream on this connection until it ends; the course is over."""


MARK_BOUND: Final = MarkBound("MARK_BOUND")
ACCEPTED: Final = Accepted("ACCEPTED")
ENTER_REQUEST: Final = EnterRequest("ENTER_REQUEST")
ATTACH_WRITER: Final = AttachWriter("ATTACH_WRITER")


@dataclass(slots=True)
class Mail:
    """Handle a POST's notifications, answers and cancellations now (answer: None).

    ``initialized``: the session's lifecycle takes ``notifications/initialized``;
    ``notes``: the application's notifications; ``cancel_here`` / ``answer_here``:
    for requests of this process; ``forward``: for another replica, through the
    store (the session's mailboxes)."""

    initialized: bool
    notes: list[Notification]
    cancel_here: list[RequestId]
    answer_here: list[Response | ErrorResponse]
    forward: list[Post]


@dataclass(slots=True)
class Rebind:
    """Perform the rebind handshake for ``request`` and answer it; the course is over."""

    request: Request


@dataclass(slots=True)
class RunBatch:
    """Answer a batch (2025-03-26) whose entries are admitted, gated and run one by
    one while its response is open; the course is over."""

    requests: list[Request]
    token: tuple[int, str] | None
    primes: bool
    #: Answer with one JSON array instead of a stream.
    json: bool


@dataclass(slots=True)
class AdmitRequests:
    """Wait for admission of ``n`` requests, reserving room for their results under
    ``lane``.  Answer True once admitted, False if the session ended meanwhile;
    raise 429 ``stream_half_open`` when it is (or becomes) half-open."""

    n: int
    request_id: RequestId | None
    lane: object


@dataclass(slots=True)
class Finished:
    """``n`` admitted requests of ``lane`` will never send a response (answer: None)."""

    n: int
    lane: object


@dataclass(slots=True)
class GiveBack:
    """Release ``key``, claimed by a call that never started (answer: None)."""

    key: str


@dataclass(slots=True)
class AnswerJson:
    """Run ``courses`` and answer with one JSON body (an array for a batch) drawing
    on ``lane``'s reservations; the course is over."""

    courses: list[CallCourse]
    is_batch: bool
    lane: object


@dataclass(slots=True)
class AllocateEpoch:
    """Answer with a fresh stream epoch for channel ``generation`` (0: no token)."""

    generation: int


@dataclass(slots=True)
class OpenRequestStream:
    """Open the request stream ``epoch`` for ``outstanding`` responses; it takes over
    what ``lane`` reserved (answer: None).  From here the runtime accounts for
    every request (each ends its reservation once its response is enqueued)."""

    epoch: str
    token: tuple[int, str] | None
    lane: object
    outstanding: int


@dataclass(slots=True)
class RunCalls:
    """Run ``courses`` on the opened stream (their answers are its frames), after a
    priming event if ``primes`` (answer: None)."""

    courses: list[CallCourse]
    primes: bool


@dataclass(slots=True)
class CountIn:
    """A batch entry refused admission is accounted for like an admitted one
    (:meth:`~weir.protocol.SessionFlow.count_in` under ``lane``; answer: None)."""

    lane: object


@dataclass(slots=True)
class StartEntry:
    """Run batch entry ``index`` by ``course`` now (answer: None).  ``refused``:
    the entry was refused on the way, and its course answers with that error."""

    index: int
    course: CallCourse
    refused: RemoteProtocolError | None = None


Effect = (
    LoadSession
    | MarkBound
    | Mail
    | Accepted
    | Rebind
    | EnterRequest
    | RunBatch
    | AdmitRequests
    | ClaimCall
    | HoldCall
    | WaitForCall
    | Finished
    | GiveBack
    | AnswerJson
    | AllocateEpoch
    | OpenRequestStream
    | RunCalls
    | AttachWriter
    | CountIn
    | StartEntry
)

#: (Answers come back as whatever the effect promises: typed where they are read.)
_Steps = Generator[Effect, Any, None]


class PostCourse(Steps[Effect]):
    """One session-era POST's course (see the module docstring)."""

    __slots__ = ("lane", "post", "rules")

    def __init__(self, post: PostMessages, rules: PostRules) -> None:
        if post.is_initialize:
            raise ValueError("initialize opens a session; it has no session-era POST course")
        # (The base's fields set here, not through its methods: one course per POST.)
        self.now = 0.0
        self.post = post
        self.rules = rules
        #: The key the lone request's result is reserved under until its stream opens.
        self.lane = object()
        self._steps = steps = _course(self)
        self._send = steps.send


def _channel(
    channel: ChannelRecord,
    post: PostMessages,
    rid: RequestId | None,
    *,
    rebind: bool,
    lone_call: bool,
    rules: PostRules,
) -> tuple[tuple[int, str] | None, bool]:
    """The POST's channel token checked against the session (fencing): the token,
    and whether it is the first to prove the channel (the session becomes bound).

    Raises:
        RemoteProtocolError: 409 for a malformed, stale or foreign token (a lone
            ``tools/call``'s token is checked by its claim, in the same round trip),
            or for a rebind this request may not make.
    """
    raw = post.ctx.headers.get("mcp-channel-token")
    if rebind:
        try:
            verdict = channel_verdict(channel.generation, channel.secret, parse_channel_token(raw))
        except RemoteProtocolError:
            verdict = ChannelVerdict.UNBOUND
        check_rebind(verdict, raw is not None, authorized=rules.authorized, request_id=rid)
        return None, False
    if raw is None:
        return None, False  # nothing to check, nothing to bind
    token = parse_channel_token(raw, rid)
    verdict = channel_verdict(channel.generation, channel.secret, token)
    if not lone_call and verdict is not ChannelVerdict.OK:
        raise channel_refusal(verdict, rid)
    return token, not channel.bound and verdict is ChannelVerdict.OK


def _mail(absorbed: Absorbed, session: PostSession, rules: PostRules) -> Mail:
    """What to do now with a POST's notifications, answers and cancellations."""
    routed = route_mail(
        absorbed, running=session.running, pending=session.pending, shared=rules.shared
    )
    return Mail(
        absorbed.initialized, absorbed.notes, routed.cancel_here, routed.answer_here, routed.post
    )


def _course(c: PostCourse) -> _Steps:
    post, rules = c.post, c.rules
    messages = post.messages
    first = messages[0]
    rid = post.refusal_id
    lone = len(messages) == 1 and isinstance(first, Request)
    method = first.method if lone and isinstance(first, Request) else None
    lone_call = method == "tools/call"
    rebind = method == REBIND_METHOD
    del first  # (the frame lives as long as the stream: it holds no request)
    session: PostSession = yield LoadSession(not lone_call, rid)

    channel = session.channel
    token: tuple[int, str] | None = None
    if channel is not None:
        token, binds = _channel(channel, post, rid, rebind=rebind, lone_call=lone_call, rules=rules)
        if binds:
            yield MARK_BOUND  # only a token that proves the channel counts
    absorbed = absorb(messages)
    if absorbed.cancels or absorbed.answers or absorbed.notes or absorbed.initialized:
        yield _mail(absorbed, session, rules)
    requests = absorbed.requests
    if not requests:
        yield ACCEPTED
        return
    if channel is not None and len(requests) == 1 and requests[0].method == REBIND_METHOD:
        yield Rebind(requests[0])
        return
    yield ENTER_REQUEST
    primes = rules.priming and primes_streams(session.protocol_version, post.ctx.protocol_version)
    json = rules.json_response or (
        rules.json_unless_sse and not accepts(post.ctx.headers.get("accept"), "text/event-stream")
    )
    if len(requests) > 1:
        yield RunBatch(requests, token, primes, json)
        return

    req = requests[0]
    lane = c.lane
    if not (yield AdmitRequests(1, req.id, lane)):
        raise session_refusal(post.ctx.session_id or "", req.id)
    course = yield from _gate_and_open(c, req, token, lane, json)
    courses = [course]
    if json:
        # The body's writer accounts for the request from here.
        del requests, req, course, absorbed
        messages.clear()
        answer = AnswerJson(courses, post.is_batch, lane)
        del courses
        yield answer
        return
    # The handler owns the request now; the stream may outlive it by far.
    del requests, req, course, absorbed
    messages.clear()
    run = RunCalls(courses, primes)
    del courses
    yield run
    del run
    yield ATTACH_WRITER


def _gate_and_open(
    c: PostCourse, req: Request, token: tuple[int, str] | None, lane: object, json: bool
) -> Generator[Effect, Any, CallCourse]:
    """An admitted request's course: through the gate when it is a keyed call, then
    its stream opened (SSE mode).  A failure ends the reservation and gives back a
    key claimed but never run, then goes on."""
    rules = c.rules
    try:
        course = CallCourse(
            req,
            c.post.ctx.headers.get("idempotency-key"),
            now=c.now,
            wait=rules.in_progress_wait,
            retry_ms=rules.retry_ms,
        )
    except GeneratorExit:
        raise  # abandoned by its runtime: nothing more may be asked
    except BaseException:
        yield Finished(1, lane)
        raise
    try:
        if course.gated:
            yield from gate(course, token, c)
        epoch = course.epoch  # (a claim on a shared store brings its stream's epoch)
        if not epoch and not json:
            epoch = yield AllocateEpoch(token[0] if token else 0)
        if not json:
            # (The runtime refuses an epoch the store handed out before: after a
            # store that lost writes, nothing may run under a reused epoch.)
            assert epoch
            yield OpenRequestStream(epoch, token, lane, 1)
    except GeneratorExit:
        raise
    except BaseException:
        yield Finished(1, lane)
        given = course.give_back()
        if given is not None:
            yield GiveBack(given.key)
        raise
    return course


class BatchEntries(Steps[Effect]):
    """A batch's entries, admitted, gated and started one at a time, in order
    (2025-03-26 batches; driven like :class:`PostCourse`).

    Each entry waits for admission as a lone request would (so the in-flight and
    credit limits hold for every entry), reserving room for its result under
    ``lane`` (the batch's stream or its one JSON body), then passes the gate, then
    :class:`StartEntry`.  An entry refused on the way gets the refusal as its
    JSON-RPC error in the batch's response and executes nothing; the others go
    on.  If the session ends while an entry waits, the rest are never started
    (their stream is gone with the session).
    """

    __slots__ = ()

    def __init__(
        self,
        requests: list[Request],
        token: tuple[int, str] | None,
        lane: object,
        rules: PostRules,
    ) -> None:
        super().__init__()
        self._begin(_entries(self, requests, token, lane, rules))


def _refused(req: Request, exc: RemoteProtocolError) -> CallCourse:
    body = encode_error(req.id, exc.code, exc.message, exc.error_data())
    return CallCourse.answered(req, body)


def _entries(
    c: BatchEntries,
    requests: list[Request],
    token: tuple[int, str] | None,
    lane: object,
    rules: PostRules,
) -> _Steps:
    for i, req in enumerate(requests):
        try:
            admitted = yield AdmitRequests(1, req.id, lane)
        except RemoteProtocolError as exc:
            yield CountIn(lane)
            yield StartEntry(i, _refused(req, exc), exc)
            continue
        if not admitted:
            return  # the session ended: its streams are gone with it
        try:
            course = CallCourse(
                req, None, now=c.now, wait=rules.in_progress_wait, retry_ms=rules.retry_ms
            )
            yield from gate(course, token, c)
        except RemoteProtocolError as exc:
            yield StartEntry(i, _refused(req, exc), exc)
            continue
        yield StartEntry(i, course)
