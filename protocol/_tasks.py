"""Tasks (the ``io.modelcontextprotocol/tasks`` extension): the record and its rules.

Theory of operation
-------------------
A *task* is a ``tools/call`` answered with a handle instead of its result: the
client polls ``tasks/get`` until the task is terminal (the result, or the error,
is inlined then), answers the task's questions with ``tasks/update``, and stops it
with ``tasks/cancel``.  Any replica may receive any of these, so everything a task
is lives in one :class:`TaskRecord` in the shared store, written only over the
version its writer read; this module is that record and the pure rules over it.
It reads no clock (the wall clock comes in as ``wall``, seconds since the epoch:
the wire's timestamps are wall time, and leases are judged by it) and does no I/O.

**States.**  ``working`` (a replica runs the handler, under a lease),
``input_required`` (the handler asked for input: nobody runs it; the questions
are in :attr:`TaskRecord.asks`), and the terminal ``completed`` (the tool's
result, an ``isError`` result included), ``failed`` (a protocol-level error:
the handler raised one, or its replica went away) and ``cancelled``.  A terminal
task never changes again.

**Runs.**  A handler runs from its start each time it runs, with every answer
gathered so far (as a sessionless request's rounds do): the first run when the
task is created, another when ``tasks/update`` answers the last open question.
Each run has a number (:attr:`TaskRecord.run`); a runner writes only while the
record still names its run and is ``working``, so a cancelled task, or one another
replica declared lost, is never overwritten by a late runner.

**Leases.**  A ``working`` record names its runner (``owner``) and a wall-clock
``lease_until`` the runner moves forward while it runs.  A reader that finds the
lease run out by more than :data:`CLOCK_SKEW` records the task ``failed`` (reason
``interrupted``) -- it is never run again, since its handler may have had effects.
Replicas' clocks are assumed within :data:`CLOCK_SKEW` of one another; a larger
skew can only fail a live task early, never run one twice.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import Any, Final

import msgspec

from ._errors import INTERNAL_ERROR, INVALID_PARAMS, Reason, RemoteProtocolError
from ._jsonrpc import RequestId

#: The extension's identifier (capabilities, ``requiredCapabilities``).
TASKS_EXTENSION: Final = "io.modelcontextprotocol/tasks"
#: The methods the extension adds (each names its task in ``params.taskId``).
TASK_METHODS: Final = frozenset({"tasks/get", "tasks/update", "tasks/cancel"})
#: Seconds two replicas' wall clocks may differ by before a live lease looks run out.
CLOCK_SKEW: Final = 2.0
#: The error code of a task failed for want of its runner, and of a task whose
#: handler failed outside the tool's own reporting.
TASK_FAILED_CODE: Final = INTERNAL_ERROR


class TaskSupport(enum.Enum):
    """How a tool may be run as a task (``execution.taskSupport`` in ``tools/list``)."""

    FORBIDDEN = "forbidden"
    OPTIONAL = "optional"
    REQUIRED = "required"


class TaskStatus(enum.Enum):
    """A task's status on the wire."""

    WORKING = "working"
    INPUT_REQUIRED = "input_required"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def terminal(self) -> bool:
        """Is this an end (``completed``, ``failed``, ``cancelled``)?"""
        return self in _TERMINAL


_TERMINAL: Final = frozenset({TaskStatus.COMPLETED, TaskStatus.FAILED, TaskStatus.CANCELLED})


class TaskRecord(msgspec.Struct, frozen=True, kw_only=True):
    """Everything a task is, as the store keeps it (see the module docstring)."""

    #: The id handed to the client (unguessable; minted by the runtime).
    id: str
    status: str
    #: Wall-clock seconds of creation and of the last change.
    created: float
    updated: float
    ttl_ms: int
    poll_ms: int
    #: The ``tools/call`` params the handler runs with (name, arguments, ``_meta``).
    params: dict[str, Any]
    message: str | None = None
    #: Questions still open (``input_required``): key -> ``{"method", "params"}``.
    asks: dict[str, Any] = {}
    #: Every answer gathered so far: key -> the client's response.
    answers: dict[str, Any] = {}
    #: The tool's result (``completed``) or the JSON-RPC error (``failed``).
    result: dict[str, Any] | None = None
    error: dict[str, Any] | None = None
    #: The replica running the handler, its lease (wall seconds) and the run's number.
    owner: str = ""
    lease_until: float = 0.0
    run: int = 0

    @property
    def state(self) -> TaskStatus:
        """:attr:`status` as an enum."""
        return TaskStatus(self.status)


_ENCODER: Final = msgspec.json.Encoder()
_DECODER: Final = msgspec.json.Decoder(TaskRecord)


