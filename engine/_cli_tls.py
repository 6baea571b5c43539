"""``weir serve --ssl-*``: the command line's TLS options.

The options build one :class:`ssl.SSLContext` with
:func:`weir.common._tls.server_ssl_context` (so ``ServerConfig.ssl_context``); a
file that cannot be used stops the start-up with one line naming it (status 1).
"""

from __future__ import annotations

import argparse
import ssl

from weir.common._tls import TlsConfigError, server_ssl_context


def add_tls_options(s: argparse.ArgumentParser) -> None:
    """The ``--ssl-*`` options of ``serve``."""
    t = s.add_argument_group("TLS (serve https://; see docs/serve.md)")
    t.add_argument("--ssl-certfile", metavar="FILE", help="the server's certificate chain (PEM)")
    t.add_argument(
        "--ssl-keyfile",
        metavar="FILE",
        help="its private key (PEM; default: in --ssl-certfile)",
    )
    t.add_argument(
        "--ssl-keyfile-password", metavar="PASSWORD", help="the password of an encrypted key"
    )
    t.add_argument(
        "--ssl-ca-certs",
        metavar="FILE",
        help="require client certificates, verified against these CA certificates (PEM)",
    )


def ssl_context_from_args(args: argparse.Namespace) -> ssl.SSLContext | None:
    """The context the ``--ssl-*`` options ask for (None: none given).

    Raises:
        SystemExit: an option without ``--ssl-certfile``, or a file that cannot be
            used, with one line saying which and why.
    """
    others = [args.ssl_keyfile, args.ssl_keyfile_password, args.ssl_ca_certs]
    if args.ssl_certfile is None:
        if any(v is not None for v in others):
            raise SystemExit("weir: the --ssl-* options need --ssl-certfile")
        return None
    try:
        return server_ssl_context(
            args.ssl_certfile,
            args.ssl_keyfile,
            password=args.ssl_keyfile_password,
            ca_certs=args.ssl_ca_certs,
        )
    except TlsConfigError as exc:
        raise SystemExit(f"weir: TLS: {exc}") from None
