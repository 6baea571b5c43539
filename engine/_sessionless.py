"""The sessionless era (MCP 2026-07-28) on the Trio engine: one POST, one answer.

Theory of operation
-------------------
A request of this era carries its client's version, capabilities, info and log
level itself (checked by the core's :func:`~weir.protocol.route`), so nothing is
looked up and nothing outlives the response:

* **Credit** still bounds what a client can make the server hold.  Every response
  takes the credit of its request's owner (:mod:`engine._owners`): the principal's
  when requests are authorized, else the connection's -- looked up from the
  request's own :class:`~engine._requester.Requester`, never from the connection, so
  a gateway's connection that carries Alice's request and then Bob's gives Bob Bob's
  owner.  An owner whose peer stops reading is refused 429 ``stream_half_open``
  before anything runs, and torn down after the liveness timeout.
* **Closing the response is cancellation** -- unless the call carries an
  ``Idempotency-Key``.  A streamed answer's handler runs in the handler nursery while
  the connection's task writes its stream; if the client goes away first, the handler
  is cancelled.  A keyed call is the exception: its client has said it will issue
  the call again under the same key if the answer is lost, so the call runs to its
  end (what it would have streamed goes nowhere), its outcome is recorded, and the
  re-issued call replays it instead of finding a half-run call whose effects nobody
  knows.  Nothing is resumable in this era, so frames carry no event ids.
* **Input-required results.**  A handler that asks the client for something
  (``ctx.elicit``, ``ctx.sample``, ``ctx.list_roots``, ``ctx.input``) gets the
  answer if the request carries it (``inputResponses``, and the earlier rounds'
  answers sealed in ``requestState``, :mod:`engine._sealed`); otherwise the answer
  is ``resultType: "input_required"`` with the asks and a new sealed state, and the
  client's next round runs the handler again.  A state that does not open -- forged,
  tampered with, expired, or another request's -- is 400, -32602
  ``request_state_invalid``.  A state is bound to the principal of the request that
  got it (and whether a token vouched for it), the method and its arguments; not to
  the connection, since clients (the official SDK's among them) send the next round
  on whichever connection and replica they have.  Without authorization every
  client is the one principal, and nothing an anonymous client could present tells
  it from another: a state is then a bearer capability, as secret as the response
  that carried it (sealed, so unreadable and unforgeable, and short-lived).  Where
  clients must not be able to continue each other's rounds, turn authorization on.
* **Refusals before the head.**  A streamed answer's head is held back until the
  handler's first message or its end (at most :data:`FIRST_OUTPUT_WAIT`), so that
  a refusal such as -32021 (a capability the request did not declare) is still a
  400 with a JSON body.
* **Results** get ``resultType``, the server's identity under ``_meta`` and, for
  cacheable methods, ``ttlMs`` and ``cacheScope`` (:func:`complete`).  A method this
  era does not have (``initialize``, ``ping``, ``logging/setLevel``,
  ``resources/subscribe``, anything unknown) is 404 with -32601; an unknown
  resource is -32602 (with ``data.uri``), as this revision numbers it.

``subscriptions/listen`` is :mod:`engine._subscriptions`'s.
"""

from __future__ import annotations

import hashlib
import secrets
import time
from collections.abc import Hashable
from typing import Any, Final

import msgspec
import trio

from weir.app import (
    NO_LOGS,
    Caller,
    Context,
    InputRequired,
    McpError,
    capabilities,
    describe,
    dispatch,
    failure,
)
from weir.protocol import (
    INVALID_PARAMS,
    METHOD_NOT_FOUND,
    RESOURCE_NOT_FOUND,
    Reason,
    RemoteProtocolError,
    accepts,
)
from weir.protocol.course import CallCourse
from weir.protocol.gate import WindowKey
from weir.protocol.jsonrpc import (
    Notification,
    Request,
    encode_notification,
    encode_result,
    error_body,
)
from weir.protocol.lifecycle import ALL_VERSIONS
from weir.protocol.sessionless import (
    MISSING_CAPABILITY,
    NAMED_TARGET,
    SESSIONLESS_VERSIONS,
    SessionlessMessage,
    check_param_headers,
    complete,
    discover_result,
    method_not_found,
    missing_capability,
    param_headers,
)
from weir.protocol.states import StreamInput, StreamState
from weir.protocol.streams import StreamKind

