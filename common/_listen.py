"""What a ``subscriptions/listen`` stream says (MCP 2026-07-28), whichever loop writes it.

Theory of operation
-------------------
A listener's first message acknowledges what the server will send it
(:func:`honoured`: the kinds asked for that this app can change, and at most
:data:`MAX_URIS` resource URIs of at most :data:`MAX_URI` characters); every message
on its stream carries the request's id as
``_meta["io.modelcontextprotocol/subscriptionId"]`` (:func:`listen_frame`), and the
stream's last message, when the server ends it, is :func:`listen_closing`.  Both
runtimes send these same bytes; how they wait, and within whose credit, is theirs.

With the tasks extension a listener may follow up to :data:`MAX_TASK_IDS` of its
principal's tasks (:func:`tasks_asked`); a change of one travels between replicas on
the store's change bus as :data:`TASK_NOTIFICATION` naming ``(principal, task id)``
(:func:`task_change_where`, :func:`task_change_read`), and each replica that has a
follower reads the record again: the bus never carries a task's content.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Final, Protocol

import msgspec

from weir.protocol.jsonrpc import RequestId, encode_notification, encode_result
from weir.protocol.sessionless import META_SUBSCRIPTION_ID
from weir.protocol.tasks import TaskRecord, detailed, not_declared

#: The most resource URIs one subscription may watch (more are not acknowledged).
MAX_URIS: Final = 256
#: The longest resource URI a subscription may watch.
MAX_URI: Final = 2048

#: The most tasks one listener may follow.
MAX_TASK_IDS: Final = 64
#: The method a task's change goes on the bus (and to listeners) as.
TASK_NOTIFICATION: Final = "notifications/tasks"

#: Listen flag -> the notification it asks for.
KINDS: Final = {
    "toolsListChanged": "notifications/tools/list_changed",
    "promptsListChanged": "notifications/prompts/list_changed",
    "resourcesListChanged": "notifications/resources/list_changed",
}


def listen_frame(request_id: RequestId, method: str, params: dict[str, Any] | None = None) -> str:
    """A notification on the listen stream of request ``request_id``."""
    body = {**(params or {}), "_meta": {META_SUBSCRIPTION_ID: request_id}}
    return encode_notification(method, body).decode()


def listen_ack(request_id: RequestId, honoured_flags: dict[str, Any]) -> str:
    """The stream's first message: what it will be told about."""
    return listen_frame(
        request_id, "notifications/subscriptions/acknowledged", {"notifications": honoured_flags}
    )


def listen_closing(request_id: RequestId) -> str:
    """The final result of a subscription the server ends (at shutdown)."""
    meta = {META_SUBSCRIPTION_ID: request_id}
    return encode_result(request_id, {"resultType": "complete", "_meta": meta}).decode()


def honoured(
    asked: object, capabilities: dict[str, Any]
) -> tuple[dict[str, Any], frozenset[str], frozenset[str]]:
    """What a listen request asked for that the server will send: the acknowledged
    flags (as the client spelled them), the notification methods, the URIs."""
    flags: dict[str, Any] = {}
    kinds: set[str] = set()
    uris: list[str] = []
    if not isinstance(asked, dict):
        return flags, frozenset(), frozenset()
    changes = {
        "toolsListChanged": "tools",
        "promptsListChanged": "prompts",
        "resourcesListChanged": "resources",
    }
    for flag, cap in changes.items():
        if asked.get(flag) is True and isinstance(capabilities.get(cap), dict):
            flags[flag] = True
            kinds.add(KINDS[flag])
    wanted = asked.get("resourceSubscriptions")
    if isinstance(wanted, list) and isinstance(capabilities.get("resources"), dict):
        for uri in wanted:
            if isinstance(uri, str) and 0 < len(uri) <= MAX_URI and uri not in uris:
                uris.append(uri)
            if len(uris) >= MAX_URIS:
                break
        if uris:
            flags["resourceSubscriptions"] = uris
    return flags, frozenset(kinds), frozenset(uris)


def tasks_asked(asked: object, tasks_declared: bool, request_id: RequestId) -> list[str]:
    """The task ids a listen request's ``notifications.taskIds`` names (at most
    :data:`MAX_TASK_IDS`, each 1-256 characters); which are the principal's own is
    the store's to say.

    Raises:
        RemoteProtocolError: 400 -32021 for task ids asked without the tasks
            extension declared.
    """
    wanted = asked.get("taskIds") if isinstance(asked, dict) else None
    if not isinstance(wanted, list) or not wanted:
        return []
    if not tasks_declared:
        raise not_declared(request_id)
    names = [t for t in wanted if isinstance(t, str) and 0 < len(t) <= 256]
    return names[:MAX_TASK_IDS]


