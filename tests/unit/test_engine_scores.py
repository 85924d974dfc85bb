"""Score plugins: raw values on small cases and the node ordering they produce."""

from __future__ import annotations

import numpy as np
import pytest

from gpufleet.engine import annotations as ann
from gpufleet.engine.model import Assignment
from gpufleet.engine.plugins.filters import NodeAffinity, TaintToleration
from gpufleet.engine.plugins.scores import LeastAllocated, MostAllocated, Spread

from tests.builders import T4, affinity, cycle_for, expr, make_node, make_pod, profile_config, scheduler, state_of


def scores(plugin, pod, st):
    nodes = np.arange(len(st))
    return plugin.normalize(np.asarray(plugin.score(cycle_for(pod), st, nodes), dtype=float))


def order(plugin, pod, st):
    """Node names, best first (stable for equal scores)."""
    s = scores(plugin, pod, st)
    return [st.nodes[i].name for i in np.argsort(-s, kind="stable")]


def _loaded_state():
    """Three equal nodes (4 cores, 8 GiB, 2 T4); 'half' is half used, 'most' three quarters."""
    st = state_of(*(make_node(n, 2, T4, cpu_milli=4_000, memory_mib=8_192) for n in ("empty", "half", "most")))
    st.reserve(Assignment("default/a", "half", 2_000, 4_096, gpu_indices=(0,), gpu_milli=1000))
    st.reserve(Assignment("default/b", "most", 3_000, 6_144, gpu_indices=(0,), gpu_milli=1000))
    st.reserve(Assignment("default/c", "most", 0, 0, gpu_indices=(1,), gpu_milli=500, gpu_memory_mib=(0,)))
    return st


@pytest.mark.parametrize(
    "plugin, expected",
    [(LeastAllocated(), ["empty", "half", "most"]), (MostAllocated(), ["most", "half", "empty"])],
)
@pytest.mark.parametrize("pod_kw", [dict(cpu="500m", memory="512Mi"), dict(cpu="500m", memory="512Mi", annotations={ann.GPU_MILLI: "200"})])
def test_allocation_scores_order(plugin, expected, pod_kw):
    assert order(plugin, make_pod(**pod_kw), _loaded_state()) == expected


def test_least_and_most_allocated_values():
    st = state_of(make_node("n", cpu_milli=4_000, memory_mib=4_096))
    pod = make_pod(cpu="1", memory="1Gi")  # 25% of both after placing
    assert scores(LeastAllocated(), pod, st).tolist() == [75.0]
    assert scores(MostAllocated(), pod, st).tolist() == [25.0]


def test_gpu_dimension_counts_for_gpu_pods_only():
    st = state_of(make_node("busy-gpu", 2, T4, cpu_milli=8_000, memory_mib=8_192), make_node("busy-cpu", 2, T4, cpu_milli=8_000, memory_mib=8_192))
    st.reserve(Assignment("default/g", "busy-gpu", 0, 0, gpu_indices=(0,), gpu_milli=1000))
    st.reserve(Assignment("default/c", "busy-cpu", 2_000, 0))
    cpu_pod = make_pod(cpu="1", memory=None)
    gpu_pod = make_pod(cpu="1", memory=None, gpu="1")
    # cpu + memory only: the node with CPU in use is fuller
    assert order(MostAllocated(), cpu_pod, st) == ["busy-cpu", "busy-gpu"]
    # with the GPU dimension, half the GPUs used outweighs a quarter of the CPU
    assert order(MostAllocated(), gpu_pod, st) == ["busy-gpu", "busy-cpu"]
    s = scores(MostAllocated(), gpu_pod, st)
    # busy-gpu: cpu 1/8, mem 0, gpu 2/2 -> mean 0.375; busy-cpu: cpu 3/8, mem 0, gpu 1/2 -> 0.2917
    assert s == pytest.approx([100 * (1 / 8 + 0 + 1) / 3, 100 * (3 / 8 + 0 + 0.5) / 3])


