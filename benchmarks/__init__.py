"""weir's fan-out benchmark (see :mod:`benchmarks.fanout` and ``RESULTS.md``).

``python -m benchmarks.fanout --help`` lists the options.  The modules here are not
part of the installed package: they run from a checkout, next to ``engine/``.
"""
