"""Tests for weir.protocol._states: every (state, input) cell of both tables.

Allowed cells are listed here independently of the module, so a change to a table
has to be made twice, on purpose.
"""

from __future__ import annotations

import enum
import itertools

import pytest

from weir.protocol._errors import LocalProtocolError
from weir.protocol._states import SESSION_TRANSITIONS, STREAM_TRANSITIONS, stream_transition
from weir.protocol.states import (
    SessionInput,
    SessionState,
    StreamInput,
    StreamState,
    session_transition,
)

S, SIN = StreamState, StreamInput
EXPECTED_STREAM: dict[tuple[StreamState, StreamInput], StreamState] = {
    (S.LIVE_DETACHED, SIN.ATTACH): S.LIVE_ATTACHED,
    (S.LIVE_DETACHED, SIN.FINISH): S.FINAL_DETACHED,
    (S.LIVE_DETACHED, SIN.ABORT): S.CLOSED,
    (S.LIVE_ATTACHED, SIN.DETACH): S.LIVE_DETACHED,
    (S.LIVE_ATTACHED, SIN.FINISH): S.FINAL_ATTACHED,
    (S.LIVE_ATTACHED, SIN.ABORT): S.CLOSED,
    (S.FINAL_DETACHED, SIN.ATTACH): S.FINAL_ATTACHED,
    (S.FINAL_DETACHED, SIN.ABORT): S.CLOSED,
    (S.FINAL_ATTACHED, SIN.DETACH): S.FINAL_DETACHED,
    (S.FINAL_ATTACHED, SIN.DELIVERED): S.CLOSED,
    (S.FINAL_ATTACHED, SIN.ABORT): S.CLOSED,
    (S.CLOSED, SIN.ATTACH): S.CLOSED,
    (S.CLOSED, SIN.DETACH): S.CLOSED,
    (S.CLOSED, SIN.DELIVERED): S.CLOSED,
    (S.CLOSED, SIN.ABORT): S.CLOSED,
}

SS, SI = SessionState, SessionInput
EXPECTED_SESSION: dict[tuple[SessionState, SessionInput], SessionState] = {
    (SS.NEW, SI.INITIALIZED): SS.ACTIVE,
    (SS.NEW, SI.REQUEST): SS.NEW,
    (SS.NEW, SI.DELETE): SS.CLOSED,
    (SS.NEW, SI.TEARDOWN): SS.CLOSED,
    (SS.ACTIVE, SI.INITIALIZED): SS.ACTIVE,
    (SS.ACTIVE, SI.REQUEST): SS.ACTIVE,
    (SS.ACTIVE, SI.DELETE): SS.CLOSED,
    (SS.ACTIVE, SI.TEARDOWN): SS.CLOSED,
}

STREAM_CELLS = list(itertools.product(StreamState, StreamInput))
SESSION_CELLS = list(itertools.product(SessionState, SessionInput))


def _cell_id(cell: tuple[enum.Enum, enum.Enum]) -> str:
    return f"{cell[0].value}-{cell[1].value}"


@pytest.mark.parametrize("cell", STREAM_CELLS, ids=_cell_id)
def test_every_stream_cell(cell: tuple[StreamState, StreamInput]) -> None:
    state, event = cell
    if cell in EXPECTED_STREAM:
        assert stream_transition(state, event) is EXPECTED_STREAM[cell]
        assert STREAM_TRANSITIONS[state][event] is EXPECTED_STREAM[cell]
    else:
        with pytest.raises(LocalProtocolError) as info:
            stream_transition(state, event)
        assert state.value in info.value.message
        assert event.value in info.value.message
        assert event not in STREAM_TRANSITIONS.get(state, {})


@pytest.mark.parametrize("cell", SESSION_CELLS, ids=_cell_id)
def test_every_session_cell(cell: tuple[SessionState, SessionInput]) -> None:
    state, event = cell
    if cell in EXPECTED_SESSION:
        assert session_transition(state, event) is EXPECTED_SESSION[cell]
        assert SESSION_TRANSITIONS[state][event] is EXPECTED_SESSION[cell]
    else:
        with pytest.raises(LocalProtocolError) as info:
            session_transition(state, event)
        assert state.value in info.value.message
        assert event.value in info.value.message


def test_tables_hold_exactly_the_expected_cells() -> None:
    stream_cells = {(s, e): t for s, row in STREAM_TRANSITIONS.items() for e, t in row.items()}
    session_cells = {(s, e): t for s, row in SESSION_TRANSITIONS.items() for e, t in row.items()}
    assert stream_cells == EXPECTED_STREAM
    assert session_cells == EXPECTED_SESSION
    assert set(STREAM_TRANSITIONS) == set(StreamState)
    assert set(SESSION_TRANSITIONS) == set(SessionState)


def test_closed_session_is_terminal() -> None:
    for event in SessionInput:
        with pytest.raises(LocalProtocolError):
            session_transition(SessionState.CLOSED, event)


def test_abort_closes_a_stream_from_every_state() -> None:
    for state in StreamState:
        assert stream_transition(state, StreamInput.ABORT) is StreamState.CLOSED


def test_every_stream_state_is_reachable_from_a_new_stream() -> None:
    reachable = {StreamState.LIVE_DETACHED}
    frontier = [StreamState.LIVE_DETACHED]
    while frontier:
        state = frontier.pop()
        for nxt in STREAM_TRANSITIONS[state].values():
            if nxt not in reachable:
                reachable.add(nxt)
                frontier.append(nxt)
    assert reachable == set(StreamState)
