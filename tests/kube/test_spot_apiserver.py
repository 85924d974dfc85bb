"""Spot nodes on a real kube-apiserver: placement by capacity type, an interruption (taint, then deletion), the drain.

The scheduler runs on a thread as ``gpufleet scheduler`` does; kube-controller-manager runs its replicaset controller
(so evicted pods are re-created by their ReplicaSet, as in a cluster), with no kubelet (pods stay bound and
Pending, and a graceful delete leaves them terminating: exactly what the drain must live with).  The test prints the
timings of each step (notice to evicted, to the replacement bound; node deleted to nothing bound to it).
"""

from __future__ import annotations

import time

import pytest

from gpufleet.kube.runner import wait_until

from tests.apiserver_support import kcm_controllers
from .test_kube_scheduler import Sched, bound, events

pytestmark = pytest.mark.apiserver  # needs KUBEBUILDER_ASSETS (tests/apiserver_support.py)

SPOT = {"karpenter.sh/capacity-type": "spot"}


@pytest.fixture
def ns(core):
    import uuid

    from kubernetes import client

    name = f"it-{uuid.uuid4().hex[:6]}"
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
    return name


@pytest.fixture(scope="module")
def replicaset_controller(control_plane):
    yield from kcm_controllers(control_plane, "replicaset", "kcm-rs.log")


@pytest.fixture
def classes(admin):
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    api = client.SchedulingV1Api(admin)
    for name, value in (("it-spot-high", 1000), ("it-spot-batch", 10), ("it-spot-low", 1)):
        try:
            api.create_priority_class(client.V1PriorityClass(metadata=client.V1ObjectMeta(name=name), value=value))
        except ApiException as exc:
            if exc.status != 409:
                raise


def _rs(apps, ns: str, name: str, replicas: int, pclass: str, spot: str | None) -> None:
    ann = {"gpufleet.io/spot": spot} if spot else {}
    body = {"apiVersion": "apps/v1", "kind": "ReplicaSet", "metadata": {"name": name},
            "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": name}},
                     "template": {"metadata": {"labels": {"app": name}, "annotations": ann},
                                  "spec": {"schedulerName": "gpufleet", "priorityClassName": pclass,
                                           "containers": [{"name": "c", "image": "busybox", "resources": {
                                               "requests": {"cpu": "1", "memory": "1Gi"}, "limits": {"nvidia.com/gpu": "1"}}}]}}}}
    apps.create_namespaced_replica_set(ns, body)


def _on(core, ns: str, node: str, live_only: bool = True) -> list:
    return [p for p in bound(core, ns).values() if p.spec.node_name == node and not (live_only and p.metadata.deletion_timestamp)]


def test_spot_placement_and_an_interruption_drain_in_priority_order(control_plane, admin, core, ns, nodes,
                                                                   replicaset_controller, classes):
    from kubernetes import client

    apps = client.AppsV1Api(admin)
    od, sp = nodes(f"{ns}-od", 4, inventory=True), nodes(f"{ns}-spot", 4, inventory=True)
    core.patch_node(sp, {"metadata": {"labels": SPOT}})
    _rs(apps, ns, "train", 2, "it-spot-batch", "prefer")  # interruptible: spot first
    _rs(apps, ns, "sweep", 2, "it-spot-low", "prefer")
    _rs(apps, ns, "serve", 1, "it-spot-high", None)  # never on spot
    s = Sched(str(control_plane.kubeconfig))
    try:
        assert wait_until(lambda: len(bound(core, ns)) == 5, 30), {k: p.spec.node_name for k, p in bound(core, ns).items()}
        where = {k: p.spec.node_name for k, p in bound(core, ns).items()}
        assert all(n == sp for k, n in where.items() if not k.startswith("serve")), where
        assert next(n for k, n in where.items() if k.startswith("serve")) == od
        first = set(where)

        t0 = time.monotonic()
        core.patch_node(sp, {"spec": {"taints": [{"key": "karpenter.sh/disrupted", "effect": "NoSchedule"}]}})
        assert wait_until(lambda: not _on(core, ns, sp), 20), [p.metadata.name for p in _on(core, ns, sp)]
        t_evicted = time.monotonic() - t0
        ev = sorted((e for e in events(core, ns) if e.reason == "Interrupted"), key=lambda e: e.first_timestamp or e.event_time)
        assert len(ev) == 4 and all("node " + sp + " is going away (taint karpenter.sh/disrupted)" in e.message for e in ev), \
            [(e.involved_object.name, e.message) for e in ev]
        order = [e.involved_object.name.rsplit("-", 1)[0] for e in ev]
        assert order == ["train", "train", "sweep", "sweep"], order  # priority 10 before priority 1
        # the ReplicaSets re-create them; they go to the on-demand node (the notice keeps spot closed), tagged
        assert wait_until(lambda: len([p for p in _on(core, ns, od) if p.metadata.name not in first]) == 3, 30), \
            {p.metadata.name: p.spec.node_name for p in bound(core, ns).values()}
        t_replaced = time.monotonic() - t0
        fresh = [p for p in _on(core, ns, od) if p.metadata.name not in first]
        # the replacement's tag is a patch after its bind: give it a moment, as a user reading it would
        assert wait_until(lambda: all("gpufleet.io/moved-from" in (core.read_namespaced_pod(p.metadata.name, ns).metadata.annotations or {})
                                      for p in fresh), 10), [(p.metadata.name, p.metadata.annotations) for p in fresh]
        from gpufleet.kube.api import KubernetesApi
        from gpufleet.kube.cli import load_profile
        from gpufleet.kube.explain_cli import explain

        code, text = explain(KubernetesApi(str(control_plane.kubeconfig)), load_profile("default", None), f"{ns}/{fresh[0].metadata.name}")
        assert code == 0 and f"moved: replaces {ns}/" in text and "going away" in text, text
        # od has 4 GPUs and serve holds one: the two train replacements (priority 10) and one sweep run there, the
        # other sweep waits (the spot node is closed)
        assert wait_until(lambda: sorted(p.metadata.name.rsplit("-", 1)[0] for p in _on(core, ns, od))
                          == ["serve", "sweep", "train", "train"], 20), [p.metadata.name for p in _on(core, ns, od)]
        # the node is deleted: nothing may stay bound to it (the drained pods were still terminating)
        t1 = time.monotonic()
        core.delete_node(sp)
        assert wait_until(lambda: not _on(core, ns, sp, live_only=False), 20), [p.metadata.name for p in _on(core, ns, sp, False)]
        t_gone = time.monotonic() - t1
        assert s.loop.stats.interrupted == 4, s.loop.stats.interrupted
        print(f"\nspot drain on a real kube-apiserver: notice -> {len(ev)} pods evicted {t_evicted:.2f} s; "
              f"-> {len(fresh)} replacements bound on {od} {t_replaced:.2f} s; node deleted -> nothing bound to it {t_gone:.2f} s")
    finally:
        s.stop()
        for rs in ("train", "sweep", "serve"):
            apps.delete_namespaced_replica_set(rs, ns)
