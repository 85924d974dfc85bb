"""Replay with team queues: borrowing, reclaim by preemption, fairness, report section."""

from __future__ import annotations

import pytest

from gpufleet.engine.model import Gpu, Node
from gpufleet.simulator.experiments.queues import fair_shares, jain, report_html, run_queue_replay, team_of
from gpufleet.simulator.traces.trace import TracePod

TEAMS2 = ["team-a", "team-b"]


def nodes(n=2):
    return [Node(f"n{i}", 64_000, 512_000, tuple(Gpu(j, f"g{i}{j}", "T4", 15360) for j in range(4)), max_pods=100) for i in range(n)]


def names_for(team, prefix, k, teams=TEAMS2):
    return [f"{prefix}{i}" for i in range(1000) if team_of(f"{prefix}{i}", teams) == team][:k]


def flood_then_owner(a_pods=8, b_pods=3):
    """team-a fills the cluster at t=0..7, team-b arrives at t=100."""
    pods = [TracePod(n, 1000, 1024, 1, 1000, creation_time=i, deletion_time=10_000)
            for i, n in enumerate(names_for("team-a", "pa", a_pods))]
    pods += [TracePod(n, 1000, 1024, 1, 1000, creation_time=100 + i, deletion_time=5_000)
             for i, n in enumerate(names_for("team-b", "pb", b_pods))]
    return pods


def test_fairness_helpers():
    assert jain([1, 1, 1]) == 1.0 and abs(jain([1, 0, 0]) - 1 / 3) < 1e-9 and jain([]) == 1.0
    assert fair_shares(8, {"a": 10, "b": 2}, {"a": 1, "b": 1}) == {"a": 6, "b": 2}  # b asks less: a gets the rest
    assert fair_shares(9, {"a": 9, "b": 9}, {"a": 2, "b": 1}) == pytest.approx({"a": 6, "b": 3})
    assert team_of("pod-1", TEAMS2) == team_of("pod-1", TEAMS2)  # stable (crc32)


def test_borrowed_gpus_are_reclaimed_for_a_team_within_quota():
    r = run_queue_replay(nodes(), flood_then_owner(), "bestfit", teams=2)
    assert r.preemptions == {"team-a": 3, "team-b": 0}  # team-a borrowed 4 GPUs; 3 come back to team-b
    assert r.delay_s["team-b"]["mean"] == 0.0  # reclaim is immediate
    assert r.delay_s["team-a"]["placed"] == 8 and r.never_placed == {"team-a": 0, "team-b": 0}
    assert max(r.gpu_alloc_pct) == 100.0
    # sampled while team-b's pods arrive: each takes a GPU back at once, so the split stays fair
    assert r.share_pct["team-a"][-3:] == [100.0, 87.5, 75.0] and r.share_pct["team-b"][-3:] == [0.0, 12.5, 25.0]
    assert r.jain[-3:] == [1.0, 1.0, 1.0]

def test_borrowing_limit_and_no_reclaim_change_the_outcome():
    # team-a may borrow at most 1 GPU (12.5% of 8): it never holds more than 5, so nothing to reclaim
    r = run_queue_replay(nodes(), flood_then_owner(), "bestfit", teams=2, borrowing_limit_pct=12.5)
    assert max(r.share_pct["team-a"]) == 62.5 and sum(r.preemptions.values()) == 0
    assert r.delay_s["team-b"]["mean"] == 0.0
    # unequal quotas: team-a owns 75%; without reclaim team-b waits for departures
    r = run_queue_replay(nodes(), flood_then_owner(), "bestfit", teams=2, quotas=[0.75, 0.25], reclaim=False)
    assert r.quota_pct == {"team-a": 75.0, "team-b": 25.0} and sum(r.preemptions.values()) == 0
    assert r.delay_s["team-b"]["placed"] == 0 and r.never_placed["team-b"] == 3  # its pods left before a GPU did
    with pytest.raises(ValueError, match="quotas"):
        run_queue_replay(nodes(), flood_then_owner(), teams=2, quotas=[1.0])


def test_report_section_is_self_contained_html():
    r = run_queue_replay(nodes(), flood_then_owner(), "bestfit", teams=2)
    doc = report_html(r)
    assert doc.startswith("<section><h2>Team queues (bestfit, seed 42)</h2>") and doc.count("<svg") == 3
    assert "team-b" in doc and "<script" not in doc and "<img" not in doc and "<link" not in doc
    d = r.to_json()
    assert d["experiment"] == "queues" and d["teams"] == TEAMS2
