"""Whole scheduling cycles through framework.Scheduler, from Pod JSON to reserved devices."""

from __future__ import annotations

import pytest

from gpufleet.engine import annotations as ann
from gpufleet.engine.framework import Cycle, GpuChoice, Profile, Scheduler
from gpufleet.engine.model import Assignment
from gpufleet.engine.state import ClusterState
from gpufleet.engine.status import Code, Status
from gpufleet.policies import build_profile

from tests.builders import (
    A100,
    T4,
    V100,
    affinity,
    assert_same_snapshot,
    container,
    expr,
    make_node,
    make_pod,
    profile_config,
    scheduler,
    snapshot,
)


class RecordingBinder:
    def __init__(self, fail_for: set[str] = frozenset()):
        self.fail_for = set(fail_for)
        self.bound: list[Assignment] = []

    def bind(self, a: Assignment) -> None:
        if a.pod_key in self.fail_for:
            raise ConnectionError("apiserver said 409 Conflict")
        self.bound.append(a)


def share(name, milli, **kw):
    return make_pod(name, annotations={ann.GPU_MILLI: str(milli), **kw.pop("annotations", {})}, **kw)


def mig(name, profile="1g.10gb", n=1):
    return make_pod(name, containers=[container(cpu="1", limits={f"nvidia.com/mig-{profile}": str(n)})])


# --- the next cycle sees what the last one took --------------------------------------------


def test_whole_gpus_are_taken_then_exhausted():
    s = scheduler([make_node("n", 2, T4)])
    d1, d2 = s.schedule(make_pod("a", gpu="1")), s.schedule(make_pod("b", gpu="1"))
    assert d1.ok and d2.ok
    assert {d1.assignment.gpu_indices, d2.assignment.gpu_indices} == {(0,), (1,)}
    assert s.state.gpu_free_milli[0].tolist() == [0, 0]
    d3 = s.schedule(make_pod("c", gpu="1"))
    assert d3.status.code is Code.UNSCHEDULABLE
    assert d3.status.reasons == ("0/1 nodes are available: 1 Insufficient nvidia.com/gpu.",)
    assert s.forget("default/a").gpu_indices == d1.assignment.gpu_indices
    d4 = s.schedule(make_pod("c", gpu="1"))
    assert d4.ok and d4.assignment.gpu_indices == d1.assignment.gpu_indices


def test_shares_pack_one_gpu_before_the_next():
    s = scheduler([make_node("n", 2, T4)])
    got = [s.schedule(share(f"s{k}", 300)).assignment for k in range(6)]
    assert [a.gpu_indices for a in got] == [(0,), (0,), (0,), (1,), (1,), (1,)]
    assert all(a.gpu_milli == 300 for a in got)
    assert s.state.gpu_free_milli[0].tolist() == [100, 100]
    assert s.schedule(share("big", 200)).status.reasons == ("0/1 nodes are available: 1 Insufficient GPU milli.",)
    assert s.schedule(share("small", 100)).ok
    # a whole GPU pod cannot use a shared GPU
    assert not s.schedule(make_pod("w", gpu="1")).ok


def test_gpu_memory_shares():
    s = scheduler([make_node("n", 1, T4)])  # 15360 MiB
    a = s.schedule(make_pod("a", annotations={ann.GPU_MEMORY: "8Gi"}))
    assert a.ok and a.assignment.gpu_memory_mib == (8_192,) and a.assignment.gpu_milli == 0
    b = s.schedule(make_pod("b", annotations={ann.GPU_MEMORY: "8Gi"}))
    assert b.status.reasons == ("0/1 nodes are available: 1 Insufficient GPU memory.",)
    assert s.schedule(make_pod("c", annotations={ann.GPU_MEMORY: "7Gi", ann.GPU_MILLI: "1000"})).ok is False
    assert s.schedule(make_pod("d", annotations={ann.GPU_MEMORY: "7Gi", ann.GPU_MILLI: "999"})).ok
    assert s.state.gpu_mem_free[0, 0] == 15_360 - 8_192 - 7_168


