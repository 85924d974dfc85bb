"""Property tests: random small clusters and pod streams, checked against an independent model.

The checker below recomputes usage from the decisions the scheduler returned and
compares it with the *node specs* (not ClusterState's arrays), and re-derives
which nodes fit each pod from the Kubernetes rules directly.  So a bookkeeping
bug in ClusterState or a filter bug cannot hide behind itself.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpufleet.engine import annotations as ann
from gpufleet.engine.errors import StateError
from gpufleet.engine.framework import Scheduler
from gpufleet.engine.model import GPU_MILLI, Assignment, MigInstance, Node, PodRequest, Taint
from gpufleet.engine.podspec import parse_pod
from gpufleet.engine.state import ClusterState
from gpufleet.engine.status import Code
from gpufleet.policies import build_profile

from tests.builders import A100, T4, V100, affinity, assert_same_snapshot, container, expr, make_node, make_pod_json, snapshot

# derandomize: the same examples on every run (a CI failure reproduces); modest counts keep the file < 20 s
SETTINGS = settings(max_examples=60, deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
PROFILES = ["bestfit", "fgd", "default", "least"]
_PROFILE_CFG = {"least": {"profiles": [{"name": "least", "plugins": {"score": ["LeastAllocated", "TaintToleration", "NodeAffinity"]}}]}}

# --- strategies ---------------------------------------------------------------------------------

TAINTS = [(), (("gpu", "true", "NoSchedule"),), (("spot", "", "PreferNoSchedule"),), (("ded", "", "NoExecute"),)]


@st.composite
def nodes_st(draw) -> list[Node]:
    out = []
    for i in range(draw(st.integers(1, 4))):
        model = draw(st.sampled_from([T4, V100, A100]))
        g = draw(st.sampled_from([0, 1, 1, 2, 2, 4, 8]))
        mig = {}
        if model == A100:
            for j in range(g):
                if draw(st.integers(0, 3)) == 0:
                    mig[j] = draw(st.lists(st.sampled_from(["1g.10gb", "3g.40gb"]), min_size=1, max_size=4))
        node = make_node(
            f"n{i}",
            g,
            model,
            cpu_milli=draw(st.integers(1, 32)) * 1000,
            memory_mib=draw(st.integers(1, 64)) * 1024,
            labels={"zone": draw(st.sampled_from("ab")), "gpus": str(g)},
            taints=draw(st.sampled_from(TAINTS)),
            unschedulable=draw(st.integers(0, 5)) == 0,
            max_pods=draw(st.integers(1, 10)),
            nvlink=[list(range(g // 2)), list(range(g // 2, g))] if g >= 2 and draw(st.booleans()) else [],
            mig=mig,
            unhealthy=draw(st.sets(st.integers(0, g - 1), max_size=1)) if g else (),
        )
        # MIG instance ids in an arbitrary order, as an agent may list them
        gpus = []
        for gpu in node.gpus:
            if gpu.mig_instances:
                ids = draw(st.permutations(range(len(gpu.mig_instances))))
                gpu = replace(gpu, mig_instances=tuple(MigInstance(m.profile, m.memory_mib, k) for m, k in zip(gpu.mig_instances, ids)))
            gpus.append(gpu)
        out.append(replace(node, gpus=tuple(gpus)))
    return out


@st.composite
def pod_st(draw, name: str) -> dict:
    kind = draw(st.sampled_from(["cpu", "whole", "share", "share", "memory", "mig"]))
    cpu = f"{draw(st.integers(0, 16)) * 500}m"
    mem = f"{draw(st.integers(0, 16))}Gi"
    annotations: dict[str, str] = {}
    kw: dict = {}
    limits: dict[str, str] = {}
    if kind == "whole":
        limits["nvidia.com/gpu"] = str(draw(st.sampled_from([1, 1, 2, 4, 8])))
    elif kind == "share":
        # sizes that add up to exactly 1000 often, so exact fits get tested
        annotations[ann.GPU_MILLI] = str(draw(st.sampled_from([250, 250, 500, 500, 750, 300, 700, 100, 999, 1000])))
        if draw(st.booleans()):
            annotations[ann.GPU_MEMORY] = f"{draw(st.sampled_from([1, 4, 12, 20]))}Gi"
    elif kind == "memory":
        annotations[ann.GPU_MEMORY] = f"{draw(st.sampled_from([2, 8, 16, 30]))}Gi"
    elif kind == "mig":
        limits[f"nvidia.com/mig-{draw(st.sampled_from(['1g.10gb', '3g.40gb']))}"] = str(draw(st.integers(1, 2)))
    if kind != "cpu" and draw(st.integers(0, 3)) == 0:
        key = draw(st.sampled_from([ann.GPU_MODELS, ann.GPU_MODELS_DENY]))
        annotations[key] = draw(st.sampled_from([T4, A100, f"{T4},{V100}"]))
    c = draw(st.sampled_from(["none", "selector", "in", "gt", "pref"]))
    if c == "selector":
        kw["nodeSelector"] = {"zone": draw(st.sampled_from("ab"))}
    elif c == "in":
        kw["affinity"] = affinity(required=[[expr("zone", "In", draw(st.sampled_from("ab")))], [expr("gpus", "Gt", "6")]])
    elif c == "gt":
        kw["affinity"] = affinity(required=[[expr("gpus", "Gt", "1"), expr("zone", "NotIn", "b")]])
    elif c == "pref":
        kw["affinity"] = affinity(preferred=[(50, [expr("zone", "In", "b")])])
    tol = draw(st.sampled_from(["none", "gpu", "all", "cordon"]))
    if tol == "gpu":
        kw["tolerations"] = [{"key": "gpu", "operator": "Equal", "value": "true", "effect": "NoSchedule"}]
    elif tol == "all":
        kw["tolerations"] = [{"operator": "Exists"}]
    elif tol == "cordon":
        kw["tolerations"] = [{"key": "node.kubernetes.io/unschedulable", "operator": "Exists", "effect": "NoSchedule"}]
    return make_pod_json(name, containers=[container(cpu=cpu, memory=mem, limits=limits)], annotations=annotations, **kw)


@st.composite
def stream_st(draw) -> list[tuple[str, object]]:
    """('pod', pod json) or ('delete', index into the pods placed so far)."""
    ops = []
    for k in range(draw(st.integers(1, 30))):
        if k and draw(st.integers(0, 4)) == 0:
            ops.append(("delete", draw(st.integers(0, 10**6))))
        else:
            ops.append(("pod", draw(pod_st(f"p{k}"))))
    return ops


# --- the independent model ------------------------------------------------------------------------


def tolerated(r: PodRequest, t: Taint) -> bool:
    for x in r.tolerations:
        if x.effect and x.effect != t.effect:
            continue
        if x.operator == "Exists" and (not x.key or x.key == t.key):
            return True
        if x.operator == "Equal" and x.key == t.key and x.value == t.value:
            return True
    return False


def req_ok(q, labels: dict) -> bool:
    v = labels.get(q.key)
    if q.operator == "In":
        return v in q.values
    if q.operator == "NotIn":
        return v not in q.values
    if q.operator == "Exists":
        return v is not None
    if q.operator == "DoesNotExist":
        return v is None
    if v is None or not v.lstrip("-").isdigit():
        return False
    return int(v) > int(q.values[0]) if q.operator == "Gt" else int(v) < int(q.values[0])


class Usage:
    """Usage recomputed from the scheduler's decisions only."""

    def __init__(self, nodes: list[Node]):
        self.nodes = {n.name: n for n in nodes}
        self.placed: dict[str, Assignment] = {}

    def node_usage(self, name: str):
        cpu = mem = pods = 0
        milli: dict[int, int] = {}
        gmem: dict[int, int] = {}
        whole: set[int] = set()
        mig: list[tuple[int, int]] = []
        for a in self.placed.values():
            if a.node != name:
                continue
            cpu += a.cpu_milli
            mem += a.memory_mib
            pods += 1
            for j, m in zip(a.gpu_indices, a.gpu_memory_mib):
                milli[j] = milli.get(j, 0) + a.gpu_milli
                gmem[j] = gmem.get(j, 0) + m
                if a.gpu_milli >= GPU_MILLI:
                    whole.add(j)
            mig.extend(a.mig)
        return cpu, mem, pods, milli, gmem, whole, mig

    def model_ok(self, r: PodRequest, model: str) -> bool:
        return (r.gpu_models_allow is None or model in r.gpu_models_allow) and model not in r.gpu_models_deny

    def fits(self, r: PodRequest, node: Node) -> bool:
        if node.unschedulable and not tolerated(r, Taint("node.kubernetes.io/unschedulable", "", "NoSchedule")):
            return False
        if any(node.labels.get(k) != v for k, v in r.node_selector):
            return False
        if r.required_terms and not any(t.requirements and all(req_ok(q, node.labels) for q in t.requirements) for t in r.required_terms):
            return False
        if any(t.effect in ("NoSchedule", "NoExecute") and not tolerated(r, t) for t in node.taints):
            return False
        cpu, mem, pods, milli, gmem, whole, mig = self.node_usage(node.name)
        if cpu + r.cpu_milli > node.cpu_milli or mem + r.memory_mib > node.memory_mib or pods + 1 > node.max_pods:
            return False
        if r.gpu_count == 0:
            return True
        if r.mig_profile:
            free = [
                (g.index, m.instance_id)
                for g in node.gpus
                if g.mig_enabled and g.healthy and self.model_ok(r, g.model)
                for m in g.mig_instances
                if m.profile == r.mig_profile
            ]
            return len([x for x in free if x not in mig]) >= r.gpu_count
        ok = 0
        for g in node.gpus:
            if g.mig_enabled or not g.healthy or not self.model_ok(r, g.model):
                continue
            used, used_mem = milli.get(g.index, 0), gmem.get(g.index, 0)
            if r.gpu_milli >= GPU_MILLI:
                ok += used == 0 and used_mem == 0
            else:
                ok += used + r.gpu_milli <= GPU_MILLI and used_mem + r.gpu_memory_mib <= g.memory_mib
        return ok >= r.gpu_count

    def check_placement(self, r: PodRequest, a: Assignment) -> None:
        node = self.nodes[a.node]
        assert self.fits(r, node), f"{r.key} placed on {a.node}, which does not fit it"
        assert (a.cpu_milli, a.memory_mib) == (r.cpu_milli, r.memory_mib)
        if r.mig_profile:
            assert a.mig_profile == r.mig_profile and len(a.mig) == r.gpu_count and a.gpu_indices == ()
            for j, _ in a.mig:
                assert self.model_ok(r, node.gpus[j].model)
        elif r.gpu_count:
            assert len(a.gpu_indices) == r.gpu_count and a.gpu_milli == r.gpu_milli and not a.mig
            for j in a.gpu_indices:
                assert self.model_ok(r, node.gpus[j].model)
        else:
            assert a.gpu_indices == () and a.mig == ()

    def check_capacities(self) -> None:
        """Nothing over-committed, against the node specs."""
        for name, node in self.nodes.items():
            cpu, mem, pods, milli, gmem, whole, mig = self.node_usage(name)
            assert cpu <= node.cpu_milli and mem <= node.memory_mib and pods <= node.max_pods, name
            for j, used in milli.items():
                g = node.gpus[j]
                assert g.healthy and not g.mig_enabled, (name, j)
                assert used <= GPU_MILLI, (name, j, used)
                assert gmem[j] <= g.memory_mib, (name, j, gmem[j])
            for j in whole:  # a whole GPU is exclusive
                assert sum(1 for a in self.placed.values() if a.node == name and j in a.gpu_indices) == 1
            assert len(set(mig)) == len(mig), (name, mig)
            for gi, iid in mig:
                g = node.gpus[gi]
                assert g.mig_enabled and g.healthy and any(m.instance_id == iid for m in g.mig_instances)

    def check_state_agrees(self, state: ClusterState) -> None:
        """ClusterState's free columns equal capacity minus the independently recomputed usage."""
        assert set(state.assignments) == set(self.placed)
        for i, node in enumerate(state.nodes):
            cpu, mem, pods, milli, gmem, _, mig = self.node_usage(node.name)
            assert state.cpu_free[i] == node.cpu_milli - cpu
            assert state.mem_free[i] == node.memory_mib - mem
            assert state.pods_free[i] == node.max_pods - pods
            for g in node.gpus:
                plain = g.healthy and not g.mig_enabled
                assert state.gpu_free_milli[i, g.index] == (GPU_MILLI - milli.get(g.index, 0) if plain else 0)
                assert state.gpu_mem_free[i, g.index] == (g.memory_mib - gmem.get(g.index, 0) if plain else 0)
            for prof, insts in state.mig_free[i].items():
                assert len(insts) == state.mig_count[prof][i]
                assert not set(insts) & set(mig)


