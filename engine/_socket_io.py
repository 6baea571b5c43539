"""Reads and writes on a connected TCP socket's descriptor, through Trio only to wait.

Theory of operation
-------------------
``trio.SocketStream.receive_some`` reaches ``recv()`` through four coroutines (the
stream, the socket's wrapper, its non-blocking helper and a context manager), and
``send`` through three.  A keep-alive connection waiting for its next request holds
that whole chain for as long as it waits -- about 2 KiB of frames per idle
connection -- and every request pays for building it.  :class:`SocketIO` does what
those layers do, in one frame: raise ``Cancelled`` if the task is already cancelled
(``checkpoint_if_cancelled``), try the call on the non-blocking descriptor; on
``BlockingIOError`` wait with ``trio.lowlevel.wait_readable`` /
``wait_writable``; after a call that succeeded at once, still yield (a
cancel-shielded checkpoint, exactly as Trio's own socket methods do), so a task
that never blocks cannot starve the others.  After a write that yield also saves
work: without it a connection reads again before its client can have sent the next
request, and that read fails and waits in ``epoll``; with it, other connections run
first and the read usually finds its request (dropping it cost 1.16 times the CPU
per call at 50 sessions, measured side by side).

The descriptor is an ``int``: before each call it is checked against the socket's
current ``fileno()``, so once the socket is closed (by any task) this object
raises ``trio.ClosedResourceError`` and never touches a number the kernel may have
given to another connection.  A close during a wait wakes the waiter with
``ClosedResourceError`` (Trio's ``notify_closing``).  Other ``OSError``\\ s become
``trio.BrokenResourceError``, as the stream would raise.

Only plain TCP streams use it (:func:`socket_io`); TLS and other streams keep the
stream's own methods.
"""

from __future__ import annotations

import os

import trio

#: The most pieces one gathered write hands the kernel (well under any ``IOV_MAX``).
GATHER_MAX = 64


class SocketIO:
    """``receive``/``send`` on one connected, non-blocking socket (module docstring)."""

    __slots__ = ("_fd", "_sock")

    def __init__(self, sock: trio.socket.SocketType) -> None:
        self._sock = sock
        self._fd = sock.fileno()

    @property
    def fileno(self) -> int:
        """The descriptor (as it was when this object was made)."""
        return self._fd

    def _live(self) -> int:
        fd = self._fd
        if self._sock.fileno() != fd:
            raise trio.ClosedResourceError("the connection's socket is closed")
        return fd

    async def receive(self, max_bytes: int) -> bytes:
        """Up to ``max_bytes`` received (``b""``: the peer closed its side).

        Raises:
            trio.ClosedResourceError: the socket was closed (before or during the wait).
            trio.BrokenResourceError: the kernel reported an error (a reset, ...).
        """
        await trio.lowlevel.checkpoint_if_cancelled()
        data = self._read(max_bytes)
        if data is not None:
            await trio.lowlevel.cancel_shielded_checkpoint()
            return data
        # (Waiting outside the ``except``: a handled exception lives as long as its
        # block, and an idle connection waits for minutes.)
        while data is None:
            await trio.lowlevel.wait_readable(self._live())
            data = self._read(max_bytes)
        return data

    def _read(self, max_bytes: int) -> bytes | None:
        try:
            return os.read(self._live(), max_bytes)
        except BlockingIOError:
            return None
        except OSError as exc:
            raise trio.BrokenResourceError(f"socket connection broken: {exc}") from exc

    async def send(self, data: memoryview | list[memoryview]) -> int:
        """Hand the kernel a prefix of ``data``; how many bytes it took (at least one).

        ``data`` may be a list of pieces, written as one gathered write (``writev``, at
        most :data:`GATHER_MAX` of them): a large frame goes out without being joined
        into a second copy first.

        Raises:
            trio.ClosedResourceError: the socket was closed (before or during the wait).
            OSError: the kernel refused the write (a reset peer: ``EPIPE``, ...).
        """
        await trio.lowlevel.checkpoint_if_cancelled()
        n = self._write(data)
        if n is not None:
            await trio.lowlevel.cancel_shielded_checkpoint()
            return n
        while n is None:
            await trio.lowlevel.wait_writable(self._live())
            n = self._write(data)
        return n

    def _write(self, data: memoryview | list[memoryview]) -> int | None:
        try:
            if isinstance(data, list):
                return os.writev(self._live(), data[:GATHER_MAX])
            return os.write(self._live(), data)
        except BlockingIOError:
            return None


def socket_io(stream: trio.abc.Stream) -> SocketIO | None:
    """A :class:`SocketIO` for a plain TCP ``stream``; None for any other kind."""
    if type(stream) is trio.SocketStream:
        return SocketIO(stream.socket)
    return None


__all__ = ["GATHER_MAX", "SocketIO", "socket_io"]
