"""Victims named on a real kube-apiserver, with the real disruption controller writing budgets' status.

docs/queues.md: preemption and reclaim take the lowest priority, then the youngest (started last), and
never a pod a PodDisruptionBudget protects.  Here the scheduler runs as ``gpufleet scheduler`` does, the
budgets' status comes from kube-controller-manager's disruption controller (only that controller runs),
victims go through the Eviction API, and the pods are marked Running and Ready with a startTime as kubelet
would (there is no kubelet in this tier).  The issue-35 scenarios: a budget written with matchExpressions
protected nothing from live preemption, and reclaim after a restart took pods that were not the youngest.
"""

from __future__ import annotations

import time
import uuid

import pytest

from gpufleet.kube.runner import wait_until

from tests.apiserver_support import mark_running
from .test_kube_scheduler import bound, pod_body
from . import test_kube_teams as teams
from .test_kube_teams import Sched, ev_reasons, namespace

pytestmark = pytest.mark.apiserver  # needs KUBEBUILDER_ASSETS (tests/apiserver_support.py)

SELECTORS = {
    "matchLabels": {"matchLabels": {"app": "db"}},
    "matchExpressions": {"matchExpressions": [{"key": "app", "operator": "In", "values": ["db"]}]},
}


@pytest.fixture(autouse=True)
def no_leftover_pods(core):
    """Pods a test leaves would take the next test's nodes (there is no namespace controller)."""
    yield
    while teams.MADE:
        ns = teams.MADE.pop()
        for p in core.list_namespaced_pod(ns).items:
            core.delete_namespaced_pod(p.metadata.name, ns, grace_period_seconds=0)


def start_time(i: int) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() - 3600 + 10 * i))


def label_node(core, name: str, role: str) -> None:
    core.patch_node(name, {"metadata": {"labels": {"gpufleet-test/role": role}}})


def body(name: str, sched: str, gpus: int, role: str | None = None, labels: dict | None = None) -> dict:
    b = pod_body(name, gpus=gpus, scheduler=sched)
    if role:
        b["spec"]["nodeSelector"] = {"gpufleet-test/role": role}
    b["metadata"]["labels"] = dict(labels or {})
    return b


def budget(policy, ns: str, name: str, selector: dict, min_available) -> None:
    policy.create_namespaced_pod_disruption_budget(ns, {
        "apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": {"name": name},
        "spec": {"minAvailable": min_available, "selector": selector}})


def settled(policy, ns: str, name: str, healthy: int, allowed: int):
    def ok() -> bool:
        b = policy.read_namespaced_pod_disruption_budget(name, ns)
        st = b.status
        return (st is not None and (st.observed_generation or 0) >= (b.metadata.generation or 0)
                and st.current_healthy == healthy and st.disruptions_allowed == allowed)
    return ok


