"""``weir serve`` options for the paths served besides the MCP endpoint.

``--metrics-path PATH`` (default ``/metrics``) moves the Prometheus text,
``--no-metrics`` serves none (that path is then 404, as any other unknown path);
``--no-legacy-sse`` serves no 2024-11-05 HTTP+SSE transport (``/sse`` and
``/messages`` are 404).  Both runtimes read these from the
:class:`~weir.engine.ServerConfig` fields :func:`route_paths` sets.
"""

from __future__ import annotations

import argparse


def add_route_options(s: argparse.ArgumentParser) -> None:
    """Add the route options to the ``serve`` parser ``s``."""
    g = s.add_argument_group("other paths")
    g.add_argument(
        "--metrics-path",
        default="/metrics",
        metavar="PATH",
        help="where the Prometheus metrics are served, without a token (default /metrics)",
    )
    g.add_argument("--no-metrics", action="store_true", help="serve no metrics (the path is 404)")
    g.add_argument(
        "--no-legacy-sse",
        action="store_true",
        help="do not serve the 2024-11-05 HTTP+SSE transport (/sse and /messages are 404)",
    )


def route_paths(args: argparse.Namespace) -> tuple[str | None, str | None]:
    """The :class:`~weir.engine.ServerConfig` ``metrics_path`` and ``legacy_sse_path``
    the route options ask for.

    Raises:
        SystemExit: a metrics path that is not a path, or is the MCP endpoint's.
    """
    metrics: str | None = None if args.no_metrics else args.metrics_path
    if metrics is not None and not metrics.startswith("/"):
        raise SystemExit(f"weir: --metrics-path must start with '/', got {metrics!r}")
    if metrics is not None and metrics == args.path:
        raise SystemExit(f"weir: --metrics-path {metrics} is the MCP endpoint's --path")
    return metrics, None if args.no_legacy_sse else "/sse"
