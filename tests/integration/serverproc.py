"""``python -m weir serve APP`` as a subprocess on an ephemeral loopback port.

Shared by the integration tests that need a real server process (the official
conformance suite, the official SDK client).  ``driver="asyncio"`` runs the same app
on the asyncio runtime instead (``python -m weir serve --runtime asyncio``).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import IO, NoReturn

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
SERVER_START_TIMEOUT = 20.0
SERVER_STOP_TIMEOUT = 10.0
_SERVING = re.compile(r"^(?:weir|sdk): serving (?P<url>https?://\S+)")
#: The command line each driver is started with (then APP, host, port, extra args).
#: ``sdk``: APP is a module that serves itself with the official SDK's own transport
#: (``python -m APP``), the peer weir's SDK bridge is compared with.
DRIVERS = {
    "trio": ("-m", "weir", "serve"),
    "asyncio": ("-m", "weir", "serve", "--runtime", "asyncio"),
    "sdk": ("-m",),
}


class WeirProcess:
    """``python -m weir serve APP`` on an ephemeral loopback port."""

    def __init__(
        self,
        app: str,
        stdout: IO[bytes],
        stderr: IO[bytes],
        args: Sequence[str] = (),
        *,
        preexec_fn: Callable[[], None] | None = None,
        driver: str = "trio",
        argv: Sequence[str] | None = None,
        cwd: Path = REPO_ROOT,
        env: Mapping[str, str] | None = None,
    ) -> None:
        """Start the server; ``argv`` replaces the whole command line (``app`` and
        ``args`` are then unused), ``cwd`` and ``env`` the child's folder and
        environment (default: the repository root, this process's environment)."""
        self._stdout = stdout
        self._stderr = stderr
        self.driver = driver
        command = argv or [
            sys.executable,
            *DRIVERS[driver],
            app,
            "--host",
            "127.0.0.1",
            "--port",
            "0",
            *args,
        ]
        self.proc = subprocess.Popen(
            command,
            cwd=cwd,
            env={**(os.environ if env is None else env), "PYTHONUNBUFFERED": "1"},
            stdin=subprocess.DEVNULL,
            stdout=stdout,
            stderr=stderr,
            preexec_fn=preexec_fn,
        )
        self.url = self._wait_for_url()

    @property
    def port(self) -> int:
        """The port the server listens on."""
        return int(self.url.rsplit(":", 1)[1].split("/", 1)[0])

    @staticmethod
    def _read(stream: IO[bytes]) -> str:
        # pread: the child shares this file's offset, which must not move under it.
        fd = stream.fileno()
        return os.pread(fd, os.fstat(fd).st_size, 0).decode(errors="replace")

    def stderr(self, limit: int = 6000) -> str:
        """The server's stderr so far (its last ``limit`` characters)."""
        text = self._read(self._stderr)
        return text if len(text) <= limit else "...\n" + text[-limit:]

    def output(self) -> str:
        """The server's stdout and stderr so far (for failure messages)."""
        out, err = self._read(self._stdout)[-2000:], self._read(self._stderr)[-6000:]
        return f"--- server stdout ---\n{out}\n--- server stderr ---\n{err}"

    def _fail(self, why: str) -> NoReturn:
        self.stop()
        pytest.fail(f"weir server did not start: {why}\n{self.output()}", pytrace=False)

    def _wait_for_url(self) -> str:
        deadline = time.monotonic() + SERVER_START_TIMEOUT
        while True:
            first = self._read(self._stdout).split("\n", 1)
            if len(first) == 2:  # the first line is complete
                match = _SERVING.match(first[0].strip())
                if match is None:
                    self._fail(f"unexpected first stdout line {first[0]!r}")
                return match.group("url")
            if self.proc.poll() is not None:
                self._fail(f"it exited with code {self.proc.returncode}")
            if time.monotonic() > deadline:
                self._fail(f"no 'weir: serving URL' line within {SERVER_START_TIMEOUT:.0f} s")
            time.sleep(0.05)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout=SERVER_STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
