"""``python -m engine`` is ``weir``."""

from engine.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
