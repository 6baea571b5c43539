"""The courses of a GET (a stream) and a DELETE: every decision, in order, as effects.

Theory of operation
-------------------
A GET reads a session's stream and a DELETE ends the session; both carry no body
and both must prove the channel the same way.  :class:`GetCourse` and
:class:`DeleteCourse` own their order, whatever runtime carries them, exactly as
:class:`~._post.PostCourse` owns a POST's: the runtime performs each effect and
delivers the answer back (``start``, ``deliver``, ``fail``) until the course is
over (``None``).

Both begin alike:

1. :class:`~._post.LoadSession` -- the principal's live session, re-read from a
   shared store (the runtime answers with a :class:`StreamSession`, or raises 404).
2. ``Mcp-Channel-Token`` (fencing): malformed, stale (409 ``cursor_stale``) or
   foreign (409 ``channel_unbound``) tokens are refused; a session whose client
   once presented its token needs it from then on (without authorization); the
   first token that proves the channel binds the session (:data:`~._post.MARK_BOUND`).

A DELETE then asks for :data:`END_SESSION` and :data:`DELETED` (200).

A GET goes on (the rules are :mod:`._resume`'s):

3. A cursor (``Last-Event-ID``) under resumption ``off`` is 409 ``cursor_unknown``.
4. Without a cursor: the session's standalone stream -- a second reader of a live
   one is 409 ``stream_conflict``; none yet, or one that ended, means a new one
   (:class:`~._post.AllocateEpoch`, :class:`OpenStandalone`).  It is written from
   its next event (:class:`WriteStream`), after a priming event where the
   revision asks for one (:class:`PrimeStream`).
5. With a cursor of a stream this process holds: the cursor must belong to the
   request's channel generation and to the events retained; the newest reader
   wins (:class:`ClaimReader`: a writer still attached to an older connection is
   cancelled, and an attached stream detached at once, :class:`DetachStream`),
   then :class:`WriteStream` from the event after the cursor.
6. With a cursor this process does not hold, and a shared store with resumption
   ``shared``: the stream is served from the store (:class:`LookUpStream`,
   :class:`ReadEvents`; an unknown or trimmed cursor is 409 ``cursor_unknown``,
   never a resume from the head), then :class:`StartReplay` and the
   :class:`~._resume.StoreTail`'s own steps (:class:`~._resume.TailSend`,
   :class:`~._resume.TailPause`; its ``TailExpire`` as :class:`ExpireClaim`) with a read after each
   round, while :data:`KEEP_TAILING` says the session and server still serve,
   until the tail ends; then :data:`END_REPLAY`.  The runtime bounds the tail
   (:attr:`StartReplay.bound`): when the bound passes during an effect, it fails
   that effect with :class:`TailCut` and the course ends the stream.

The courses do no I/O, read no clock (``now`` comes with every answer) and hold
nothing global.  Effects without fields are preallocated singletons.
"""

from __future__ import annotations

import contextlib
from collections.abc import Generator, Sequence
from dataclasses import dataclass
from typing import Final, Protocol, cast

from ._binding import (
    ChannelVerdict,
    channel_refusal,
    channel_verdict,
    parse_channel_token,
    prove_channel,
)
from ._endpoint import DeleteSession, OpenStream, RequestContext
from ._errors import RemoteProtocolError
from ._event_ids import EventId
from ._lifecycle import primes_streams
from ._post import MARK_BOUND, AllocateEpoch, ChannelRecord, LoadSession, MarkBound
from ._resume import (
    StoredFrame,
    StoreTail,
    TailExpire,
    TailPause,
    TailSend,
    check_cursor_channel,
    check_resume_policy,
    displaces_writer,
    standalone_plan,
)
from ._steps import Singleton, Steps
from ._streams import StreamLog, StreamTable


class StreamSession(Protocol):
    """What the courses read of the session a runtime loaded (:class:`LoadSession`)."""

    @property
    def channel(self) -> ChannelRecord | None:
        """The session's channel binding; None where the runtime binds no channels."""

    @property
    def protocol_version(self) -> str:
        """The revision ``initialize`` negotiated."""

    @property
    def streams(self) -> StreamTable:
        """The session's streams held in this process."""


class StoredStream(Protocol):
    """What a shared store knows about one stream (the answer to :class:`LookUpStream`)."""

    @property
    def binding(self) -> int: ...
    @property
    def last_seq(self) -> int: ...
    @property
    def finished(self) -> bool: ...


