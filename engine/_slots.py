"""The store's pipelined hot path on a Redis Cluster: one pipe per primary, by slot.

Theory of operation
-------------------
On a single node every script goes through one pipelined connection
(:mod:`._resp`).  A cluster spreads the slots over several primaries, so
:class:`ClusterPipe` holds one such pipe per primary and sends each command to the
primary that serves its first key's slot.  weir's keys carry one hash tag per session
(and per principal for tasks), so every script touches one slot and one node.

* **Slots.**  :func:`key_slot` is Redis' own: CRC16 (XMODEM) of the key's hash tag
  (the part between the first ``{`` and the next ``}``, when not empty) or of the
  whole key, modulo 16384.  :class:`SlotTable` is the layout: which primary
  address serves each slot, read from ``CLUSTER SLOTS``.
* **Redirections.**  ``MOVED slot host:port`` means that node did not run the
  command and the slot lives elsewhere now: the table learns the new owner for that
  slot and the command goes there (safe: nothing ran).  ``ASK slot host:port``
  (a slot being migrated, this key already moved) sends the command once to that
  node right behind an ``ASKING`` on the same connection, without changing the
  table.  At most :data:`MAX_REDIRECTS` hops; more is an outage (the store maps
  ``MOVED``/``ASK`` replies to 503).
* **Topology refresh on the first error.**  A node that cannot be reached (its pipe
  is down, or a command failed with a connection error or timeout) makes the pipe
  ask the cluster for its layout again at once -- from up to :data:`REFRESH_TRIES`
  nodes whose connection is up, then from one seed or known node that is not (which
  may take the pipe's timeout to answer or fail) -- so the
  slots of a promoted replica are served from it as soon as the cluster has
  promoted it.  One refresh runs at a time; callers that find one under way wait
  for it.  A command whose reply was lost is never re-sent (it may have run): it
  fails, and the store refuses the call (503).
* **Bounds.**  One pipe per primary address in the current layout (and the seeds
  while bootstrapping); pipes of nodes that left the layout are stopped.  Everything
  else each pipe bounds itself (:mod:`._resp`).

This module needs no event loop of its own: the Trio runtime's
:class:`~._resp_cluster.TrioClusterPipe` and the asyncio runtime's twin supply how a
node's pipe is started and stopped, and an event to wait on.
"""

from __future__ import annotations

import binascii
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Protocol

import coredis.exceptions as cx

from ._resp import Arg, Pipe, PipeCalls

#: Slots in a Redis Cluster.
SLOTS = 16384
#: Redirections followed for one command before it fails as an outage.
MAX_REDIRECTS = 5
#: Nodes asked for the layout in one refresh (up nodes first).
REFRESH_TRIES = 3

Address = tuple[str, int]


def key_slot(key: Arg) -> int:
    """The cluster slot of ``key`` (Redis' rule, hash tags included)."""
    raw = key if isinstance(key, bytes) else str(key).encode()
    start = raw.find(b"{")
    if start != -1:
        end = raw.find(b"}", start + 1)
        if end > start + 1:
            raw = raw[start + 1 : end]
    return binascii.crc_hqx(raw, 0) & (SLOTS - 1)


def parse_redirect(message: str) -> tuple[str, int, Address] | None:
    """``("MOVED" | "ASK", slot, (host, port))`` for a redirection reply, else None."""
    parts = message.split(" ")
    if len(parts) != 3 or parts[0] not in ("MOVED", "ASK"):
        return None
    host, colon, port = parts[2].rpartition(":")
    if not colon or not port.isdigit() or not parts[1].isdigit():
        return None
    return parts[0], int(parts[1]), (host.strip("[]"), int(port))