def encode_record(record: TaskRecord) -> bytes:
    """The record's bytes, as the store keeps them."""
    return _ENCODER.encode(record)


def decode_record(data: bytes) -> TaskRecord:
    """A stored record.  Raises ``msgspec.DecodeError`` for bytes that are not one."""
    return _DECODER.decode(data)


def declared(capabilities: Mapping[str, Any]) -> bool:
    """Did the request declare the tasks extension (``capabilities.extensions``)?"""
    extensions = capabilities.get("extensions")
    return isinstance(extensions, dict) and TASKS_EXTENSION in extensions


def not_declared(request_id: RequestId | None) -> RemoteProtocolError:
    """400, -32021: the request needs the tasks extension it did not declare."""
    return RemoteProtocolError(
        f"this request needs the client capability extensions[{TASKS_EXTENSION!r}], "
        "which it did not declare",
        http_status=400,
        reason=Reason.MISSING_CAPABILITY,
        code=-32021,
        request_id=request_id,
        data={"requiredCapabilities": {"extensions": {TASKS_EXTENSION: {}}}},
    )


def task_not_found(request_id: RequestId | None) -> RemoteProtocolError:
    """-32602 for a task id this principal has no task under (unknown, expired, or
    another principal's: the three answers are identical)."""
    return RemoteProtocolError(
        "no such task",
        http_status=400,
        reason=Reason.TASK_NOT_FOUND,
        code=INVALID_PARAMS,
        request_id=request_id,
    )


def task_id_of(params: object, request_id: RequestId | None) -> str:
    """``params.taskId``, or 400 -32602 when it is missing or not a short string."""
    task_id = params.get("taskId") if isinstance(params, dict) else None
    if not isinstance(task_id, str) or not 0 < len(task_id) <= 256:
        raise RemoteProtocolError(
            "params.taskId must be a string of 1 to 256 characters",
            http_status=400,
            reason=Reason.INVALID_REQUEST,
            code=INVALID_PARAMS,
            request_id=request_id,
        )
    return task_id


def new_task(
    task_id: str,
    params: dict[str, Any],
    *,
    wall: float,
    ttl_ms: int,
    poll_ms: int,
    owner: str,
    lease: float,
    answers: Mapping[str, Any] | None = None,
) -> TaskRecord:
    """A ``working`` task whose first run belongs to ``owner``."""
    return TaskRecord(
        id=task_id,
        status=TaskStatus.WORKING.value,
        created=wall,
        updated=wall,
        ttl_ms=ttl_ms,
        poll_ms=poll_ms,
        params=params,
        answers=dict(answers or {}),
        owner=owner,
        lease_until=wall + lease,
        run=1,
    )


def lease_ran_out(record: TaskRecord, wall: float) -> bool:
    """Is ``record`` working under a lease nobody has renewed (beyond the skew)?"""
    return record.state is TaskStatus.WORKING and wall > record.lease_until + CLOCK_SKEW


def runs(record: TaskRecord, run: int) -> bool:
    """Does ``record`` still belong to run ``run`` (working, that run)?"""
    return record.state is TaskStatus.WORKING and record.run == run


def lease_renewed(record: TaskRecord, wall: float, lease: float) -> TaskRecord:
    """The runner's lease moved to ``wall + lease``."""
    return msgspec.structs.replace(record, lease_until=wall + lease)


def task_completed(record: TaskRecord, result: dict[str, Any], wall: float) -> TaskRecord:
    """The handler returned ``result`` (a tool error's ``isError`` result included)."""
    return _ended(record, TaskStatus.COMPLETED, wall, result=result)


def task_failed(record: TaskRecord, error: dict[str, Any], wall: float) -> TaskRecord:
    """A protocol-level error ended the task (``code``, ``message``, ``data``)."""
    return _ended(record, TaskStatus.FAILED, wall, error=error)


def task_interrupted(record: TaskRecord, wall: float) -> TaskRecord:
    """The runner went away (its lease ran out, or its server shut down): failed,
    never run again -- its handler may have had effects."""
    error = {
        "code": TASK_FAILED_CODE,
        "message": "the server running this task went away before it finished; "
        "it may have had effects, and it will not be run again",
        "data": {"reason": str(Reason.INTERRUPTED)},
    }
    return _ended(record, TaskStatus.FAILED, wall, error=error)


def task_cancelled(record: TaskRecord, wall: float) -> TaskRecord:
    """``tasks/cancel`` of a task that had not ended (a terminal one is unchanged)."""
    if record.state.terminal:
        return record
    return _ended(record, TaskStatus.CANCELLED, wall, message="cancelled by the client")


#: The longest ``statusMessage`` kept (longer ones are cut).
MAX_STATUS_MESSAGE: Final = 1024


