"""The room a preemption makes is kept for the preemptor, on a real kube-apiserver.

Why: between the Eviction and the watch showing the victim gone, the live loop tries other pods.  kube-scheduler
counts a pod nominated to a node (``status.nominatedNodeName``) on that node for pods of lower or equal priority,
so none of them takes the room meanwhile; gpufleet's round does the same (``engine.round``'s nominations).  Here
the victim carries a finalizer, so it stays terminating as long as the test wants (there is no kubelet), and a
lower-priority pod that would fit in the half of the node already free arrives while it does.
"""

from __future__ import annotations

import pytest

import json
import time
import uuid

from gpufleet.kube.runner import wait_until

from .test_kube_scheduler import bound, pod_body
from .test_kube_teams import Sched, ev_reasons, namespace, no_leftover_pods, watch_nominations

pytestmark = pytest.mark.apiserver  # needs KUBEBUILDER_ASSETS (tests/apiserver_support.py)

__all__ = ["no_leftover_pods"]  # the autouse fixture, used here too

FINALIZER = "gpufleet.io/test-hold"


def test_a_lower_priority_pod_does_not_take_the_room_a_preemption_made(control_plane, admin, core, crds, nodes):
    from kubernetes import client

    tag = uuid.uuid4().hex[:6]
    prio = client.SchedulingV1Api(admin)
    prio.create_priority_class({"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
                                "metadata": {"name": f"urgent-{tag}"}, "value": 1000})
    ns = namespace(core)
    node = nodes(f"{tag}-n", 4, inventory=True)
    name = f"gpufleet-{tag}"
    s = Sched(str(control_plane.kubeconfig), name)
    try:
        low = pod_body("low", gpus=2, scheduler=name)
        low["metadata"]["finalizers"] = [FINALIZER]  # its deletion waits for the test: the victim is terminating
        core.create_namespaced_pod(ns, low)
        assert wait_until(lambda: "low" in bound(core, ns), 15), ev_reasons(admin, ns)

        urgent = pod_body("urgent", gpus=4, scheduler=name)  # needs the whole node: low must go
        urgent["spec"]["priorityClassName"] = f"urgent-{tag}"
        seen = watch_nominations(core, ns, "urgent")
        core.create_namespaced_pod(ns, urgent)
        assert wait_until(lambda: core.read_namespaced_pod("low", ns).metadata.deletion_timestamp is not None, 20), \
            ev_reasons(admin, ns)
        assert wait_until(lambda: node in seen, 10), seen  # status.nominatedNodeName, as kube-scheduler writes it

        # meanwhile a lower-priority pod that the two free GPUs would fit arrives: the room is urgent's
        core.create_namespaced_pod(ns, pod_body("late", gpus=2, scheduler=name))
        assert wait_until(lambda: any(n == "late" and r == "FailedScheduling" and "nominated pod" in m
                                      for n, r, m in ev_reasons(admin, ns)), 20), ev_reasons(admin, ns)
        time.sleep(1.0)  # several retries (backoff 0.2-1 s): still not placed
        assert "late" not in bound(core, ns)

        core.patch_namespaced_pod("low", ns, {"metadata": {"finalizers": None}})  # the victim is gone now
        assert wait_until(lambda: "urgent" in bound(core, ns), 20), ev_reasons(admin, ns)
        u = bound(core, ns)["urgent"]
        a = json.loads(u.metadata.annotations["gpufleet.io/assignment"])
        assert u.spec.node_name == node and sorted(g["index"] for g in a["gpus"]) == [0, 1, 2, 3]
        time.sleep(1.0)
        assert set(bound(core, ns)) == {"urgent"}  # late waits: no room left anywhere
    finally:
        s.stop()
        try:
            core.patch_namespaced_pod("low", ns, {"metadata": {"finalizers": None}})
        except client.ApiException:
            pass  # gone already
        prio.delete_priority_class(f"urgent-{tag}")
