"""``bench/bound_options.py``: HiGHS option sets for the offline bound, and what counts as the same output."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.bench.loader import REPO, bench_module


def _module():
    return bench_module("bound_options")


def test_variant_values_take_highs_types():
    got = _module().parse_variant("mip_rel_gap=0.0015, threads=1,mip_heuristic_run_rins=False,presolve=off")
    assert got == {"mip_rel_gap": 0.0015, "threads": 1, "mip_heuristic_run_rins": False, "presolve": "off"}
    assert type(got["threads"]) is int and type(got["mip_heuristic_run_rins"]) is bool


@pytest.mark.parametrize("bad", ["mip_rel_gap", "=1", "threads=", "a=1,,b=2"])
def test_a_variant_without_name_or_value_is_refused(bad):
    with pytest.raises(ValueError, match="expected name=value"):
        _module().parse_variant(bad)


def test_differences_leave_out_the_solve_time_only():
    base = {"unallocated_gpu_pct": 3.1132, "best_found_pct": 3.1146, "gap_pct": 0.0014, "solve_s": 3.0,
            "left_out": {"810 milli": [238, 1104]}}
    diff = _module().differences
    assert diff(base, dict(base, solve_s=0.3)) == {}
    other = dict(base, best_found_pct=3.2431, left_out={"810 milli": [242, 1104]}, solve_s=0.3)
    assert diff(base, other) == {"best_found_pct": (3.1146, 3.2431),
                                 "left_out": ({"810 milli": [238, 1104]}, {"810 milli": [242, 1104]})}


def test_a_bad_variant_is_a_usage_error():
    env = dict(os.environ, PYTHONPATH=str(REPO / "src"))
    p = subprocess.run([sys.executable, str(REPO / "bench" / "bound_options.py"), "--variant", "threads"],
                       capture_output=True, text=True, env=env, timeout=120)
    assert p.returncode == 2 and "--variant" in p.stderr and "Traceback" not in p.stderr
