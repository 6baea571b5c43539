"""``weir serve --runtime asyncio``: the command line's side of the asyncio runtime.

Theory of operation
-------------------
The command line is the Trio engine's (:mod:`weir.engine.cli`); :mod:`weir.asyncio`
imports neither it nor Trio, and is imported from here only when asked for.  With
``--runtime asyncio`` the CLI:

1. **Refuses what the asyncio runtime does not serve yet** (:func:`refusals`): every
   option given on the command line is looked up in :data:`TRIO_ONLY`; one given with
   a value the asyncio runtime cannot honour is refused, one line each, naming the
   option, what the asyncio runtime does instead, and that the Trio runtime serves it
   -- never silently ignored.  The ``--auth-*`` options and an SDK app's own
   token verifier are served (the authorization is the Trio path's). The sessionless revision's keys
   (``--state-key-file``/``$WEIR_STATE_KEYS``) are served.
2. **Checks the rest as the Trio path does** (the same :func:`config_from_args`), and
   turns the :class:`~weir.engine.ServerConfig` into a
   :class:`~weir.asyncio.AsyncioConfig` (:func:`asyncio_config`).
3. **Runs** :func:`weir.asyncio.run`, printing ``weir: serving URL`` first on stdout
   and the event loop on stderr; a start-up failure is one line on stderr, status 1.
"""

from __future__ import annotations

import dataclasses
import logging
import sys
from collections.abc import Callable, Iterable

from weir.app import App
from weir.asyncio import AsyncioConfig, StartupFailed, run
from weir.common._memory import tune_allocator
from weir.protocol import ReadTimeouts

from ._config import ServerConfig
from ._startup import describe, explain

log = logging.getLogger(__name__)


def _never(value: object) -> bool:
    return False


@dataclasses.dataclass(frozen=True, slots=True)
class TrioOnly:
    """An option the asyncio runtime serves only with values ``served`` accepts."""

    flag: str
    why: str
    served: Callable[[object], bool] = _never


#: ``serve`` options (by argparse ``dest``) the asyncio runtime does not serve yet,
#: or serves with one value only.  Every other option it serves as the Trio path does.
TRIO_ONLY: dict[str, TrioOnly] = {
    "resume": TrioOnly(
        "--resume",
        "the asyncio runtime always gives events ids (only 'shared' and 'pinned' are served)",
        lambda v: v in ("shared", "pinned"),
    ),
    "workers": TrioOnly(
        "--workers",
        "the asyncio runtime runs one process (only 1 is served; run replicas on a shared "
        "--store instead)",
        lambda v: v == 1,
    ),
    "reuse_port": TrioOnly("--reuse-port", "the asyncio runtime runs one process"),
    "max_inbound_bytes": TrioOnly(
        "--max-inbound-bytes",
        "the asyncio runtime has no budget on what all connections buffer together",
    ),
    "initialize_timeout": TrioOnly(
        "--initialize-timeout",
        "the asyncio runtime forgets a silent new session after --session-idle-timeout only",
    ),
    "session_retain_bytes": TrioOnly(
        "--session-retain-bytes",
        "the asyncio runtime bounds each session's history by count (256 frames a "
        "stream; 256 calls and 256 KiB of results)",
    ),
    "memory_budget": TrioOnly(
        "--memory-budget", "the asyncio runtime has no budget across all sessions"
    ),
}

#: ``serve`` options the asyncio runtime serves as the Trio path does (every option is
#: here or in :data:`TRIO_ONLY`; a test keeps it so, so that a new option is never
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
        "log_level",
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
        "claim_lease",
        "ssl_certfile",
        "ssl_keyfile",
        "ssl_keyfile_password",
        "ssl_ca_certs",
    }
)

_TAIL = "it is served by the Trio runtime only for now (drop it, or serve with --runtime trio)"


def refusals(given: dict[str, object]) -> list[str]:
    """One line for each option in ``given`` (argparse ``dest`` -> value, the options
    on the command line only) that the asyncio runtime would not honour."""
    lines = []
    for dest, value in given.items():
        rule = TRIO_ONLY.get(dest)
        if rule is not None and not rule.served(value):
            lines.append(f"weir: --runtime asyncio refuses {rule.flag}: {rule.why}; {_TAIL}")
    return lines


def asyncio_config(
    config: ServerConfig, startup_timeout: float, store: str = "memory"
) -> AsyncioConfig:
    """The asyncio runtime's settings for what ``config`` (checked, from the command
    line) asks, every field of it that the asyncio runtime serves, on the ``--store``
    named ``store`` (checked by the command line too)."""
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
        ssl_context=config.ssl_context,
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
