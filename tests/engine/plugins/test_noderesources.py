"""NodeResources: the fit filter and the least-/most-allocated scores, alone and driving placement."""

from __future__ import annotations

import dataclasses

import pytest

from gpufleet.engine import annotations as ann
from gpufleet.engine.model import Assignment
from gpufleet.engine.plugins.noderesources import LeastAllocated, MostAllocated, NodeResourcesFit
from gpufleet.engine.podspec import parse_pod
from gpufleet.engine.state import ClusterState

from tests.builders import (
    T4, affinity, expr, make_node, make_pod, profile_config,
    scheduler, score_order, scores, state_of, verdicts,
)

from ..builders import gpu_node, place, pod


@pytest.mark.parametrize(
    "cpu, memory, expected",
    [
        ("1", "1Gi", {"big": None, "small": None, "full": "Too many pods"}),
        ("4", "8Gi", {"big": None, "small": None, "full": "Too many pods"}),  # exactly the free amount fits
        ("4001m", "1Gi", {"big": None, "small": "Insufficient cpu", "full": "Too many pods"}),
        ("1", "9Gi", {"big": None, "small": "Insufficient memory", "full": "Too many pods"}),
        ("5", "9Gi", {"big": None, "small": "Insufficient cpu", "full": "Too many pods"}),  # cpu reported first
        ("65", "1Gi", {"big": "Insufficient cpu", "small": "Insufficient cpu", "full": "Too many pods"}),
    ],
)
def test_node_resources_fit(cpu, memory, expected):
    st = state_of(
        make_node("big", cpu_milli=64_000, memory_mib=262_144),
        make_node("small", cpu_milli=4_000, memory_mib=8_192),
        make_node("full", cpu_milli=64_000, memory_mib=262_144, max_pods=1),
    )
    st.reserve(Assignment("default/running", "full", 0, 0))
    assert verdicts(NodeResourcesFit(), make_pod(cpu=cpu, memory=memory), st) == expected


def test_node_resources_fit_sees_reservations():
    st = state_of(make_node("n", cpu_milli=4_000, memory_mib=8_192))
    pod = make_pod(cpu="3", memory="1Gi")
    assert verdicts(NodeResourcesFit(), pod, st) == {"n": None}
    st.reserve(Assignment("default/x", "n", 2_000, 0))
    assert verdicts(NodeResourcesFit(), pod, st) == {"n": "Insufficient cpu"}


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
    assert score_order(plugin, make_pod(**pod_kw), _loaded_state()) == expected


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
    assert score_order(MostAllocated(), cpu_pod, st) == ["busy-cpu", "busy-gpu"]
    # with the GPU dimension, half the GPUs used outweighs a quarter of the CPU
    assert score_order(MostAllocated(), gpu_pod, st) == ["busy-gpu", "busy-cpu"]
    s = scores(MostAllocated(), gpu_pod, st)
    # busy-gpu: cpu 1/8, mem 0, gpu 2/2 -> mean 0.375; busy-cpu: cpu 3/8, mem 0, gpu 1/2 -> 0.2917
    assert s == pytest.approx([100 * (1 / 8 + 0 + 1) / 3, 100 * (3 / 8 + 0 + 0.5) / 3])


def test_scores_stay_in_range_on_zero_capacity_nodes():
    st = state_of(make_node("zero", cpu_milli=0, memory_mib=0), make_node("n"))
    for p in (LeastAllocated(), MostAllocated()):
        s = scores(p, make_pod(cpu="1"), st)
        assert ((s >= 0) & (s <= 100)).all()


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


def test_every_scalar_resource_fits():
    n1 = dataclasses.replace(gpu_node("n1"), scalars=(("ephemeral-storage", 10 << 30), ("hugepages-2Mi", 1 << 30), ("rdma/hca", 2)))
    n2 = gpu_node("n2")  # reports none of them
    st = ClusterState([n1, n2])
    p = parse_pod(pod("x", extra_resources={"rdma/hca": "2", "hugepages-2Mi": "512Mi", "ephemeral-storage": "1Gi"}))
    assert dict(p.scalars) == {"rdma/hca": 2, "hugepages-2Mi": 512 << 20, "ephemeral-storage": 1 << 30}
    v = verdicts(NodeResourcesFit(), p, st)
    assert v["n1"] is None and v["n2"] == "Insufficient ephemeral-storage"
    place(st, pod("y", extra_resources={"rdma/hca": "1"}), "n1")
    assert verdicts(NodeResourcesFit(), p, st)["n1"] == "Insufficient rdma/hca"
    st.unreserve("default/y")
    assert verdicts(NodeResourcesFit(), p, st)["n1"] is None