def task_change_where(principal: str, task_id: str) -> str:
    """What a task change on the bus names: its principal and id, nothing else."""
    return msgspec.json.encode([principal, task_id]).decode()


def task_change_read(where: str) -> tuple[str, str] | None:
    """``(principal, task id)`` of a task change read off the bus (None: malformed)."""
    try:
        principal, task_id = msgspec.json.decode(where)
    except (msgspec.DecodeError, ValueError, TypeError):
        return None
    if not isinstance(principal, str) or not isinstance(task_id, str):
        return None
    return principal, task_id


class ListenMarks:
    """What one listen response has yet to send, kept without any event loop.

    A change only marks (:meth:`mark`, :meth:`mark_task`); the runtime's sender wakes
    when a mark was made and sends :meth:`take`'s frames within its owner's credit.
    Guarantees: only what the listener was acknowledged is marked (its kinds, its
    URIs, the tasks it follows and only for its own principal); marks coalesce (a
    kind or URI once however often it changed, a task's newest state); :meth:`take`
    gives list notices, then resource updates, then task states, each kind sorted
    or in marking order, and clears what it gave.  At most one mark per kind, URI
    (:data:`MAX_URIS`) and task (:data:`MAX_TASK_IDS`) is ever held.
    """

    __slots__ = (
        "_kinds_marked",
        "_states",
        "_updated",
        "kinds",
        "principal",
        "request_id",
        "task_ids",
        "uris",
    )

    def __init__(
        self,
        request_id: RequestId,
        kinds: frozenset[str],
        uris: frozenset[str],
        principal: str = "",
        task_ids: frozenset[str] = frozenset(),
    ) -> None:
        self.request_id = request_id
        #: Notification methods acknowledged; resource URIs acknowledged.
        self.kinds, self.uris = kinds, uris
        #: Who listens (a task's status goes only to its own principal's listeners).
        self.principal = principal
        #: Tasks whose status this listener agreed to send (the tasks extension).
        self.task_ids = task_ids
        self._kinds_marked: set[str] = set()
        self._updated: set[str] = set()
        self._states: dict[str, dict[str, Any]] = {}

    def mark(self, method: str, uri: str | None) -> bool:
        """Mark a list change (``uri`` None) or a resource's update, if this listener
        was acknowledged it; True if marked (its sender should wake)."""
        if uri is not None:
            if uri not in self.uris:
                return False
            self._updated.add(uri)
        elif method in self.kinds:
            self._kinds_marked.add(method)
        else:
            return False
        return True

    def mark_task(self, principal: str, task_id: str, state: dict[str, Any]) -> bool:
        """Mark task ``task_id``'s new state, if this listener follows it and is its
        principal's (the newest state replaces an unsent one); True if marked."""
        if task_id not in self.task_ids or principal != self.principal:
            return False
        self._states[task_id] = state
        return True

    def take(self) -> list[str]:
        """The frames to send now, in order, the marks they came from cleared."""
        rid = self.request_id
        frames = [listen_frame(rid, method) for method in sorted(self._kinds_marked)]
        updated = "notifications/resources/updated"
        frames += [listen_frame(rid, updated, {"uri": uri}) for uri in sorted(self._updated)]
        frames += [listen_frame(rid, TASK_NOTIFICATION, s) for s in self._states.values()]
        self._kinds_marked, self._updated, self._states = set(), set(), {}
        return frames


class TaskFollower(Protocol):
    """A listener as :func:`deliver_task` sees it (either runtime's)."""

    @property
    def marks(self) -> ListenMarks: ...

    def notify_task(self, principal: str, task_id: str, state: dict[str, Any]) -> None: ...


def deliver_task(listeners: Iterable[TaskFollower], principal: str, record: TaskRecord) -> None:
    """Give ``record``'s state (as ``tasks/get`` answers it, without ``resultType``) to
    each of ``listeners`` that follows the task; nothing is built when none does."""
    following = [s for s in listeners if record.id in s.marks.task_ids]
    if not following:
        return  # (the common case: nobody here listens)
    state = detailed(record)
    state.pop("resultType", None)
    for listener in following:
        listener.notify_task(principal, record.id, state)