from ._auth import REQUEST_ACCESS
from ._connection import Connection
from ._context import SessionlessBackend
from ._requester import Requester
from ._server_base import _ServerBase, log
from ._session import Session, SessionClosed, StreamHandle, StreamLost
from ._store import StoreUnavailable
from ._subscriptions import Listener, honoured
from ._writer import SSE_HEADERS, PeerGone, write_stream

#: The revision this module serves.
VERSION: Final = SESSIONLESS_VERSIONS[-1]
#: The methods this era serves.
METHODS: Final = frozenset(
    {
        "server/discover",
        "subscriptions/listen",
        "tools/list",
        "tools/call",
        "prompts/list",
        "prompts/get",
        "resources/list",
        "resources/read",
        "resources/templates/list",
        "completion/complete",
    }
)
#: Methods of the session era only: 404 on this one, even for an app's fallback.
NOT_THIS_ERA: Final = frozenset(
    {"initialize", "ping", "logging/setLevel", "resources/subscribe", "resources/unsubscribe"}
)
#: Methods that may answer ``input_required``, and stream notifications first.
INPUT_METHODS: Final = frozenset(NAMED_TARGET)
#: Seconds between two reads of the store's change bus (shared stores only).
CHANGE_POLL: Final = 0.1
#: How far back a replica's first read of the bus goes (clock skew between hosts).
CHANGE_LOOKBACK: Final = 5.0
#: Seconds a streamed answer's head waits for the handler's first message.
FIRST_OUTPUT_WAIT: Final = 1.0
#: Params that are the round's, not the request's (left out of its digest).
_ROUND_PARAMS: Final = ("_meta", "inputResponses", "requestState")


