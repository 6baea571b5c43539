"""A session's SSE stream as the engine holds it: the core's log plus its writer's wake-up.

Theory of operation
-------------------
A :class:`StreamHandle` is one stream of a :class:`~weir.engine._session.Session`:
the pure :class:`weir.protocol.streams.StreamLog` plus a Trio wake-up so the
attached writer (a connection task) notices appends.  Messages are only ever
*appended* to a log, writers only ever *read* it.  Every frame enters the log
through :meth:`StreamHandle.send`, which first takes the session's credit for its
exact encoded size, waiting when there is none -- behind earlier frames of *its own
stream* only -- so a stream's frames are never reordered and a session never holds
more than its credit.  With a shared store a frame goes to the store (the
stream's ``sink``) before the log, under the stream's lock, so store order is log
order.

Also here: the exceptions a frame's sender sees when its stream or session is gone.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

import trio

from weir.app import StreamGone
from weir.protocol.states import StreamInput, StreamState
from weir.protocol.streams import StreamKind, StreamLog

if TYPE_CHECKING:
    from ._session import Session


def _closed(log: StreamLog) -> bool:
    return log.state is StreamState.CLOSED


class StreamLost(StreamGone):
    """A frame could not be enqueued: its stream or session is gone (stop quietly).
    To a tool it is the app's :class:`~weir.app.StreamGone`."""


class SessionClosed(StreamLost):
    """The session ended while a frame waited for credit."""


class FrameTooLarge(ValueError):
    """A message is larger than the session's whole byte credit: it can never be sent."""


