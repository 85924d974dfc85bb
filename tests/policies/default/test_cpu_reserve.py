"""The default policy's CPU reserve: once CPU binds first, CPU-only pods keep off the CPU a node's free GPUs need."""

from __future__ import annotations

import numpy as np
import pytest

from gpufleet.engine.framework import Cycle
from gpufleet.engine.model import PodRequest
from gpufleet.engine.state import ClusterState
from gpufleet.policies.default import CpuReserve, CpuReserveArgs, WorkloadModel
from tests.builders import T4, make_node, scheduler, verdicts


def gpu_pod(name: str, cpu: int = 4000) -> PodRequest:
    return PodRequest(name=name, cpu_milli=cpu, memory_mib=1024, gpu_count=1, gpu_milli=1000)


def cpu_pod(name: str, cpu: int) -> PodRequest:
    return PodRequest(name=name, cpu_milli=cpu, memory_mib=1024)


def nodes():
    # 8 GPUs, 72 cores: g0 32 cores, g1 24 cores (4 T4 each), c0 16 cores and no GPU
    return [make_node("g0", 4, T4, cpu_milli=32_000), make_node("g1", 4, T4, cpu_milli=24_000), make_node("c0", 0, cpu_milli=16_000)]


def learned(gpu_pods: int = 64, cpu_only: int = 48, **kw) -> CpuReserve:
    """GPU pods at 4 cores per GPU; 48 CPU-only pods of 8 cores make CPU demand at full GPU demand
    (256 + 384 cores per 64 GPUs, i.e. 80 cores per 8 GPUs) exceed the 72 cores there are."""
    model = WorkloadModel()
    for i in range(gpu_pods):
        model.observe(gpu_pod(f"g{i}"))
    for i in range(cpu_only):
        model.observe(cpu_pod(f"c{i}", 8000))
    return CpuReserve(CpuReserveArgs.from_config("CpuReserve", kw), model)


R = CpuReserve.REASON


@pytest.mark.parametrize("case, policy, pod, want", [
    # a free GPU needs 4 cores here: g0 keeps 16 of its 32, g1 16 of its 24
    ("fits beside the reserve", {}, cpu_pod("x", 8000), {"g0": None, "g1": None, "c0": None}),
    ("eats g1's reserve only", {}, cpu_pod("x", 9000), {"g0": None, "g1": R, "c0": None}),
    ("eats both reserves", {}, cpu_pod("x", 17000), {"g0": R, "g1": R, "c0": None}),
    ("CPU does not bind", {"cpu_only": 10}, cpu_pod("x", 17000), {"g0": None, "g1": None, "c0": None}),
    ("reserve off", {"cpu_reserve": 0.0}, cpu_pod("x", 17000), {"g0": None, "g1": None, "c0": None}),
    ("half a reserve", {"cpu_reserve": 0.5}, cpu_pod("x", 17000), {"g0": None, "g1": R, "c0": None}),
    ("a GPU pod uses the reserve", {}, gpu_pod("x", 17000), {"g0": None, "g1": None, "c0": None}),
    ("no workload learned yet", {"gpu_pods": 32}, cpu_pod("x", 17000), {"g0": None, "g1": None, "c0": None}),
    ("a pod with no CPU request", {}, cpu_pod("x", 0), {"g0": None, "g1": None, "c0": None}),
])
def test_cpu_reserve_verdicts(case, policy, pod, want):
    assert verdicts(learned(**policy), pod, ClusterState(nodes())) == want, case


@pytest.mark.parametrize("waited_s, reserved", [(0.0, True), (599.0, True), (600.0, False), (3600.0, False)])
def test_a_pod_that_waited_long_enough_may_use_the_reserve(waited_s, reserved):
    # GPU demand that stopped coming must not hold CPU for good: after reserve_max_wait_s the pod may take it
    res = learned().filter(Cycle(request=cpu_pod("x", 17000), rng=np.random.default_rng(0), waited_s=waited_s),
                           ClusterState(nodes()))
    assert (not res.ok[0]) == reserved and res.passes_all == (not reserved)


def test_the_reserve_shrinks_as_gpu_pods_take_the_gpus_and_the_diagnosis_names_it():
    s = scheduler(nodes(), "default")
    for r in [gpu_pod(f"seen-g{i}") for i in range(64)] + [cpu_pod(f"seen-c{i}", 8000) for i in range(48)]:
        s.observe(r)
    d = s.schedule(cpu_pod("big", 20_000))
    assert not d.ok
    assert "1 Insufficient cpu" in d.status.message and f"2 {R}" in d.status.message
    for i in range(3):  # three GPUs of g0 taken (12 cores): one free GPU keeps 4 of the 20 cores left
        assert s.schedule(PodRequest(name=f"gpu{i}", cpu_milli=4000, memory_mib=1024, gpu_count=1, gpu_milli=1000,
                                     node_selector=(("kubernetes.io/hostname", "g0"),))).ok
    assert not s.schedule(cpu_pod("c17", 17_000)).ok
    d = s.schedule(cpu_pod("c16", 16_000))
    assert d.ok and d.assignment.node == "g0"
    assert d.rejected_by == set() and not s.schedule(cpu_pod("c17b", 17_000)).ok
    assert s.schedule(cpu_pod("c17c", 17_000)).rejected_by == {"NodeResourcesFit", "CpuReserve"}


def test_the_reserve_learns_where_it_is_only_a_filter():
    # FGD's scores with the default's reserve as a filter: the filter must see the pods to learn the CPU per GPU
    cfg = {"name": "fgd-reserve", "tieBreak": "ordered",
           "plugins": {"filter": ["NodeResourcesFit", "GpuFit", "CpuReserve"], "score": ["FGDScore"], "gpuSelect": "FGDScore"}}
    s = scheduler(nodes(), cfg)
    for r in [gpu_pod(f"seen-g{i}") for i in range(64)] + [cpu_pod(f"seen-c{i}", 8000) for i in range(48)]:
        s.observe(r)
    d = s.schedule(cpu_pod("big", 20_000))
    assert not d.ok and R in d.status.message
