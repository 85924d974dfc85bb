"""The decision-throughput guard (bench/throughput_guard.py) in the test command: a slower engine fails it.

The figure is engine time / reference time, measured side by side in this run (see the module's docstring), so a
loaded machine does not fail it and a commit that makes decisions more than 25% slower does.  A failed measurement
is taken once more before the test fails: a real regression fails both, a burst of load on the shared machine
rarely hits the same side twice.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))
import throughput_guard as guard  # noqa: E402


def test_decision_throughput_within_25_percent_of_the_baseline() -> None:
    base = guard.load_baseline()["ratio"]
    tries = []
    for _ in range(2):
        m = guard.measure()
        ok, share = guard.verdict(m["ratio"], base)
        tries.append(f"{share:.0%} of the baseline's throughput (ratio {m['ratio']:.3f} vs {base:.3f}, rounds {m['ratios']})")
        if ok:
            return
    pytest.fail("decision throughput regressed more than 25%: " + "; then ".join(tries)
                + " -- if the slowdown is intended, record a new baseline: python bench/throughput_guard.py record")


def test_verdict_is_throughput_share() -> None:
    assert guard.verdict(1.0, 1.0) == (True, 1.0)
    assert guard.verdict(1.3, 1.0)[0]  # 77% of the throughput
    assert not guard.verdict(1.4, 1.0)[0]  # 71%
    assert guard.verdict(0.5, 1.0) == (True, 2.0)


def test_a_slower_engine_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every decision made twice as slow (a busy wait as long as the decision) moves the figure by about 2x, far
    past the 25% the guard allows: the figure measures the engine, not the machine."""
    from gpufleet.engine.framework import Scheduler

    plain = guard.measure(rounds=2)["ratio"]
    orig = Scheduler.schedule

    def slow(self, *a, **k):  # type: ignore[no-untyped-def]
        t0 = time.perf_counter()
        out = orig(self, *a, **k)
        end = time.perf_counter() + (time.perf_counter() - t0)
        while time.perf_counter() < end:
            pass
        return out

    monkeypatch.setattr(Scheduler, "schedule", slow)
    slowed = guard.measure(rounds=2)["ratio"]
    assert slowed > plain * 1.4, (plain, slowed)