def test_cpu_and_pod_slots_are_taken_too():
    s = scheduler([make_node("n", 0, cpu_milli=2_000, memory_mib=4_096, max_pods=3)], profile_config())
    assert s.schedule(make_pod("a", cpu="1500m", memory="1Gi")).ok
    assert s.schedule(make_pod("b", cpu="600m")).status.reasons == ("0/1 nodes are available: 1 Insufficient cpu.",)
    assert s.schedule(make_pod("c", cpu="500m", memory="3Gi")).ok
    assert s.schedule(make_pod("d", cpu=None, memory="1Mi")).status.reasons == ("0/1 nodes are available: 1 Insufficient memory.",)
    assert s.schedule(make_pod("e", cpu=None, memory=None)).ok
    assert s.schedule(make_pod("f", cpu=None, memory=None)).status.reasons == ("0/1 nodes are available: 1 Too many pods.",)


# --- bind failure, reserve plugins ---------------------------------------------------------


def test_unreserve_on_bind_failure_restores_state():
    s = scheduler([make_node("a", 2, T4), make_node("b", 1, A100, mig={0: ["1g.10gb"]})])
    binder = RecordingBinder(fail_for={"default/x", "default/m"})
    assert s.schedule_and_bind(make_pod("keep", cpu="1"), binder).ok
    before = snapshot(s.state)
    for pod in (make_pod("x", gpu="2", cpu="3"), mig("m")):
        d = s.schedule_and_bind(pod, binder)
        assert d.status.code is Code.ERROR and d.assignment is None
        assert "bind failed: apiserver said 409 Conflict" in d.status.message
        assert_same_snapshot(snapshot(s.state), before)
    assert [a.pod_key for a in binder.bound] == ["default/keep"]
    binder.fail_for.clear()
    d = s.schedule_and_bind(make_pod("x", gpu="1"), binder)
    assert d.ok and binder.bound[-1] == d.assignment == s.state.assignments["default/x"]


class CountingReserve:
    """A reserve plugin (e.g. a quota ledger) that can refuse."""

    name = "Ledger"

    def __init__(self, refuse: set[str]):
        self.refuse, self.held = refuse, set()

    def reserve(self, cycle: Cycle, state: ClusterState) -> Status:
        if cycle.request.name in self.refuse:
            return Status.wait("quota exhausted")
        self.held.add(cycle.request.key)
        return Status.success()

    def unreserve(self, cycle: Cycle, state: ClusterState) -> None:
        self.held.discard(cycle.request.key)


def test_reserve_plugin_refusal_and_bind_failure_undo_everything():
    prof = build_profile({"profiles": [profile_config()]})
    ok_ledger, refusing = CountingReserve(set()), CountingReserve({"q"})
    prof.reserves = [ok_ledger, refusing]
    s = Scheduler(prof, ClusterState([make_node("n", 1, T4)]))
    before = snapshot(s.state)
    d = s.schedule(make_pod("q", gpu="1"))
    assert d.status.code is Code.WAIT and d.status.plugin == "Ledger" and d.status.reasons == ("quota exhausted",)
    assert ok_ledger.held == set()  # the first plugin was unreserved again
    assert_same_snapshot(snapshot(s.state), before)
    d = s.schedule_and_bind(make_pod("p", gpu="1"), RecordingBinder({"default/p"}))
    assert d.status.code is Code.ERROR and ok_ledger.held == set() and refusing.held == set()
    assert_same_snapshot(snapshot(s.state), before)
    assert s.schedule(make_pod("p", gpu="1")).ok and ok_ledger.held == {"default/p"}


# --- explain ---------------------------------------------------------------------------------


def test_explain_changes_nothing_and_gives_per_node_reasons():
    s = scheduler([make_node("t4", 1, T4), make_node("a100", 1, A100, taints=[("gpu", "a100", "NoSchedule")]), make_node("cpu")])
    before = snapshot(s.state)
    d = s.explain(make_pod("p", gpu="1"))
    assert d.ok and d.assignment.node == "t4" and d.feasible_nodes == 1
    assert d.diagnosis.by_node == {"t4": "fits", "a100": "node(s) had untolerated taint {gpu: a100}", "cpu": "Insufficient nvidia.com/gpu"}
    assert_same_snapshot(snapshot(s.state), before)
    s.schedule(make_pod("taker", gpu="1"))
    d = s.explain(make_pod("p", gpu="1"))
    assert not d.ok and d.diagnosis.by_node["t4"] == "Insufficient nvidia.com/gpu"
    assert d.status.reasons == (
        "0/3 nodes are available: 2 Insufficient nvidia.com/gpu, 1 node(s) had untolerated taint {gpu: a100}.",
    )


# --- taints + affinity + shares --------------------------------------------------------------


