"""Issue 17 on a real kube-apiserver: a complete gang holds nothing; one reclaim is one eviction.

Both reproduce what a controller does: a gang's pods are created one at a time,
and a team creates many pods at once while others borrow its quota.  The counts
(evictions, ``Preempted`` / ``Reclaiming`` events, ``gpufleet_evictions_total``)
are printed (``pytest -s``) and asserted.  Victims are deleted with grace period
0: there is no kubelet to finish a graceful delete.
"""

from __future__ import annotations

import pytest

import threading
import time
import uuid

from gpufleet.kube.api import KubernetesApi
from gpufleet.kube.cli import Metrics, load_profile
from gpufleet.kube.loop import SchedulerLoop
from gpufleet.kube.runner import Runner, wait_until

from .test_kube_scheduler import bound, pod_body
from .test_kube_teams import ev_reasons, namespace, no_leftover_pods  # noqa: F401 (fixtures)

pytestmark = pytest.mark.apiserver  # needs KUBEBUILDER_ASSETS (tests/apiserver_support.py)


class Sched:
    def __init__(self, kubeconfig: str, name: str, grace_s: int | None = 0):
        self.api = KubernetesApi(kubeconfig, pool_size=20)
        self.metrics = Metrics()
        self.loop = SchedulerLoop(self.api, load_profile("default", None), scheduler_name=name, bind_workers=4,
                                  event_thread=True, backoff_initial_s=0.2, backoff_max_s=1.0, eviction_grace_s=grace_s)
        self.runner = Runner(self.api, self.loop, None, self.metrics, watch_timeout_s=20)
        self.stop_ev = threading.Event()
        self.thread = threading.Thread(target=self.runner.run, args=(self.stop_ev,), daemon=True)
        self.thread.start()
        assert self.runner.ready.wait(20)

    def evictions(self, reason: str) -> int:
        v = self.metrics.registry.get_sample_value("gpufleet_evictions_total", {"reason": reason})
        return int(v or 0)

    def stop(self) -> None:
        self.stop_ev.set()
        self.thread.join(15)


def test_reclaim_for_many_pending_pods_evicts_each_victim_once(control_plane, admin, core, crds, nodes):  # noqa: F811
    """Team a borrows 8 of team b's 16 GPUs; team b then creates 16 pods at once: exactly 8 evictions,
    8 ``Preempted`` events (each naming the pod it was for), 8 ``Reclaiming`` events, metric 8."""
    tag = uuid.uuid4().hex[:6]
    qa, qb = f"qa-{tag}", f"qb-{tag}"
    for q in (qa, qb):
        crds.create_cluster_custom_object("gpufleet.io", "v1alpha1", "queues", {
            "apiVersion": "gpufleet.io/v1alpha1", "kind": "Queue", "metadata": {"name": q},
            "spec": {"quota": {"nvidia.com/gpu": "16"}}})
    na, nb = namespace(core, qa), namespace(core, qb)
    for i in range(4):
        nodes(f"{tag}-n{i}", 8, cpu="64")
    name = f"gpufleet-{tag}"
    s = Sched(str(control_plane.kubeconfig), name)
    try:
        for i in range(24):
            core.create_namespaced_pod(na, pod_body(f"a{i:02d}", scheduler=name))
        assert wait_until(lambda: len(bound(core, na)) == 24, 60)
        for i in range(16):  # all pending at once, as a Job with parallelism 16 creates them
            core.create_namespaced_pod(nb, pod_body(f"b{i:02d}", scheduler=name))
        assert wait_until(lambda: len(bound(core, nb)) == 16, 60), ev_reasons(admin, nb)[-5:]
        time.sleep(2.0)  # events and metrics catch up
        left = len(core.list_namespaced_pod(na).items)
        evs_a, evs_b = ev_reasons(admin, na), ev_reasons(admin, nb)
        preempted = [(n, m) for n, r, m in evs_a if r == "Preempted"]
        reclaiming = [(n, m) for n, r, m in evs_b if r == "Reclaiming"]
        counts = {"evicted": 24 - left, "Preempted events": len(preempted), "Reclaiming events": len(reclaiming),
                  "evictions_total{reclaimed}": s.evictions("reclaimed"),
                  "evictions_total{already_gone}": s.evictions("already_gone"), "stats.reclaimed": s.loop.stats.reclaimed}
        print(f"\nreclaim counts: {counts}")
        assert counts["evicted"] == 8 and len(bound(core, na)) == 16
        assert len(preempted) == 8 and len({n for n, _ in preempted}) == 8  # one event per victim
        assert all(f"{nb}/b" in m and f"queue {qb}" in m for _, m in preempted)  # names the pod it was for
        assert len(reclaiming) == 8
        assert s.evictions("reclaimed") == 8 and s.loop.stats.reclaimed == 8
        assert s.evictions("already_gone") == 0
    finally:
        s.stop()
        for q in (qa, qb):
            crds.delete_cluster_custom_object("gpufleet.io", "v1alpha1", "queues", q)


