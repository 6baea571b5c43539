"""The official MCP conformance suite against ``python -m engine serve conformance``.

The suite is installed from npm on first use (see tests/conformance_runner.py).
When it cannot be installed or run, these tests skip, unless
``WEIR_REQUIRE_CONFORMANCE=1`` (CI sets it), when they fail.
With ``WEIR_CONFORMANCE_REPORT_DIR`` set, each run's summary lines are also written
to ``$WEIR_CONFORMANCE_REPORT_DIR/<suite version>.txt`` so CI can check the leg ran.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO, NoReturn

import pytest

from tests.conformance_runner import (
    ConformanceReport,
    ConformanceUnavailable,
    ensure_suite,
    run_conformance,
)

pytestmark = pytest.mark.conformance

REPO_ROOT = Path(__file__).resolve().parents[2]
SERVER_START_TIMEOUT = 20.0
SERVER_STOP_TIMEOUT = 5.0
_SERVING = re.compile(r"^weir: serving (?P<url>https?://\S+)")

# WARNING checks that are accepted, as (scenario, check id). Anything else fails.
#
# None are.  (Suite 0.1.16's server-sse-polling scenario sends
# `mcp-protocol-version: 2025-03-26` on a session that negotiated 2025-11-25; servers
# that decide on priming events from that per-request header get two warnings.
# weir decides from the negotiated revision, so it primes and gets none.)
ALLOWED_WARNINGS_0_1_16: frozenset[tuple[str, str]] = frozenset()
ALLOWED_WARNINGS_0_2_0_ALPHA_12: frozenset[tuple[str, str]] = frozenset()


class WeirServer:
    """``python -m engine serve conformance`` on an ephemeral port."""

    def __init__(self, stdout: IO[bytes], stderr: IO[bytes]) -> None:
        """Start it, its output going to the given (seekable, temporary) files."""
        self._stdout = stdout
        self._stderr = stderr
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "engine",
                "serve",
                "conformance",
                "--host",
                "127.0.0.1",
                "--port",
                "0",
            ],
            cwd=REPO_ROOT,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
            stdin=subprocess.DEVNULL,
            stdout=self._stdout,
            stderr=self._stderr,
        )
        self.url = self._wait_for_url()

    @staticmethod
    def _read(stream: IO[bytes]) -> str:
        # pread: the child shares this file's offset, which must not move under it.
        fd = stream.fileno()
        return os.pread(fd, os.fstat(fd).st_size, 0).decode(errors="replace")

    def stderr(self, limit: int = 6000) -> str:
        text = self._read(self._stderr)
        return text if len(text) <= limit else "...\n" + text[-limit:]

    def _fail(self, why: str) -> NoReturn:
        self.stop()
        stdout = self._read(self._stdout)[-2000:]
        pytest.fail(
            f"weir server did not start: {why}\n"
            f"--- server stdout ---\n{stdout}\n--- server stderr ---\n{self.stderr()}",
            pytrace=False,
        )

    def _wait_for_url(self) -> str:
        deadline = time.monotonic() + SERVER_START_TIMEOUT
        while True:
            first_line = self._read(self._stdout).split("\n", 1)
            if len(first_line) == 2:  # the first line is complete
                match = _SERVING.match(first_line[0].strip())
                if match is None:
                    self._fail(f"unexpected first stdout line {first_line[0]!r}")
                return match.group("url")
            if self.proc.poll() is not None:
                self._fail(f"it exited with code {self.proc.returncode}")
            if time.monotonic() > deadline:
                self._fail(f"no 'weir: serving URL' line within {SERVER_START_TIMEOUT:.0f}s")
            time.sleep(0.05)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout=SERVER_STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@pytest.fixture(scope="module")
def weir_server() -> Iterator[WeirServer]:
    with tempfile.TemporaryFile() as stdout, tempfile.TemporaryFile() as stderr:
        server = WeirServer(stdout, stderr)
        try:
            yield server
        finally:
            server.stop()


def _unavailable(reason: str) -> NoReturn:
    message = f"conformance suite unavailable: {reason}"
    if os.environ.get("WEIR_REQUIRE_CONFORMANCE") == "1":
        pytest.fail(message, pytrace=False)
    pytest.skip(message)


def _run_suite(
    request: pytest.FixtureRequest,
    version: str,
    *,
    suite: str,
    spec_version: str | None = None,
) -> tuple[ConformanceReport, WeirServer]:
    server: WeirServer | None = None
    try:
        # Installing first means a machine without npm skips before starting a server.
        ensure_suite(version)
        server = request.getfixturevalue("weir_server")
        assert isinstance(server, WeirServer)
        report = run_conformance(
            server.url, version=version, suite=suite, spec_version=spec_version
        )
    except ConformanceUnavailable as exc:
        reason = exc.reason
        if server is not None and server.proc.poll() is not None:
            reason += f"\n--- server stderr ---\n{server.stderr()}"
        _unavailable(reason)

    assert server is not None
    lines = report.summary_lines()
    print(f"\n[conformance {version}]\n" + "\n".join(lines))
    report_dir = os.environ.get("WEIR_CONFORMANCE_REPORT_DIR")
    if report_dir:
        path = Path(report_dir)
        path.mkdir(parents=True, exist_ok=True)
        (path / f"{version}.txt").write_text("\n".join(lines) + "\n")
    return report, server


def _check(
    report: ConformanceReport,
    server: WeirServer,
    *,
    expected_scenarios: int,
    allowed_warnings: frozenset[tuple[str, str]],
) -> None:
    def explain(what: str) -> str:
        text = f"{what}\n{report.format()}"
        if server.proc.poll() is not None:
            text += (
                f"\nthe server exited with code {server.proc.returncode}; "
                f"its stderr:\n{server.stderr()}"
            )
        return text

    assert report.total == expected_scenarios, explain(
        f"expected {expected_scenarios} scenarios, got {report.total}"
    )
    assert report.scenarios_failed == 0, explain(f"{report.scenarios_failed} scenario(s) failed")
    unexpected = [
        f"{scenario}: {note.check_id}: {note.message}"
        for scenario, note in report.warnings()
        if (scenario, note.check_id) not in allowed_warnings
    ]
    assert not unexpected, explain("unexpected WARNING checks:\n" + "\n".join(unexpected))


def test_conformance_0_1_16_all(request: pytest.FixtureRequest) -> None:
    report, server = _run_suite(request, "0.1.16", suite="all")
    _check(report, server, expected_scenarios=32, allowed_warnings=ALLOWED_WARNINGS_0_1_16)


def test_conformance_0_2_0_alpha_12_all_2025_11_25(request: pytest.FixtureRequest) -> None:
    report, server = _run_suite(request, "0.2.0-alpha.12", suite="all", spec_version="2025-11-25")
    _check(
        report,
        server,
        expected_scenarios=33,
        allowed_warnings=ALLOWED_WARNINGS_0_2_0_ALPHA_12,
    )
