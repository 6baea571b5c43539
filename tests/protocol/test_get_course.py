"""A GET's and a DELETE's courses, driven step by step with no runtime: every effect
sequence asserted as data (fresh stream, standalone conflict, resume with a cursor,
unknown and trimmed cursors, stale and foreign tokens, the first token binding,
displacement of an older writer, a replay from the store and its tail, DELETE)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest

from weir.protocol import DeleteSession, OpenStream, Reason, RemoteProtocolError
from weir.protocol._endpoint import RequestContext
from weir.protocol._event_ids import EventId
from weir.protocol._http_events import Headers
from weir.protocol.get import (
    DELETED,
    END_REPLAY,
    END_SESSION,
    KEEP_TAILING,
    ClaimReader,
    DeleteCourse,
    DetachStream,
    ExpireClaim,
    GetCourse,
    LookUpStream,
    OpenStandalone,
    PrimeStream,
    ReadEvents,
    StartReplay,
    StreamRules,
    TailCut,
    WriteStream,
)
from weir.protocol.post import MARK_BOUND, AllocateEpoch, LoadSession
from weir.protocol.resume import KEEPALIVE, TailPause, TailSend
from weir.protocol.states import StreamInput
from weir.protocol.streams import StreamKind, StreamLog, StreamTable

SID = "s" * 22
EP = "0000000a"
OTHER = "0000000b"
LOAD = LoadSession(verify=True, request_id=None)


@dataclass(frozen=True)
class Channel:
    generation: int = 1
    secret: str = "sekrit"
    bound: bool = False


@dataclass
class FakeSession:
    """A session as a runtime would answer :class:`LoadSession` with (plain data)."""

    channel: Channel | None = field(default_factory=Channel)
    protocol_version: str = "2025-11-25"
    streams: StreamTable = field(default_factory=StreamTable)


@dataclass(frozen=True)
class Info:
    binding: int = 0
    last_seq: int = 3
    finished: bool = False


@dataclass(frozen=True)
class Event:
    seq: int
    data: bytes = b"{}"
    final: bool = False
    replica: str = "r2"


def ctx(version: str = "2025-11-25", **headers: str) -> RequestContext:
    return RequestContext(session_id=SID, protocol_version=version, headers=Headers.of(**headers))


def get(cursor: EventId | None = None, **headers: str) -> OpenStream:
    return OpenStream(ctx=ctx(**headers), last_event_id=cursor)


def stream(
    session: FakeSession,
    epoch: str = EP,
    kind: StreamKind = StreamKind.REQUEST,
    events: int = 3,
    binding: int = 0,
) -> StreamLog:
    log = session.streams.add(StreamLog(epoch, kind, binding=binding))
    for _ in range(events):
        log.append("{}")
    return log


class Driver:
    """Delivers scripted answers; records every effect the course asks for."""

    def __init__(self, course: GetCourse | DeleteCourse) -> None:
        self.course = course
        self.effects: list[Any] = []
        self.now = 0.0
        self.effect: Any = course.start(self.now)

    def step(self, answer: object = None) -> Any:
        assert self.effect is not None
        self.effects.append(self.effect)
        self.effect = self.course.deliver(answer, self.now)
        return self.effect

    def fail(self, exc: BaseException) -> Any:
        assert self.effect is not None
        self.effects.append(self.effect)
        self.effect = self.course.fail(exc, self.now)
        return self.effect


RULES = StreamRules(resume="pinned")
SHARED = StreamRules(resume="shared", shared=True, keepalive=None, lease=30.0, give_up_after=60.0)


# ---------------------------------------------------------------- the standalone stream
def test_a_fresh_standalone_stream_is_allocated_opened_primed_and_written() -> None:
    session = FakeSession(channel=Channel(bound=True))
    d = Driver(GetCourse(get(mcp_channel_token="1.sekrit"), RULES))
    assert d.effect == LOAD
    assert d.step(session) == AllocateEpoch(1)  # under the token's generation
    assert d.step(EP) == OpenStandalone(EP, (1, "sekrit"))
    log = session.streams.add(StreamLog(EP, StreamKind.STANDALONE))
    assert d.step(log) == PrimeStream(EP)
    assert d.step() == WriteStream(EP, 0)  # the priming event is seq 0: written too
    assert d.step() is None


def test_an_idle_standalone_stream_is_attached_from_its_next_event_unprimed_for_old_clients() -> (
    None
):
    session = FakeSession(protocol_version="2025-03-26")
    stream(session, kind=StreamKind.STANDALONE, events=2)
    d = Driver(GetCourse(OpenStream(ctx=ctx("2025-03-26"), last_event_id=None), RULES))
    d.step(session)
    assert d.effects == [LOAD] and d.effect == WriteStream(EP, 2)


def test_priming_is_off_without_resumption() -> None:
    session = FakeSession()
    d = Driver(GetCourse(get(), StreamRules(resume="off")))
    assert d.step(session) == AllocateEpoch(0)
    d.step(EP)
    assert d.step(session.streams.add(StreamLog(EP, StreamKind.STANDALONE))) == WriteStream(EP, 0)


def test_a_second_reader_of_a_live_standalone_stream_is_409_stream_conflict() -> None:
    session = FakeSession()
    stream(session, kind=StreamKind.STANDALONE).handle(StreamInput.ATTACH)
    d = Driver(GetCourse(get(), RULES))
    with pytest.raises(RemoteProtocolError) as err:
        d.step(session)
    assert err.value.reason is Reason.STREAM_CONFLICT and err.value.http_status == 409


def test_an_ended_standalone_stream_is_replaced() -> None:
    session = FakeSession()
    stream(session, kind=StreamKind.STANDALONE).handle(StreamInput.ABORT)
    d = Driver(GetCourse(get(), RULES))
    assert isinstance(d.step(session), AllocateEpoch)


# ---------------------------------------------------------------- channel tokens
def test_the_first_token_that_proves_the_channel_binds_the_session() -> None:
    session = FakeSession(channel=Channel(bound=False))
    stream(session, kind=StreamKind.STANDALONE)
    d = Driver(GetCourse(get(mcp_channel_token="1.sekrit"), RULES))
    assert d.step(session) is MARK_BOUND
    assert d.step() == PrimeStream(EP)


def test_a_bound_session_is_not_bound_again() -> None:
    session = FakeSession(channel=Channel(bound=True))
    stream(session, kind=StreamKind.STANDALONE)
    d = Driver(GetCourse(get(mcp_channel_token="1.sekrit"), RULES))
    assert d.step(session) == PrimeStream(EP)


@pytest.mark.parametrize(
    ("token", "reason"),
    [
        ("0.sekrit", Reason.CURSOR_STALE),  # fenced by a rebind
        ("1.wrong", Reason.CHANNEL_UNBOUND),
        ("2.sekrit", Reason.CHANNEL_UNBOUND),  # a generation from the future
        ("garbage", Reason.CHANNEL_UNBOUND),
    ],
)
def test_a_bad_token_is_refused_409_before_anything_is_bound(token: str, reason: Reason) -> None:
    session = FakeSession(channel=Channel(generation=1, bound=False))
    stream(session, kind=StreamKind.STANDALONE)
    d = Driver(GetCourse(get(mcp_channel_token=token), RULES))
    with pytest.raises(RemoteProtocolError) as err:
        d.step(session)
    assert err.value.reason is reason and err.value.http_status == 409
    assert d.effects == [LOAD]


def test_a_bound_session_needs_its_token_unless_authorized() -> None:
    session = FakeSession(channel=Channel(bound=True))
    stream(session, kind=StreamKind.STANDALONE)
    d = Driver(GetCourse(get(), RULES))
    with pytest.raises(RemoteProtocolError) as err:
        d.step(session)
    assert err.value.reason is Reason.CHANNEL_UNBOUND and "GET stream" in str(err.value)
    d = Driver(GetCourse(get(), StreamRules(resume="pinned", authorized=True)))
    assert d.step(session) == PrimeStream(EP)  # the principal is the proof


# ---------------------------------------------------------------- resumption here
def test_resume_with_a_cursor_writes_from_the_event_after_it() -> None:
    session = FakeSession()
    stream(session, events=5)
    d = Driver(GetCourse(get(EventId(EP, 2)), RULES))
    assert d.step(session) == ClaimReader(EP)
    assert d.step(False) == WriteStream(EP, 3)  # no writer was attached: nothing displaced
    assert d.step() is None


def test_the_newest_reader_displaces_the_old_writer() -> None:
    session = FakeSession()
    stream(session, events=5).handle(StreamInput.ATTACH)
    d = Driver(GetCourse(get(EventId(EP, 4)), RULES))
    assert d.step(session) == ClaimReader(EP)
    assert d.step(True) == DetachStream(EP)
    assert d.step() == WriteStream(EP, 5)


def test_a_displaced_writer_of_a_detached_stream_needs_no_detach() -> None:
    session = FakeSession()
    stream(session, events=5)  # LIVE_DETACHED: its writer is on its way out already
    d = Driver(GetCourse(get(EventId(EP, 4)), RULES))
    d.step(session)
    assert d.step(True) == WriteStream(EP, 5)


@pytest.mark.parametrize("cursor", [EventId(OTHER, 0), EventId(EP, 9)])
def test_an_unknown_cursor_is_409_cursor_unknown_without_a_shared_store(cursor: EventId) -> None:
    session = FakeSession()
    stream(session, events=3)
    d = Driver(GetCourse(get(cursor), RULES))
    with pytest.raises(RemoteProtocolError) as err:
        d.step(session)
    assert err.value.reason is Reason.CURSOR_UNKNOWN and err.value.http_status == 409
    assert d.effects == [LOAD]  # never a resume from the head


def test_a_cursor_under_resumption_off_is_409() -> None:
    session = FakeSession()
    stream(session)
    d = Driver(GetCourse(get(EventId(EP, 0)), StreamRules(resume="off")))
    with pytest.raises(RemoteProtocolError) as err:
        d.step(session)
    assert err.value.reason is Reason.CURSOR_UNKNOWN


def test_a_cursor_of_another_channel_generation_is_409() -> None:
    session = FakeSession(channel=Channel(generation=2, bound=True))
    stream(session, binding=1)  # opened before a rebind
    d = Driver(GetCourse(get(EventId(EP, 0), mcp_channel_token="2.sekrit"), RULES))
    with pytest.raises(RemoteProtocolError) as err:
        d.step(session)
    assert err.value.reason is Reason.CHANNEL_UNBOUND


def test_a_stale_token_with_a_cursor_is_409_cursor_stale() -> None:
    session = FakeSession(channel=Channel(generation=2, bound=True))
    stream(session, binding=1)
    d = Driver(GetCourse(get(EventId(EP, 0), mcp_channel_token="1.sekrit"), RULES))
    with pytest.raises(RemoteProtocolError) as err:
        d.step(session)
    assert err.value.reason is Reason.CURSOR_STALE


# ---------------------------------------------------------------- replay from the store
def test_a_cursor_held_elsewhere_is_replayed_from_the_store_then_tailed_to_its_end() -> None:
    session = FakeSession()
    d = Driver(GetCourse(get(EventId(OTHER, 1)), SHARED))
    assert d.step(session) == LookUpStream(OTHER)
    assert d.step(Info(last_seq=3)) == ReadEvents(OTHER, 1)
    assert d.step([Event(2), Event(3)]) == StartReplay(60.0)
    send = d.step()
    assert isinstance(send, TailSend) and b"id: 0000000b:2" in send.data
    assert b"id: 0000000b:3" in send.data and b"replica=r2" in send.data
    assert d.step() is KEEP_TAILING
    assert d.step(True) == ReadEvents(OTHER, 3)  # from the last event sent
    d.now = 0.5
    last = d.step([Event(4, final=True)])
    assert isinstance(last, TailSend) and b"id: 0000000b:4" in last.data
    assert d.step() is END_REPLAY  # the final event ends the tail: no more reads
    assert d.step() is None


def test_a_quiet_tail_pauses_and_asks_about_a_silent_producer() -> None:
    session = FakeSession()
    d = Driver(GetCourse(get(EventId(OTHER, 3)), SHARED))
    d.step(session)
    d.step(Info(last_seq=3))
    d.now = 31.0  # past the lease since the tail began
    assert d.step([]) == StartReplay(60.0)
    assert d.step() == ExpireClaim(OTHER)
    pause = d.step()
    assert isinstance(pause, TailPause) and pause.until > d.now
    assert d.step() is KEEP_TAILING
    assert d.step(False) is END_REPLAY  # the session or the server stopped serving


def test_keepalives_on_a_quiet_replay() -> None:
    rules = StreamRules(resume="shared", shared=True, keepalive=5.0, give_up_after=60.0)
    d = Driver(GetCourse(get(EventId(OTHER, 3)), rules))
    d.step(FakeSession())
    d.step(Info(last_seq=3))
    d.now = 6.0
    d.step([])
    assert d.step() == TailSend(KEEPALIVE)


def test_the_runtime_bound_cuts_the_tail_and_the_course_ends_the_stream() -> None:
    d = Driver(GetCourse(get(EventId(OTHER, 3)), SHARED))
    d.step(FakeSession())
    d.step(Info(last_seq=3))
    d.step([])
    d.step()  # StartReplay -> TailPause
    assert isinstance(d.effect, TailPause)
    assert d.fail(TailCut()) is END_REPLAY
    assert d.step() is None


def test_the_bound_running_out_while_the_end_is_written_ends_the_course() -> None:
    """Found by the simulator (a stalled reader): the cut can land on END_REPLAY's
    own write; the course ends there instead of raising TailCut at its driver."""
    d = Driver(GetCourse(get(EventId(OTHER, 3)), SHARED))
    d.step(FakeSession())
    d.step(Info(last_seq=3))
    d.step([])
    d.step()
    assert d.fail(TailCut()) is END_REPLAY
    assert d.fail(TailCut()) is None


def test_a_peer_gone_during_the_tail_is_raised_not_ended() -> None:
    d = Driver(GetCourse(get(EventId(OTHER, 1)), SHARED))
    d.step(FakeSession())
    d.step(Info())
    d.step([Event(2)])
    d.step()  # -> TailSend
    gone = ConnectionResetError()
    with pytest.raises(ConnectionResetError):
        d.fail(gone)


def test_an_unknown_cursor_in_the_store_is_409_before_the_response_starts() -> None:
    d = Driver(GetCourse(get(EventId(OTHER, 1)), SHARED))
    d.step(FakeSession())
    with pytest.raises(RemoteProtocolError) as err:
        d.step(None)  # the store never had the stream
    assert err.value.reason is Reason.CURSOR_UNKNOWN
    d = Driver(GetCourse(get(EventId(OTHER, 1)), SHARED))
    d.step(FakeSession())
    d.step(Info())
    with pytest.raises(RemoteProtocolError) as err:
        d.step(None)  # trimmed: the store no longer holds the events after the cursor
    assert err.value.reason is Reason.CURSOR_UNKNOWN
    assert not any(isinstance(e, StartReplay) for e in d.effects)


def test_a_cursor_past_what_this_replica_sent_is_asked_of_a_shared_store() -> None:
    """Found by the simulator: an append that applied though its reply was lost.
    This replica ended the stream at seq 2 (it thinks seq 3 was never stored); the
    client got seq 3 from another replica's replay and comes back here.  The store,
    not this replica's log, says what happened after the cursor."""
    session = FakeSession()
    stream(session, events=3)  # seqs 0..2 sent here
    d = Driver(GetCourse(get(EventId(EP, 3)), SHARED))
    assert d.step(session) == LookUpStream(EP)
    d.step(Info(last_seq=3))
    assert d.step([]) == StartReplay(60.0)  # resumed after seq 3: nothing from the head
    # Without a shared store, the same cursor is still refused (tested above).


