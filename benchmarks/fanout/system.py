"""What the operating system says: CPU time, memory, who runs on which CPU.

Theory of operation
-------------------
A server's CPU time over the measured phase is the nanosecond on-CPU time of its
threads (``/proc/PID/task/TID/schedstat``, read at both ends: :func:`cpu_used`), or,
where that is missing or a thread ended meanwhile, ``utime + stime`` from
``/proc/PID/stat`` (10 ms ticks; that split also gives the system share); its
memory ``VmRSS`` and ``VmHWM`` from ``/proc/PID/status``; all of them include the
live direct children, where ``weir serve --workers N`` runs its workers.  The whole
machine's busy time (``/proc/stat``, not idle and not iowait) is read too, so that
CPU taken by other processes on a shared machine shows in the report; :func:`wait_for_quiet`
(``--quiet-wait``) waits, bounded, for a quiet moment before a run.

:func:`child_setup` makes the ``preexec_fn`` that lowers a child's priority
(``--peer-nice``) and pins it to CPUs (``--pin-server``); :func:`pin_self` moves this
process (and so every child it starts later) to the other CPUs.

Readings of a process that has gone are skipped (``OSError``), never fatal.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

import trio

_CLK_TCK = os.sysconf("SC_CLK_TCK")


def child_setup(nice: int = 0, cpus: set[int] | None = None) -> Callable[[], None] | None:
    """A ``preexec_fn`` that lowers a child's priority by ``nice`` and pins it to ``cpus``."""
    if not nice and cpus is None:
        return None

    def setup() -> None:
        if nice:
            os.nice(nice)
        if cpus is not None:
            os.sched_setaffinity(0, cpus)

    return setup


def pin_self(cpus: set[int]) -> None:
    """Pin every thread of this process to ``cpus`` (children started later inherit it)."""
    for tid in os.listdir("/proc/self/task"):
        with contextlib.suppress(OSError):  # a thread may have just exited
            os.sched_setaffinity(int(tid), cpus)


def proc_children(pid: int) -> list[int]:
    """Direct children of ``pid`` (``weir serve --workers N`` runs its workers there)."""
    try:
        with open(f"/proc/{pid}/task/{pid}/children", "rb") as f:
            return [int(x) for x in f.read().split()]
    except OSError:
        return []


def proc_cpu_split(pid: int) -> tuple[float, float]:
    """(user, system) CPU seconds of ``pid`` and its live children so far."""
    user = system = 0.0
    for p in (pid, *proc_children(pid)):
        try:
            with open(f"/proc/{p}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
        except OSError:
            continue
        user += int(fields[11]) / _CLK_TCK
        system += int(fields[12]) / _CLK_TCK
    return user, system


def proc_cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of ``pid`` so far."""
    return sum(proc_cpu_split(pid))


@dataclass(frozen=True)
class CpuReading:
    """A process's CPU time at one moment, two ways: ``user`` and ``system`` in the
    kernel's 10 ms ticks (``/proc/PID/stat``: every thread, also those that have
    ended), and ``exact``, the nanosecond on-CPU time of its live threads
    (``/proc/PID/task/TID/schedstat``; None where the kernel keeps none)."""

    user: float
    system: float
    exact: float | None


def cpu_reading(pid: int) -> CpuReading:
    """:class:`CpuReading` of ``pid`` and its live children (``--workers``)."""
    user, system = proc_cpu_split(pid)
    exact = 0
    for p in (pid, *proc_children(pid)):
        try:
            tids = os.listdir(f"/proc/{p}/task")
        except OSError:
            if p == pid:
                return CpuReading(user, system, None)  # (no /proc here)
            continue
        for tid in tids:
            try:
                with open(f"/proc/{p}/task/{tid}/schedstat", "rb") as f:
                    exact += int(f.read().split()[0])
            except (OSError, ValueError, IndexError):
                if p == pid and tid == str(pid):
                    return CpuReading(user, system, None)  # (no schedstat here)
    return CpuReading(user, system, exact / 1e9)


def cpu_used(before: CpuReading, after: CpuReading) -> float:
    """CPU seconds used between two readings: the exact figure, unless a thread or
    child ended in between (its time is then missing from the exact sum, so the ticks
    show more than it by over their rounding) or the kernel keeps none: the ticks."""
    ticks = after.user + after.system - before.user - before.system
    if before.exact is None or after.exact is None:
        return ticks
    exact = after.exact - before.exact
    if exact < 0 or ticks - exact > 0.03 + 0.05 * ticks:
        return ticks
    return exact


def machine_busy_seconds() -> float:
    """CPU seconds all CPUs spent busy (not idle, not iowait) since boot."""
    with open("/proc/stat", "rb") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    return (sum(fields[:8]) - fields[3] - fields[4]) / _CLK_TCK


def own_cpu_seconds() -> float:
    """User + system CPU seconds of this (the load generator's) process."""
    t = os.times()
    return t.user + t.system


def proc_memory(pid: int) -> tuple[int, int]:
    """(VmRSS, VmHWM) of ``pid`` plus its live children, in bytes."""
    rss = hwm = 0
    for p in (pid, *proc_children(pid)):
        try:
            with open(f"/proc/{p}/status", "rb") as f:
                for line in f:
                    if line.startswith(b"VmRSS:"):
                        rss += int(line.split()[1]) * 1024
                    elif line.startswith(b"VmHWM:"):
                        hwm += int(line.split()[1]) * 1024
        except OSError:
            continue
    return rss, hwm


async def wait_for_quiet(max_wait: float, cores: float = 0.3) -> float:
    """Wait (at most ``max_wait`` s) until the machine's busy CPU is below ``cores``.

    Other processes on a shared machine skew every number here; this waits for a
    quiet moment and returns the busy level last seen (in cores).
    """
    start = time.monotonic()
    busy = 0.0
    for i in range(100_000):
        b0 = machine_busy_seconds()
        await trio.sleep(2.0)
        busy = (machine_busy_seconds() - b0) / 2.0
        waited = time.monotonic() - start
        if busy < cores or waited >= max_wait:
            if i:
                print(f"fanout: waited {waited:.0f} s; busy now {busy:.2f} cores", file=sys.stderr)
            return busy
        if i % 15 == 0:
            print(f"fanout: machine busy ({busy:.2f} cores); waiting", file=sys.stderr)
    return busy