class SlotTable:
    """Which primary serves each slot (None: nobody known)."""

    def __init__(self) -> None:
        self._owner: list[Address | None] = [None] * SLOTS

    def owner(self, slot: int) -> Address | None:
        """The address serving ``slot``, if the layout names one."""
        return self._owner[slot]

    def move(self, slot: int, address: Address) -> None:
        """``slot`` is served by ``address`` now (a ``MOVED`` reply said so)."""
        self._owner[slot] = address

    def load(self, reply: Any, asked: Address) -> set[Address]:
        """Replace the layout with a ``CLUSTER SLOTS`` reply got from ``asked``;
        returns the primaries it names.  A malformed reply raises ``ValueError``
        and leaves the table as it was."""
        owner: list[Address | None] = [None] * SLOTS
        primaries: set[Address] = set()
        if not isinstance(reply, list):
            raise ValueError(f"CLUSTER SLOTS replied {type(reply).__name__}")
        for entry in reply:
            if not isinstance(entry, list) or len(entry) < 3 or not isinstance(entry[2], list):
                raise ValueError("CLUSTER SLOTS: malformed slot range")
            first, last, node = int(entry[0]), int(entry[1]), entry[2]
            if not 0 <= first <= last < SLOTS or len(node) < 2:
                raise ValueError("CLUSTER SLOTS: malformed slot range")
            host = node[0].decode() if isinstance(node[0], bytes) else str(node[0])
            address = (host if host and host != "?" else asked[0], int(node[1]))
            primaries.add(address)
            owner[first : last + 1] = [address] * (last - first + 1)
        self._owner = owner
        return primaries


class NodePipe(Pipe, Protocol):
    """What :class:`ClusterPipe` asks of one node's pipe (either runtime's): a
    :class:`~._resp.Pipe` that says whether it is connected and counts its commands."""

    commands: int

    @property
    def up(self) -> bool: ...


class Flag(Protocol):
    """An event (``trio.Event`` or ``asyncio.Event``)."""

    def set(self) -> None: ...

    async def wait(self) -> Any: ...