def test_a_stored_stream_of_another_channel_is_refused() -> None:
    session = FakeSession(channel=Channel(generation=2, bound=True))
    d = Driver(GetCourse(get(EventId(OTHER, 1), mcp_channel_token="2.sekrit"), SHARED))
    assert d.step(session) == LookUpStream(OTHER)
    with pytest.raises(RemoteProtocolError) as err:
        d.step(Info(binding=1))
    assert err.value.reason is Reason.CHANNEL_UNBOUND


def test_pinned_resumption_never_asks_the_store() -> None:
    rules = StreamRules(resume="pinned", shared=True)
    d = Driver(GetCourse(get(EventId(OTHER, 1)), rules))
    with pytest.raises(RemoteProtocolError) as err:
        d.step(FakeSession())
    assert err.value.reason is Reason.CURSOR_UNKNOWN and d.effects == [LOAD]


# ---------------------------------------------------------------- DELETE
def delete(**headers: str) -> DeleteSession:
    return DeleteSession(ctx=ctx(**headers))


def test_delete_ends_the_session_and_answers_200() -> None:
    d = Driver(DeleteCourse(delete(), RULES))
    assert d.effect == LOAD
    assert d.step(FakeSession()) is END_SESSION
    assert d.step() is DELETED
    assert d.step() is None


