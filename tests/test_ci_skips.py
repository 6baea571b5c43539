"""CI's rule that nothing skips unexpectedly (``tests/conftest.py``), run on a tiny suite."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest_plugins = ["pytester"]

_SUITE = """
import pytest

def test_runs() -> None:
    assert True

def test_skips() -> None:
    pytest.skip("the leg could not run")

@pytest.mark.xfail(reason="known")
def test_xfails() -> None:
    assert False
"""


def _run(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, forbid: str | None
) -> pytest.RunResult:
    pytester.makeconftest((Path(__file__).parent / "conftest.py").read_text())
    pytester.makepyfile(test_suite=_SUITE)
    if forbid is None:
        monkeypatch.delenv("WEIR_FORBID_SKIPS", raising=False)
    else:
        monkeypatch.setenv("WEIR_FORBID_SKIPS", forbid)
    return pytester.runpytest_subprocess("-p", "no:trio", "-p", "no:cacheprovider")


def test_ci_turns_an_unexpected_skip_into_a_failure(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    result = _run(pytester, monkeypatch, "1")
    result.assert_outcomes(passed=1, failed=1, xfailed=1)
    result.stdout.fnmatch_lines(["*allows no unexpected skip*the leg could not run*"])


def test_a_developer_run_still_skips(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    _run(pytester, monkeypatch, None).assert_outcomes(passed=1, skipped=1, xfailed=1)
