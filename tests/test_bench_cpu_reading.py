"""The benchmarks' CPU reading: exact where the kernel keeps it, ticks where it must.

A short run's server CPU used to be counted in 10 ms ticks, so a phase of 0.07 s
(the floor at 50 sessions) was known to +-14 %; every ratio to the floor carried
that.  These tests pin the rule that picks between the two readings and check the
exact reading against this process's own ticks (no speed is asserted).
"""

from __future__ import annotations

import os

import pytest

from benchmarks.fanout.system import CpuReading, cpu_reading, cpu_used


def test_the_exact_figure_is_used_when_the_ticks_agree_with_it() -> None:
    before = CpuReading(user=1.00, system=0.20, exact=1.195)
    after = CpuReading(user=1.05, system=0.22, exact=1.2613)
    assert cpu_used(before, after) == pytest.approx(0.0663)


def test_a_thread_that_ended_between_readings_falls_back_to_ticks() -> None:
    # The ticks grew by 0.5 s, the live threads' sum by 0.1 s: a thread took its
    # 0.4 s with it when it ended, so only the ticks are right.
    before = CpuReading(user=1.0, system=0.0, exact=1.0)
    after = CpuReading(user=1.5, system=0.0, exact=1.1)
    assert cpu_used(before, after) == pytest.approx(0.5)


def test_no_exact_reading_means_ticks() -> None:
    before = CpuReading(user=1.0, system=0.1, exact=None)
    after = CpuReading(user=1.2, system=0.1, exact=None)
    assert cpu_used(before, after) == pytest.approx(0.2)
    assert cpu_used(before, CpuReading(1.2, 0.1, 9.0)) == pytest.approx(0.2)


def test_this_process_reads_the_same_both_ways() -> None:
    before = cpu_reading(os.getpid())
    if before.exact is None:
        pytest.fail("this kernel keeps no schedstat: the exact reading cannot be checked")
    # Burn a bounded amount of CPU (a fixed count of steps, no clock involved).
    total = 0
    for i in range(3_000_000):
        total += i * i % 7
    after = cpu_reading(os.getpid())
    assert after.exact is not None
    ticks = after.user + after.system - before.user - before.system
    assert after.exact - before.exact > 0
    # Both count this process's CPU (the ticks round to 10 ms at each end).  A
    # thread of an earlier test that ends meanwhile takes its time out of the exact
    # sum; the rule then gives the ticks, so the figure agrees either way.
    assert abs(cpu_used(before, after) - ticks) <= 0.03 + 0.1 * ticks
    assert total > 0
