"""Fan-out benchmark: hundreds of MCP sessions calling ``tools/call`` over keep-alive.

Theory of operation
-------------------
One run measures one server.  The server is either given (``--url``, any MCP
Streamable HTTP endpoint with an ``echo`` tool; ``--pid`` lets CPU and RSS be read)
or started here as a subprocess on 127.0.0.1 (``--server weir|floor|ceiling|sdk|sdk-weir``;
``compare`` runs weir, the floor and the ceiling one after another, ``all`` adds the
SDK, ``sdk-compare`` runs sdk-weir, sdk and weir; ``--repeat N`` runs that rotation N
times and reports each ratio as the median of the rounds'; ``--compare-store URL``
runs weir on the memory store and on URL):

* ``weir`` -- ``python -m weir serve benchmarks.weir_app:app`` (the demo's
  ``echo`` plus a ``mark`` tally used to count duplicate executions exactly);
* ``floor`` -- :mod:`benchmarks.floor`, the same answers as the ceiling with HTTP
  framed by hand: the least a Trio server spends on these requests;
* ``ceiling`` -- :mod:`benchmarks.ceiling`, a minimal Trio + h11 server answering
  the same requests in the same wire format without any MCP machinery;
* ``sdk`` -- :mod:`benchmarks.sdk_server`, the official Python SDK on uvicorn;
* ``sdk-weir`` -- ``python -m weir serve benchmarks.sdk_server:server``: the very
  app ``sdk`` serves, served by weir through its SDK bridge (:mod:`.sdk_side`).

What is measured (``--measure``):

* ``session`` (the default): what a user of the server sees.  All S sessions start
  at once; each connects, sends ``initialize`` and ``notifications/initialized``
  and makes K ``tools/call`` of ``echo`` (64 bytes of text) one after another on
  its keep-alive connection.  The server's CPU is counted over all of it, so CPU
  per call includes each session's share of connecting and ``initialize``, and
  ``initialize`` is timed from the start of connecting (its p50 and p99 are
  reported).  ``/metrics`` is read only at the two ends, so the scraping that
  only weir answers is not charged to weir.
* ``phase``: setup first, unmeasured (sessions open 64 at a time and make
  ``--warmup`` calls), then only the calls (or ``--duration`` seconds of them,
  paced with ``--rate``) are measured, while ``/metrics`` is sampled; the mode of
  the half-open and gateway runs.
* ``idle``: the sessions are opened (one call each) and left idle on their
  connections for ``--idle-hold`` seconds (5: weir parks connections idle for 2 s);
  the report is the server's RSS per
  session over its RSS before the first.

A ``phase`` run has three phases -- **setup**, the **measured phase** (while the
server's CPU, RSS and ``/metrics`` are watched) and the **report** -- and may add,
beside the measured sessions, **half-open peers**
(``--half-open N``: sessions that stop reading their stream and keep sending) and a
**retrying gateway** (``--gateway-retries R``, :mod:`benchmarks.gateway`) between the
clients and the server.

**Isolating what the server does** from what the peers' own traffic costs a shared
machine (the load generator, the peers, the gateway and the server otherwise share the
same cores, and every one of the peers' POSTs costs all of them CPU):
``--peer-process`` and ``--peer-nice`` (:mod:`.peers`), ``--pin-server``
(:mod:`.servers`) and ``--ab`` (:mod:`.cli`, compared by :mod:`.report`).

Output: a progress bar on stderr when it is a terminal, then a table and exactly
one JSON line on stdout (with the p99 of every 5 s of the phase), and a PNG (latency
CDF, p99 over time, queue depth over time, RSS over time) when matplotlib is
installed.  A server that exits during its run marks the run invalid.  Every loop is
bounded in count and in time.

The modules, each importing only modules listed above it:

* :mod:`.common` -- the repository root, :class:`BenchError`, :class:`Options`;
* :mod:`.client` -- the HTTP/1.1 client and MCP sessions, and how a call is timed;
* :mod:`.system` -- CPU, memory and CPU placement from ``/proc`` and ``sched_*``;
* :mod:`.metrics` -- weir's ``/metrics`` and the store's command counts;
* :mod:`.report` -- the run's record and statistics, the table, ratios, provenance, plot;
* :mod:`.sdk_side` -- the SDK's app on weir against the SDK's own transport: ratios, table;
* :mod:`.peers` -- the half-open (and control) peers, in this process or their own;
* :mod:`.load` -- one run: the sessions, the drivers, the samplers, the sums;
* :mod:`.servers` -- starting and stopping the server and the gateway around a run;
* :mod:`.cli` -- the command line (``python -m benchmarks.fanout``, :mod:`.__main__`).
"""

from __future__ import annotations

from .cli import main, options, parser
from .common import BenchError, Options
from .load import Run
from .report import RunResult
from .servers import run_one

__all__ = ["BenchError", "Options", "Run", "RunResult", "main", "options", "parser", "run_one"]