# --- properties ------------------------------------------------------------------------------------


def make_scheduler(nodes, policy, seed):
    return Scheduler(build_profile(_PROFILE_CFG.get(policy, policy)), ClusterState(nodes), seed=seed)


@SETTINGS
@given(nodes=nodes_st(), stream=stream_st(), policy=st.sampled_from(PROFILES), seed=st.integers(0, 3))
def test_no_overcommit_and_placements_respect_filters(nodes, stream, policy, seed):
    s = make_scheduler(nodes, policy, seed)
    model = Usage(nodes)
    for op, arg in stream:
        if op == "delete":
            if model.placed:
                key = sorted(model.placed)[arg % len(model.placed)]
                assert s.forget(key) == model.placed.pop(key)
        else:
            r = parse_pod(arg)
            expected = [n.name for n in nodes if model.fits(r, n)]
            d = s.schedule(r)
            if d.ok:
                model.check_placement(r, d.assignment)
                assert d.feasible_nodes == len(expected)
                model.placed[r.key] = d.assignment
            else:
                assert d.status.code is Code.UNSCHEDULABLE, d.status
                assert expected == [], f"{r.key} rejected but fits {expected}: {d.status}"
                assert sum(d.diagnosis.counts.values()) == len(nodes)
        model.check_capacities()
        model.check_state_agrees(s.state)
    assert (s.state.cpu_free >= 0).all() and (s.state.gpu_free_milli >= 0).all() and (s.state.gpu_mem_free >= 0).all()