def test_scores_stay_in_range_on_zero_capacity_nodes():
    st = state_of(make_node("zero", cpu_milli=0, memory_mib=0), make_node("n"))
    for p in (LeastAllocated(), MostAllocated()):
        s = scores(p, make_pod(cpu="1"), st)
        assert ((s >= 0) & (s <= 100)).all()


def test_spread_prefers_fewer_pods():
    st = state_of(make_node("a"), make_node("b"), make_node("c"))
    for k in range(3):
        st.reserve(Assignment(f"default/a{k}", "a", 0, 0))
    st.reserve(Assignment("default/b0", "b", 0, 0))
    assert order(Spread(), make_pod(), st) == ["c", "b", "a"]
    assert scores(Spread(), make_pod(), st).tolist() == pytest.approx([0.0, 200 / 3, 100.0])


def test_spread_all_equal():
    st = state_of(make_node("a"), make_node("b"))
    assert scores(Spread(), make_pod(), st).tolist() == [100.0, 100.0]


def test_preferred_node_affinity_weights():
    st = state_of(make_node("a", labels={"zone": "a", "ssd": "1"}), make_node("b", labels={"zone": "b", "ssd": "1"}), make_node("c"))
    pod = make_pod(affinity=affinity(preferred=[(80, [expr("zone", "In", "a")]), (20, [expr("ssd", "Exists")])]))
    s = scores(NodeAffinity(), pod, st)
    assert s.tolist() == pytest.approx([100.0, 20.0, 0.0])
    assert scores(NodeAffinity(), make_pod(), st).tolist() == [0.0, 0.0, 0.0]


def test_prefer_no_schedule_taints_score_lower():
    st = state_of(
        make_node("clean"),
        make_node("one", taints=[("spot", "", "PreferNoSchedule")]),
        make_node("two", taints=[("spot", "", "PreferNoSchedule"), ("old", "", "PreferNoSchedule"), ("x", "", "NoSchedule")]),
    )
    assert scores(TaintToleration(), make_pod(), st).tolist() == pytest.approx([100.0, 50.0, 0.0])
    tol = make_pod(tolerations=[{"key": "spot", "operator": "Exists"}])
    assert scores(TaintToleration(), tol, st).tolist() == pytest.approx([100.0, 100.0, 0.0])
    assert scores(TaintToleration(), make_pod(), state_of(make_node("a"))).tolist() == [100.0]


@pytest.mark.parametrize(
    "score, expected_nodes",
    [
        ("LeastAllocated", ["a", "b", "a", "b"]),  # spreads
        ("MostAllocated", ["a", "a", "a", "a"]),  # packs
    ],
)
def test_allocation_scores_drive_placement(score, expected_nodes):
    s = scheduler([make_node("a", cpu_milli=8_000, memory_mib=8_192), make_node("b", cpu_milli=8_000, memory_mib=8_192)], profile_config([score]))
    got = [s.schedule(make_pod(f"p{k}", cpu="1", memory="1Gi")).assignment.node for k in range(4)]
    assert got == expected_nodes


def test_weights_combine_scores():
    """Preferred affinity (weight 10) beats binpacking (weight 1) towards the fuller node."""
    nodes = [make_node("full", labels={"zone": "x"}), make_node("pref", labels={"zone": "y"})]
    pod = make_pod("p", affinity=affinity(preferred=[(50, [expr("zone", "In", "y")])]))
    s = scheduler(nodes, profile_config([{"name": "MostAllocated", "weight": 1}, {"name": "NodeAffinity", "weight": 10}]))
    s.state.reserve(Assignment("default/x", "full", 8_000, 0))
    assert s.schedule(pod).assignment.node == "pref"
    s2 = scheduler(nodes, profile_config([{"name": "MostAllocated", "weight": 10}, {"name": "NodeAffinity", "weight": 1}]))
    s2.state.reserve(Assignment("default/x", "full", 8_000, 0))
    assert s2.schedule(pod).assignment.node == "full"
