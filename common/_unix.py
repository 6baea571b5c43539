"""A listening Unix domain socket for ``weir serve --uds PATH``, on either runtime.

Theory of operation
-------------------
:func:`bind_unix` binds and listens on ``PATH``.  A file already there is replaced
only if it is a socket nobody listens on (a server that died without removing it:
connecting is refused); a live server's socket, or a file that is not a socket, is
left alone and the bind refused with the reason; every failure to listen is a
:class:`UnixListenError` naming the path.  The file
gets the mode the process's umask gives; who may connect is who may write to it.
:func:`remove_unix` removes it at shutdown if it is still the one bound (not a newer
server's).

Drain tracking over a Unix socket: ``SIOCOUTQ`` on an ``AF_UNIX`` stream socket
counts kernel buffer memory (with its per-buffer overhead), not bytes, so both
runtimes measure only TCP sockets exactly; over a Unix socket a frame counts as
delivered once the kernel has taken it, and a reader that stops is found when the
socket's buffer is full and writes block (the drain window then runs as on TCP).
"""

from __future__ import annotations

import contextlib
import errno
import os
import socket
import stat


class UnixListenError(OSError):
    """Listening on a Unix socket path failed: ``filename`` is the path, ``strerror``
    says why (a live server's socket there, a file that is not a socket, no folder)."""


def bind_unix(path: str, backlog: int = 1024) -> tuple[socket.socket, int]:
    """A non-blocking socket listening on ``path``, and the inode of its file.

    Raises:
        UnixListenError: something that must not be replaced is at ``path``, or the
            bind failed (a missing folder, no permission, a path too long).
    """
    try:
        _clear_stale(path)
    except UnixListenError:
        raise
    except OSError as exc:  # (no permission to remove a stale one, say)
        raise UnixListenError(exc.errno or 0, exc.strerror or str(exc), path) from exc
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.bind(path)
        sock.listen(backlog)
        sock.setblocking(False)
        return sock, os.stat(path).st_ino
    except OSError as exc:
        sock.close()
        raise UnixListenError(exc.errno or 0, exc.strerror or str(exc), path) from exc
    except BaseException:
        sock.close()
        raise


def _clear_stale(path: str) -> None:
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(mode):
        raise UnixListenError(errno.EEXIST, "the file exists and is not a socket", path)
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.settimeout(1.0)
        probe.connect(path)
    except ConnectionRefusedError:
        os.unlink(path)  # nobody listens: a dead server's leftover
        return
    except OSError:
        pass  # (a full backlog, say: someone listens)
    finally:
        probe.close()
    raise UnixListenError(errno.EADDRINUSE, "another server listens there", path)


def remove_unix(path: str, inode: int) -> None:
    """Remove ``path`` if it is still the socket file of inode ``inode``."""
    with contextlib.suppress(OSError):
        if os.lstat(path).st_ino == inode:
            os.unlink(path)
