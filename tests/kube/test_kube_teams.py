"""Queues, reclaim, PriorityClass preemption with a PodDisruptionBudget, and gangs on a real kube-apiserver.

The scheduler runs as in test_kube_scheduler (``Runner`` on a thread, the real
client), with the gpufleet CRDs installed from ``deploy/crds``.  Victims are
deleted with grace period 0: there is no kubelet to finish a graceful delete.
"""

from __future__ import annotations

import json
import threading
import time
import uuid

import pytest

from gpufleet.kube.api import KubernetesApi
from gpufleet.kube.cli import Metrics, load_profile
from gpufleet.kube.loop import SchedulerLoop
from gpufleet.kube.runner import Runner, wait_until

from .test_kube_scheduler import bound, pod_body

pytestmark = pytest.mark.apiserver  # needs KUBEBUILDER_ASSETS (tests/apiserver_support.py)


MADE: list[str] = []


def namespace(core, queue: str | None = None) -> str:
    name = f"it-{uuid.uuid4().hex[:6]}"
    core.create_namespace({"apiVersion": "v1", "kind": "Namespace",
                           "metadata": {"name": name, "labels": {"gpufleet.io/queue": queue} if queue else {}}})
    MADE.append(name)
    return name


@pytest.fixture(autouse=True)
def no_leftover_pods(core):
    """Pods left pending by a test would take the next test's nodes (there is no namespace controller)."""
    yield
    while MADE:
        ns = MADE.pop()
        for p in core.list_namespaced_pod(ns).items:
            core.delete_namespaced_pod(p.metadata.name, ns, grace_period_seconds=0)


class Sched:
    """A scheduler of its own name, so pods other test files left pending never reach this test's nodes."""

    def __init__(self, kubeconfig: str, name: str):
        self.api = KubernetesApi(kubeconfig, pool_size=20)
        self.loop = SchedulerLoop(self.api, load_profile("default", None), scheduler_name=name, bind_workers=4, event_thread=True,
                                  backoff_initial_s=0.2, backoff_max_s=1.0, eviction_grace_s=0)
        self.runner = Runner(self.api, self.loop, None, Metrics(), watch_timeout_s=20)
        self.stop_ev = threading.Event()
        self.thread = threading.Thread(target=self.runner.run, args=(self.stop_ev,), daemon=True)
        self.thread.start()
        assert self.runner.ready.wait(20)

    def stop(self) -> None:
        self.stop_ev.set()
        self.thread.join(15)


def ev_reasons(admin, ns: str) -> list[tuple[str, str, str]]:
    from kubernetes import client

    # raw JSON: events other components write through core/v1 (the disruption controller's) have no eventTime,
    # which the client's events.k8s.io model refuses
    items = json.loads(client.EventsV1Api(admin).list_namespaced_event(ns, _preload_content=False).data)["items"]
    return [((e.get("regarding") or {}).get("name"), e.get("reason"), e.get("note") or "") for e in items]


def watch_nominations(core, ns: str, name: str, timeout_s: int = 40) -> list[str]:
    """The nominatedNodeName values a pod shows, collected from a watch in the background."""
    import threading

    from kubernetes import watch

    seen: list[str] = []
    ready = threading.Event()

    def run() -> None:
        w = watch.Watch()
        rv = core.list_namespaced_pod(ns).metadata.resource_version
        ready.set()
        try:
            for ev in w.stream(core.list_namespaced_pod, ns, field_selector=f"metadata.name={name}", resource_version=rv,
                               timeout_seconds=timeout_s):
                nn = ev["object"].status.nominated_node_name
                if nn and nn not in seen:
                    seen.append(nn)
        except Exception:  # noqa: BLE001 - the control plane went away at the session's end: nothing more to see
            pass

    threading.Thread(target=run, daemon=True).start()
    ready.wait(10)
    return seen