def task_status_message(record: TaskRecord, message: str, wall: float) -> TaskRecord:
    """The handler says where it is: ``statusMessage`` (cut to :data:`MAX_STATUS_MESSAGE`)."""
    return msgspec.structs.replace(record, message=message[:MAX_STATUS_MESSAGE], updated=wall)


def task_asked(record: TaskRecord, asks: Mapping[str, Any], wall: float) -> TaskRecord:
    """The run stopped to ask ``asks`` (nobody runs the task until they are answered)."""
    return msgspec.structs.replace(
        record,
        status=TaskStatus.INPUT_REQUIRED.value,
        updated=wall,
        asks=dict(asks),
        owner="",
        lease_until=0.0,
    )


def task_answered(
    record: TaskRecord, responses: Mapping[str, Any], wall: float, *, owner: str, lease: float
) -> TaskRecord | None:
    """Fold ``tasks/update``'s ``responses`` into ``record``: answers to open
    questions are kept and the questions closed; keys that name no open question
    are ignored.  Once no question is open the task is ``working`` again under a
    new run of ``owner``.  ``None`` when nothing changes (no open question answered,
    or the task is not waiting for input)."""
    if record.state is not TaskStatus.INPUT_REQUIRED:
        return None
    taken = {k: v for k, v in responses.items() if k in record.asks}
    if not taken:
        return None
    asks = {k: v for k, v in record.asks.items() if k not in taken}
    answers = {**record.answers, **taken}
    if asks:
        return msgspec.structs.replace(record, asks=asks, answers=answers, updated=wall)
    return msgspec.structs.replace(
        record,
        status=TaskStatus.WORKING.value,
        asks={},
        answers=answers,
        updated=wall,
        owner=owner,
        lease_until=wall + lease,
        run=record.run + 1,
    )


def _ended(
    record: TaskRecord,
    status: TaskStatus,
    wall: float,
    *,
    result: dict[str, Any] | None = None,
    error: dict[str, Any] | None = None,
    message: str | None = None,
) -> TaskRecord:
    return msgspec.structs.replace(
        record,
        status=status.value,
        updated=wall,
        asks={},
        result=result,
        error=error,
        message=message if message is not None else record.message,
        owner="",
        lease_until=0.0,
    )


# ------------------------------------------------------------------ the wire
def _iso(wall: float) -> str:
    """``wall`` (seconds since the epoch, UTC) as ISO 8601 with milliseconds."""
    ms = int(wall * 1000)
    days, ms_of_day = divmod(ms, 86_400_000)
    # Days since 1970-01-01 to a civil date (the proleptic Gregorian calendar).
    z = days + 719_468
    era = z // 146_097
    doe = z - era * 146_097
    yoe = (doe - doe // 1460 + doe // 36_524 - doe // 146_096) // 365
    doy = doe - (365 * yoe + yoe // 4 - yoe // 100)
    mp = (5 * doy + 2) // 153
    day = doy - (153 * mp + 2) // 5 + 1
    month = mp + 3 if mp < 10 else mp - 9
    year = yoe + era * 400 + (1 if month <= 2 else 0)
    seconds, milli = divmod(ms_of_day, 1000)
    hour, rest = divmod(seconds, 3600)
    minute, second = divmod(rest, 60)
    return f"{year:04d}-{month:02d}-{day:02d}T{hour:02d}:{minute:02d}:{second:02d}.{milli:03d}Z"


def _task_fields(record: TaskRecord) -> dict[str, Any]:
    out: dict[str, Any] = {
        "taskId": record.id,
        "status": record.status,
        "createdAt": _iso(record.created),
        "lastUpdatedAt": _iso(record.updated),
        "ttlMs": record.ttl_ms,
        "pollIntervalMs": record.poll_ms,
    }
    if record.message is not None:
        out["statusMessage"] = record.message
    return out


def create_result(record: TaskRecord) -> dict[str, Any]:
    """``CreateTaskResult``: the handle ``tools/call`` answers with (flat, no result)."""
    return {"resultType": "task", **_task_fields(record)}


def detailed(record: TaskRecord) -> dict[str, Any]:
    """``tasks/get``'s answer: the task, with its open questions, result or error."""
    out: dict[str, Any] = {"resultType": "complete", **_task_fields(record)}
    state = record.state
    if state is TaskStatus.INPUT_REQUIRED:
        out["inputRequests"] = dict(record.asks)
    elif state is TaskStatus.COMPLETED and record.result is not None:
        out["result"] = record.result
    elif state is TaskStatus.FAILED and record.error is not None:
        out["error"] = record.error
    return out


def ack() -> dict[str, Any]:
    """The answer of ``tasks/update`` and ``tasks/cancel``: an empty acknowledgement."""
    return {"resultType": "complete"}