@SETTINGS
@given(
    gpus=st.lists(st.sampled_from([T4, A100]), min_size=1, max_size=3),
    shares=st.lists(st.tuples(st.sampled_from([250, 500, 750, 1000]), st.sampled_from([0, 0, 4, 8])), min_size=1, max_size=14),
    policy=st.sampled_from(PROFILES),
)
def test_shares_fill_gpus_exactly(gpus, shares, policy):
    """Few GPUs, many shares: GPUs fill to exactly 1000 milli / their memory, never beyond, never short."""
    nodes = [make_node(f"g{i}", 1, m, cpu_milli=64_000) for i, m in enumerate(gpus)]
    s = make_scheduler(nodes, policy, 0)
    model = Usage(nodes)
    for k, (milli, mem_gib) in enumerate(shares):
        a = {ann.GPU_MILLI: str(milli)}
        if mem_gib:
            a[ann.GPU_MEMORY] = f"{mem_gib}Gi"
        r = parse_pod(make_pod_json(f"s{k}", annotations=a))
        expected = [n.name for n in nodes if model.fits(r, n)]
        d = s.schedule(r)
        assert d.ok == bool(expected), (r.key, expected, d.status)
        if d.ok:
            model.check_placement(r, d.assignment)
            assert d.feasible_nodes == len(expected)
            model.placed[r.key] = d.assignment
        model.check_capacities()
        model.check_state_agrees(s.state)


