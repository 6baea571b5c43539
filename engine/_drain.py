"""Kernel send-queue measurement: how many bytes has the peer really acknowledged?

Theory of operation
-------------------
``send()`` returning only means the kernel accepted the bytes.  On Linux,
``ioctl(fd, SIOCOUTQ)`` (the same number as ``TIOCOUTQ``) returns how many bytes sit
in the socket's send queue *not yet acknowledged by the peer*; so
``acknowledged = written - outq``.  :class:`DrainMeter` wraps that for one
connection.  ``TCP_NOTSENT_LOWAT`` is set as well (trio sets 16 KiB by default; we
make it explicit and configurable) so the kernel never hides an unbounded backlog:
beyond it, writes block in *our* process, where the credit bounds them.

Where the ioctl is unavailable (not Linux, not a TCP socket, an in-memory test
stream), the meter falls back to "accepted by ``send()`` = acknowledged", and
:attr:`DrainMeter.exact` is ``False``.  Detection of a stalled peer then relies on
``send_all`` blocking, which happens once the kernel buffers are full.
"""

from __future__ import annotations

import array
import fcntl
import socket
import sys
from typing import Final

import trio

#: ``SIOCOUTQ`` on Linux (``TIOCOUTQ`` from ``<asm-generic/ioctls.h>``).
SIOCOUTQ: Final = 0x5411
#: ``TCP_NOTSENT_LOWAT`` (Linux 3.12+, macOS); ``socket`` exposes it on some builds only.
TCP_NOTSENT_LOWAT: Final = getattr(
    socket, "TCP_NOTSENT_LOWAT", 25 if sys.platform == "linux" else 0x201
)


def _raw_socket(stream: trio.abc.Stream) -> trio.socket.SocketType | None:
    if isinstance(stream, trio.SocketStream):
        return stream.socket
    return None


class DrainMeter:
    """Reads the unacknowledged byte count of one connection's socket."""

    __slots__ = ("_buf", "_fd", "exact")

    def __init__(self, stream: trio.abc.Stream, *, notsent_lowat: int | None = 16384) -> None:
        sock = _raw_socket(stream)
        self._fd = -1
        self._buf = array.array("i", [0])
        self.exact = False
        if (
            sock is None
            or sys.platform != "linux"
            or sock.family not in (socket.AF_INET, socket.AF_INET6)
        ):
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
        """Bytes handed to the kernel that the peer has not acknowledged (0 if unknown)."""
        if not self.exact:
            return 0
        try:
            fcntl.ioctl(self._fd, SIOCOUTQ, self._buf, True)
        except OSError:
            return 0
        return int(self._buf[0])
