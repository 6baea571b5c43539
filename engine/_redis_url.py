"""A store URL, turned into the clients that talk to it: coredis, and the hot path's pipe.

Theory of operation
-------------------
:meth:`~._redis_store.RedisStore.connect` takes one URL; this module owns what it
may say and what each form builds.  Nothing here connects: the clients come back
not entered yet, so a bad URL is ``ValueError`` and never an outage.

* ``redis://[user:password@]host[:port][/db]`` and ``rediss://...`` (TLS; coredis'
  ``ssl_*`` query options apply) build a single-node coredis client with its
  automatic retries **off** (a script whose reply was lost may have run; see
  :mod:`._redis_connection`).  A plain ``redis://`` store also gets a pipelined
  connection (:class:`~._resp.Pipe`; :class:`~._resp.RespPipe` on Trio) that carries the
  hot path's scripts and session reads; a TLS store has none, and coredis carries
  everything.
* ``redis+cluster://[user:password@]host:port[,host:port...]`` and
  ``rediss+cluster://...`` build a Redis Cluster client from its seed nodes: no
  database or path, only the ``ssl_*`` options (anything else is refused), and
  only ``CLUSTERDOWN`` is retried (the command was refused, so nothing ran).  A
  plain ``redis+cluster://`` store also gets a cluster pipe (one pipelined
  connection per primary, commands routed by slot: :mod:`._slots`) for the same
  hot path.

Every client's connect, read and pool timeouts are the store's one deadline.  A
malformed or unsupported URL, or TLS material that cannot be loaded, is
``ValueError`` naming the URL with its password redacted (:func:`_redact`).
"""

from __future__ import annotations

import ssl
from collections.abc import Callable
from typing import Literal, cast
from urllib.parse import parse_qsl, unquote, urlsplit

import coredis
import coredis.exceptions as cx
from coredis.client import Client
from coredis.connection import TCPLocation
from coredis.retry import ConstantRetryPolicy, NoRetryPolicy

from ._resp import Pipe, RespPipe

_SCHEMES: dict[str, tuple[bool, bool]] = {  # scheme -> (tls, cluster)
    "redis": (False, False),
    "rediss": (True, False),
    "redis+cluster": (False, True),
    "rediss+cluster": (True, True),
}
_CLUSTER_QUERY = frozenset({"ssl_ca_certs", "ssl_certfile", "ssl_keyfile", "ssl_cert_reqs"})


def _redact(url: str) -> str:
    """``url`` without its password, for messages."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "<malformed URL>"
    userinfo, at, hosts = parts.netloc.rpartition("@")
    if not at or ":" not in userinfo:
        return url
    user = userinfo.partition(":")[0]
    return parts._replace(netloc=f"{user}:***@{hosts}").geturl()


def _cluster_seeds(url: str) -> tuple[str | None, str | None, list[tuple[str, int]]]:
    """A cluster URL's username, password and seed nodes (ValueError if malformed)."""
    parts = urlsplit(url)
    userinfo, at, hosts = parts.netloc.rpartition("@")
    username: str | None = None
    password: str | None = None
    if at:
        user, colon, secret = userinfo.partition(":")
        username = unquote(user) or None
        password = unquote(secret) if colon else None
    seeds: list[tuple[str, int]] = []
    for seed in hosts.split(","):
        node = urlsplit(f"//{seed}")
        if not node.hostname:
            raise ValueError(f"store URL {_redact(url)!r}: a cluster seed node has no host")
        seeds.append((node.hostname, node.port or 6379))  # port: ValueError if bad
    return username, password, seeds


