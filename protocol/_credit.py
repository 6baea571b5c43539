"""Per-session drain credit, half-open detection, and per-connection drain tracking.

Theory of operation
-------------------
A *frame* is one SSE event in a stream log.  It holds its session's credit from
the moment it is enqueued (appended to a log) until its last byte has been
**acknowledged by the peer's TCP stack** -- not merely accepted by ``send()``.  The
budget is per session, shared by all of that session's streams, and has two
dimensions, frames and bytes (:class:`CreditLimits`).  So a session whose client
stopped reading holds at most its credit in queued frames, whatever else happens.

:class:`SessionCredit` is pure arithmetic on counters plus one small state
machine (table in :mod:`protocol._states`):

* ``OPEN`` -- frames are admitted as long as they fit (:meth:`~SessionCredit.try_acquire`).
* ``EXHAUSTED`` -- a frame did not fit and waits (the driver said so with
  :meth:`~SessionCredit.mark_blocked`).  Requests are still admitted.
* ``HALF_OPEN`` -- exhausted *and* no forward progress (no acknowledged byte, no
  released frame) for ``drain_window`` seconds.  :meth:`~SessionCredit.admit`
  refuses session-scoped requests with 429 ``stream_half_open`` before anything is
  dispatched.  Progress moves it back to ``EXHAUSTED``; room for the waiting frames
  (:meth:`~SessionCredit.mark_unblocked`) back to ``OPEN``.
* ``DEAD`` -- frames pending and no progress for ``liveness_timeout`` seconds: the
  driver must tear the session down.  Terminal.

Time is an argument (``now``); :meth:`~SessionCredit.deadline` names the next
instant at which :meth:`~SessionCredit.handle_timer` would change something.

:class:`DrainTracker` belongs to one connection.  The driver reports every byte
it hands to the kernel (:meth:`~DrainTracker.wrote`), marks where each frame's last
byte lies in that byte stream (:meth:`~DrainTracker.mark`), and reports how many
bytes the peer has acknowledged since last time (:meth:`~DrainTracker.bytes_drained`,
computed by the driver as ``written - unacknowledged``); the tracker returns the
marks that are now fully acknowledged, in order.

:class:`CreditPool` is what every owner's credit in one process holds together.  Credit
is per owner, and without authorization every connection is an owner of its own, so the
per-owner bound alone lets many connections that stop reading hold many times one
credit.  A credit given a pool adds to it what it takes and takes out what it releases
(or all it still holds when it leaves); admission (``SessionFlow.try_admit``) refuses
new work 503 ``overloaded`` while the pool holds its limit.  It bounds what new work may
add, not a frame already admitted: the total can pass the limit by the results of
requests admitted before it was reached, each within its owner's credit.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Generic, TypeVar

from ._errors import SERVER_ERROR, LocalProtocolError, Reason, RemoteProtocolError
from ._states import CreditInput, CreditState, credit_transition

T = TypeVar("T")


class CreditPool:
    """Unacknowledged bytes that every owner's credit in one process holds together
    (see the module docstring).

    Args:
        limit: bytes held at which admission refuses new work (``>= 1``).

    Raises:
        ValueError: ``limit`` is below 1.
    """

    __slots__ = ("bytes_in_use", "limit", "peak_bytes")

    def __init__(self, limit: int) -> None:
        if limit < 1:
            raise ValueError("a credit pool's limit must be >= 1 byte")
        self.limit = limit
        #: Bytes taken and not released by the credits in the pool.
        self.bytes_in_use = 0
        #: Its high-water mark.
        self.peak_bytes = 0

    @property
    def full(self) -> bool:
        """True while the pool holds its limit or more (admission refuses)."""
        return self.bytes_in_use >= self.limit

    def refusal(self, retry_after_ms: int, request_id: int | str | None) -> RemoteProtocolError:
        """The 503 ``overloaded`` answer to work refused while the pool is full."""
        return RemoteProtocolError(
            "this server holds its limit of unacknowledged response bytes; retry later",
            http_status=503,
            reason=Reason.OVERLOADED,
            code=SERVER_ERROR,
            request_id=request_id,
            retry_after_ms=retry_after_ms,
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class CreditLimits:
    """Per-session credit and timers.

    Attributes:
        frames: most frames a session may hold unacknowledged.
        bytes: most bytes a session may hold unacknowledged (a single frame larger
            than this is admitted only when nothing else is held).
        drain_window: seconds of no progress, while exhausted, before half-open.
        liveness_timeout: seconds of no progress, with frames pending, before the
            session is torn down.
    """

    frames: int = 256
    bytes: int = 1024 * 1024
    drain_window: float = 10.0
    liveness_timeout: float = 60.0

    def __post_init__(self) -> None:
        if self.frames < 1 or self.bytes < 1:
            raise ValueError("credit limits must be >= 1")
        if not 0 < self.drain_window <= self.liveness_timeout:
            raise ValueError("need 0 < drain_window <= liveness_timeout")


class SessionCredit:
    """One session's credit (see the module docstring).

    Args:
        limits: the budget and timers.
        now: creation time.
        pool: the process's pool this credit's bytes also count in (None: none).
    """

    __slots__ = (
        "_exhausted_since",
        "bytes_in_use",
        "frames_in_use",
        "last_progress",
        "limits",
        "peak_bytes",
        "peak_frames",
        "pool",
        "reserved_bytes",
        "reserved_frames",
        "state",
    )

    def __init__(self, limits: CreditLimits, now: float, pool: CreditPool | None = None) -> None:
        self.limits = limits
        self.pool = pool
        self.state = CreditState.OPEN
        self.frames_in_use = 0
        self.bytes_in_use = 0
        #: Credit set aside for admitted requests' results and not drawn on yet
        #: (kept by :class:`~weir.protocol.SessionFlow`).  It counts as held: frames
        #: fit only in what neither frames nor reservations hold.
        self.reserved_frames = 0
        self.reserved_bytes = 0
        #: High-water marks of the two, as frames were acquired (how close the
        #: session came to its credit; ``frames`` is never exceeded, ``bytes`` only
        #: by a lone frame larger than the whole byte credit).
        self.peak_frames = 0
        self.peak_bytes = 0
        self.last_progress = now
        self._exhausted_since = now

    # ------------------------------------------------------------ frames
    @property
    def held_frames(self) -> int:
        """Frames held plus frames reserved (never more than ``limits.frames``)."""
        return self.frames_in_use + self.reserved_frames

    @property
    def held_bytes(self) -> int:
        """Bytes held plus bytes reserved (more than ``limits.bytes`` only for a lone frame)."""
        return self.bytes_in_use + self.reserved_bytes

    def fits(self, nbytes: int, own_frames: int = 0, own_bytes: int = 0) -> bool:
        """Whether a frame of ``nbytes`` fits in the remaining credit, counting
        ``own_frames``/``own_bytes`` of the reservations as free (the part reserved
        for the frame's own request)."""
        lim = self.limits  # (the two sums are held_frames and held_bytes, inlined: hot)
        if self.frames_in_use + self.reserved_frames - own_frames >= lim.frames:
            return False
        held = self.bytes_in_use + self.reserved_bytes
        return held == 0 or held - own_bytes + nbytes <= lim.bytes

    def try_acquire(self, nbytes: int, now: float) -> bool:
        """Take credit for one frame if it fits; never blocks, never changes state.

        Raises:
            LocalProtocolError: the session is ``DEAD``.
        """
        self.check_alive()
        if not self.fits(nbytes):
            return False
        self.take(nbytes, now)
        return True

    def check_alive(self) -> None:
        """Raise if the session is ``DEAD`` (no frame may take its credit any more).

        Raises:
            LocalProtocolError: the session is ``DEAD``.
        """
        if self.state is CreditState.DEAD:
            credit_transition(self.state, CreditInput.PROGRESS)  # raises

    def take(self, nbytes: int, now: float) -> None:
        """Take credit for one frame the caller found fits (see :meth:`fits`).

        Raises:
            LocalProtocolError: the session is ``DEAD``.
        """
        if self.state is CreditState.DEAD:  # (checked here: a call only when it raises)
            self.check_alive()
        if self.frames_in_use == 0:
            self.last_progress = now  # the liveness clock starts with the first pending frame
        self.frames_in_use += 1
        self.bytes_in_use += nbytes
        if self.frames_in_use > self.peak_frames:
            self.peak_frames = self.frames_in_use
        if self.bytes_in_use > self.peak_bytes:
            self.peak_bytes = self.bytes_in_use
        pool = self.pool
        if pool is not None:
            pool.bytes_in_use += nbytes
            if pool.bytes_in_use > pool.peak_bytes:
                pool.peak_bytes = pool.bytes_in_use

    def correct(self, acquired: int, actual: int) -> None:
        """Replace a frame's acquired byte count by its actual encoded size."""
        self.bytes_in_use += actual - acquired
        if self.pool is not None:
            self.pool.bytes_in_use += actual - acquired

    def release(self, frames: int, nbytes: int, now: float) -> None:
        """Return credit for drained (or discarded) frames; counts as progress."""
        if frames < 0 or nbytes < 0 or frames > self.frames_in_use or nbytes > self.bytes_in_use:
            raise LocalProtocolError(
                f"releasing {frames} frames/{nbytes} bytes but only "
                f"{self.frames_in_use}/{self.bytes_in_use} are held"
            )
        self.frames_in_use -= frames
        self.bytes_in_use -= nbytes
        if self.pool is not None:
            self.pool.bytes_in_use -= nbytes
        if frames or nbytes:
            self.progress(now)

    def leave_pool(self) -> None:
        """Give the pool back everything this credit still holds and stop counting in
        it (the owner ended; what its frames still hold goes with it).  Idempotent."""
        if self.pool is not None:
            self.pool.bytes_in_use -= self.bytes_in_use
            self.pool = None

    # ------------------------------------------------------------ state
    def mark_blocked(self, now: float) -> None:
        """A frame is waiting for credit: ``OPEN`` becomes ``EXHAUSTED``."""
        if self.state is CreditState.OPEN:
            self.state = credit_transition(self.state, CreditInput.EXHAUST)
            self._exhausted_since = now

    def mark_unblocked(self, now: float) -> None:
        """No frame waits any more: back to ``OPEN``."""
        if self.state in (CreditState.EXHAUSTED, CreditState.HALF_OPEN):
            self.state = credit_transition(self.state, CreditInput.REPLENISH)

    def progress(self, now: float) -> None:
        """The peer acknowledged bytes (or frames were released)."""
        self.last_progress = max(self.last_progress, now)
        if self.state is CreditState.HALF_OPEN:
            self.state = credit_transition(self.state, CreditInput.PROGRESS)

    def deadline(self) -> float:
        """The next instant :meth:`handle_timer` may change the state (``inf``: none)."""
        out = math.inf
        if self.state is CreditState.EXHAUSTED:
            out = max(self._exhausted_since, self.last_progress) + self.limits.drain_window
        if self.frames_in_use and self.state is not CreditState.DEAD:
            out = min(out, self.last_progress + self.limits.liveness_timeout)
        return out

    def handle_timer(self, now: float) -> CreditState:
        """Apply the timers at ``now``; return the (possibly new) state."""
        if self.state is CreditState.DEAD:
            return self.state
        if self.frames_in_use and now >= self.last_progress + self.limits.liveness_timeout:
            self.state = credit_transition(self.state, CreditInput.EXPIRE)
        elif self.state is CreditState.EXHAUSTED and now >= (
            max(self._exhausted_since, self.last_progress) + self.limits.drain_window
        ):
            self.state = credit_transition(self.state, CreditInput.STALL)
        return self.state

    def is_half_open(self, now: float) -> bool:
        """Apply the timers, then say whether the session is half-open (or dead)."""
        return self.handle_timer(now) in (CreditState.HALF_OPEN, CreditState.DEAD)

    def admit(self, now: float, request_id: int | str | None = None) -> None:
        """Admission check for one session-scoped request, before dispatch.

        Raises:
            RemoteProtocolError: 429 ``stream_half_open`` with ``retryAfterMs``
                when the session is half-open.
        """
        if self.is_half_open(now):
            retry_ms = max(1000, int(self.limits.drain_window * 1000))
            raise RemoteProtocolError(
                "this session's streams are not draining (half-open); retry later",
                http_status=429,
                reason=Reason.STREAM_HALF_OPEN,
                code=SERVER_ERROR,
                request_id=request_id,
                retry_after_ms=retry_ms,
            )


class DrainTracker(Generic[T]):
    """Which frames one connection's peer has acknowledged (see the module docstring)."""

    __slots__ = ("_marks", "acked", "written")

    def __init__(self) -> None:
        self.written = 0
        self.acked = 0
        #: (end offset, token), oldest first; a list (56 bytes empty, a deque 760) with
        #: the acknowledged prefix cut in one slice.
        self._marks: list[tuple[int, T]] = []

    def wrote(self, nbytes: int) -> int:
        """Record ``nbytes`` handed to the kernel; return the new total written."""
        self.written += nbytes
        return self.written

    def mark(self, end_offset: int, token: T) -> None:
        """Report ``token`` drained once byte ``end_offset - 1`` is acknowledged.

        A mark at or below what is already acknowledged is returned by the next
        :meth:`bytes_drained` call (``bytes_drained(0)`` flushes it).

        Raises:
            ValueError: marks must be given in non-decreasing offset order and not
                beyond what was written.
        """
        if end_offset > self.written or (self._marks and end_offset < self._marks[-1][0]):
            raise ValueError(f"bad mark at {end_offset} (written {self.written})")
        self._marks.append((end_offset, token))

    def bytes_drained(self, nbytes: int) -> list[T]:
        """``nbytes`` more bytes were acknowledged; return the tokens now drained, in order."""
        if nbytes < 0 or self.acked + nbytes > self.written:
            raise ValueError(
                f"cannot acknowledge {nbytes} bytes: {self.written - self.acked} outstanding"
            )
        self.acked += nbytes
        marks = self._marks
        acked = self.acked
        n = 0
        for end, _ in marks:
            if end > acked:
                break
            n += 1
        if not n:
            return []
        out = [token for _, token in marks[:n]]
        del marks[:n]
        return out

    def acknowledged_total(self, unacknowledged: int) -> list[T]:
        """Convenience: the kernel says ``unacknowledged`` bytes are still in flight."""
        return self.bytes_drained(max(0, self.written - unacknowledged - self.acked))

    def settle(self, unacknowledged: int) -> tuple[list[T], T | None]:
        """The kernel says ``unacknowledged`` bytes are still in flight: the tokens
        now wholly acknowledged, oldest first, and the token whose frame the peer
        acknowledged only part of (``None`` unless bytes were acknowledged and no
        frame completed).

        The second is the one rule of progress both runtimes apply: acknowledged
        bytes of a pending frame are progress for that frame's owner only -- bytes
        of a refusal or of another owner's frame before it are nobody's progress.
        """
        before, owner = self.acked, self.oldest()
        drained = self.acknowledged_total(unacknowledged)
        partial = owner if (self.acked > before and not drained) else None
        return drained, partial

    def take_pending(self) -> list[T]:
        """Every token not yet acknowledged, oldest first; the tracker forgets them."""
        out = [token for _, token in self._marks]
        self._marks.clear()
        return out

    @property
    def pending(self) -> bool:
        """True while some mark is not yet acknowledged."""
        return bool(self._marks)

    def oldest(self) -> T | None:
        """The token of the oldest mark not yet acknowledged, if any."""
        return self._marks[0][1] if self._marks else None

    @property
    def outstanding(self) -> int:
        """Bytes written and not yet acknowledged."""
        return self.written - self.acked
