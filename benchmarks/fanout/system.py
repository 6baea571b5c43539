"""What the operating system says: CPU time, memory, who runs on which CPU.

Theory of operation
-------------------
A server's CPU time is ``utime + stime`` from ``/proc/PID/stat`` (read at both ends
of the measured phase), its memory ``VmRSS`` and ``VmHWM`` from
``/proc/PID/status``; both include the live direct children, where
``weir serve --workers N`` runs its workers.  The whole machine's busy time
(``/proc/stat``, not idle and not iowait) is read too, so that CPU taken by other
processes on a shared machine shows in the report; :func:`wait_for_quiet`
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
