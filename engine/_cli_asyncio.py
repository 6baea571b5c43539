"""``weir serve --runtime asyncio``: the command line's side of the asyncio runtime.

Theory of operation
-------------------
The command line is the Trio engine's (:mod:`weir.engine.cli`); :mod:`weir.asyncio`
imports neither it nor Trio, and is imported from here only when asked for.  With
``--runtime asyncio`` the CLI:

1. **Serves every ``serve`` option the Trio path serves**, with the same meaning;
   :data:`SERVED` names them, and a test keeps it equal to the parser's options, so an
   option added later cannot be silently ignored by this runtime (whoever adds one
   decides here whether the asyncio runtime serves it).
2. **Checks them as the Trio path does** (the same :func:`config_from_args`), and
   turns the :class:`~weir.engine.ServerConfig` into a
   :class:`~weir.asyncio.AsyncioConfig` (:func:`asyncio_config`).
3. **Runs** :func:`weir.asyncio.run`, printing ``weir: serving URL`` first on stdout
   and the event loop on stderr; a start-up failure is one line on stderr, status 1.
"""

from __future__ import annotations

import dataclasses
import logging
import sys
from collections.abc import Iterable

from weir.app import App
from weir.asyncio import AsyncioConfig, StartupFailed, run
from weir.common._memory import tune_allocator
from weir.engine._tasks import TaskSettings
from weir.protocol import ReadTimeouts

from ._config import ServerConfig
from ._startup import describe, explain

log = logging.getLogger(__name__)


#: ``serve`` options the asyncio runtime serves as the Trio path does: all of them (a
#: test keeps this equal to the parser's options, so that a new option is never
#: silently ignored by the asyncio runtime).
SERVED: frozenset[str] = frozenset(
    {
        "app",
        "runtime",
        "app_dir",
        "startup_timeout",
        "host",
        "port",
        "path",
        "json_response",
        "allow_host",
        "forwarded_allow_ips",
        "root_path",
        "log_level",
        "log_format",
        "access_log",
        "credit_frames",
        "credit_bytes",
        "drain_window",
        "liveness_timeout",
        "max_connections",
        "keepalive_timeout",
        "head_timeout",
        "body_timeout",
        "linger_timeout",
        "max_body_bytes",
        "max_header_bytes",
        "max_header_fields",
        "max_target_bytes",
        "max_sessions",
        "session_idle_timeout",
        "initialize_timeout",
        "max_inbound_bytes",
        "max_outbound_bytes",
        "max_batch",
        "sse_keepalive",
        "state_key_file",
        "auth_issuer",
        "auth_resource",
        "auth_jwks_url",
        "auth_jwks_file",
        "auth_scope",
        "auth_server",
        "shutdown_grace",
        "max_sessions_per_principal",
        "retry_window",
        "store",
        "replica_id",
        "store_replicas",
        "store_replica_timeout",
        "claim_lease",
        "session_retain_bytes",
        "memory_budget",
        "resume",
        "workers",
        "reuse_port",
        "ssl_certfile",
        "ssl_keyfile",
        "ssl_keyfile_password",
        "ssl_ca_certs",
        "metrics_path",
        "no_metrics",
        "no_legacy_sse",
        "reload",
        "reload_dir",
        "uds",
        "task_ttl",
        "task_poll_ms",
        "max_tasks_per_principal",
        "max_task_result_bytes",
    }
)


#: ``serve`` options that only the Trio runtime has.  With ``--runtime asyncio`` each
#: must be left at its default or turned off: anything else is refused, never ignored.
TRIO_ONLY: frozenset[str] = frozenset({"park_idle_after"})
_PARK_DEFAULT = next(
    f.default for f in dataclasses.fields(ServerConfig) if f.name == "park_idle_after"
)


def asyncio_config(
    config: ServerConfig, startup_timeout: float, store: str = "memory"
) -> AsyncioConfig:
    """The asyncio runtime's settings for what ``config`` (checked, from the command
    line) asks, every field of it that the asyncio runtime serves, on the ``--store``
    named ``store`` (checked by the command line too).

    Raises:
        ValueError: a :data:`TRIO_ONLY` setting was asked for.
    """
    if config.park_idle_after not in (0, _PARK_DEFAULT):
        raise ValueError(
            "--park-idle-after is the Trio runtime's: on asyncio an idle connection keeps "
            "its task; leave it unset or 0 with --runtime asyncio"
        )
    return AsyncioConfig(
        host=config.host,
        port=config.port,
        endpoint=config.endpoint(),
        limits=config.limits,
        read_timeouts=ReadTimeouts(
            keepalive=config.keepalive_timeout,
            head=config.head_timeout,
            body=config.body_timeout,
            linger=config.linger_timeout,
        ),
        credit=config.credit,
        max_connections=config.connection_limit,
        max_sessions=config.max_sessions,
        idle_timeout=config.session_idle_timeout,
        initialize_timeout=config.initialize_timeout,
        max_inbound_bytes=config.max_inbound_bytes,
        max_outbound_bytes=config.max_outbound_bytes,
        sse_keepalive=config.sse_keepalive,
        startup_timeout=startup_timeout,
        state_keys=config.state_keys,
        auth=config.auth,
        metrics_path=config.metrics_path,
        shutdown_grace=config.shutdown_grace,
        retry_ms=config.retry_ms,
        max_sessions_per_principal=config.max_sessions_per_principal,
        legacy_sse_path=config.legacy_sse_path,
        legacy_messages_path=config.legacy_messages_path,
        retry_window=config.retry_window,
        store=store,
        replica_id=config.replica_id,
        claim_lease=config.claim_lease,
        resume=config.resume,
        session_retain_bytes=config.session_retain_bytes,
        memory_budget=config.memory_budget,
        reuse_port=config.reuse_port,
        ssl_context=config.ssl_context,
        tasks=TaskSettings.of(config),
        uds=config.uds,
    )


def serve_on_asyncio(app: App, config: AsyncioConfig, warn: Iterable[str] = ()) -> int:
    """Run the asyncio runtime until a signal; the process's exit status.

    ``warn``: lines printed to stderr once the server listens.
    """
    serving = False

    def started(url: str, loop_name: str) -> None:
        nonlocal serving
        serving = True
        tune_allocator()  # (as weir serve does on Trio: large buffers unmapped when freed)
        print(f"weir: serving {url}", flush=True)
        hint = "" if loop_name == "uvloop" else " (uvloop is not installed: weir[asyncio])"
        print(f"weir: runtime asyncio, event loop {loop_name}{hint}", file=sys.stderr, flush=True)
        for line in warn:
            print(line, file=sys.stderr, flush=True)

    try:
        run(app, config, started=started)
    except KeyboardInterrupt:
        return 130
    except Exception as exc:
        if serving:
            raise  # not a start-up failure: a bug, with its traceback
        log.debug("start-up failed", exc_info=exc)
        line = (
            str(exc)
            if isinstance(exc, StartupFailed)
            else explain(exc, config.host, config.port) or f"weir: could not start: {describe(exc)}"
        )
        print(line, file=sys.stderr, flush=True)
        return 1
    return 0
