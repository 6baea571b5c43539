"""A session's flow control: request admission and in-order credit grants.

Theory of operation
-------------------
:class:`~weir.protocol._credit.SessionCredit` is the arithmetic of one session's drain
credit.  :class:`SessionFlow` is what a driver builds on it, in one place so that
every driver admits and grants identically:

* **Admission** (:meth:`SessionFlow.try_admit`).  A session-scoped request is
  admitted only if a *reservation* for its result fits: one frame and the
  session's typical frame size in bytes (:attr:`SessionFlow.typical_frame`, a
  moving average of its frame sizes), in what neither held frames nor other
  reservations take.  Reservations count as held, so frames plus reservations
  never exceed the credit -- no overdraft -- and responses waiting for credit
  stay near the credit too.  A session that holds nothing at all always admits
  (else it could never make progress); one that has no room for a reservation
  admits nothing, even with nothing in flight: a request admitted into a full
  credit would run and then find no room for its result.  A half-open session
  refuses at once: 429 ``stream_half_open``; so does every session while the
  process's :class:`~weir.protocol.CreditPool` holds its limit: 503
  ``overloaded`` (other owners hold the bytes, so this session's changes could
  not end a wait).  Otherwise the answer is
  :attr:`Admit.WAIT` (or :attr:`Admit.BLOCKED`, when this refusal is what
  exhausted the credit, so the credit's deadline moved): the driver waits for a
  change -- a grant, a release, the session ending -- or the deadline, and asks
  again (so a refusal, if it comes, comes within the drain window).
* **Reservations** belong to a *lane* (below): the stream that will carry the
  result, or a key the driver picks before that stream exists and hands over
  with :meth:`move`.  Only frames of that lane draw on it, and only for what the
  free credit lacks; what they draw comes back to it as they drain (progress
  notifications of a call do not use up its result's room).  It ends with
  :meth:`done` -- once the response is enqueued, so it was granted first -- or,
  with ``keep`` (JSON mode: one body, sent later), at :meth:`settle`.  A refused
  batch entry is counted in with an empty reservation (:meth:`count_in`).  So a
  result no larger than its reservation is granted at once, whatever the
  session's other streams hold: stalled streams can take every byte that is not
  reserved, never a reserved one.
* **Grants, per stream** (:meth:`try_acquire`, :meth:`wait_for`,
  :meth:`release`).  Every frame takes credit for its encoded size before it
  enters a stream log.  Each frame names its *lane* -- the stream it belongs to
  (``None``: a lane of its own for ordering).  Order is kept per lane only: a
  frame waits (gets a *ticket*) when it does not fit or an earlier frame of *its
  own* lane waits; :meth:`release` grants, in ticket order, every waiter that
  fits and has no earlier waiter in its lane.  The streams of one session have
  no order between them (Streamable HTTP), so a stream whose peer stopped
  reading never parks another stream's frames behind its own.  The price is
  that a large waiting frame may be passed by smaller frames of other streams;
  it is granted once the credit held leaves room for it.  That cannot deadlock:
  what is held is either acknowledged (released) or, with no progress, the
  session goes half-open (admission stops) and is torn down.  Memory is bounded
  exactly: nothing is ever granted beyond the credit, reservations included.

  A result *larger* than its reservation, when the free credit cannot supply
  the rest, keeps waiting in its lane (its order kept), having drawn its whole
  reservation.  The credit is then exhausted, so the usual rule applies: once
  nothing is acknowledged for the drain window the session is half-open and new
  requests get 429 before they run (nothing refused has run); the result is
  granted as soon as credit returns -- other streams drain, their connections go
  away (the driver releases an abandoned stream's credit), requests end -- or
  the session is torn down at the liveness timeout.  Why not otherwise: an
  overdraft would break the bound; replacing the result by an error would throw
  away the outcome of a call that has run (it is not a refusal, and a retry
  would be answered with the error); reserving more than a typical frame per
  request would cut every session's concurrency to cover atypical results.
  One wait could never end that way: every frame acknowledged (nothing in use,
  so no acknowledgement is coming) while results of admitted requests wait, each
  larger than what is left of its own reservation and each kept out by the
  others' reservations -- the credit is all reserved, and all the reservations
  wait on one another.  The session would sit half-open for ever, since the
  liveness timeout needs a frame in use.  So when no frame is in use, the oldest
  waiting frame of a lane that holds a reservation is granted past the other
  lanes' reservations (never past the credit: it is the only frame in use, and
  only a lone frame may be larger than the byte credit).  The others' promise is
  broken for as long as that one frame is in flight; it is kept again when it is
  acknowledged, or the liveness timeout ends the session.  A lane without a
  reservation (a stream with no admitted request of its own, e.g. a stalled
  ``GET``) is never granted that way: reserved room is never given to it.

  A waiter that gives up calls :meth:`cancel`: ``True`` if it was still queued,
  ``False`` if it had been granted (it then owns credit it must :meth:`release`).
* **Ending** (:meth:`close`): every queued ticket is returned so that the driver
  wakes its waiter, which then finds the flow closed.
* **Too large** (:func:`~weir.protocol.budget.fit_response`).  A response bigger than
  the session's whole byte credit could only be sent by exceeding the bound, so it
  is replaced by a ``result_too_large`` error -- which is also the call's recorded
  outcome, so a retry does not run the call again to the same end.

No clock is read: every method that can start or stop a timer takes ``now``,
and :meth:`deadline` is the credit's next instant of interest.
"""

