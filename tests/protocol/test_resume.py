"""Tests for weir.protocol._resume: which stream a GET attaches to, who may resume."""

from __future__ import annotations

import pytest

from weir.protocol import Reason, RemoteProtocolError
from weir.protocol._event_ids import EventId
from weir.protocol._resume import check_cursor_channel, check_resume_policy, standalone_plan
from weir.protocol.resume import displaces_writer
from weir.protocol.states import StreamInput
from weir.protocol.streams import StreamKind, StreamLog


def _stream(*inputs: StreamInput, kind: StreamKind = StreamKind.STANDALONE) -> StreamLog:
    log = StreamLog("0000abcd", kind)
    for event in inputs:
        log.handle(event)
    return log


def test_a_cursor_is_refused_only_when_resumption_is_off() -> None:
    cursor = EventId("0000abcd", 3)
    for policy in ("shared", "pinned"):
        check_resume_policy(cursor, policy)
    check_resume_policy(None, "off")  # a fresh GET is fine
    with pytest.raises(RemoteProtocolError) as info:
        check_resume_policy(cursor, "off")
    assert (info.value.http_status, info.value.reason) == (409, Reason.CURSOR_UNKNOWN)


def test_a_second_live_standalone_stream_is_a_conflict() -> None:
    assert standalone_plan(None) is True  # none yet: open one
    assert standalone_plan(_stream(StreamInput.ABORT)) is True  # ended: a new one
    assert standalone_plan(_stream()) is False  # detached: attach to it
    with pytest.raises(RemoteProtocolError) as info:
        standalone_plan(_stream(StreamInput.ATTACH))
    assert (info.value.http_status, info.value.reason) == (409, Reason.STREAM_CONFLICT)


@pytest.mark.parametrize(
    ("binding", "token", "ok"),
    [(0, None, True), (2, (2, "s"), True), (2, (3, "s"), False), (0, (1, "s"), False)],
)
def test_a_cursor_resumes_only_on_the_channel_it_was_issued_on(
    binding: int, token: tuple[int, str] | None, ok: bool
) -> None:
    if ok:
        check_cursor_channel(binding, token)
        return
    with pytest.raises(RemoteProtocolError) as info:
        check_cursor_channel(binding, token)
    assert (info.value.http_status, info.value.reason) == (409, Reason.CHANNEL_UNBOUND)


def test_the_newest_reader_displaces_an_attached_writer_only() -> None:
    request = StreamKind.REQUEST
    assert displaces_writer(_stream(StreamInput.ATTACH, kind=request))
    attached_final = _stream(StreamInput.ATTACH, kind=request)
    attached_final.append("{}", final=True)
    assert displaces_writer(attached_final)
    assert not displaces_writer(_stream(kind=request))
    assert not displaces_writer(_stream(StreamInput.ATTACH, StreamInput.DETACH, kind=request))
    assert not displaces_writer(_stream(StreamInput.ABORT, kind=request))
