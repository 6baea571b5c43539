"""Fixtures shared by the engine tests.

``peak`` watches every credit acquisition of every session in the test: queue depth
may never exceed a session's credit (checked at each acquisition), and the largest
depth seen may never exceed the requesting module's ``FRAMES``.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest

from weir.protocol import SessionCredit


@dataclass
class Peak:
    """Largest frames/bytes any session's credit ever held (every acquisition is seen)."""

    frames: int = 0
    bytes: int = 0
    violations: list[str] = field(default_factory=list)


@pytest.fixture
def peak(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[Peak]:
    """Watch every credit acquisition: queue depth may never exceed the frame credit."""
    seen = Peak()
    original = SessionCredit.try_acquire

    def watched(self: SessionCredit, nbytes: int, now: float) -> bool:
        ok = original(self, nbytes, now)
        seen.frames = max(seen.frames, self.frames_in_use)
        seen.bytes = max(seen.bytes, self.bytes_in_use)
        if self.frames_in_use > self.limits.frames or (
            self.bytes_in_use > self.limits.bytes and self.frames_in_use > 1
        ):
            seen.violations.append(f"{self.frames_in_use}/{self.bytes_in_use} at {now}")
        return ok

    monkeypatch.setattr(SessionCredit, "try_acquire", watched)
    yield seen
    assert not seen.violations
    assert seen.frames <= request.module.FRAMES
