"""Giving memory back to the operating system after large buffers are freed.

Theory of operation
-------------------
A stalled session's large results are freed when it is torn down, but with
glibc's defaults the process's RSS often does not come down: glibc serves large
allocations with ``mmap`` only above a threshold that it *raises* each time such
a block is freed (up to 32 MiB), so after the first 1 MiB result is freed, later
ones come from the heap, where freed blocks stay mapped and fragment it.

:func:`tune_allocator` pins the threshold (``mallopt(M_MMAP_THRESHOLD, 128 KiB)``,
which also turns the raising off) and lowers the heap's trim threshold, so large
buffers are mapped on their own and unmapped when freed.  :func:`trim` asks glibc
to return free heap pages at once (``malloc_trim(0)``); :func:`reclaim` collects
the cycles that may still hold a torn-down session's buffers first.  Both runtimes
call it after tearing down a session that held at least :data:`RECLAIM_AFTER`
bytes, at most once a second (:class:`ReclaimPacing` decides, for both).

Both do nothing where the C library is not glibc (musl, macOS) or cannot be
loaded.  ``weir serve`` calls :func:`tune_allocator` at start-up; an embedding
program decides for itself.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import math
import sys
from functools import cache

M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
#: Allocations at least this large get their own mapping (glibc's initial default).
MMAP_THRESHOLD = 128 * 1024


@cache
def _libc() -> ctypes.CDLL | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:
        return None
    if not hasattr(libc, "mallopt") or not hasattr(libc, "malloc_trim"):
        return None
    return libc


def tune_allocator() -> bool:
    """Pin glibc's mmap threshold so large freed buffers leave the process (True if set)."""
    libc = _libc()
    if libc is None:
        return False
    ok = libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1
    libc.mallopt(M_TRIM_THRESHOLD, 2 * MMAP_THRESHOLD)
    return bool(ok)


def trim() -> None:
    """Return free heap memory to the operating system now (glibc only; else nothing)."""
    libc = _libc()
    if libc is not None:
        libc.malloc_trim(0)


def reclaim() -> None:
    """Collect the cycles that may still hold a torn-down session's buffers (its
    cancelled tasks' tracebacks), then :func:`trim`."""
    gc.collect()
    trim()


#: A session that held at least this many bytes (its credit in use, replay history
#: and kept results, on either runtime) is followed by a :func:`reclaim`.
RECLAIM_AFTER = 256 * 1024


class ReclaimPacing:
    """When a session's end calls for a :func:`reclaim`: the session held at least
    :data:`RECLAIM_AFTER` bytes, and none was called for in the last second (a
    reclaim collects and trims the whole heap: many sessions ending together need
    one).  The runtime runs it a second later, once the session's cancelled tasks
    have unwound, and counts it."""

    __slots__ = ("_last",)

    def __init__(self) -> None:
        self._last = -math.inf

    def after_end(self, held: int, now: float) -> bool:
        """A session that held ``held`` bytes ended at ``now`` (seconds, any
        monotonic clock): whether to reclaim."""
        if held < RECLAIM_AFTER or now - self._last < 1.0:
            return False
        self._last = now
        return True


__all__ = ["RECLAIM_AFTER", "ReclaimPacing", "reclaim", "trim", "tune_allocator"]
