"""``python -m benchmarks.fanout``: see :mod:`benchmarks.fanout.cli` and ``--help``."""

from __future__ import annotations

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