def _cluster_client(url: str, *, tls: bool, timeout: float) -> coredis.RedisCluster[bytes]:
    parts = urlsplit(url)
    if parts.path not in ("", "/", "/0") or parts.fragment:
        raise ValueError(f"store URL {_redact(url)!r}: a cluster URL has no database or path")
    query = dict(parse_qsl(parts.query, keep_blank_values=True))
    unknown = set(query) - _CLUSTER_QUERY
    if unknown:
        raise ValueError(
            f"store URL {_redact(url)!r}: unsupported cluster option(s) {sorted(unknown)}; "
            f"supported: {sorted(_CLUSTER_QUERY)}"
        )
    username, password, seeds = _cluster_seeds(url)
    nodes = [TCPLocation(host, port) for host, port in seeds]
    cert_reqs = query.get("ssl_cert_reqs")
    if cert_reqs not in (None, "optional", "required", "none"):
        raise ValueError(f"store URL {_redact(url)!r}: bad ssl_cert_reqs {cert_reqs!r}")
    return coredis.RedisCluster(
        startup_nodes=nodes,
        username=username,
        password=password,
        ssl=tls,
        ssl_ca_certs=query.get("ssl_ca_certs"),
        ssl_certfile=query.get("ssl_certfile"),
        ssl_keyfile=query.get("ssl_keyfile"),
        ssl_cert_reqs=cast(Literal["optional", "required", "none"] | None, cert_reqs),
        connect_timeout=timeout,
        stream_timeout=timeout,
        pool_timeout=timeout,
        decode_responses=False,
        verify_version=False,
        # CLUSTERDOWN means the command was refused, so retrying it is safe; a lost reply
        # is not (the script may have run): see the module docstring.
        retry_policy=ConstantRetryPolicy((cx.ClusterDownError,), retries=2, delay=0.1),
    )


def _client_for(url: str, *, timeout: float) -> Client[bytes]:
    """A coredis client for ``url`` (not entered yet).  Raises ValueError for a bad URL."""
    scheme, sep, _ = url.partition("://")
    if not sep or scheme.lower() not in _SCHEMES:
        raise ValueError(
            f"store URL {_redact(url)!r}: unsupported scheme {scheme + sep!r}; expected "
            "redis://host[:port][/db], rediss://... (TLS), "
            "redis+cluster://host:port[,host:port...] or rediss+cluster://..."
        )
    tls, cluster = _SCHEMES[scheme.lower()]
    try:
        if cluster:
            return _cluster_client(url, tls=tls, timeout=timeout)
        parts = urlsplit(url)
        if not parts.hostname:
            raise ValueError(f"store URL {_redact(url)!r} has no host")
        _ = parts.port  # raises ValueError for a malformed port
        return coredis.Redis.from_url(
            url,
            decode_responses=False,
            verify_version=False,
            retry_policy=NoRetryPolicy(),
            connect_timeout=timeout,
            stream_timeout=timeout,
            pool_timeout=timeout,
        )
    except ValueError as exc:  # urllib's and coredis' own complaints about the URL
        if str(exc).startswith("store URL"):
            raise
        raise ValueError(f"store URL {_redact(url)!r}: {exc}") from exc
    except (ssl.SSLError, OSError) as exc:  # e.g. an unreadable CA file
        raise ValueError(f"store URL {_redact(url)!r}: TLS setup failed: {exc}") from exc


def _pipe_for(
    url: str,
    *,
    timeout: float,
    kind: Callable[..., Pipe] = RespPipe,
    cluster_kind: Callable[..., Pipe] | None = None,
) -> Pipe | None:
    """The pipelined hot-path connection for a plain ``redis://`` URL (``kind``) or a
    plain ``redis+cluster://`` URL (``cluster_kind``, one pipe per primary); None for
    TLS URLs, which coredis carries whole."""
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme == "redis+cluster" and cluster_kind is not None:
        username, password, seeds = _cluster_seeds(url)
        return cluster_kind(seeds, username=username, password=password, timeout=timeout)
    if scheme != "redis" or not parts.hostname:
        return None
    path = parts.path.strip("/")
    db = int(path) if path.isdigit() else 0
    return kind(
        parts.hostname,
        parts.port or 6379,
        username=unquote(parts.username) if parts.username else None,
        password=unquote(parts.password) if parts.password is not None else None,
        db=db,
        timeout=timeout,
    )