@pytest.mark.parametrize("how", sorted(SELECTORS))
def test_preemption_spares_the_pods_a_budget_protects_whatever_its_selector(how, control_plane, admin, core, crds,
                                                                            nodes, disruption_controller):
    from kubernetes import client

    tag = uuid.uuid4().hex[:6]
    sched = f"gpufleet-{tag}"
    policy = client.PolicyV1Api(admin)
    client.SchedulingV1Api(admin).create_priority_class({"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
                                                         "metadata": {"name": f"urgent-{tag}"}, "value": 1000})
    ns = namespace(core)
    label_node(core, nodes(f"{tag}-db", 8, cpu="64"), "db")
    label_node(core, nodes(f"{tag}-batch", 8, cpu="64"), "batch")
    s = Sched(str(control_plane.kubeconfig), sched)
    try:
        names = [f"db-{i}" for i in range(4)] + [f"batch-{i}" for i in range(8)]
        for n in names:
            db = n.startswith("db")
            core.create_namespaced_pod(ns, body(n, sched, 2 if db else 1, "db" if db else "batch",
                                                {"app": "db" if db else "batch"}))
        assert wait_until(lambda: len(bound(core, ns)) == 12, 30), ev_reasons(admin, ns)
        for i, n in enumerate(names):  # started in creation order: batch-7 is the youngest
            mark_running(core, ns, n, start_time(i))
        budget(policy, ns, "db", SELECTORS[how], 4)
        assert wait_until(settled(policy, ns, "db", 4, 0), 30), policy.read_namespaced_pod_disruption_budget("db", ns).status
        urgent = body("urgent", sched, 2)
        urgent["spec"]["priorityClassName"] = f"urgent-{tag}"
        core.create_namespaced_pod(ns, urgent)
        assert wait_until(lambda: "urgent" in bound(core, ns), 30), ev_reasons(admin, ns)
        left = set(bound(core, ns))
        assert {f"db-{i}" for i in range(4)} <= left  # the budget kept every db pod
        assert {f"batch-{i}" for i in range(8)} - left == {"batch-6", "batch-7"}  # the two youngest batch pods went
        assert bound(core, ns)["urgent"].spec.node_name == f"{tag}-batch"
        preempted = {n for n, r, _ in ev_reasons(admin, ns) if r == "Preempted"}
        assert wait_until(lambda: {n for n, r, _ in ev_reasons(admin, ns) if r == "Preempted"} == {"batch-6", "batch-7"}, 10), preempted
    finally:
        s.stop()


def test_reclaim_after_a_restart_takes_the_youngest_borrowed_pods_and_spares_a_budget(control_plane, admin, core, crds,
                                                                                      nodes, disruption_controller):
    from kubernetes import client

    tag = uuid.uuid4().hex[:6]
    sched = f"gpufleet-{tag}"
    policy = client.PolicyV1Api(admin)
    qa, qb = f"qa-{tag}", f"qb-{tag}"
    for q, gpus in ((qa, 16), (qb, 8)):
        crds.create_cluster_custom_object("gpufleet.io", "v1alpha1", "queues", {
            "apiVersion": "gpufleet.io/v1alpha1", "kind": "Queue", "metadata": {"name": q},
            "spec": {"quota": {"nvidia.com/gpu": str(gpus)}}})
    na, nb = namespace(core, qa), namespace(core, qb)
    for i in range(3):
        nodes(f"{tag}-n{i}", 8, cpu="64")
    s = Sched(str(control_plane.kubeconfig), sched)
    try:
        for i in range(1, 25):  # team-a takes all 24 GPUs: 16 of its own, 8 borrowed from team-b
            core.create_namespaced_pod(na, body(f"a-{i}", sched, 1, labels={"app": f"a{i}"}))
        assert wait_until(lambda: len(bound(core, na)) == 24, 40), ev_reasons(admin, na)
        for i in range(24, 0, -1):  # kubelet's status writes come in any order; startTime says who is youngest
            mark_running(core, na, f"a-{i}", start_time(i))
    finally:
        s.stop()
    # a budget over the two youngest, written with matchExpressions
    budget(policy, na, "keep", {"matchExpressions": [{"key": "app", "operator": "In", "values": ["a23", "a24"]}]}, 2)
    assert wait_until(settled(policy, na, "keep", 2, 0), 30), policy.read_namespaced_pod_disruption_budget("keep", na).status
    s = Sched(str(control_plane.kubeconfig), sched)  # a new scheduler relists the bound pods (by name: a-1, a-10, a-11...)
    try:
        for j in range(8):
            core.create_namespaced_pod(nb, body(f"b-{j}", sched, 1))
        assert wait_until(lambda: len(bound(core, nb)) == 8, 60), ev_reasons(admin, nb)
        assert wait_until(lambda: len(bound(core, na)) == 16, 20)
        gone = {f"a-{i}" for i in range(1, 25)} - set(bound(core, na))
        assert gone == {f"a-{i}" for i in range(15, 23)}, sorted(gone)  # the youngest 8 the budget lets go
        assert s.loop.stats.reclaimed == 8 and s.loop.stats.preempted == 0
    finally:
        s.stop()
        for q in (qa, qb):
            crds.delete_cluster_custom_object("gpufleet.io", "v1alpha1", "queues", q)