def test_quota_admission_and_reclaim_of_borrowed_gpus(control_plane, admin, core, crds, nodes):
    tag = uuid.uuid4().hex[:6]
    qa, qb = f"qa-{tag}", f"qb-{tag}"
    for q in (qa, qb):
        crds.create_cluster_custom_object("gpufleet.io", "v1alpha1", "queues", {
            "apiVersion": "gpufleet.io/v1alpha1", "kind": "Queue", "metadata": {"name": q},
            "spec": {"quota": {"nvidia.com/gpu": "2"}}})
    na, nb = namespace(core, qa), namespace(core, qb)
    nodes(f"{tag}-n", 4, cpu="64")
    s = Sched(str(control_plane.kubeconfig), f"gpufleet-{tag}")
    try:
        for i in range(4):  # team a borrows b's idle quota
            core.create_namespaced_pod(na, pod_body(f"a{i}", scheduler=f"gpufleet-{tag}"))
            assert wait_until(lambda i=i: f"a{i}" in bound(core, na), 15)
            time.sleep(0.05)  # distinct ages
        assert all(p.metadata.annotations["gpufleet.io/queue"] == qa for p in bound(core, na).values())
        core.create_namespaced_pod(nb, pod_body("b0", scheduler=f"gpufleet-{tag}"))
        assert wait_until(lambda: "b0" in bound(core, nb), 20), ev_reasons(admin, nb)
        assert wait_until(lambda: len(bound(core, na)) == 3, 10)
        assert "a3" not in bound(core, na)  # the youngest borrowed pod went
        # events are written asynchronously: wait for them rather than race the recorder
        assert wait_until(lambda: any(r == "Reclaiming" for _, r, _ in ev_reasons(admin, nb)), 10), ev_reasons(admin, nb)
        assert wait_until(lambda: any(n == "a3" and r == "Preempted" and f"queue {qb}" in m
                                      for n, r, m in ev_reasons(admin, na)), 10), ev_reasons(admin, na)
        # over quota with nothing left to borrow: waits, with the queue named in the reason
        core.create_namespaced_pod(na, pod_body("a4", scheduler=f"gpufleet-{tag}"))
        core.create_namespaced_pod(na, pod_body("a5", scheduler=f"gpufleet-{tag}"))
        assert wait_until(lambda: any(n in ("a4", "a5") and r == "FailedScheduling" and qa in m
                                      for n, r, m in ev_reasons(admin, na)), 30), ev_reasons(admin, na)
    finally:
        s.stop()
        for q in (qa, qb):
            crds.delete_cluster_custom_object("gpufleet.io", "v1alpha1", "queues", q)