def test_delete_of_a_bound_session_without_its_token_is_409() -> None:
    d = Driver(DeleteCourse(delete(), RULES))
    with pytest.raises(RemoteProtocolError) as err:
        d.step(FakeSession(channel=Channel(bound=True)))
    assert err.value.reason is Reason.CHANNEL_UNBOUND and "DELETE" in str(err.value)
    assert d.effects == [LOAD]  # nothing ended


def test_delete_with_the_first_token_binds_then_ends() -> None:
    d = Driver(DeleteCourse(delete(mcp_channel_token="1.sekrit"), RULES))
    assert d.step(FakeSession()) is MARK_BOUND
    assert d.step() is END_SESSION


def test_delete_with_a_stale_token_is_409_cursor_stale() -> None:
    d = Driver(DeleteCourse(delete(mcp_channel_token="1.sekrit"), RULES))
    with pytest.raises(RemoteProtocolError) as err:
        d.step(FakeSession(channel=Channel(generation=2)))
    assert err.value.reason is Reason.CURSOR_STALE


def test_a_runtime_that_binds_no_channels_is_never_asked_to() -> None:
    d = Driver(DeleteCourse(delete(mcp_channel_token="1.sekrit"), RULES))
    assert d.step(FakeSession(channel=None)) is END_SESSION


def test_effects_without_fields_are_singletons() -> None:
    one, two = Driver(DeleteCourse(delete(), RULES)), Driver(DeleteCourse(delete(), RULES))
    assert one.step(FakeSession()) is two.step(FakeSession()) is END_SESSION
    assert repr(END_SESSION) == "END_SESSION" and repr(KEEP_TAILING) == "KEEP_TAILING"
