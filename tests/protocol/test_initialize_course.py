"""An ``initialize`` POST's course, driven step by step with no runtime: the effects
asked for, in order, for a good request, a malformed one, a refused session, a
runtime without channel tokens, and an answer that could not be sent."""

from __future__ import annotations

import pytest

from weir.protocol import Reason, RemoteProtocolError
from weir.protocol.jsonrpc import Request
from weir.protocol.lifecycle import (
    AnswerInitialize,
    ForgetSession,
    InitializeCourse,
    OpenSession,
)

SID = "s" * 43


def initialize(params: object, rid: int = 7) -> Request:
    return Request(id=rid, method="initialize", params=params)  # type: ignore[arg-type]


GOOD = {
    "protocolVersion": "2025-06-18",
    "capabilities": {"sampling": {}},
    "clientInfo": {"name": "c", "version": "1", "icons": ["big"]},
}


def test_a_good_initialize_opens_a_session_then_answers_with_its_id_and_token() -> None:
    course = InitializeCourse(initialize(GOOD))
    opening = course.start(0.0)
    assert isinstance(opening, OpenSession)
    assert opening.request_id == 7
    assert opening.asked.version == "2025-06-18"
    assert opening.asked.capabilities == {"sampling": {}}
    assert opening.asked.client_info == {"name": "c", "version": "1"}  # (icons not kept)
    answer = course.deliver((SID, "1.tok"), 1.0)
    assert answer == AnswerInitialize(
        [
            ("content-type", "application/json"),
            ("mcp-session-id", SID),
            ("mcp-channel-token", "1.tok"),
        ],
        7,
        "2025-06-18",
    )
    assert course.deliver(None, 2.0) is None


def test_a_runtime_without_channel_tokens_sends_no_token_header() -> None:
    course = InitializeCourse(initialize(GOOD))
    course.start(0.0)
    answer = course.deliver((SID, None), 0.0)
    assert isinstance(answer, AnswerInitialize)
    assert [name for name, _ in answer.headers] == ["content-type", "mcp-session-id"]


def test_an_unserved_revision_negotiates_the_newest() -> None:
    course = InitializeCourse(initialize({**GOOD, "protocolVersion": "1999-01-01"}))
    opening = course.start(0.0)
    assert isinstance(opening, OpenSession)
    assert opening.asked.version != "1999-01-01"
    answer = course.deliver((SID, None), 0.0)
    assert isinstance(answer, AnswerInitialize)
    assert answer.version == opening.asked.version


@pytest.mark.parametrize(
    "params",
    [None, {"capabilities": {}}, {**GOOD, "capabilities": []}, {**GOOD, "clientInfo": "x"}],
    ids=["no-params", "no-version", "capabilities-not-object", "client-info-not-object"],
)
def test_a_malformed_initialize_is_refused_before_any_session_exists(params: object) -> None:
    course = InitializeCourse(initialize(params))
    with pytest.raises(RemoteProtocolError) as refused:
        course.start(0.0)
    assert refused.value.http_status == 400
    assert refused.value.reason is Reason.INVALID_REQUEST
    assert refused.value.request_id == 7


def test_a_refused_session_ends_the_course_with_the_refusal_and_nothing_to_forget() -> None:
    course = InitializeCourse(initialize(GOOD))
    course.start(0.0)
    limit = RemoteProtocolError("full", http_status=503, reason=Reason.SESSION_LIMIT)
    with pytest.raises(RemoteProtocolError) as refused:
        course.fail(limit, 0.0)
    assert refused.value is limit


def test_an_answer_that_could_not_be_sent_forgets_the_session_then_fails() -> None:
    course = InitializeCourse(initialize(GOOD))
    course.start(0.0)
    course.deliver((SID, "1.tok"), 0.0)
    gone = ConnectionResetError("peer went away")
    assert course.fail(gone, 1.0) == ForgetSession(SID)
    with pytest.raises(ConnectionResetError):
        course.deliver(None, 1.0)


def test_only_initialize_has_this_course() -> None:
    with pytest.raises(ValueError, match="not an initialize request"):
        InitializeCourse(Request(id=1, method="tools/list", params={}))
