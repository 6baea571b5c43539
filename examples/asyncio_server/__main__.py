"""``python -m examples.asyncio_server``: see :func:`examples.asyncio_server.main`."""

from . import main

raise SystemExit(main())
