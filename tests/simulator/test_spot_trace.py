"""The GFS-shaped generator reproduces the trace's published shape; spot capacity comes and goes as modelled."""

from __future__ import annotations

import pytest

from gpufleet.simulator.traces.spot_trace import FLEET, HP, TARGETS, describe, fleet, jobs, spot_events

TOLERANCE = {  # relative, for a 14-day sample at full rate (seed 1); the test reports every miss at once
    "hp_job_share": 0.01, "hp_gpu_seconds_share": 0.03, "hp_median_duration_s": 0.1, "hp_p90_duration_s": 0.1,
    "spot_median_duration_s": 0.1, "spot_p90_duration_s": 0.1, "multi_worker_share": 0.2, "jobs_per_hour": 0.06,
    "hourly_arrival_cv": 0.15, "org_gini_gpu_seconds": 0.05, "organizations": 0.0, "gpus": 0.001, "nodes": 0.0,
}


def test_generated_workload_has_the_traces_shape():
    js = jobs(seed=1, hours=24 * 14)
    got = describe(js, fleet(), 24 * 14).values
    misses = [f"{k}: {got[k]:.4g} vs {TARGETS[k]:.4g}" for k, tol in TOLERANCE.items()
              if abs(got[k] - TARGETS[k]) > tol * abs(TARGETS[k]) + 1e-9]
    assert not misses, misses


def test_seeded_and_scaled():
    a, b = jobs(seed=3, hours=6, scale=0.1), jobs(seed=3, hours=6, scale=0.1)
    assert a == b and a != jobs(seed=4, hours=6, scale=0.1)
    assert 0 < len(a) < 200 and all(0 <= j.submit_s < 6 * 3600 for j in a)
    assert {j.kind for j in jobs(seed=3, hours=48, scale=0.2)} == {HP, "Spot"}
    small = fleet(scale=0.05)
    assert {n.model for n in small} == set(FLEET) and not any(n.spot for n in small)


def test_spot_nodes_get_a_notice_go_and_come_back():
    nodes = fleet(scale=0.05, spot_share=0.3)
    spot = {n.name for n in nodes if n.spot}
    assert len([n for n in nodes if not n.spot]) == len(fleet(scale=0.05)) and len(spot) == 65  # beside, not instead
    assert {n.model for n in fleet(scale=0.05, spot_share=0.3, spot_models=["A10"]) if n.spot} == {"A10"}
    ev = spot_events(nodes, hours=72, up_h=6, down_h=1, notice_s=120, seed=2)
    assert ev and {e.node for e in ev} <= spot
    for name in spot:
        mine = [e for e in ev if e.node == name]
        kinds = [e.kind for e in mine]
        assert kinds == (["notice", "gone", "back"] * len(kinds))[: len(kinds)]  # in this order, repeated
        for a, b in zip(mine, mine[1:]):
            assert a.t_s <= b.t_s
            if a.kind == "notice":
                assert b.t_s - a.t_s == pytest.approx(120)