def test_priority_class_preemption_spares_pods_under_a_disruption_budget(control_plane, admin, core, crds, nodes):
    from kubernetes import client

    tag = uuid.uuid4().hex[:6]
    client.SchedulingV1Api(admin).create_priority_class({"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
                                                         "metadata": {"name": f"urgent-{tag}"}, "value": 1000})
    ns = namespace(core)
    nodes(f"{tag}-n", 2)
    guarded = pod_body("guarded", scheduler=f"gpufleet-{tag}")
    guarded["metadata"]["labels"] = {"app": "db"}
    client.PolicyV1Api(admin).create_namespaced_pod_disruption_budget(ns, {
        "apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": {"name": "db"},
        "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "db"}}}})
    s = Sched(str(control_plane.kubeconfig), f"gpufleet-{tag}")
    try:
        core.create_namespaced_pod(ns, guarded)
        core.create_namespaced_pod(ns, pod_body("batch", scheduler=f"gpufleet-{tag}"))
        assert wait_until(lambda: len(bound(core, ns)) == 2, 15)
        urgent = pod_body("urgent", scheduler=f"gpufleet-{tag}")
        urgent["spec"]["priorityClassName"] = f"urgent-{tag}"
        seen = watch_nominations(core, ns, "urgent")
        core.create_namespaced_pod(ns, urgent)
        assert core.read_namespaced_pod("urgent", ns).spec.priority == 1000  # the apiserver resolved the class
        assert wait_until(lambda: "urgent" in bound(core, ns), 20), ev_reasons(admin, ns)
        assert set(bound(core, ns)) == {"guarded", "urgent"}  # the budget kept guarded
        u = core.read_namespaced_pod("urgent", ns)
        # nominated while its victim went; since 1.35 the Binding clears status.nominatedNodeName
        # (ClearingNominatedNodeNameAfterBinding), so the nomination is seen on the watch, not on the bound pod
        assert wait_until(lambda: u.spec.node_name in seen, 5), seen
        assert wait_until(lambda: any(n == "batch" and r == "Preempted" for n, r, _ in ev_reasons(admin, ns)), 10)
    finally:
        s.stop()


def test_gang_binds_only_when_min_member_pods_fit(control_plane, admin, core, crds, nodes):
    tag = uuid.uuid4().hex[:6]
    ns = namespace(core)
    crds.create_namespaced_custom_object("gpufleet.io", "v1alpha1", ns, "podgroups", {
        "apiVersion": "gpufleet.io/v1alpha1", "kind": "PodGroup", "metadata": {"name": "train"},
        "spec": {"minMember": 3, "scheduleTimeoutSeconds": 30}})
    nodes(f"{tag}-a", 2)
    nodes(f"{tag}-b", 2)
    s = Sched(str(control_plane.kubeconfig), f"gpufleet-{tag}")
    try:
        wait_until(lambda: f"{ns}/train" in s.loop.cache.objects.groups, 10)
        for i in range(2):
            core.create_namespaced_pod(ns, pod_body(f"w{i}", annotations={"gpufleet.io/pod-group": "train"}, scheduler=f"gpufleet-{tag}"))
        time.sleep(2.0)
        assert bound(core, ns) == {}  # 2 of 3: nothing binds
        core.create_namespaced_pod(ns, pod_body("w2", annotations={"gpufleet.io/pod-group": "train"}, scheduler=f"gpufleet-{tag}"))
        assert wait_until(lambda: len(bound(core, ns)) == 3, 15), ev_reasons(admin, ns)
        used = {json.loads(p.metadata.annotations["gpufleet.io/assignment"])["node"] for p in bound(core, ns).values()}
        assert used <= {f"{tag}-a", f"{tag}-b"}
    finally:
        s.stop()


def test_a_high_priority_gang_preempts_room_for_all_members(control_plane, admin, core, crds, nodes):
    from kubernetes import client

    tag = uuid.uuid4().hex[:6]
    client.SchedulingV1Api(admin).create_priority_class({"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
                                                         "metadata": {"name": f"train-{tag}"}, "value": 500})
    ns = namespace(core)
    nodes(f"{tag}-a", 2)
    nodes(f"{tag}-b", 2)
    s = Sched(str(control_plane.kubeconfig), f"gpufleet-{tag}")
    try:
        for i in range(4):
            core.create_namespaced_pod(ns, pod_body(f"batch{i}", scheduler=f"gpufleet-{tag}"))
        assert wait_until(lambda: len(bound(core, ns)) == 4, 15)
        for i in range(2):
            w = pod_body(f"w{i}", gpus=2, annotations={"gpufleet.io/pod-group": "train",
                                                       "gpufleet.io/pod-group-min-member": "2"}, scheduler=f"gpufleet-{tag}")
            w["spec"]["priorityClassName"] = f"train-{tag}"
            core.create_namespaced_pod(ns, w)
        assert wait_until(lambda: {"w0", "w1"} <= set(bound(core, ns)), 25), ev_reasons(admin, ns)
        assert not any(n.startswith("batch") for n in bound(core, ns))  # two whole nodes were needed
        assert any(r == "Preempting" for _, r, _ in ev_reasons(admin, ns))
    finally:
        s.stop()


def test_a_high_priority_pod_takes_cpu_kept_for_free_gpus_rather_than_evict(control_plane, admin, core, crds, nodes):
    # the default's CPU reserve, live: 64 waiting GPU pods ask 33 cores per GPU (none fits), so the GPU node keeps
    # its CPU from CPU-only pods; a low-priority CPU-only pod goes to the CPU-only node.  A high-priority one then
    # takes the kept CPU; evicting the low-priority pod to keep CPU for GPU pods that have not come would be wrong.
    from kubernetes import client

    tag = uuid.uuid4().hex[:6]
    client.SchedulingV1Api(admin).create_priority_class({"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
                                                         "metadata": {"name": f"urgent-{tag}"}, "value": 1000})
    ns = namespace(core)
    nodes(f"{tag}-g0", 4, cpu="32")
    nodes(f"{tag}-c0", 0, cpu="16")
    s = Sched(str(control_plane.kubeconfig), f"gpufleet-{tag}")

    def body(name: str, cpu: str, gpus: int = 0) -> dict:
        b = pod_body(name, gpus=gpus, scheduler=f"gpufleet-{tag}")
        b["spec"]["containers"][0]["resources"]["requests"]["cpu"] = cpu
        return b

    try:
        for i in range(64):
            core.create_namespaced_pod(ns, body(f"gpu{i}", "33", gpus=1))
        assert wait_until(lambda: len(s.loop.queue.pending) >= 64, 20)
        core.create_namespaced_pod(ns, body("low", "16"))
        assert wait_until(lambda: "low" in bound(core, ns), 15), ev_reasons(admin, ns)
        assert bound(core, ns)["low"].spec.node_name == f"{tag}-c0"
        urgent = body("urgent", "8")
        urgent["spec"]["priorityClassName"] = f"urgent-{tag}"
        core.create_namespaced_pod(ns, urgent)
        assert wait_until(lambda: "urgent" in bound(core, ns), 15), ev_reasons(admin, ns)
        assert bound(core, ns)["urgent"].spec.node_name == f"{tag}-g0"
        time.sleep(1.0)
        assert "low" in bound(core, ns)
        assert not [r for _, r, _ in ev_reasons(admin, ns) if r in ("Preempting", "Preempted")]
        held = lambda: s.runner.metrics.registry.get_sample_value("gpufleet_held_room_placements_total")  # noqa: E731
        assert wait_until(lambda: held() == 1, 5), held()
        # an equal-priority twin still waits for the reserve, and is told why
        core.create_namespaced_pod(ns, body("same", "8"))
        assert wait_until(lambda: any(n == "same" and r == "FailedScheduling" and "kept their CPU for their free GPUs" in m
                                      for n, r, m in ev_reasons(admin, ns)), 15), ev_reasons(admin, ns)
        assert "same" not in bound(core, ns)
    finally:
        s.stop()