from __future__ import annotations

import enum
import itertools
import math
from collections.abc import Hashable

from ._credit import CreditLimits, CreditPool, SessionCredit
from ._jsonrpc import RequestId
from ._states import CreditState

#: The starting guess of a session's frame size, before any frame was sent.
INITIAL_FRAME_ESTIMATE = 256.0


class Admit(enum.Enum):
    """The answer of :meth:`SessionFlow.try_admit`."""

    ADMITTED = "admitted"
    WAIT = "wait"  # no room: wait for a change or the deadline, then ask again
    BLOCKED = "blocked"  # as WAIT, and the credit just became exhausted (deadline moved)


class _Reserve:
    """What one lane's admitted requests reserved, and how much its frames draw on.

    ``frames`` and ``nbytes`` are the sums over ``units``, kept as units come and go
    (every admission and every answer reads them)."""

    __slots__ = ("drawn_bytes", "drawn_frames", "frames", "nbytes", "units")

    def __init__(self) -> None:
        #: (frames, bytes) reserved per admitted request of the lane.
        self.units: list[tuple[int, int]] = []
        #: Their sums.
        self.frames = 0
        self.nbytes = 0
        #: The part of it that frames of the lane hold now (restored as they drain).
        self.drawn_frames = 0
        self.drawn_bytes = 0

    def add(self, units: list[tuple[int, int]]) -> tuple[int, int]:
        """Reserve ``units`` too; the (frames, bytes) they add."""
        self.units.extend(units)
        if len(units) == 1:
            frames, nbytes = units[0]
        else:
            frames, nbytes = sum(f for f, _ in units), sum(b for _, b in units)
        self.frames += frames
        self.nbytes += nbytes
        return frames, nbytes

    def drop(self, n: int | None) -> None:
        """End the ``n`` smallest reservations (None: all of them); a refused batch
        entry's empty one goes first, as it is its own."""
        units = self.units
        if n is None or n >= len(units):
            units.clear()
            self.frames = self.nbytes = 0
            return
        units.sort()
        for frames, nbytes in units[:n]:
            self.frames -= frames
            self.nbytes -= nbytes
        del units[:n]


