"""Built-in applications: ``demo`` and ``conformance``."""
