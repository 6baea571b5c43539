"""``python -m examples.sdk_everything``: serve the SDK "everything" app with the SDK itself.

The app is :data:`examples.sdk_everything.server`; this serves it the way the SDK
documents: its Streamable HTTP Starlette app (stateful sessions, SSE responses, an
in-memory event store for resumption, a 500 ms SSE retry hint), under uvicorn.
It prints ``sdk: serving http://HOST:PORT/mcp`` on stdout first (``--port 0``, the
default, picks a free port).  Needs the ``sdk`` extra.
"""

from __future__ import annotations

import argparse
import contextlib
import socket

import uvicorn

from . import MemoryEventStore, server


def main(argv: list[str] | None = None) -> None:
    """``python -m examples.sdk_everything [--host H] [--port N]``."""
    p = argparse.ArgumentParser(prog="examples.sdk_everything", description=__doc__.split("\n")[0])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--log-level", default="warning", help="uvicorn's log level")
    args = p.parse_args(argv)

    app = server.streamable_http_app(
        event_store=MemoryEventStore(), retry_interval=500, host=args.host
    )
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((args.host, args.port))
    sock.listen(1024)
    port = sock.getsockname()[1]
    config = uvicorn.Config(app, log_level=args.log_level, access_log=False)
    print(f"sdk: serving http://{args.host}:{port}/mcp", flush=True)
    with contextlib.suppress(KeyboardInterrupt):
        uvicorn.Server(config).run(sockets=[sock])


if __name__ == "__main__":
    main()
