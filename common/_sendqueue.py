"""The kernel's count of bytes a TCP peer has not acknowledged, for either runtime.

Theory of operation
-------------------
``send()`` returning only means the kernel accepted the bytes.  On Linux,
``ioctl(fd, SIOCOUTQ)`` (the same number as ``TIOCOUTQ``) returns how many bytes sit
in a TCP socket's send queue *not yet acknowledged by the peer*, so a runtime that
counts what it handed the kernel knows ``acknowledged = written - unacknowledged``.
:class:`KernelSendQueue` reads that number for one socket.  Both runtimes hold one
per connection: the Trio engine on the accepted socket (under TLS, on the TCP socket
beneath it), the asyncio runtime on its transport's socket (adding what the transport
itself still buffers).

``TCP_NOTSENT_LOWAT`` is set as well when asked (the Trio runtime does, 16 KiB by
default), so the kernel never hides an unbounded backlog of *unsent* bytes: beyond it,
writes wait in the process, where the session's credit bounds them.  (The asyncio
runtime does not ask: its transport hands the kernel what it accepts and buffers the
rest itself, and that buffer is counted beside the kernel's queue.)

Where the ioctl is unavailable (not Linux, not a TCP socket -- a Unix socket's
``SIOCOUTQ`` counts buffer memory, not bytes -- or an in-memory test stream), the
queue reports 0 and :attr:`KernelSendQueue.exact` is ``False``: what the kernel
accepted then stands in for what the peer acknowledged, and a stalled peer is found
once the kernel's buffers fill and writes block.
"""

from __future__ import annotations

import array
import fcntl
import socket
import sys
from typing import Final, Protocol

#: ``SIOCOUTQ`` on Linux (``TIOCOUTQ`` from ``<asm-generic/ioctls.h>``).
SIOCOUTQ: Final = 0x5411
#: ``TCP_NOTSENT_LOWAT`` (Linux 3.12+, macOS); ``socket`` exposes it on some builds only.
TCP_NOTSENT_LOWAT: Final = getattr(
    socket, "TCP_NOTSENT_LOWAT", 25 if sys.platform == "linux" else 0x201
)
_TCP: Final = (socket.AF_INET, socket.AF_INET6)


class SocketLike(Protocol):
    """What :class:`KernelSendQueue` needs of a socket (the standard library's, Trio's,
    or asyncio's transport socket all qualify)."""

    @property
    def family(self) -> int: ...

    def fileno(self) -> int: ...

    def setsockopt(self, level: int, optname: int, value: int, /) -> None: ...


class KernelSendQueue:
    """Reads the unacknowledged byte count of one TCP socket's send queue.

    Guarantees: :meth:`unacknowledged` never reports more bytes acknowledged than the
    peer acknowledged while :attr:`exact` is true; when it is false it reports 0 (the
    kernel's acceptance stands in for the peer's acknowledgement).
    """

    __slots__ = ("_buf", "_fd", "exact")

    def __init__(self, sock: SocketLike | None, *, notsent_lowat: int | None = 16384) -> None:
        self._fd = -1
        self._buf = array.array("i", [0])
        #: True when the count comes from the kernel (Linux, TCP).
        self.exact = False
        if sock is None or sys.platform != "linux" or sock.family not in _TCP:
            return
        try:
            if notsent_lowat is not None:
                sock.setsockopt(socket.IPPROTO_TCP, TCP_NOTSENT_LOWAT, notsent_lowat)
            fd = sock.fileno()
            fcntl.ioctl(fd, SIOCOUTQ, self._buf, True)
        except OSError:
            return
        self._fd = fd
        self.exact = True

    def unacknowledged(self) -> int:
        """Bytes handed to the kernel that the peer has not acknowledged (0 if unknown,
        or once the socket is closed)."""
        if not self.exact:
            return 0
        try:
            fcntl.ioctl(self._fd, SIOCOUTQ, self._buf, True)
        except OSError:
            return 0
        return int(self._buf[0])


__all__ = ["SIOCOUTQ", "TCP_NOTSENT_LOWAT", "KernelSendQueue", "SocketLike"]