def test_terminating_victims_are_not_deleted_again_while_the_reclaiming_pods_retry(control_plane, admin, core, crds,  # noqa: F811
                                                                                  nodes):
    """A graceful delete (the pods' own grace period) leaves the victims Terminating -- here until the test
    finishes them, as a kubelet would after the grace period -- while the reclaiming pods retry every
    second: still one DELETE, one event and one count per victim."""
    tag = uuid.uuid4().hex[:6]
    qa, qb = f"qa-{tag}", f"qb-{tag}"
    for q in (qa, qb):
        crds.create_cluster_custom_object("gpufleet.io", "v1alpha1", "queues", {
            "apiVersion": "gpufleet.io/v1alpha1", "kind": "Queue", "metadata": {"name": q},
            "spec": {"quota": {"nvidia.com/gpu": "4"}}})
    na, nb = namespace(core, qa), namespace(core, qb)
    nodes(f"{tag}-a", 4)
    nodes(f"{tag}-b", 4)
    name = f"gpufleet-{tag}"
    s = Sched(str(control_plane.kubeconfig), name, grace_s=None)
    try:
        for i in range(6):
            core.create_namespaced_pod(na, pod_body(f"a{i}", scheduler=name))
        assert wait_until(lambda: len(bound(core, na)) == 6, 30)
        for i in range(4):
            core.create_namespaced_pod(nb, pod_body(f"b{i}", scheduler=name))
        assert wait_until(lambda: len(bound(core, nb)) == 2, 20)

        def terminating() -> list[str]:
            return [p.metadata.name for p in core.list_namespaced_pod(na).items if p.metadata.deletion_timestamp]
        wait_until(lambda: len(terminating()) >= 2, 20)
        time.sleep(5.0)  # the reclaiming pods retry (backoff 0.2 .. 1 s) while their victims terminate
        during = {"terminating": len(terminating()), "Preempted events": sum(r == "Preempted" for _, r, _ in ev_reasons(admin, na)),
                  "evictions_total{reclaimed}": s.evictions("reclaimed")}
        for n in terminating():  # the kubelet's part: the grace period is over
            core.delete_namespaced_pod(n, na, grace_period_seconds=0)
        all_bound = wait_until(lambda: len(bound(core, nb)) == 4, 20)
        time.sleep(1.0)
        after = {"a left": len(core.list_namespaced_pod(na).items),
                 "Preempted events": sum(r == "Preempted" for _, r, _ in ev_reasons(admin, na)),
                 "Reclaiming events": sum(r == "Reclaiming" for _, r, _ in ev_reasons(admin, nb)),
                 "evictions_total{reclaimed}": s.evictions("reclaimed"), "already_gone": s.evictions("already_gone")}
        print(f"\nwhile terminating (5 s): {during}; after: {after}")
        assert all_bound, ev_reasons(admin, nb)[-4:]
        assert during == {"terminating": 2, "Preempted events": 2, "evictions_total{reclaimed}": 2}
        assert after == {"a left": 4, "Preempted events": 2, "Reclaiming events": 2, "evictions_total{reclaimed}": 2,
                         "already_gone": 0}
    finally:
        s.stop()
        for q in (qa, qb):
            crds.delete_cluster_custom_object("gpufleet.io", "v1alpha1", "queues", q)


