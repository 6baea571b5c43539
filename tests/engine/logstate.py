"""Logging put back as it was after a test that called weir's ``configure``
(which replaces the root's handler and sets its own and its libraries' loggers)."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager

from weir.common._logs import _THIRD_PARTY, DIRECT


@contextmanager
def logging_restored() -> Iterator[None]:
    """On exit: the root's handlers, level and filters, weir's access and lifecycle
    loggers' and the libraries' levels, filters and ``disabled``, and the access
    log's short way, as they were on entry."""
    root = logging.getLogger()
    loggers = [logging.getLogger(name) for name in ("weir.access", "weir.ops", *_THIRD_PARTY)]
    saved_root = (root.handlers[:], root.level, root.filters[:])
    saved = [(each, each.level, each.disabled, each.filters[:]) for each in loggers]
    saved_direct = (DIRECT.handler, DIRECT.formatter)
    try:
        yield
    finally:
        root.handlers[:], root.filters[:] = saved_root[0], saved_root[2]
        root.setLevel(saved_root[1])
        for each, level, disabled, filters in saved:
            each.setLevel(level)
            each.disabled, each.filters[:] = disabled, filters
        DIRECT.handler, DIRECT.formatter = saved_direct
