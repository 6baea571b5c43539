"""``weir serve --reload``: restart the server when the app's code changes (development).

Theory of operation
-------------------
The process that was asked to ``--reload`` serves nothing itself: it is a supervisor
that runs the server as a child, ``python -m weir <its own arguments> --no-reload``
(as ``--workers`` children are run: the same command line and environment, so the same
configuration), and every :data:`POLL` seconds compares the modification times of the
``.py`` files under ``--app-dir`` and each ``--reload-dir`` (hidden folders and
``__pycache__`` skipped) with the last ones seen.  On a change it stops the child
(SIGTERM, then SIGKILL after :data:`STOP_TIMEOUT`) and starts another on the same port
(with ``--port 0``, the one the first child chose).  A child that exits by itself after
it served once (a syntax error in an edit, say) is restarted at the next change; one
that fails its first start ends the supervisor with its status, as ``weir serve`` would.
SIGINT and SIGTERM are passed to the child, and the supervisor exits with its status.

No new dependency: polling a development tree's mtimes twice a second is cheap.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import signal
import subprocess
import sys
import threading
from collections.abc import Sequence
from typing import IO

#: Seconds between two looks at the files.
POLL = 0.5
#: Seconds a child has to stop at a change before it is killed.
STOP_TIMEOUT = 5.0
_SKIPPED = frozenset({"__pycache__", "node_modules"})


def add_reload_options(s: argparse.ArgumentParser) -> None:
    """Add ``--reload`` and ``--reload-dir`` to the ``serve`` parser ``s``."""
    g = s.add_argument_group("development")
    g.add_argument(
        "--reload",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="restart the server when a .py file under --app-dir or a --reload-dir "
        "changes (for development; one process)",
    )
    g.add_argument(
        "--reload-dir",
        action="append",
        default=[],
        metavar="DIR",
        help="also watch the .py files under DIR (repeatable)",
    )


def check_reload(args: argparse.Namespace) -> None:
    """Refuse ``--reload`` with what it cannot serve.

    Raises:
        SystemExit: one line saying why.
    """
    if args.reload and args.workers > 1:
        raise SystemExit("weir: --reload runs one server process: not with --workers > 1")
    for folder in args.reload_dir:
        if not os.path.isdir(folder):
            raise SystemExit(f"weir: --reload-dir {folder!r} is not a directory")


def snapshot(folders: Sequence[str]) -> dict[str, int]:
    """``{path: mtime in ns}`` of every ``.py`` file under ``folders``."""
    seen: dict[str, int] = {}
    for top in folders:
        for root, dirs, files in os.walk(top):
            dirs[:] = [d for d in dirs if not d.startswith(".") and d not in _SKIPPED]
            for name in files:
                if name.endswith(".py"):
                    path = os.path.join(root, name)
                    with contextlib.suppress(OSError):  # (gone since the listing)
                        seen[path] = os.stat(path).st_mtime_ns
    return seen


_SERVING = re.compile(r"^weir: serving (?:https?://\S*?:(?P<port>\d+)/|unix:)")


def serving_port(line: str) -> int | None:
    """From a ``weir: serving`` line, the port (-1 for ``unix:PATH``); else None."""
    match = _SERVING.match(line)
    if match is None:
        return None
    return int(match["port"]) if match["port"] else -1


def _pump(stream: IO[str], served: list[int]) -> None:
    """Copy a child's stdout to ours; the first ``weir: serving`` line's port (see
    :func:`serving_port`) goes into ``served``."""
    for line in stream:
        port = serving_port(line)
        if port is not None and not served:
            served.append(port)
        sys.stdout.write(line)
        sys.stdout.flush()


def _stop(child: subprocess.Popen[str], signum: int = signal.SIGTERM) -> int:
    if child.poll() is None:
        child.send_signal(signum)
        try:
            child.wait(STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            child.kill()
    return child.wait()


def run_reloading(args: argparse.Namespace, argv: Sequence[str]) -> int:
    """Run the server as a child of this process, restarted at each change of the
    watched files, until SIGINT or SIGTERM; the child's last exit status."""
    folders = [os.path.abspath(d) for d in (args.app_dir, *args.reload_dir)]
    served: list[int] = []  # the port the first child serves on, once it said so
    stopping = threading.Event()
    child: subprocess.Popen[str] | None = None
    # (a misspelt variable is ignored anyway: left out, each child does not warn again)
    dropped = set(getattr(args, "misspelt_variables", ()))
    env = {k: v for k, v in os.environ.items() if k not in dropped}
    env["PYTHONUNBUFFERED"] = "1"

    def start() -> subprocess.Popen[str]:
        extra = ["--app-dir", folders[0], "--no-reload"]
        if served and served[0] >= 0:
            extra += ["--port", str(served[0])]
        proc = subprocess.Popen(
            [sys.executable, "-m", "weir", *argv, *extra],
            stdout=subprocess.PIPE,
            text=True,
            env=env,
            # Its own process group: a terminal's Ctrl-C reaches it once, from here
            # (twice, the second would cut its graceful shutdown short).
            process_group=0,
        )
        assert proc.stdout is not None
        threading.Thread(target=_pump, args=(proc.stdout, served), daemon=True).start()
        return proc

    def forward(signum: int, _frame: object) -> None:
        stopping.set()
        if child is not None and child.poll() is None:
            child.send_signal(signum)

    signal.signal(signal.SIGINT, forward)
    signal.signal(signal.SIGTERM, forward)
    seen = snapshot(folders)
    child = start()
    try:
        while not stopping.wait(POLL):
            now = snapshot(folders)
            status = child.poll()
            if status is not None and not served:
                return status  # the first start failed: said by the child
            if now == seen:
                continue
            changed = sorted(p for p in now.keys() | seen.keys() if now.get(p) != seen.get(p))
            seen = now
            print(f"weir: reloading ({os.path.relpath(changed[0])} changed)", file=sys.stderr)
            _stop(child)
            child = start()
        return child.wait()
    finally:
        if child.poll() is None:
            _stop(child)
