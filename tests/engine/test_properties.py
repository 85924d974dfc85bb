"""Property tests: no resource is ever over-committed; unreserve and rollback restore state exactly."""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpufleet.engine.framework import Scheduler
from gpufleet.engine.model import PodRequest
from gpufleet.engine.state import ClusterState
from gpufleet.policies import build_profile

from .builders import gpu_node, mig_node

MODELS = ["T4", "V100M32", "A100-SXM4-80GB"]

nodes_st = st.lists(
    st.tuples(st.integers(0, 8), st.sampled_from(MODELS), st.integers(2, 64), st.booleans()),
    min_size=1, max_size=6,
)
pods_st = st.lists(
    st.tuples(
        st.integers(0, 16_000),  # cpu milli
        st.integers(0, 64_000),  # memory MiB
        st.sampled_from([(0, 0), (1, 100), (1, 333), (1, 500), (1, 999), (1, 1000), (2, 1000), (4, 1000), (8, 1000)]),
        st.sampled_from([0, 0, 4096, 12_000]),  # GPU memory per GPU
        st.sampled_from([None, None, None, "1g.10gb"]),
    ),
    min_size=1, max_size=40,
)


def build(spec):
    out = []
    for i, (g, model, cores, mig) in enumerate(spec):
        if mig:
            out.append(mig_node(f"m{i}"))
        else:
            mem = {"T4": 16_384, "V100M32": 32_768, "A100-SXM4-80GB": 81_920}[model]
            out.append(gpu_node(f"n{i}", g, model=model, memory_mib=mem, cpu_milli=cores * 1000, mem_mib=cores * 4000, max_pods=12))
    return out


def requests(spec):
    out = []
    for i, (cpu, mem, (n, milli), gmem, mig) in enumerate(spec):
        if mig:
            out.append(PodRequest(name=f"p{i}", cpu_milli=cpu, memory_mib=mem, gpu_count=1, mig_profile=mig))
        else:
            out.append(PodRequest(name=f"p{i}", cpu_milli=cpu, memory_mib=mem, gpu_count=n, gpu_milli=milli if n else 0,
                                  gpu_memory_mib=gmem if n == 1 and milli < 1000 else 0))
    return out


def check_no_overcommit(state: ClusterState, nodes) -> None:
    """Recompute usage from the assignments alone and compare with capacities."""
    n = len(nodes)
    cpu, mem, pods = np.zeros(n, int), np.zeros(n, int), np.zeros(n, int)
    gpu, gmem = np.zeros(state.gpu_free_milli.shape, int), np.zeros(state.gpu_free_milli.shape, int)
    mig_used: set = set()
    for a in state.assignments.values():
        i = state.index[a.node]
        cpu[i] += a.cpu_milli
        mem[i] += a.memory_mib
        pods[i] += 1
        for g, m in zip(a.gpu_indices, a.gpu_memory_mib or (0,) * len(a.gpu_indices)):
            gpu[i, g] += a.gpu_milli
            gmem[i, g] += m
        for inst in a.mig:
            assert (i, inst) not in mig_used, "MIG instance handed out twice"
            mig_used.add((i, inst))
    for i, node in enumerate(nodes):
        assert cpu[i] <= node.cpu_milli and mem[i] <= node.memory_mib and pods[i] <= node.max_pods
        for g in node.gpus:
            assert gpu[i, g.index] <= 1000, f"GPU {node.name}/{g.index} over-committed: {gpu[i, g.index]}"
            assert gmem[i, g.index] <= g.memory_mib
            if g.mig_enabled:
                assert gpu[i, g.index] == 0, "whole/shared pod on a MIG-mode GPU"


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(nodes_st, pods_st, st.sampled_from(["bestfit", "fgd", "default", "packing", "random"]))
def test_no_resource_is_ever_overcommitted(node_spec, pod_spec, policy):
    nodes = build(node_spec)
    state = ClusterState(nodes)
    s = Scheduler(build_profile(policy), state, seed=1)
    for r in requests(pod_spec):
        d = s.schedule(r)
        if d.ok:
            a = d.assignment
            node = nodes[state.index[a.node]]
            if r.gpu_count and not r.mig_profile:
                assert len(a.gpu_indices) == r.gpu_count
                assert all(not node.gpus[g].mig_enabled for g in a.gpu_indices)
        check_no_overcommit(state, nodes)
    assert (state.cpu_free >= 0).all() and (state.gpu_free_milli >= 0).all() and (state.gpu_mem_free >= 0).all()


def snapshot(state: ClusterState):
    return [x.copy() for x in (state.cpu_free, state.mem_free, state.pods_free, state.gpu_free_milli, state.gpu_mem_free)] + [
        {k: sorted(v) for d in state.mig_free for k, v in d.items()}.__repr__()]


def same(a, b) -> bool:
    return all((x == y).all() if isinstance(x, np.ndarray) else x == y for x, y in zip(a, b))


@settings(max_examples=50, deadline=None)
@given(nodes_st, pods_st)
def test_unreserve_restores_exact_state(node_spec, pod_spec):
    nodes = build(node_spec)
    state = ClusterState(nodes)
    s = Scheduler(build_profile("bestfit"), state, seed=0)
    reqs = requests(pod_spec)
    half = len(reqs) // 2
    for r in reqs[:half]:
        s.schedule(r)
    before = snapshot(state)
    placed = [r.key for r in reqs[half:] if s.schedule(r).ok]
    for k in reversed(placed):
        s.forget(k)
    assert same(before, snapshot(state))


@settings(max_examples=40, deadline=None)
@given(nodes_st, pods_st)
def test_transaction_rollback_restores_state(node_spec, pod_spec):
    nodes = build(node_spec)
    state = ClusterState(nodes)
    s = Scheduler(build_profile("bestfit"), state, seed=0)
    reqs = requests(pod_spec)
    for r in reqs[::2]:  # some pods already running
        s.schedule(r)
    before = snapshot(state)
    running = list(state.assignments)
    with state.transaction() as tx:  # tentative: evict one, place the rest, then not commit
        if running:
            tx.evict(running[0])
        for r in reqs[1::2]:
            d = s.decide(s.new_cycle(r))
            if d.ok:
                tx.reserve(d.assignment)
    assert same(before, snapshot(state))
    try:
        with state.transaction() as tx:
            for r in reqs[1::2]:
                d = s.decide(s.new_cycle(r))
                if d.ok:
                    tx.reserve(d.assignment)
            raise RuntimeError("gang member failed")
    except RuntimeError:
        pass
    assert same(before, snapshot(state))
    with state.transaction() as tx:
        placed = []
        for r in reqs[1::2]:
            d = s.decide(s.new_cycle(r))
            if d.ok:
                tx.reserve(d.assignment)
                placed.append(r.key)
        tx.commit()
    assert all(k in state.assignments for k in placed)
    check_no_overcommit(state, nodes)
