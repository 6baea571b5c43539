"""The official MCP Python SDK (``mcp`` 2.3.0) serving an ``echo`` tool: the peer to beat.

One app, two transports.  :func:`build_server` makes the app -- an ``MCPServer`` with
one tool, ``echo`` -- and the module attribute :data:`server` is that app, at module
level as an SDK user writes it:

* ``python -m benchmarks.sdk_server [--port 0] [--json-response]`` serves it with the
  SDK's own stack as its documentation deploys it: its Streamable HTTP Starlette app
  (stateful sessions, SSE responses unless ``--json-response``) under uvicorn on
  127.0.0.1, and prints ``sdk: serving http://HOST:PORT/mcp`` first on stdout;
* ``python -m weir serve benchmarks.sdk_server:server`` serves the very same app
  through weir (:func:`weir.app.sdk.from_sdk`), unchanged.

Logging is at WARNING and uvicorn's access log is off, as for weir, so neither side
pays for log lines.  Needs the ``sdk`` extra.
"""

from __future__ import annotations

import argparse
import contextlib
import socket

from mcp.server.mcpserver import MCPServer


def build_server() -> MCPServer:
    """The benchmark's SDK app: ``MCPServer("sdk-bench")`` with the tool ``echo``."""
    mcp = MCPServer("sdk-bench", log_level="WARNING")

    @mcp.tool()
    async def echo(text: str) -> str:
        """Return the text unchanged."""
        return text

    return mcp


#: The app both transports serve (``weir serve benchmarks.sdk_server:server``).
server = build_server()


def main(argv: list[str] | None = None) -> None:
    """``python -m benchmarks.sdk_server``."""
    p = argparse.ArgumentParser(prog="benchmarks.sdk_server", description=__doc__.split("\n")[0])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--json-response", action="store_true")
    args = p.parse_args(argv)

    import uvicorn

    app = server.streamable_http_app(json_response=args.json_response, host=args.host)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((args.host, args.port))
    sock.listen(4096)
    port = sock.getsockname()[1]
    config = uvicorn.Config(app, log_level="warning", access_log=False, backlog=4096)
    uv = uvicorn.Server(config)
    print(f"sdk: serving http://{args.host}:{port}/mcp", flush=True)
    with contextlib.suppress(KeyboardInterrupt):
        uv.run(sockets=[sock])


if __name__ == "__main__":
    main()
