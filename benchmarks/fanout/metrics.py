"""What the server says about itself: weir's ``/metrics`` and the store's command counts.

Theory of operation
-------------------
For weir, ``/metrics`` (Prometheus text) is scraped every ``--sample-interval``
seconds during the measured phase (queue depth over time, for the plot) and at both
ends of it (executions, refusals, teardowns, duplicates stopped by the idempotency
gate).  :func:`scrape` returns ``None`` for a server without ``/metrics`` (the
ceiling, the SDK), and the run then reports those numbers as ``n/a``.  Per-session
series are labelled with :func:`session_label`, a short hash of the session id, which
is how the half-open peers' sessions are picked out of the others.

With ``--store``, :func:`store_round_trips` reads the Redis-protocol server's
``INFO commandstats`` at both ends of the phase: the top-level commands weir's store
sent, for "store round trips per call".
"""

from __future__ import annotations

import hashlib
import socket
from urllib.parse import urlsplit

import trio

from .client import Client, HttpError


def _bulk(host: str, port: int, command: bytes) -> str | None:
    """One command's bulk-string reply (``INFO ...``, ``CLUSTER NODES``), or None."""
    try:
        with socket.create_connection((host, port), 2) as c:
            c.sendall(command)
            data = b""
            while not data.endswith(b"\r\n") or data.count(b"\r\n") < 2:
                chunk = c.recv(65536)
                if not chunk:
                    break
                data += chunk
                header, _, rest = data.partition(b"\r\n")
                if header.startswith(b"$") and len(rest) >= int(header[1:]):
                    break
    except OSError:
        return None
    return data.decode("utf-8", "replace")


def store_round_trips(url: str) -> int | None:
    """Commands clients sent to the Redis-protocol server at ``url`` so far (on a
    ``redis+cluster://`` URL: to every primary the seed node names).

    Counts the top-level commands weir's store issues (EVALSHA/EVAL scripts and
    HGETALL), from ``INFO commandstats``; commands run inside scripts are not
    round trips and are not counted.
    """
    parts = urlsplit(url)
    nodes = [(parts.hostname or "127.0.0.1", parts.port or 6379)]
    if "cluster" in parts.scheme:
        layout = _bulk(*nodes[0], b"*2\r\n$7\r\nCLUSTER\r\n$5\r\nNODES\r\n")
        if layout is None:
            return None
        nodes = []
        for line in layout.splitlines()[1:]:
            fields = line.split()
            if len(fields) > 2 and "master" in fields[2] and "fail" not in fields[2]:
                name, _, number = fields[1].split("@", 1)[0].rpartition(":")
                nodes.append((name or "127.0.0.1", int(number)))
    total = 0
    for host, port in nodes:
        data = _bulk(host, port, b"*2\r\n$4\r\nINFO\r\n$12\r\ncommandstats\r\n")
        if data is None:
            return None
        for line in data.splitlines():
            name, _, stats = line.partition(":")
            if name in ("cmdstat_evalsha", "cmdstat_eval", "cmdstat_hgetall"):
                total += int(stats.split("calls=", 1)[1].split(",", 1)[0])
    return total


def parse_metrics(text: str) -> dict[str, float]:
    """Prometheus text -> {``name{labels}``: value}."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        name, _, value = line.rpartition(" ")
        try:
            out[name] = float(value)
        except ValueError:
            continue
    return out


def _series(metrics: dict[str, float], name: str) -> dict[str, float]:
    """``{label value: sample}`` of a metric with one label (``name{session="…"}``)."""
    prefix = name + "{"
    return {k.split('"')[1]: v for k, v in metrics.items() if k.startswith(prefix) and '"' in k}


def session_label(session_id: str) -> str:
    """The label weir's ``/metrics`` uses for a session (a short hash of its id)."""
    return hashlib.sha256(session_id.encode()).hexdigest()[:12]


async def scrape(client: Client, url_path: str) -> dict[str, float] | None:
    """GET ``/metrics``; ``None`` if the server has none."""
    req = f"GET {url_path} HTTP/1.1\r\nHost: {client.host}:{client.port}\r\n\r\n".encode()
    try:
        with trio.fail_after(10):
            reply = await client.exchange(req, None)
    except (HttpError, trio.TooSlowError):
        return None
    if reply.status != 200:
        return None
    return parse_metrics(reply.body.decode(errors="replace"))
