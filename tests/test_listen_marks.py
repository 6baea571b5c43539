"""What a listen response has yet to send (:class:`weir.common.ListenMarks`), the one
set of rules both runtimes' listeners keep: tested without any event loop.

Guarantees checked: only acknowledged kinds, URIs and followed tasks of the
listener's own principal are marked (``mark*`` says whether to wake the sender);
marks coalesce (a kind or a URI once, a task's newest state); ``take`` gives list
notices, then resource updates, then task states, each frame carrying the
subscription id, and clears what it gave.
"""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from weir.common import ListenMarks

TOOLS = "notifications/tools/list_changed"
PROMPTS = "notifications/prompts/list_changed"
UPDATED = "notifications/resources/updated"
TASKS = "notifications/tasks"
SUB = "io.modelcontextprotocol/subscriptionId"


def marks() -> ListenMarks:
    return ListenMarks(
        7, frozenset({TOOLS, PROMPTS}), frozenset({"a://1", "a://2"}), "alice", frozenset({"t1"})
    )


def decoded(frames: list[str]) -> list[tuple[str, dict[str, Any]]]:
    out = []
    for frame in frames:
        msg = json.loads(frame)
        assert msg["params"]["_meta"] == {SUB: 7} and "id" not in msg
        params = {k: v for k, v in msg["params"].items() if k != "_meta"}
        out.append((msg["method"], params))
    return out


def test_only_what_was_acknowledged_is_marked() -> None:
    m = marks()
    assert not m.mark("notifications/resources/list_changed", None)  # kind not asked
    assert not m.mark(UPDATED, "a://3")  # URI not acknowledged
    assert not m.mark_task("alice", "t2", {"taskId": "t2"})  # task not followed
    assert not m.mark_task("bob", "t1", {"taskId": "t1"})  # another principal's t1
    assert m.take() == []


def test_marks_coalesce_and_come_out_in_order_once() -> None:
    m = marks()
    assert m.mark_task("alice", "t1", {"taskId": "t1", "status": "working"})
    assert m.mark(UPDATED, "a://2") and m.mark(UPDATED, "a://1") and m.mark(UPDATED, "a://2")
    assert m.mark(TOOLS, None) and m.mark(PROMPTS, None) and m.mark(TOOLS, None)
    assert m.mark_task("alice", "t1", {"taskId": "t1", "status": "completed"})
    assert decoded(m.take()) == [
        (PROMPTS, {}),
        (TOOLS, {}),
        (UPDATED, {"uri": "a://1"}),
        (UPDATED, {"uri": "a://2"}),
        (TASKS, {"taskId": "t1", "status": "completed"}),  # the newest state only
    ]
    assert m.take() == []  # taken once


@given(
    st.lists(
        st.one_of(
            st.tuples(st.sampled_from([TOOLS, PROMPTS, "x/y"]), st.none()),
            st.tuples(st.just(UPDATED), st.sampled_from(["a://1", "a://2", "a://9"])),
        ),
        max_size=40,
    )
)
def test_one_frame_per_distinct_wanted_change(changes: list[tuple[str, str | None]]) -> None:
    m = marks()
    woke = [m.mark(method, uri) for method, uri in changes]
    wanted = {(meth, uri) for meth, uri in changes if (uri in m.uris if uri else meth in m.kinds)}
    assert any(woke) == bool(wanted)
    got = {(meth, p.get("uri")) for meth, p in decoded(m.take())}
    assert got == wanted