def _mixed_nodes():
    return [
        make_node("a-tainted", 2, T4, labels={"zone": "a"}, taints=[("gpu", "true", "NoSchedule")]),
        make_node("b-a100", 1, A100, labels={"zone": "b"}),
        make_node("a-cpu", 0, labels={"zone": "a"}),
        make_node("a-soft", 1, V100, labels={"zone": "a"}, taints=[("spot", "", "PreferNoSchedule")]),
        make_node("c-cordoned", 4, A100, labels={"zone": "c"}, unschedulable=True),
    ]


def test_mix_of_taints_affinity_and_shares():
    s = scheduler(_mixed_nodes(), profile_config(["LeastAllocated", {"name": "TaintToleration", "weight": 5}]))
    tol = [{"key": "gpu", "operator": "Equal", "value": "true", "effect": "NoSchedule"}]
    # zone a, no toleration: only the soft-tainted V100 is left
    d = s.schedule(share("p1", 500, nodeSelector={"zone": "a"}))
    assert d.ok and d.assignment.node == "a-soft"
    # tolerating the hard taint, the PreferNoSchedule score sends it to the T4 node instead
    d = s.schedule(share("p2", 500, nodeSelector={"zone": "a"}, tolerations=tol))
    assert d.ok and d.assignment.node == "a-tainted"
    # affinity NotIn a, model allow-list excluding A100 -> nothing
    d = s.schedule(share("p3", 500, affinity=affinity(required=[[expr("zone", "NotIn", "a")]]), annotations={ann.GPU_MODELS: T4}))
    assert d.status.reasons == (
        "0/5 nodes are available: 3 node(s) didn't match Pod's node affinity/selector, "
        "1 node(s) had no GPU of an allowed model, 1 node(s) were unschedulable.",
    )
    # the same pod allowed on A100 goes to b
    d = s.schedule(share("p4", 500, affinity=affinity(required=[[expr("zone", "NotIn", "a")]]), annotations={ann.GPU_MODELS: A100}))
    assert d.ok and d.assignment.node == "b-a100"
    # tolerating cordon + preferring zone c lands on the cordoned node
    d = s.schedule(
        make_pod(
            "p5",
            gpu="4",
            tolerations=[{"key": "node.kubernetes.io/unschedulable", "operator": "Exists"}],
            affinity=affinity(preferred=[(100, [expr("zone", "In", "c")])]),
        )
    )
    assert d.ok and d.assignment.node == "c-cordoned" and d.assignment.gpu_indices == (0, 1, 2, 3)
    # zone a without toleration: V100 has 500 left, a 600 share does not fit anywhere in zone a;
    # each node counts once, under the first filter it fails (cordon before affinity)
    d = s.schedule(share("p6", 600, nodeSelector={"zone": "a"}))
    assert d.status.reasons == (
        "0/5 nodes are available: 2 Insufficient GPU milli, 1 node(s) didn't match Pod's node affinity/selector, "
        "1 node(s) had untolerated taint {gpu: true}, 1 node(s) were unschedulable.",
    )


def test_preferred_affinity_and_soft_taints_steer_placement():
    nodes = [make_node("plain", 1, T4), make_node("ssd", 1, T4, labels={"disk": "ssd"}), make_node("spot", 1, T4, taints=[("spot", "", "PreferNoSchedule")])]
    s = scheduler(nodes, profile_config([{"name": "NodeAffinity", "weight": 2}, "TaintToleration"]))
    pod = lambda n: make_pod(n, gpu="1", affinity=affinity(preferred=[(10, [expr("disk", "In", "ssd")])]))  # noqa: E731
    assert [s.schedule(pod(f"p{k}")).assignment.node for k in range(3)] == ["ssd", "plain", "spot"]


# --- MIG -------------------------------------------------------------------------------------


def test_mig_pods_fill_instances_then_fail():
    node = make_node("m", 2, A100, mig={0: ["1g.10gb"] * 3 + ["3g.40gb"]})
    s = scheduler([node, make_node("t4", 1, T4)])
    got = [s.schedule(mig(f"m{k}")) for k in range(3)]
    assert all(d.ok and d.assignment.node == "m" for d in got)
    assert sorted(d.assignment.mig for d in got) == [((0, 0),), ((0, 1),), ((0, 2),)]
    assert all(d.assignment.mig_profile == "1g.10gb" and d.assignment.gpu_indices == () for d in got)
    d = s.schedule(mig("m3"))
    assert d.status.reasons == ("0/2 nodes are available: 2 Insufficient nvidia.com/mig-1g.10gb.",)
    big = s.schedule(mig("big", "3g.40gb"))
    assert big.ok and big.assignment.mig == ((0, 3),)
    # the plain A100 on the MIG node still takes a whole-GPU pod; the T4 takes the next
    whole = [s.schedule(make_pod(f"w{k}", gpu="1", annotations={ann.GPU_MODELS: A100})) for k in range(2)]
    assert whole[0].ok and whole[0].assignment.node == "m" and whole[0].assignment.gpu_indices == (1,)
    assert not whole[1].ok
    s.forget("default/m1")
    again = s.schedule(mig("m4"))
    assert again.ok and again.assignment.mig == ((0, 1),)


