"""Tasks (the ``io.modelcontextprotocol/tasks`` extension): the record a store keeps
for each task and the rules over it, for runtimes.  See :mod:`weir.protocol._tasks`
for the theory of operation."""

from __future__ import annotations

from ._tasks import (
    ACK,
    TASK_METHODS,
    TASKS_EXTENSION,
    TaskRecord,
    TaskStatus,
    TaskSupport,
    answered,
    asked,
    cancelled,
    completed,
    create_result,
    decode_record,
    detailed,
    encode_record,
    failed,
    interrupted,
    lease_ran_out,
    new_task,
    renewed,
    runs,
    task_id_of,
    task_not_found,
)

__all__ = [
    "ACK",
    "TASKS_EXTENSION",
    "TASK_METHODS",
    "TaskRecord",
    "TaskStatus",
    "TaskSupport",
    "answered",
    "asked",
    "cancelled",
    "completed",
    "create_result",
    "decode_record",
    "detailed",
    "encode_record",
    "failed",
    "interrupted",
    "lease_ran_out",
    "new_task",
    "renewed",
    "runs",
    "task_id_of",
    "task_not_found",
]