class ClusterPipe(PipeCalls):
    """One pipelined connection per primary, commands routed by slot (see the module
    docstring).  A runtime subclass supplies :meth:`_start`, :meth:`_stop`,
    :meth:`_flag` and ``run``.

    Args:
        seeds: addresses to read the layout from first.
        node: builds one node's pipe: ``node(host, port)``.
    """

    def __init__(self, seeds: Sequence[Address], node: Callable[[str, int], NodePipe]) -> None:
        if not seeds:
            raise ValueError("a cluster pipe needs at least one seed node")
        self.seeds = list(seeds)
        self._node_kind = node
        self._nodes: dict[Address, NodePipe] = {}
        self._table = SlotTable()
        self._primaries: set[Address] = set()
        self._refresh: Flag | None = None  # a refresh under way (set when it ends)
        self._loaded = self._flag()  # set once a layout was read
        #: Why the last layout refresh failed (None once one succeeded).
        self.layout_failure: BaseException | None = None
        #: Layout refreshes that succeeded (the first read included).
        self.refreshes = 0

    # -- what a runtime supplies
    def _start(self, pipe: NodePipe) -> None:
        """Run ``pipe.run()`` in the background until :meth:`_stop`."""
        raise NotImplementedError

    def _stop(self, pipe: NodePipe) -> None:
        """Stop what :meth:`_start` started."""
        raise NotImplementedError

    def _flag(self) -> Flag:
        """A fresh event."""
        raise NotImplementedError

    # -- the Pipe interface
    @property
    def failure(self) -> BaseException | None:
        """Why the pipe cannot serve now: the layout could not be read, or a primary's
        connection is down (None when every known primary is up)."""
        if self.layout_failure is not None or not self._primaries:
            return self.layout_failure
        for address in self._primaries:
            node = self._nodes.get(address)
            if node is not None and not node.up:
                return node.failure or cx.ConnectionError(f"{address} is down")
        return None

    @property
    def commands(self) -> int:
        """Commands sent, over every node."""
        return sum(node.commands for node in self._nodes.values())

    @property
    def up(self) -> bool:
        """Whether a layout is known and every primary's connection is up."""
        return bool(self._primaries) and self.failure is None

    async def wait_up(self) -> None:
        """Until a layout is known and every primary in it is connected."""
        await self._loaded.wait()
        for address in list(self._primaries):
            node = self._nodes.get(address)
            if node is not None:  # (None: it left the layout meanwhile)
                await node.wait_up()

    async def call(self, *args: Arg, asking: bool = False) -> Any:
        """Send one keyed command (its first argument after the name is the key) to
        the primary serving that key's slot."""
        if len(args) < 2:
            raise ValueError(f"a cluster pipe routes by key; {args[:1]!r} has none")
        return await self._routed(args[1], lambda node, ask: node.call(*args, asking=ask))

    async def evalsha(
        self,
        source: str | bytes,
        sha: str | bytes,
        keys: Sequence[Arg],
        args: Sequence[Arg],
        *,
        asking: bool = False,
    ) -> Any:
        """The script on the primary serving its first key's slot."""
        return await self._routed(
            _first_key(keys), lambda node, ask: node.evalsha(source, sha, keys, args, asking=ask)
        )

    async def evalsha_durable(
        self,
        source: str | bytes,
        sha: str | bytes,
        keys: Sequence[Arg],
        args: Sequence[Arg],
        replicas: int,
        wait_ms: int,
        *,
        asking: bool = False,
    ) -> tuple[Any, int]:
        """The script, then ``WAIT``, both on the primary that ran it."""

        def op(node: NodePipe, ask: bool) -> Awaitable[tuple[Any, int]]:
            return node.evalsha_durable(source, sha, keys, args, replicas, wait_ms, asking=ask)

        result: tuple[Any, int] = await self._routed(_first_key(keys), op)
        return result

    # -- routing
    async def _routed(self, key: Arg, op: Callable[[NodePipe, bool], Awaitable[Any]]) -> Any:
        slot = key_slot(key)
        node = await self._node_serving(slot)
        asking = False
        for _ in range(MAX_REDIRECTS):
            try:
                return await op(node, asking)
            except cx.ResponseError as exc:
                redirect = parse_redirect(str(exc))
                if redirect is None:
                    raise
                kind, moved_slot, address = redirect
                node = self._node(address)
                asking = kind == "ASK"
                if not asking:
                    self._table.move(moved_slot, address)
                    self._primaries.add(address)
            except (cx.ConnectionError, TimeoutError, OSError):
                await self.refresh()  # the first error: ask the cluster now
                raise
        raise cx.ResponseError(f"MOVED: slot {slot} redirected {MAX_REDIRECTS} times")

    async def _node_serving(self, slot: int) -> NodePipe:
        address = self._table.owner(slot)
        if address is None or not self._node(address).up:
            await self.refresh()
            address = self._table.owner(slot)
            if address is None:
                raise cx.ConnectionError(
                    f"no node of the cluster is known to serve slot {slot}"
                ) from self.layout_failure
        return self._node(address)

    def _node(self, address: Address) -> NodePipe:
        node = self._nodes.get(address)
        if node is None:
            node = self._nodes[address] = self._node_kind(*address)
            self._start(node)
        return node

    async def refresh(self) -> None:
        """Read the layout again now (joins a refresh under way; never raises: a
        failure is kept in :attr:`layout_failure` for the next caller)."""
        running = self._refresh
        if running is not None:
            await running.wait()
            return
        done = self._refresh = self._flag()
        try:
            await self._read_layout()
        finally:
            self._refresh = None
            done.set()

    async def _read_layout(self) -> None:
        known = dict.fromkeys([*self._primaries, *self.seeds, *self._nodes])
        # Nodes whose connection is up first; at most one that is down, since asking
        # it waits for its reconnection (the pipe's timeout).
        up = [a for a in known if a in self._nodes and self._nodes[a].up]
        down = [a for a in known if a not in up]
        for address in [*up[:REFRESH_TRIES], *down[:1]]:
            try:
                reply = await self._node(address).call("CLUSTER", "SLOTS")
                primaries = self._table.load(reply, address)
            except (cx.RedisError, OSError, TimeoutError, ValueError) as exc:
                self.layout_failure = exc
                continue
            self.layout_failure = None
            self._primaries = primaries
            self.refreshes += 1
            for stale in [a for a in self._nodes if a not in primaries]:
                self._stop(self._nodes.pop(stale))
            for primary in primaries:  # connect to every primary now, not on first use
                self._node(primary)
            self._loaded.set()
            return


def _first_key(keys: Sequence[Arg]) -> Arg:
    if not keys:
        raise ValueError("a cluster pipe routes a script by its first key; it has none")
    return keys[0]


__all__ = ["SLOTS", "ClusterPipe", "SlotTable", "key_slot", "parse_redirect"]