def test_multi_gpu_pod_gets_an_nvlink_island():
    s = scheduler([make_node("dgx", 8, A100, nvlink=[[0, 1, 2, 3], [4, 5, 6, 7]])], profile_config(["MostAllocated"]))
    a = s.schedule(make_pod("one", gpu="1")).assignment
    b = s.schedule(make_pod("two", gpu="2")).assignment
    c = s.schedule(make_pod("four", gpu="4")).assignment
    assert a.gpu_indices == (0,) and b.gpu_indices == (1, 2) and c.gpu_indices == (4, 5, 6, 7)
    assert not s.schedule(make_pod("two-more", gpu="2")).ok


# --- policies ----------------------------------------------------------------------------------


@pytest.mark.parametrize("policy", ["bestfit", "fgd", "packing", "default"])
def test_policy_profile_reused_across_states(policy):
    """One profile object serving successive snapshots (simulator runs) decides from each one's nodes."""
    prof = build_profile(policy)
    for k in range(40):
        zone = "a" if k % 2 else "b"
        st = ClusterState([make_node("n0", 2, T4, labels={"zone": zone}), make_node("n1", 2, T4, labels={"zone": "b"})])
        d = Scheduler(prof, st).schedule(share(f"p{k}", 500, nodeSelector={"zone": "a"}))
        assert d.ok is (zone == "a"), (k, d.status)
        del st  # CPython may give the next state the same id()


def test_gpu_selector_failure_is_an_error_not_a_crash():
    class NoDevices:
        name = "NoDevices"

        def select_gpus(self, cycle, state, node):
            return None

    prof = build_profile({"profiles": [profile_config()]})
    prof.gpu_selector = NoDevices()
    s = Scheduler(prof, ClusterState([make_node("n", 1, T4)]))
    d = s.schedule(make_pod("p", gpu="1"))
    assert d.status.code is Code.ERROR and d.status.plugin == "NoDevices" and "node n" in d.status.message
    assert s.state.assignments == {}


def test_decide_does_not_reserve():
    s = scheduler([make_node("n", 1, T4)])
    before = snapshot(s.state)
    cyc = s.new_cycle(make_pod("p", gpu="1"))
    d = s.decide(cyc)
    assert d.ok and cyc.assignment == d.assignment and cyc.node == 0
    assert_same_snapshot(snapshot(s.state), before)
    assert s.reserve(cyc).ok and "default/p" in s.state.assignments
    s.unreserve(cyc)
    assert_same_snapshot(snapshot(s.state), before)


def test_only_nodes_mask_for_the_extender():
    import numpy as np

    s = scheduler([make_node("a", 1, T4), make_node("b", 1, T4)])
    cyc = s.new_cycle(make_pod("p", gpu="1"))
    cyc.only_nodes = np.array([False, True])
    assert s.decide(cyc).assignment.node == "b"
    cyc = s.new_cycle(make_pod("p", gpu="1"))
    cyc.only_nodes = np.array([False, False])
    assert s.decide(cyc).status.reasons == ("0/2 nodes are available: 2 node(s) were not offered by kube-scheduler.",)


def test_empty_cluster():
    s = scheduler([])
    d = s.schedule(make_pod("p"))
    assert not d.ok and d.status.reasons == ("0/0 nodes are available: no nodes in the cluster.",)


def test_choice_type():
    assert GpuChoice() == GpuChoice((), ()) and Profile("x").tie_break == "random"


def test_scheduling_an_already_placed_pod_is_a_status_not_an_exception():
    s = scheduler([make_node("n", 2, T4)])
    assert s.schedule(make_pod("a", gpu="1")).ok
    d = s.schedule(make_pod("a", gpu="1"))  # e.g. a duplicate watch event
    assert not d.ok and "already assigned" in d.status.message
    assert len(s.state.assignments) == 1
