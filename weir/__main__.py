"""``python -m weir`` is the ``weir`` command."""

from weir.engine.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
