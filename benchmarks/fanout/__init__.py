"""Fan-out benchmark: hundreds of MCP sessions calling ``tools/call`` over keep-alive.

Theory of operation
-------------------
One run measures one server.  The server is either given (``--url``, any MCP
Streamable HTTP endpoint with an ``echo`` tool; ``--pid`` lets CPU and RSS be read)
or started here as a subprocess on 127.0.0.1 (``--server weir|ceiling|sdk``;
``all`` runs the three one after another and compares them):

* ``weir`` -- ``python -m weir serve benchmarks.weir_app:app`` (the demo's
  ``echo`` plus a ``mark`` tally used to count duplicate executions exactly);
* ``ceiling`` -- :mod:`benchmarks.ceiling`, a minimal Trio + h11 server answering
  the same requests in the same wire format without any MCP machinery;
* ``sdk`` -- :mod:`benchmarks.sdk_server`, the official Python SDK on uvicorn.

A run has three phases -- **setup** (S sessions open and warm up), the **measured
phase** (every session makes K ``tools/call`` of ``echo``, or calls for
``--duration`` seconds, while the server's CPU, RSS and ``/metrics`` are watched) and
the **report** -- and may add, beside the measured sessions, **half-open peers**
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