def test_a_gang_created_one_by_one_holds_nothing_once_complete(control_plane, admin, core, crds, nodes):  # noqa: F811
    """Two 4-GPU nodes, one taken by a 4-GPU pod.  A gang of 3 x 2 GPUs (queue quota 4) arrives one pod at a
    time: while 2 of 3 are there it holds the free node and a 1-GPU pod of the same queue is told which gang
    holds it and until when; when the third member comes the gang is complete but cannot be placed (6 GPUs,
    quota 4), so its hold goes at once and the 1-GPU pod binds, counted alone against the quota."""
    tag = uuid.uuid4().hex[:6]
    q = f"q-{tag}"
    crds.create_cluster_custom_object("gpufleet.io", "v1alpha1", "queues", {
        "apiVersion": "gpufleet.io/v1alpha1", "kind": "Queue", "metadata": {"name": q},
        "spec": {"quota": {"nvidia.com/gpu": "4"}, "borrowingLimit": {"nvidia.com/gpu": "0"}}})
    ns, other = namespace(core, q), namespace(core)
    crds.create_namespaced_custom_object("gpufleet.io", "v1alpha1", ns, "podgroups", {
        "apiVersion": "gpufleet.io/v1alpha1", "kind": "PodGroup", "metadata": {"name": "train"},
        "spec": {"minMember": 3, "scheduleTimeoutSeconds": 600}})
    nodes(f"{tag}-a", 4)
    nodes(f"{tag}-b", 4)
    name = f"gpufleet-{tag}"
    s = Sched(str(control_plane.kubeconfig), name)
    grp = {"gpufleet.io/pod-group": "train"}
    try:
        wait_until(lambda: f"{ns}/train" in s.loop.cache.objects.groups and q in getattr(s.loop.cache.tree, "queues", {}), 10)
        core.create_namespaced_pod(other, pod_body("filler", gpus=4, scheduler=name))
        assert wait_until(lambda: "filler" in bound(core, other), 15)
        for i in range(2):  # a controller creates the members one at a time
            core.create_namespaced_pod(ns, pod_body(f"w{i}", gpus=2, annotations=grp, scheduler=name))
            time.sleep(0.5)
        assert wait_until(lambda: len(s.loop.round.gangs.held) == 2, 10)
        core.create_namespaced_pod(ns, pod_body("solo", scheduler=name))

        def solo_reasons() -> list[str]:
            return [m for n, r, m in ev_reasons(admin, ns) if n == "solo" and r == "FailedScheduling"]
        named = wait_until(lambda: any(f"pod group {ns}/train holds" in m for m in solo_reasons()), 10)
        held_reasons = solo_reasons()
        print(f"\nsolo while the gang holds (2 of 3 arrived): {held_reasons}")
        from gpufleet.kube.explain_cli import explain

        code, text = explain(KubernetesApi(str(control_plane.kubeconfig)), load_profile("default", None), f"{ns}/solo", name)
        print(f"gpufleet explain {ns}/solo:\n{text}")
        assert bound(core, ns) == {}
        core.create_namespaced_pod(ns, pod_body("w2", gpus=2, annotations=grp, scheduler=name))
        t0 = time.monotonic()
        ok = wait_until(lambda: "solo" in bound(core, ns), 10)
        waited = time.monotonic() - t0
        gang_reasons = [m for n, r, m in ev_reasons(admin, ns) if n.startswith("w") and r == "FailedScheduling"]
        print(f"solo bound after the gang completed: {ok} ({waited:.1f} s); held now: {s.loop.round.gangs.held}; "
              f"queue {q} GPU milli used: {s.loop.cache.tree.used(q, 'gpu_milli') if s.loop.cache.tree else None}; "
              f"last gang reasons: {gang_reasons[-2:]}")
        assert named and any("until" in m and "UTC" in m for m in held_reasons)  # which gang, until when
        assert code == 0 and f"pod group {ns}/train holds 4 GPU(s) on {tag}-" in text and "UTC at the latest" in text
        assert ok and s.loop.round.gangs.held == [] and s.loop.round.gangs.holder is None
        assert not any(n.startswith("w") for n in bound(core, ns))  # all or nothing
        assert s.loop.cache.tree is not None and s.loop.cache.tree.used(q, "gpu_milli") == 1000  # only solo counts
        # the gang waits, holding nothing, with why (its quota or the GPUs, whichever its transaction met first)
        assert wait_until(lambda: any("of the 3 required members fit" in m for n, r, m in ev_reasons(admin, ns)
                                      if n.startswith("w") and r == "FailedScheduling"), 10)
    finally:
        s.stop()
        crds.delete_cluster_custom_object("gpufleet.io", "v1alpha1", "queues", q)
