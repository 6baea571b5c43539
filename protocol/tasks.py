"""Tasks (the ``io.modelcontextprotocol/tasks`` extension): the record a store keeps
for each task and the rules over it, for runtimes.  See :mod:`weir.protocol._tasks`
for the theory of operation."""

from __future__ import annotations

from ._tasks import (
    TASKS_EXTENSION,
    TaskRecord,
    TaskSupport,
    ack,
    create_result,
    decode_record,
    detailed,
    encode_record,
    lease_ran_out,
    lease_renewed,
    new_task,
    not_declared,
    runs,
    task_answered,
    task_asked,
    task_cancelled,
    task_completed,
    task_failed,
    task_id_of,
    task_interrupted,
    task_not_found,
    task_status_message,
)

__all__ = [
    "TASKS_EXTENSION",
    "TaskRecord",
    "TaskSupport",
    "ack",
    "create_result",
    "decode_record",
    "detailed",
    "encode_record",
    "lease_ran_out",
    "lease_renewed",
    "new_task",
    "not_declared",
    "runs",
    "task_answered",
    "task_asked",
    "task_cancelled",
    "task_completed",
    "task_failed",
    "task_id_of",
    "task_interrupted",
    "task_not_found",
    "task_status_message",
]