@dataclass(frozen=True, slots=True)
class StreamRules:
    """How a runtime is configured, as far as GET and DELETE decide (one per server)."""

    #: The resumption policy: ``shared``, ``pinned`` or ``off`` (see ``RESUME_POLICIES``).
    resume: str = "shared"
    #: Other replicas may exist (a shared store): cursors they issued are served from it.
    shared: bool = False
    #: Authorization is on (the principal is proof enough without the channel token).
    authorized: bool = False
    #: Seconds of silence before a keep-alive comment on a replayed stream (None: never).
    keepalive: float | None = None
    #: The producing replica's claim lease (a silent producer is asked about after it).
    lease: float = 30.0
    #: How long a replay from the store may last at most.
    give_up_after: float = 600.0
    #: This replica's id (names the producer of replayed events it cannot name).
    replica: str = ""


class TailCut(Exception):
    """The runtime's bound on a replay (:attr:`StartReplay.bound`) has passed."""


# ---------------------------------------------------------------- effects
class EndSession(Singleton):
    """The session ends: its lifecycle takes DELETE, and it is torn down everywhere
    (answer: None)."""


class Deleted(Singleton):
    """Answer the DELETE ``200`` with no body; the course is over."""


class KeepTailing(Singleton):
    """Answer True while the session and the server still serve (the tail reads on)."""


class EndReplay(Singleton):
    """End the replayed stream's response; the course is over."""


END_SESSION: Final = EndSession("END_SESSION")
DELETED: Final = Deleted("DELETED")
KEEP_TAILING: Final = KeepTailing("KEEP_TAILING")
END_REPLAY: Final = EndReplay("END_REPLAY")
#: A GET or DELETE loads its session like any request that is not a lone call.
_LOAD: Final = LoadSession(verify=True, request_id=None)


@dataclass(frozen=True, slots=True)
class OpenStandalone:
    """Open the session's standalone stream ``epoch`` under ``token``; answer with
    its :class:`~._streams.StreamLog`."""

    epoch: str
    token: tuple[int, str] | None


@dataclass(frozen=True, slots=True)
class PrimeStream:
    """Send stream ``epoch``'s priming event (an id, empty data) in a task of its
    own (answer: None)."""

    epoch: str


@dataclass(frozen=True, slots=True)
class ClaimReader:
    """This connection is stream ``epoch``'s reader now: a close asked of an earlier
    connection is done with, and a writer still attached to an older connection is
    cancelled.  Answer whether there was one."""

    epoch: str


@dataclass(frozen=True, slots=True)
class DetachStream:
    """Detach stream ``epoch`` from the writer just cancelled, so that the new reader
    attaches at once (answer: None)."""

    epoch: str


@dataclass(frozen=True, slots=True)
class WriteStream:
    """Write stream ``epoch`` on this connection from event ``seq`` on, until it
    ends; the course is over."""

    epoch: str
    seq: int


@dataclass(frozen=True, slots=True)
class LookUpStream:
    """Ask the store about stream ``epoch``: answer a :class:`StoredStream`, or None
    if the session never had it."""

    epoch: str


@dataclass(frozen=True, slots=True)
class ReadEvents:
    """Read stream ``epoch``'s stored events after ``after``: answer them (a sequence
    of :class:`~._resume.StoredFrame`), or None if the store no longer holds them."""

    epoch: str
    after: int


@dataclass(frozen=True, slots=True)
class ExpireClaim:
    """Ask the store to expire the claim of the replica producing stream ``epoch`` if
    its lease ran out (the tail's :class:`~._resume.TailExpire`; a store that cannot
    answer now is no reason to stop: answer None)."""

    epoch: str


@dataclass(frozen=True, slots=True)
class StartReplay:
    """Start the replayed stream's response (200).  What follows, up to
    :data:`END_REPLAY`, is bounded by ``bound`` seconds from now: an effect still
    running then is failed with :class:`TailCut` (answer: None)."""

    bound: float


GetEffect = (
    LoadSession
    | MarkBound
    | AllocateEpoch
    | OpenStandalone
    | PrimeStream
    | ClaimReader
    | DetachStream
    | WriteStream
    | LookUpStream
    | ReadEvents
    | StartReplay
    | TailSend
    | TailPause
    | ExpireClaim
    | KeepTailing
    | EndReplay
)
DeleteEffect = LoadSession | MarkBound | EndSession | Deleted

_GetSteps = Generator[GetEffect, object, None]
_DeleteSteps = Generator[DeleteEffect, object, None]


class GetCourse(Steps[GetEffect]):
    """One GET's course (see the module docstring).  A failure of an effect is raised
    again, except :class:`TailCut`, which ends a replay."""

    __slots__ = ("request", "rules")

    def __init__(self, request: OpenStream, rules: StreamRules) -> None:
        super().__init__()
        self.request = request
        self.rules = rules
        self._begin(_get(self))