class SessionFlow:
    """Admission and credit grants for one session (see the module docstring)."""

    __slots__ = (
        "_lanes",
        "_queue",
        "_reserves",
        "_tickets",
        "closed",
        "credit",
        "inflight",
        "typical_frame",
    )

    def __init__(self, limits: CreditLimits, now: float, pool: CreditPool | None = None) -> None:
        self.credit = SessionCredit(limits, now, pool)
        #: Admitted requests whose response is not enqueued yet.
        self.inflight = 0
        #: A moving average of this session's frame sizes (admission's byte estimate).
        self.typical_frame = INITIAL_FRAME_ESTIMATE
        self.closed = False
        #: (ticket, nbytes, lane), oldest first.
        #: A list, not a deque: an empty list costs 56 bytes, an empty deque 760,
        #: and every idle session holds one (it is short and walked in full anyway).
        self._queue: list[tuple[int, int, Hashable | None]] = []
        #: Tickets queued per named lane (a lane with a waiter takes nothing at once).
        self._lanes: dict[Hashable, int] = {}
        #: The reservations of admitted requests, by lane.
        self._reserves: dict[Hashable | None, _Reserve] = {}
        self._tickets = itertools.count(1)

    # ------------------------------------------------------------------ admission
    def try_admit(
        self, n: int, now: float, request_id: RequestId | None = None, lane: Hashable | None = None
    ) -> Admit:
        """Admit ``n`` requests now, each reserving room for its result in ``lane``
        (the stream that will carry it; see :meth:`move`), or say to wait.

        The driver checks :attr:`closed` first (a closed session admits nothing).

        Raises:
            RemoteProtocolError: 429 ``stream_half_open`` if the session is half-open;
                503 ``overloaded`` if the process's credit pool holds its limit.
        """
        credit = self.credit
        credit.admit(now, request_id)
        lim = credit.limits
        pool = credit.pool  # (pool.full, inlined: every admission reads it)
        if pool is not None and pool.bytes_in_use >= pool.limit:
            raise pool.refusal(max(1000, int(lim.drain_window * 1000)), request_id)
        unit = max(1, math.ceil(self.typical_frame))
        free_frames = lim.frames - credit.held_frames
        free_bytes = lim.bytes - credit.held_bytes
        if n <= free_frames and n * unit <= free_bytes:
            self._reserve(lane, [(1, unit)] * n)
        elif not credit.held_frames and not credit.held_bytes:
            # Nothing held at all: admit (else no progress), reserving what there is.
            each = free_bytes // n
            self._reserve(lane, [(1 if i < free_frames else 0, each) for i in range(n)])
        elif credit.state is CreditState.OPEN:
            # No credit: that starts the drain window, exactly as a waiting frame does.
            credit.mark_blocked(now)
            return Admit.BLOCKED
        else:
            return Admit.WAIT
        self.inflight += n
        return Admit.ADMITTED

    def _reserve(self, lane: Hashable | None, units: list[tuple[int, int]]) -> None:
        reserve = self._reserves.get(lane)
        if reserve is None:
            reserve = self._reserves[lane] = _Reserve()
        frames, nbytes = reserve.add(units)
        self.credit.reserved_frames += frames
        self.credit.reserved_bytes += nbytes

    def count_in(self, n: int = 1, lane: Hashable | None = None) -> None:
        """Account ``n`` requests of ``lane`` as in flight without asking and without
        a reservation (refused batch entries: their answer is a short error)."""
        self.inflight += n
        self._reserve(lane, [(0, 0)] * n)

    def done(
        self, n: int, now: float, lane: Hashable | None = None, *, keep: bool = False
    ) -> list[int]:
        """``n`` admitted requests of ``lane`` have their response enqueued (or never
        will): their reservations end; the tickets now granted, oldest first.

        ``keep``: the reservations stay until :meth:`settle` (a response that is
        only part of one body still to be sent: JSON mode).
        """
        self.inflight -= n
        return [] if keep else self._unreserve(lane, n, now)

    def settle(self, lane: Hashable | None, now: float) -> list[int]:
        """Every reservation left in ``lane`` ends; the tickets now granted."""
        return self._unreserve(lane, None, now)

    def _unreserve(self, lane: Hashable | None, n: int | None, now: float) -> list[int]:
        reserve = self._reserves.get(lane)
        if reserve is None:
            return []
        credit = self.credit
        unused_frames = reserve.frames - reserve.drawn_frames
        unused_bytes = reserve.nbytes - reserve.drawn_bytes
        reserve.drop(n)
        if not reserve.units:
            del self._reserves[lane]
        # Frames drawn on a reservation that ended simply hold credit of their own.
        reserve.drawn_frames = min(reserve.drawn_frames, reserve.frames)
        reserve.drawn_bytes = min(reserve.drawn_bytes, reserve.nbytes)
        credit.reserved_frames += reserve.frames - reserve.drawn_frames - unused_frames
        credit.reserved_bytes += reserve.nbytes - reserve.drawn_bytes - unused_bytes
        return self._grant(now)

    def move(self, src: Hashable | None, dst: Hashable) -> None:
        """The reservations made in lane ``src`` (a key the driver chose before the
        stream existed) belong to lane ``dst`` from now on."""
        reserve = self._reserves.pop(src, None)
        if reserve is None:
            return
        into = self._reserves.get(dst)
        if into is None:
            self._reserves[dst] = reserve
            return
        into.add(reserve.units)
        into.drawn_frames += reserve.drawn_frames
        into.drawn_bytes += reserve.drawn_bytes

    def observe_frame(self, nbytes: int) -> None:
        """Fold one frame's actual size into :attr:`typical_frame`."""
        self.typical_frame += (nbytes - self.typical_frame) / 8

    # --------------------------------------------------------------------- grants
    @property
    def waiting(self) -> int:
        """Tickets queued, not granted yet."""
        return len(self._queue)

    def reserved(self, lane: Hashable | None) -> tuple[int, int]:
        """(frames, bytes) reserved in ``lane`` and not drawn on by its frames now."""
        reserve = self._reserves.get(lane)
        if reserve is None:
            return 0, 0
        return reserve.frames - reserve.drawn_frames, reserve.nbytes - reserve.drawn_bytes

    def _take(self, nbytes: int, now: float, lane: Hashable | None) -> bool:
        # One frame of ``lane``, if it fits in the free credit plus its lane's unused
        # reservation; it draws on the reservation only for what the free credit lacks.
        # With no frame in use, a lane with a reservation is granted past the other
        # lanes' reservations (see the module docstring): nothing else could end
        # its wait.
        credit = self.credit
        own_frames, own_bytes = self.reserved(lane)
        if not credit.fits(nbytes, own_frames, own_bytes) and (
            credit.frames_in_use or lane not in self._reserves
        ):
            return False
        lim = credit.limits
        # (credit.held_frames and held_bytes, inlined: one frame's hot path)
        frames = min(
            own_frames, 1 if credit.frames_in_use + credit.reserved_frames >= lim.frames else 0
        )
        held = credit.bytes_in_use + credit.reserved_bytes
        nbytes_drawn = min(own_bytes, max(0, held + nbytes - lim.bytes)) if held else 0
        credit.take(nbytes, now)
        if frames or nbytes_drawn:
            reserve = self._reserves[lane]
            reserve.drawn_frames += frames
            reserve.drawn_bytes += nbytes_drawn
            credit.reserved_frames -= frames
            credit.reserved_bytes -= nbytes_drawn
        return True

    def try_acquire(self, nbytes: int, now: float, lane: Hashable | None = None) -> bool:
        """Take credit for one frame of ``lane`` if that needs no wait: it fits -- in
        the free credit plus what ``lane`` reserved -- and no earlier frame of the same
        lane waits (other lanes' waiters do not matter)."""
        if self.closed or (lane is not None and lane in self._lanes):
            return False
        credit = self.credit
        if credit.state is CreditState.DEAD:  # (checked here: a call only when it raises)
            credit.check_alive()
        return self._take(nbytes, now, lane)

    def wait_for(self, nbytes: int, now: float, lane: Hashable | None = None) -> int:
        """Queue a frame of ``nbytes`` behind the earlier waiters of ``lane``; its ticket.

        The credit becomes exhausted (the drain window starts) if it was not.
        """
        ticket = next(self._tickets)
        self._queue.append((ticket, nbytes, lane))
        if lane is not None:
            self._lanes[lane] = self._lanes.get(lane, 0) + 1
        self.credit.mark_blocked(now)
        return ticket

    def _dequeued(self, lane: Hashable | None) -> None:
        if lane is not None:
            left = self._lanes[lane] - 1
            if left:
                self._lanes[lane] = left
            else:
                del self._lanes[lane]

    def cancel(self, ticket: int, now: float) -> bool:
        """Withdraw a waiting ticket: True if it was still queued (no credit taken)."""
        for i, (queued, _, lane) in enumerate(self._queue):
            if queued == ticket:
                del self._queue[i]
                self._dequeued(lane)
                if not self._queue:
                    self.credit.mark_unblocked(now)  # nothing waits for credit any more
                return True
        return False

    def release(
        self, frames: int, nbytes: int, now: float, lane: Hashable | None = None
    ) -> list[int]:
        """Return credit of frames of ``lane``; the tickets now granted, oldest first.

        What the frames drew on their lane's reservation goes back to it (while its
        requests are in flight); every waiter that fits is granted, in ticket order,
        except one whose lane has an earlier waiter still queued -- so order is kept
        within each lane.
        """
        if not frames and not nbytes:
            return []
        credit = self.credit
        credit.release(frames, nbytes, now)
        reserve = self._reserves.get(lane)
        if reserve is not None:
            back_frames = min(frames, reserve.drawn_frames)
            back_bytes = min(nbytes, reserve.drawn_bytes)
            reserve.drawn_frames -= back_frames
            reserve.drawn_bytes -= back_bytes
            credit.reserved_frames += back_frames
            credit.reserved_bytes += back_bytes
        return self._grant(now)

    def _grant(self, now: float) -> list[int]:
        granted: list[int] = []
        if not self.closed and self._queue:
            kept: list[tuple[int, int, Hashable | None]] = []
            stuck: set[Hashable] = set()  # lanes whose oldest waiter did not fit
            for entry in self._queue:
                ticket, size, lane = entry
                if lane not in stuck and self._take(size, now, lane):
                    granted.append(ticket)
                    self._dequeued(lane)
                else:
                    kept.append(entry)
                    if lane is not None:
                        stuck.add(lane)
            self._queue = kept
        if not self._queue:
            self.credit.mark_unblocked(now)
        return granted

    # --------------------------------------------------------------------- ending
    def close(self) -> list[int]:
        """End the flow: no more grants; the tickets still queued, to wake."""
        self.closed = True
        queued = [ticket for ticket, _, _ in self._queue]
        self._queue.clear()
        self._lanes.clear()
        self._reserves.clear()
        self.credit.reserved_frames = self.credit.reserved_bytes = 0
        self.credit.leave_pool()
        return queued

    def deadline(self) -> float:
        """The credit's next instant of interest (``inf``: none)."""
        return self.credit.deadline()
