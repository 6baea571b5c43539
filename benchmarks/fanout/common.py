"""What every part of the fan-out benchmark shares: the repository root, the error, the options.

Theory of operation
-------------------
:data:`REPO` is the root of the checkout (this file is ``benchmarks/fanout/common.py``,
three levels below it).  Servers, the gateway and the peer process are started with it
as their working directory, and the provenance in the JSON line hashes the sources
under it (``protocol/`` and ``engine/``).

:class:`BenchError` means a run could not be carried out; the command line reports it
and exits with status 1.  :class:`Options` is the validated command line
(:func:`benchmarks.fanout.cli.options` builds it); every other module reads it and none
changes it (``--ab`` makes modified copies with :func:`dataclasses.replace`).

This module imports nothing else from the package.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]  # benchmarks/fanout/common.py -> the checkout


class BenchError(Exception):
    """A run could not be carried out (a server did not start, setup failed, ...)."""


@dataclass
class Options:
    """The parsed command line (see :func:`parser`)."""

    sessions: int
    calls: int
    concurrency: int
    duration: float | None
    rate: float | None
    warmup: int
    text_size: int
    json_response: bool
    sessionless: bool
    half_open: int
    half_open_rate: float
    half_open_pad: int
    half_open_posters: int
    half_open_control: bool
    gateway_retries: int
    gateway_timeout: float
    gateway_scope: str
    sample_interval: float
    call_timeout: float
    credit: dict[str, float]
    weir_app: str
    metrics_path: str
    legacy_sse_path: str
    progress: bool
    quiet_wait: float
    store: str | None = None
    #: Sessionless: every tools/call carries a fresh ``Idempotency-Key`` (weir's gate).
    idempotency_keys: bool = False
    store_replicas: int = 0  # weir: --store-replicas (only where a store is used)
    workers: int = 1
    #: The runtime weir serves on (``weir serve --runtime``).
    runtime: str = "trio"
    peer_process: bool = False
    peer_nice: int = 0
    pin_server: bool = False
    #: ``session``: the whole life of every session is measured (connect, initialize,
    #: the calls), all sessions starting at once; ``phase``: only the calls, after a
    #: setup phase; ``idle``: sessions opened and left idle, for memory.
    measure: str = "session"
    idle_hold: float = 5.0
    #: ``--client CMD``: this command drives the server instead of fanout's own client.
    client: str | None = None