@SETTINGS
@given(nodes=nodes_st(), stream=stream_st(), policy=st.sampled_from(PROFILES))
def test_reserve_then_unreserve_restores_exact_state(nodes, stream, policy):
    s = make_scheduler(nodes, policy, 0)
    for op, arg in stream:
        if op == "delete":
            if s.state.assignments:
                key = sorted(s.state.assignments)[arg % len(s.state.assignments)]
                # unreserve then reserve the same assignment: exact state again
                before = snapshot(s.state)
                a = s.forget(key)
                s.state.reserve(a)
                assert_same_snapshot(snapshot(s.state), before)
            continue
        before = snapshot(s.state)
        d = s.schedule(parse_pod(arg))
        if not d.ok:
            assert_same_snapshot(snapshot(s.state), before)
            continue
        after = snapshot(s.state)
        s.forget(d.assignment.pod_key)
        assert_same_snapshot(snapshot(s.state), before)
        s.state.reserve(d.assignment)
        assert_same_snapshot(snapshot(s.state), after)


@SETTINGS
@given(nodes=nodes_st(), stream=stream_st(), evict=st.lists(st.integers(0, 10**6), max_size=4), fail=st.booleans())
def test_transaction_rollback_restores_state(nodes, stream, evict, fail):
    s = make_scheduler(nodes, "bestfit", 0)
    pods = [parse_pod(arg) for op, arg in stream if op == "pod"]
    half = len(pods) // 2
    for r in pods[:half]:
        s.schedule(r)
    before = snapshot(s.state)
    try:
        with s.state.transaction() as tx:
            for k in evict:
                if s.state.assignments:
                    tx.evict(sorted(s.state.assignments)[k % len(s.state.assignments)])
            for r in pods[half:]:
                d = s.decide(s.new_cycle(r))
                if d.ok:
                    tx.reserve(d.assignment)
            for k in evict[:2]:  # evict again, now possibly pods reserved inside the transaction
                if s.state.assignments:
                    tx.evict(sorted(s.state.assignments)[(k * 7 + 3) % len(s.state.assignments)])
            if fail:
                tx.reserve(Assignment("x/overflow", s.state.nodes[0].name, 10**9, 0))  # raises StateError
    except StateError:
        assert fail
    assert_same_snapshot(snapshot(s.state), before)