class StreamHandle:
    """A stream's log, the wake-up its writer waits on, and the writer's cancel scope."""

    __slots__ = (
        "_changed",
        "_lock",
        "abandoned",
        "close_retry_ms",
        "generation",
        "log",
        "outstanding",
        "session",
        "sink",
        "writer_scope",
    )

    def __init__(self, log: StreamLog, session: Session) -> None:
        self.log = log
        self.session = session
        #: The session generation the stream belongs to (fencing).
        self.generation = session.record.generation
        #: Where frames go before the wire (the shared store), or None.
        self.sink: Callable[[int, str, bool, str | None], Awaitable[None]] | None = None
        self._lock: trio.Lock | None = None  # created on first use (see :attr:`lock`)
        self._changed: trio.Event | None = None  # created only when a writer waits
        self.outstanding = 0  # requests whose response is still to come on this stream
        self.close_retry_ms: int | None = None  # set: server closes the connection early
        self.writer_scope: trio.CancelScope | None = None
        #: True from the moment its writer's connection went away until a reader
        #: attaches again: frames appended meanwhile are history, holding no credit.
        self.abandoned = False

    @property
    def lock(self) -> trio.Lock:
        """Held while a frame goes to the store and the log, so store order is log order."""
        lock = self._lock
        if lock is None:
            lock = self._lock = trio.Lock()
        return lock

    async def send(self, payload: str, *, final: bool = False, event: str | None = None) -> None:
        """Take credit for one frame (waiting behind this stream's earlier frames if none
        is left), append it, wake the writer.

        Frames for a CLOSED stream are dropped without taking credit.

        Raises:
            SessionClosed: the session ended while waiting for credit.
        """
        await self._enqueue(payload, final=final, event=event, call_key=None)

    async def respond(self, payload: str | None, *, call_key: str | None = None) -> None:
        """Enqueue one request's response (``None``: it was cancelled and has none).

        ``call_key`` (shared stores): record the response in the idempotency gate
        in the same store step that appends it.

        The response of the stream's last outstanding request is its final frame;
        this is decided under the stream's lock, so responses of a batch finishing
        in any order never put a frame after the final one.
        """
        if payload is None:
            async with self.lock:
                self.outstanding -= 1
                if (
                    self.outstanding <= 0
                    and self.log.kind is not StreamKind.LEGACY
                    and not _closed(self.log)
                ):
                    self.handle(StreamInput.ABORT)  # nothing more will come: end the stream
            return
        if _closed(self.log):
            self.outstanding -= 1
            return
        await self._enqueue(payload, final=None, event=None, call_key=call_key)

    async def _enqueue(
        self, payload: str, *, final: bool | None, event: str | None, call_key: str | None
    ) -> None:
        # The one way into the log: credit first (in stream order), then -- under the stream's
        # lock, so store order is log order -- the store (if shared), then the log.
        # ``final=None`` means "a response": one fewer outstanding, and final if last.
        log = self.log
        if final is not None and _closed(log):
            return
        encoded = log.encode_next(payload, event=event)
        size = len(encoded[1])
        limit = self.session.credit.limits.bytes
        if size > limit:
            raise FrameTooLarge(
                f"a {size}-byte message is larger than the session's credit ({limit} bytes)"
            )
        await self.session.acquire(size, lane=log.epoch)
        async with self.lock:
            if final is None:
                final = self._count_response()
            if _closed(log):  # aborted while we waited
                self.session.release(1, size, log.epoch)
                return
            if self.sink is not None:
                try:
                    await self.sink(log.next_seq, payload, final, call_key)
                except BaseException:
                    # Not in the store, so never on the wire: give the credit back
                    # and end the stream (a rebind fenced it, or the store failed).
                    self.session.release(1, size, log.epoch)
                    if not _closed(log):
                        self.handle(StreamInput.ABORT)
                    raise
                if _closed(log):
                    # Aborted while the store took the event (its client went, or it
                    # was torn down): stored, so any replica can replay it, but this
                    # stream takes nothing more.
                    self.session.release(1, size, log.epoch)
                    return
            self._append(payload, final, event, size, encoded)
        self.wake()

    def try_send_now(self, payload: str) -> bool:
        """:meth:`send` without waiting, where that is possible; True if it was done.

        Possible when the stream has no store sink, nothing holds its lock, no
        frame of this stream waits for credit and there is credit for this one --
        exactly the cases where :meth:`send` would not block.  Otherwise nothing
        changes and the caller awaits :meth:`send`.
        """
        return self._enqueue_now(payload, final=False)

    def try_respond_now(self, payload: str) -> bool:
        """:meth:`respond` without waiting, where that is possible (see :meth:`try_send_now`)."""
        return self._enqueue_now(payload, final=None)

    def _enqueue_now(self, payload: str, *, final: bool | None) -> bool:
        log = self.log
        if self.sink is not None or (self._lock is not None and self._lock.locked()):
            return False
        if _closed(log):  # dropped without credit, as _enqueue does
            if final is None:
                self.outstanding -= 1
            return True
        encoded = log.encode_next(payload)
        size = len(encoded[1])
        if not self.session.try_acquire_now(size, lane=log.epoch):
            return False
        if final is None:
            final = self._count_response()
        self._append(payload, final, None, size, encoded)
        self.wake()
        return True

    def _count_response(self) -> bool:
        # One fewer response to come; the last one is the stream's final frame.
        self.outstanding -= 1
        return self.outstanding <= 0 and self.log.kind is not StreamKind.LEGACY

    def _append(
        self,
        payload: str,
        final: bool,
        event: str | None,
        size: int,
        encoded: tuple[int, bytes] | None = None,
    ) -> int:
        log = self.log
        before = log.retained_bytes
        log.append(payload, final=final, event=event, encoded=encoded)
        actual = log.last_frame_size()
        session = self.session
        session.credit.correct(size, actual)
        session.flow.observe_frame(actual)
        budget = session.budget
        if budget is not None:
            budget.charge(session.record.session_id, log.retained_bytes - before)
        if self.abandoned:  # nobody will write it until a resumption: history only
            session.release(*log.mark_drained(log.next_seq), log.epoch)
        return actual

    def wake(self) -> None:
        """Wake whoever waits in :meth:`wait_changed` (nothing to do if nobody does)."""
        changed = self._changed
        if changed is not None:
            self._changed = None
            changed.set()

    async def wait_changed(self) -> None:
        """Block until the next append or lifecycle change."""
        changed = self._changed
        if changed is None:
            changed = self._changed = trio.Event()
        await changed.wait()

    def drained(self, upto_seq: int) -> None:
        """A peer acknowledged every frame of this stream below ``upto_seq``."""
        self.session.drained(self, upto_seq)

    def handle(self, event: StreamInput) -> None:
        """Apply a lifecycle input to the log's state machine and wake the writer."""
        self.log.handle(event)
        self.wake()

    def request_close(self, retry_ms: int) -> None:
        """Ask the attached writer to send ``retry:`` and end the HTTP response early."""
        self.close_retry_ms = retry_ms
        self.wake()