class _Sessionless(_ServerBase):
    """Requests of the sessionless era (see the module docstring)."""

    async def _sessionless(self, conn: Connection, msg: SessionlessMessage, who: Requester) -> None:
        message = msg.message
        if isinstance(message, Notification):
            await conn.send(conn.http.send_response(202, ()))
            return
        assert msg.meta is not None
        req = message
        if req.method not in METHODS and (
            self.app.fallback_fn is None or req.method in NOT_THIS_ERA
        ):
            raise method_not_found(req.method, req.id)
        if req.method == "server/discover":
            found = encode_result(req.id, self._discover())
            await conn.send(conn.http.send_response(200, _JSON, found))
            return
        if req.method == "tools/call":
            self._check_param_headers(msg, req)
        inputs = None
        if req.method in INPUT_METHODS:
            if self.app.fallback_every_method:  # the app keeps its own rounds' state
                req = self._open_app_state(who, req)
            else:
                inputs = self._inputs(who, req)
        owner = self._owner(conn, who)
        meta = msg.meta
        caller = Caller(
            meta.capabilities,
            meta.client_info or {},
            log_level=meta.log_level or NO_LOGS,
            protocol_version=meta.version,
        )
        # The request reserves room for its answer under a key of its own, which its
        # stream (if it has one) takes over: the owner is shared by connections.
        lane = object()
        try:
            await owner.admit(1, req.id, lane)  # 429 once this connection's peer stopped reading
        except SessionClosed:
            raise PeerGone from None
        self.metrics.admissions += 1
        if req.method == "subscriptions/listen":
            await self._listen(conn, owner, req, lane)
            return
        course = None
        header_key = msg.headers.get("idempotency-key")
        if header_key is None and req.method == "tools/call":
            header_key = self._same_request_key(req)
        if req.method == "tools/call" and header_key is not None:
            try:
                course = await self._keyed_course(who.principal, req, header_key)
            except BaseException:
                owner.done(1, lane)
                raise
            if course.replay is not None:  # it ran: its stored answer, nothing runs
                owner.done(1, lane)
                await self._send_json(conn, owner, list(_JSON), course.replay)
                return
        if req.method == "tools/call" and course is None:
            self.metrics.executions += 1  # (a keyed call is counted at its gate)
        sse = req.method in INPUT_METHODS and not self.config.json_response
        if sse and accepts(msg.headers.get("accept"), "text/event-stream"):
            await self._sessionless_sse(conn, owner, who, req, inputs, caller, course, lane)
            return
        try:
            try:
                backend = SessionlessBackend(owner, None, caller)
                body = await self._answer_recorded(owner, who, req, None, inputs, backend, course)
            finally:
                owner.done(1, lane, keep=True)  # the reservation is the body's
            if body is None:
                raise PeerGone  # cancelled with the server going away: nothing to answer
            await self._send_json(conn, owner, list(_JSON), body, lane)
        finally:
            owner.settle(lane)

    # ---------------------------------------------------------------- the checks
    def _same_request_key(self, req: Request) -> str | None:
        """With ``retry_window`` set: a key for an unkeyed call that the same request
        (same id, method and params) gets again within the window -- a gateway's
        retry of the same bytes.  Off by default: two clients of one principal that
        send the same request would share one answer (see ``ServerConfig``)."""
        window = self.config.retry_window
        if window <= 0:
            return None
        canonical = msgspec.json.encode([req.id, req.method, req.params], order="sorted")
        bucket = int(time.time() // window)
        # (a WindowKey: no client's Idempotency-Key can name this record)
        return WindowKey(f"same:{hashlib.sha256(canonical).hexdigest()[:32]}:{bucket}")

    def _check_param_headers(self, msg: SessionlessMessage, req: Request) -> None:
        """``Mcp-Param-*`` headers, against the called tool's ``x-mcp-header`` annotations."""
        params = req.params if isinstance(req.params, dict) else {}
        name = params.get("name")
        schema = self.app.input_schema(name) if isinstance(name, str) else None
        arguments = params.get("arguments")
        if schema is None or not isinstance(arguments, dict):
            return
        annotated = param_headers(schema)
        if annotated:
            check_param_headers(msg.headers, annotated, arguments, req.id)

    def _inputs(self, who: Requester, req: Request) -> dict[str, Any]:
        """The answers this round carries: the sealed state's, then ``inputResponses``.

        Raises:
            RemoteProtocolError: 400, -32602 for a state that does not open or is
                another request's.
        """
        params = req.params if isinstance(req.params, dict) else {}
        inputs: dict[str, Any] = {}
        claims = self._open_state(who, req)
        if claims is not None:
            answers = claims.get("a")
            if isinstance(answers, dict):
                inputs.update(answers)
        responses = params.get("inputResponses")
        if isinstance(responses, dict):
            inputs.update(responses)
        return inputs

    def _open_state(self, who: Requester, req: Request) -> dict[str, Any] | None:
        """The claims of the request state this round carries (None without one).

        Raises:
            RemoteProtocolError: 400, -32602 for a state that does not open or is
                another request's.
        """
        state = (req.params or {}).get("requestState")
        if state is None:
            return None
        claims = self.sealer.open(state) if isinstance(state, str) else None
        if claims is None or claims.get("b") != _binding(who, req):
            raise RemoteProtocolError(
                "requestState is invalid, expired, or not this request's",
                http_status=400,
                reason=Reason.REQUEST_STATE_INVALID,
                code=INVALID_PARAMS,
                request_id=req.id,
            )
        return claims

    def _open_app_state(self, who: Requester, req: Request) -> Request:
        """An app that runs its own input rounds (a fallback for every method) gets
        back the ``requestState`` it minted, once weir's seal around it opens: so a
        state is bound to its principal and request and expires, whatever the app
        does with it."""
        claims = self._open_state(who, req)
        if claims is None:
            return req
        params = dict(req.params or {})
        inner = claims.get("x")
        if isinstance(inner, str):
            params["requestState"] = inner
        else:
            params.pop("requestState", None)
        return msgspec.structs.replace(req, params=params)

    def _seal_app_state(self, who: Requester, req: Request, result: dict[str, Any]) -> None:
        """An app's ``input_required`` result: its ``requestState`` goes out sealed
        (see :meth:`_open_app_state`)."""
        claims: dict[str, Any] = {"b": _binding(who, req)}
        inner = result.get("requestState")
        if isinstance(inner, str):
            claims["x"] = inner
        try:
            result["requestState"] = self.sealer.seal(claims)
        except ValueError as exc:
            raise McpError(INVALID_PARAMS, str(exc)) from None

    # ---------------------------------------------------------------- results
    def _discover(self) -> dict[str, Any]:
        described = describe(self.app, VERSION)
        return discover_result(
            ALL_VERSIONS,
            self._capabilities(described),
            self._server_info(),
            described.get("instructions"),
        )

    def _capabilities(self, described: dict[str, Any] | None = None) -> dict[str, Any]:
        """This era's capabilities: the app's, with list changes and resource
        updates announced on ``subscriptions/listen`` (an app describing itself
        says so itself; ``described`` is its description, if already asked for)."""
        if self.app.describe_fn is not None:
            return dict((described or describe(self.app, VERSION))["capabilities"])
        caps = capabilities(self.app)
        for name in ("tools", "prompts"):
            if name in caps:
                caps[name] = {"listChanged": True}
        if "resources" in caps:
            caps["resources"] = {"subscribe": True, "listChanged": True}
        return caps

    def _server_info(self) -> dict[str, Any]:
        """The identity stamped on every result: the app's name and version, or what
        its ``describe`` hook says (asked once: an identity does not change)."""
        if self.app.describe_fn is None:
            return {"name": self.app.name, "version": self.app.version}
        if self.described_info is None:
            self.described_info = dict(describe(self.app, VERSION)["serverInfo"])
        return self.described_info

    async def _answer_recorded(
        self,
        owner: Session,
        who: Requester,
        req: Request,
        handle: StreamHandle | None,
        inputs: dict[str, Any] | None,
        backend: SessionlessBackend,
        course: CallCourse | None,
    ) -> bytes | None:
        """:meth:`_sessionless_answer`, and for a keyed call its outcome in the gate.

        A finished call records its answer; an ``input_required`` answer, a refusal
        or the client's cancellation gives the key back (nothing finished); a call
        the process abandons is recorded ``interrupted``.
        """
        if course is None:
            return await self._sessionless_answer(owner, who, req, handle, inputs, backend)
        principal = who.principal
        backend.detached = True
        course.started()
        try:
            body = await self._sessionless_answer(owner, who, req, handle, inputs, backend)
        except RemoteProtocolError:
            await self._keyed_record(principal, course, course.finished(None, final_append=False))
            raise
        except BaseException:
            await self._keyed_record(principal, course, course.abandoned())
            raise
        outcome = body if body is not None and not backend.asked else None
        await self._keyed_record(principal, course, course.finished(outcome, final_append=False))
        return body

    async def _sessionless_answer(
        self,
        owner: Session,
        who: Requester,
        req: Request,
        handle: StreamHandle | None,
        inputs: dict[str, Any] | None,
        backend: SessionlessBackend,
    ) -> bytes | None:
        """Run one request's handler; its encoded answer (``None`` if cancelled).

        Raises:
            RemoteProtocolError: 400, -32021 when the handler needs a capability the
                request did not declare.
        """
        ctx = Context(
            backend,
            req.id,
            _meta(req),
            state=self.state,
            inputs=inputs,
            access_token=REQUEST_ACCESS.get(),
        )
        with trio.CancelScope() as scope:
            if not backend.detached:  # a keyed call is not cancelled with its response
                owner.running[backend.run_key] = scope
            try:
                try:
                    result = await dispatch(self.app, req, ctx)
                    if result.get("resultType") == "input_required":  # the app's own round
                        backend.asked = True  # (not an outcome a keyed call records)
                        if self.app.fallback_every_method and req.method in INPUT_METHODS:
                            self._seal_app_state(who, req, result)
                except InputRequired as asked:
                    backend.asked = True
                    result = self._input_required(who, req, asked, ctx)
                decorated = complete(req.method, result, self._server_info())
                return self._fit(req, encode_result(req.id, decorated), handle)
            except StreamLost:
                return None
            except McpError as exc:
                if exc.code == METHOD_NOT_FOUND:  # an app's fallback does not serve it
                    raise method_not_found(req.method, req.id) from None
                if exc.code == MISSING_CAPABILITY:
                    needed = (exc.data or {}).get("requiredCapabilities") or {}
                    raise missing_capability(needed, req.id) from None
                if exc.code == RESOURCE_NOT_FOUND:  # this revision says -32602 for it
                    exc = McpError(INVALID_PARAMS, exc.message, exc.data)
                return failure(req, exc)
            except Exception as exc:
                return failure(req, exc)
            finally:
                owner.running.pop(backend.run_key, None)
        return None

    def _input_required(
        self, who: Requester, req: Request, asked: InputRequired, ctx: Context
    ) -> dict[str, Any]:
        """The ``input_required`` result: what is asked, and the answers so far, sealed."""
        claims = {"b": _binding(who, req), "a": ctx.answered}
        try:
            state = self.sealer.seal(claims)
        except ValueError as exc:
            raise McpError(INVALID_PARAMS, str(exc)) from None
        return {
            "resultType": "input_required",
            "inputRequests": asked.requests,
            "requestState": state,
        }

    # ---------------------------------------------------------------- streams
    async def _sessionless_sse(
        self,
        conn: Connection,
        owner: Session,
        who: Requester,
        req: Request,
        inputs: dict[str, Any] | None,
        caller: Caller,
        course: CallCourse | None,
        lane: Hashable,
    ) -> None:
        """Answer on an SSE stream; the handler is cancelled if the client goes away.

        The stream takes over what the request reserved under ``lane``."""
        handle = self._open_answer_stream(owner)
        owner.move_reservations(lane, handle.log.epoch)
        first = trio.Event()
        refused: list[RemoteProtocolError] = []
        started = False
        backend = SessionlessBackend(owner, handle, caller, on_output=first.set)

        async def run() -> None:
            try:
                try:
                    body = await self._answer_recorded(
                        owner, who, req, handle, inputs, backend, course
                    )
                except RemoteProtocolError as exc:
                    if not started:
                        refused.append(exc)  # answered as this POST's status
                        return
                    body = error_body(exc)
                first.set()
                await handle.respond(body.decode() if body is not None else None)
            except StreamLost:
                pass
            finally:
                first.set()
                owner.done(1, handle.log.epoch)

        self._handlers_start(run)
        try:
            with trio.move_on_after(FIRST_OUTPUT_WAIT):
                await first.wait()
            if refused:
                raise refused[0]
            started = True
            keepalive = self.config.sse_keepalive
            await write_stream(conn, owner, handle, 0, SSE_HEADERS, keepalive=keepalive)
        finally:
            _end(owner, backend, handle)

    def _open_answer_stream(self, owner: Session) -> StreamHandle:
        """A stream for one request's answer: no event ids (nothing resumes).  Its
        epoch is drawn afresh until it names none of the owner's streams (open or
        kept): four random bytes meet again over a busy principal's life."""
        epoch = secrets.token_hex(4)
        while epoch in owner.handles:
            epoch = secrets.token_hex(4)
        handle = owner.open_stream(
            epoch,
            StreamKind.REQUEST,
            max_events=self.config.max_stream_events,
            emit_ids=False,
        )
        handle.outstanding = 1
        return handle

    async def _listen(self, conn: Connection, owner: Session, req: Request, lane: Hashable) -> None:
        """``subscriptions/listen``: acknowledge, then stream changes until the end."""
        params = req.params if isinstance(req.params, dict) else {}
        flags, kinds, uris = honoured(params.get("notifications"), self._capabilities())
        handle = self._open_answer_stream(owner)
        owner.move_reservations(lane, handle.log.epoch)
        listener = Listener(req, handle, kinds, uris)
        if not handle.try_send_now(listener.ack(flags)):
            self._handlers_start(handle.send, listener.ack(flags))
        owner.done(1, handle.log.epoch)  # its "answer" (the acknowledgement) is enqueued
        self.subscribers.add(listener)
        sender = trio.CancelScope()

        async def send_changes() -> None:
            with sender:
                await listener.run()

        # The sender is a handler task, not a child of this one: the writer's own
        # errors (a peer gone) then reach the connection loop as they are.
        self._handlers_start(send_changes)
        try:
            keepalive = self.config.sse_keepalive
            await write_stream(conn, owner, handle, 0, SSE_HEADERS, keepalive=keepalive)
        finally:
            sender.cancel()
            self.subscribers.discard(listener)
            if handle.log.state is not StreamState.CLOSED:
                handle.handle(StreamInput.ABORT)

    def _changed(self, method: str, uri: str | None = None) -> None:
        """A handler announced a change: deliver it here and, with a shared store, put
        it on the store's bus for the other replicas (:meth:`_relay_changes`)."""
        self._deliver_change(method, uri)
        if self.store.shared:
            change = msgspec.json.encode({"m": method, "u": uri, "r": self.replica_id})
            self._handlers_start(self._publish_change, change)

    async def _publish_change(self, change: bytes) -> None:
        try:
            await self.store.publish_change(change)
        except StoreUnavailable:
            log.warning("could not put an announced change on the store's bus")

    async def _relay_changes(self) -> None:
        """Shared stores only: deliver the changes other replicas announced.

        Reads the bus every :data:`CHANGE_POLL` seconds while anyone here listens, so
        an idle replica costs the store nothing.  Once someone starts to listen, the
        first read goes :data:`CHANGE_LOOKBACK` seconds back (the bus's ids are the
        store's clock in milliseconds), so a change announced elsewhere just as the
        listener arrived is not lost; a listener may hear a notice a few seconds
        old, which only asks it to fetch a list again.
        """
        cursor: str | None = None
        while True:
            await trio.sleep(CHANGE_POLL)
            if not self.subscribers and not self.sessions:
                cursor = None
                continue
            if cursor is None:
                cursor = f"{int((time.time() - CHANGE_LOOKBACK) * 1000)}-0"
            try:
                cursor, changes = await self.store.read_changes(cursor)
            except StoreUnavailable:
                continue
            for raw in changes:
                try:
                    change = msgspec.json.decode(raw)
                except msgspec.DecodeError:
                    continue
                if not isinstance(change, dict) or change.get("r") == self.replica_id:
                    continue
                method, uri = change.get("m"), change.get("u")
                if isinstance(method, str) and (uri is None or isinstance(uri, str)):
                    self._deliver_change(method, uri)

    def _deliver_change(self, method: str, uri: str | None) -> None:
        """Tell every client here that wants it that a list changed, or resource
        ``uri`` did: sessionless listeners, and session-era GET streams (resource
        updates only where the session subscribed).  Never waits: a GET stream
        without credit for the notice right now misses it (its peer is not reading)."""
        for listener in list(self.subscribers):
            listener.notify(method, uri)
        params = {"uri": uri} if uri is not None else None
        payload = encode_notification(method, params).decode()
        for session in self.sessions.values():
            standalone = session.standalone
            if standalone is None or standalone.log.state is StreamState.CLOSED:
                continue
            if uri is None or uri in session.caller.subscriptions:
                standalone.try_send_now(payload)

    def _end_subscriptions(self) -> None:
        """At shutdown: end each subscription gracefully (its final result)."""
        for listener in list(self.subscribers):
            if not listener.handle.try_respond_now(listener.closing()):
                self._handlers_start(listener.handle.respond, listener.closing())


_JSON: Final = (("content-type", "application/json"),)


def _end(owner: Session, backend: SessionlessBackend, handle: StreamHandle) -> None:
    """Closing the response is cancellation in this era: nothing is resumed.  (Of
    this request's handler: another client of the principal may use the same id.)"""
    scope = owner.running.get(backend.run_key)
    if scope is not None:
        scope.cancel()
    if handle.log.state is not StreamState.CLOSED:
        handle.handle(StreamInput.ABORT)


def _binding(who: Requester, req: Request) -> str:
    """What a request state is bound to: the request's principal (and whether a token
    vouched for it), its method, and its params other than the round's own (a
    digest).  Not the connection: clients send the next round on whichever connection
    (and replica) they have -- see the module docstring."""
    params = req.params if isinstance(req.params, dict) else {}
    kept = {k: v for k, v in params.items() if k not in _ROUND_PARAMS}
    bound = [who.principal, who.authorized, req.method, kept]
    canonical = msgspec.json.encode(bound, order="sorted")
    return hashlib.sha256(canonical).hexdigest()


def _meta(req: Request) -> dict[str, Any] | None:
    meta = (req.params or {}).get("_meta") if isinstance(req.params, dict) else None
    return meta if isinstance(meta, dict) else None
