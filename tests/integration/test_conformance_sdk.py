"""The official conformance suite against an app written with the official SDK: served
by weir (``weir serve examples.sdk_everything:server``, through
:func:`weir.app.sdk.from_sdk`) and served by the SDK's own Streamable HTTP transport
(``python -m examples.sdk_everything``), on all three revisions weir serves.

The proof asked of the bridge: weir's score is the SDK's own or better, scenario by
scenario (no scenario the SDK passes may fail through weir).  Both servers run the
same app module in their own processes, side by side, one suite run each.  Every
leg also writes its summary to ``$WEIR_CONFORMANCE_REPORT_DIR/sdk-<server>-<leg>.txt``
so CI can check that each ran.  Skips (or, with ``WEIR_REQUIRE_CONFORMANCE=1``,
fails) when the suite cannot be installed, as the other conformance tests do.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conformance_runner import ConformanceReport, ConformanceUnavailable, run_conformance
from tests.integration.serverproc import WeirProcess
from tests.integration.test_conformance import _unavailable

if os.environ.get("WEIR_REQUIRE_SDK") != "1":
    pytest.importorskip("mcp")

pytestmark = pytest.mark.conformance

#: (suite version, spec version or None, leg name).
LEGS = (
    ("0.1.16", None, "0.1.16"),
    ("0.2.0-alpha.12", "2025-11-25", "0.2.0-alpha.12-2025-11-25"),
    ("0.2.0-alpha.12", "2026-07-28", "0.2.0-alpha.12-2026-07-28"),
)


@contextlib.contextmanager
def _serving(app: str, driver: str) -> Iterator[WeirProcess]:
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        server = WeirProcess(app, out, err, driver=driver)
        try:
            yield server
        finally:
            server.stop()


def _run(server: WeirProcess, version: str, spec: str | None) -> ConformanceReport:
    try:
        return run_conformance(server.url, version=version, suite="all", spec_version=spec)
    except ConformanceUnavailable as exc:
        _unavailable(exc.reason)


def _passed(report: ConformanceReport) -> set[str]:
    return {s.name for s in report.scenarios if s.ok}


@pytest.mark.parametrize(("version", "spec", "leg"), LEGS, ids=[leg for *_, leg in LEGS])
def test_an_sdk_app_scores_through_weir_what_the_sdk_scores_itself(
    version: str, spec: str | None, leg: str
) -> None:
    with _serving("examples.sdk_everything:server", "trio") as via_weir:
        weir = _run(via_weir, version, spec)
    with _serving("examples.sdk_everything", "sdk") as by_itself:
        sdk = _run(by_itself, version, spec)
    report_dir = os.environ.get("WEIR_CONFORMANCE_REPORT_DIR")
    for name, report in (("weir", weir), ("own", sdk)):
        lines = report.summary_lines()
        print(f"\n[conformance {leg}, SDK app served by {name}]\n" + "\n".join(lines))
        if report_dir:
            Path(report_dir).mkdir(parents=True, exist_ok=True)
            (Path(report_dir) / f"sdk-{name}-{leg}.txt").write_text("\n".join(lines) + "\n")
    assert weir.total == sdk.total > 0
    lost = sorted(_passed(sdk) - _passed(weir))
    assert not lost, f"the SDK passes these itself, weir fails them: {lost}\n{weir.format()}"
    assert weir.scenarios_passed >= sdk.scenarios_passed
