"""CI's rules for the whole suite: nothing skips unexpectedly, and nothing is left to chance.

**Skips.**  A skipped test is a test that did not run: in CI that is a failure unless
expected.

Tests skip for honest reasons on a developer's machine (no ``npm``, no SDK extra, not
Linux).  CI installs and starts everything, so there a skip means a required leg did not
run, and a green run would hide it.  With ``WEIR_FORBID_SKIPS=1`` (set by ``.ci/run``)
every skip whose reason does not match :data:`EXPECTED_SKIPS` is reported as a failure
that names the reason.

**Hypothesis.**  On a developer's machine the property tests draw new examples every
run, which is how they find new bugs.  In CI (``WEIR_HYPOTHESIS_PROFILE=ci``, set by
``.ci/run``) they are derandomized: the same examples every run, so a landing never
depends on which examples a run happened to draw.  A failure found locally is kept in
the local example database and printed with the decorator that reproduces it.
"""

from __future__ import annotations

import os
import re
from collections.abc import Generator
from typing import Final

import pytest
from hypothesis import settings

settings.register_profile("ci", derandomize=True, print_blob=True)
if os.environ.get("WEIR_HYPOTHESIS_PROFILE"):
    settings.load_profile(os.environ["WEIR_HYPOTHESIS_PROFILE"])

#: Skip reasons CI accepts, each with why it is expected there.  Empty: on the CI
#: machine (Linux, every extra installed, Valkey and Node started) nothing may skip.
EXPECTED_SKIPS: Final[tuple[re.Pattern[str], ...]] = ()


def _expected(reason: str) -> bool:
    return any(p.search(reason) for p in EXPECTED_SKIPS)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, None]:
    """Turn an unexpected skip into a failure when ``WEIR_FORBID_SKIPS=1``."""
    outcome = yield
    report: pytest.TestReport = outcome.get_result()
    if os.environ.get("WEIR_FORBID_SKIPS") != "1" or not report.skipped:
        return
    if hasattr(report, "wasxfail"):
        return  # an expected failure is not a skip
    longrepr = report.longrepr
    reason = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
    if _expected(reason):
        return
    report.outcome = "failed"
    report.longrepr = (
        f"{item.nodeid} skipped, and WEIR_FORBID_SKIPS=1 allows no unexpected skip: {reason}"
    )