@settings(max_examples=30, deadline=None, derandomize=True, database=None)
@given(nodes=nodes_st(), picks=st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 10**6)), max_size=12))
def test_copy_is_isolated(nodes, picks):
    """What-if work on a copy (explain, preemption) never leaks into the live state."""
    s = make_scheduler(nodes, "bestfit", 0)
    live = snapshot(s.state)
    c = s.state.copy()
    for k, (i, j) in enumerate(picks):
        ni = i % len(nodes)
        free = c.mig_free[ni]
        profs = sorted(p for p, v in free.items() if v)
        try:
            if profs:
                p = profs[j % len(profs)]
                c.reserve(Assignment(f"w/{k}", nodes[ni].name, 0, 0, mig=(free[p][0],), mig_profile=p))
            elif c.gpu_n[ni]:
                c.reserve(Assignment(f"w/{k}", nodes[ni].name, 0, 0, gpu_indices=(j % int(c.gpu_n[ni]),), gpu_milli=100, gpu_memory_mib=(0,)))
            else:
                c.reserve(Assignment(f"w/{k}", nodes[ni].name, 100, 0))
        except StateError:
            pass
    assert_same_snapshot(snapshot(s.state), live)
    assert np.array_equal(s.state.gpu_free_milli, live["gpu_free_milli"])