class DeleteCourse(Steps[DeleteEffect]):
    """One DELETE's course (see the module docstring); nothing to undo on failure."""

    __slots__ = ("request", "rules")

    def __init__(self, request: DeleteSession, rules: StreamRules) -> None:
        super().__init__()
        self.request = request
        self.rules = rules
        self._begin(_delete(self))


def _prove(
    session: StreamSession, ctx: RequestContext, authorized: bool, what: str
) -> Generator[MarkBound, object, tuple[int, str] | None]:
    """Check the request's channel token and prove the channel; the token."""
    token = parse_channel_token(ctx.headers.get("mcp-channel-token"))
    channel = session.channel
    if channel is not None:
        verdict = channel_verdict(channel.generation, channel.secret, token)
        if verdict is not ChannelVerdict.OK:
            raise channel_refusal(verdict, None)
        if prove_channel(
            bound=channel.bound, presented=token is not None, authorized=authorized, what=what
        ):
            yield MARK_BOUND
    return token


def _delete(c: DeleteCourse) -> _DeleteSteps:
    session = cast(StreamSession, (yield _LOAD))
    yield from _prove(session, c.request.ctx, c.rules.authorized, "DELETE")
    del session
    yield END_SESSION
    yield DELETED


def _get(c: GetCourse) -> _GetSteps:
    rules, ctx, cursor = c.rules, c.request.ctx, c.request.last_event_id
    session = cast(StreamSession, (yield _LOAD))
    token = yield from _prove(session, ctx, rules.authorized, "a GET stream")
    check_resume_policy(cursor, rules.resume)
    log: StreamLog | None
    if cursor is None:
        log = session.streams.standalone
        if standalone_plan(log):
            # None yet, or the old one ended (e.g. fenced by a rebind): a new one.
            epoch = cast(str, (yield AllocateEpoch(token[0] if token else 0)))
            log = cast(StreamLog, (yield OpenStandalone(epoch, token)))
        assert log is not None
        seq = log.next_seq
        if rules.resume != "off" and primes_streams(session.protocol_version, ctx.protocol_version):
            yield PrimeStream(log.epoch)
        yield WriteStream(log.epoch, seq)
        return
    try:
        log = session.streams.get(cursor)
    except RemoteProtocolError:
        if not (rules.shared and rules.resume == "shared"):
            raise
        log = None
    if log is None:
        del session
        yield from _replay(c, cursor, token)
        return
    check_cursor_channel(log.binding, token)
    try:
        seq = log.cursor_after(cursor)
    except RemoteProtocolError:
        if not (rules.shared and rules.resume == "shared"):
            raise
        # Past what this replica sent: with a shared store the store may hold more
        # (an append that applied though its reply was lost, after which this
        # replica ended the stream).  The store's log is the authority: replay it.
        del session
        yield from _replay(c, cursor, token)
        return
    if (yield ClaimReader(log.epoch)) and displaces_writer(log):
        # The old connection is presumed dead: the newest reader wins.
        yield DetachStream(log.epoch)
    yield WriteStream(log.epoch, seq)


def _replay(c: GetCourse, cursor: EventId, token: tuple[int, str] | None) -> _GetSteps:
    """Serve a cursor of a stream another replica produced: replay, then tail."""
    rules, epoch = c.rules, cursor.epoch
    info = cast("StoredStream | None", (yield LookUpStream(epoch)))
    tail = StoreTail(
        cursor,
        binding=info.binding if info is not None else None,
        last_seq=info.last_seq if info is not None else -1,
        finished=info.finished if info is not None else False,
        token=token,
        now=c.now,
        keepalive=rules.keepalive,
        lease=rules.lease,
        give_up_after=rules.give_up_after,
        replica=rules.replica,
    )
    events = cast("Sequence[StoredFrame] | None", (yield ReadEvents(epoch, cursor.seq)))
    steps = tail.feed(events, c.now)  # may refuse: before the head
    yield StartReplay(rules.give_up_after)  # the tail's own bound, also over stalled writes
    try:
        while True:
            for step in steps:
                yield ExpireClaim(epoch) if isinstance(step, TailExpire) else step
            if tail.ended or not (yield KEEP_TAILING):
                break
            events = cast("Sequence[StoredFrame] | None", (yield ReadEvents(epoch, tail.after)))
            steps = tail.feed(events, c.now)
    except TailCut:
        pass
    # The bound may run out while the end itself is being written (a reader that
    # stopped reading): the write is cut, the connection is unusable and closes.
    # The stream is over either way; nothing is left to do.
    with contextlib.suppress(TailCut):
        yield END_REPLAY
