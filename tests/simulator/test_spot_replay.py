"""The replay with spot capacity: interruptions drain and re-place, gangs move whole, per-class GPU-hours and cost."""

from __future__ import annotations

import pytest

from gpufleet.cli.main import main
from gpufleet.engine.prices import parse_prices_text
from gpufleet.simulator.experiments.spot_replay import HP, SPOT, run_spot_replay
from gpufleet.simulator.traces.spot_trace import GfsJob, GfsNode, SpotEvent, fleet, fleet_gpus, jobs, spot_events

PRICES = parse_prices_text("builtin: false\nmodels:\n  A10: {onDemandPerGpuHour: 1.0, spotPerGpuHour: 0.25}\n", "p.yaml")


def _job(name, kind, at, dur, workers=1, milli=1000):
    return GfsJob(name, "org-1", kind, "A10", workers, milli, 4, at, dur)


def test_a_notice_drains_the_node_and_the_pod_runs_again_elsewhere():
    nodes = [GfsNode("od", "A10", 1, 32), GfsNode("sp", "A10", 1, 32, spot=True)]
    js = [_job("s", SPOT, 0.0, 3600.0), _job("h", HP, 0.0, 600.0)]
    ev = [SpotEvent(1800.0, "sp", "notice"), SpotEvent(1920.0, "sp", "gone"), SpotEvent(7200.0, "sp", "back")]
    r = run_spot_replay(nodes, js, ev, PRICES)
    hp, spot = r.classes[HP], r.classes[SPOT]
    assert r.leftover_on_gone_nodes == 0 and r.node_events == {"notice": 1, "gone": 1, "back": 1}
    assert hp.spot_gpu_h == 0 and hp.completed_gpu_h == pytest.approx(600 / 3600)  # HP never on spot
    assert spot.interrupted == 1 and spot.lost_gpu_h == pytest.approx(0.5)  # 30 minutes on spot, lost
    assert spot.completed_gpu_h == pytest.approx(1.0)  # run again from the start, on the on-demand node (free since 600 s)
    assert spot.replace_delays_s == [0.0]  # placed again at once
    assert spot.spot_gpu_h == pytest.approx(0.5) and spot.on_demand_gpu_h == pytest.approx(1.0)
    assert spot.cost == pytest.approx(0.5 * 0.25 + 1.0 * 1.0) and spot.cost_all_on_demand == pytest.approx(1.5)


def test_a_gang_with_a_member_on_a_going_node_moves_whole():
    nodes = [GfsNode(f"sp{i}", "A10", 1, 32, spot=True) for i in range(2)] + [GfsNode(f"od{i}", "A10", 1, 32) for i in range(2)]
    r = run_spot_replay(nodes, [_job("g", SPOT, 0.0, 7200.0, workers=2)], [SpotEvent(3600.0, "sp0", "notice"),
                                                                          SpotEvent(3720.0, "sp0", "gone")], PRICES)
    spot = r.classes[SPOT]
    assert spot.interrupted == 2 and len(spot.evicted_pods) == 2  # the member on sp1 went too
    assert spot.lost_gpu_h == pytest.approx(2.0) and spot.completed_gpu_h == pytest.approx(4.0)
    assert spot.on_demand_gpu_h == pytest.approx(4.0)  # placed again whole on on-demand (one spot node left: not both)
    assert r.leftover_on_gone_nodes == 0


def test_generated_run_accounts_every_gpu_hour():
    nodes = fleet(0.02, 0.3)
    js = jobs(seed=5, hours=24, scale=0.02, prefill_h=48, fit_gpus=fleet_gpus(nodes))
    prices = parse_prices_text("builtin: false\nmodels:\n" + "".join(
        f"  {m}: {{onDemandPerGpuHour: 2.0, spotPerGpuHour: 0.7}}\n" for m in fleet_gpus(nodes, spot=True)), "p")
    r = run_spot_replay(nodes, js, spot_events(nodes, 24, up_h=3, down_h=1, seed=5), prices)
    assert r.leftover_on_gone_nodes == 0 and r.node_events["notice"] > 0
    assert r.classes[HP].spot_gpu_h == 0 and r.classes[HP].interrupted == 0
    for c in (r.classes[HP], r.classes[SPOT]):
        assert c.completed_gpu_h + c.lost_gpu_h + c.unfinished_gpu_h == pytest.approx(c.spot_gpu_h + c.on_demand_gpu_h)
        assert c.cost <= c.cost_all_on_demand + 1e-9 and c.unpriced_gpu_h == 0


def test_unknown_prices_are_counted_not_zero():
    nodes = [GfsNode("sp", "A10", 1, 32, spot=True)]
    r = run_spot_replay(nodes, [_job("s", SPOT, 0.0, 3600.0)], [], parse_prices_text("builtin: false\n", "p"))
    assert r.classes[SPOT].unpriced_gpu_h == pytest.approx(1.0) and r.classes[SPOT].cost == 0


def test_the_command(capsys, tmp_path):
    code = main(["simulate", "--experiment", "spot", "--scale", "0.02", "--hours", "6", "--prefill-hours", "0",
                 "--report", str(tmp_path / "r.html"), "--json", str(tmp_path / "r.json"), "--no-progress"])
    out = capsys.readouterr()
    assert code == 0, out.err
    assert "Spot (spot nodes)" in out.out and "HP (all on-demand)" in out.out and "hp_job_share" in out.out
    assert "<table" in (tmp_path / "r.html").read_text()
    assert main(["simulate", "--experiment", "spot", "--policy", "fgd,default", "--report", ""]) == 2
    assert "one --policy" in capsys.readouterr().err
