"""Pod-level resources and in-place resize through the live loop (fake API server).

The node has 4 CPUs and no GPUs, so only cpu decides; kube-scheduler 1.37 reaches the same outcomes on a
real apiserver in ``tests/kube/test_k137_side_by_side.py``.
"""

from __future__ import annotations

import copy

from tests.kube.fake_api import FakeApi
from gpufleet.kube.loop import SchedulerLoop
from gpufleet.policies import build_profile


def cpu_node(name: str = "n1", cpu: str = "4") -> dict:
    return {"metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}, "annotations": {}}, "spec": {},
            "status": {"allocatable": {"cpu": cpu, "memory": "16Gi", "pods": "110"},
                       "conditions": [{"type": "Ready", "status": "True"}]}}


def cpu_pod(name: str, cpu: str, scheduler: str = "gpufleet", node: str | None = None, pod_cpu: str | None = None) -> dict:
    spec: dict = {"schedulerName": scheduler,
                  "containers": [{"name": "c", "resources": {"requests": {"cpu": cpu, "memory": "64Mi"}}}]}
    if pod_cpu:
        spec["resources"] = {"requests": {"cpu": pod_cpu}}
    if node:
        spec["nodeName"] = node
    return {"metadata": {"name": name, "namespace": "ml", "uid": f"uid-{name}", "annotations": {}}, "spec": spec,
            "status": {"phase": "Running" if node else "Pending"}}


def make(api: FakeApi) -> SchedulerLoop:
    loop = SchedulerLoop(api, build_profile("bestfit"))
    loop.resync()
    return loop


def test_pod_level_requests_take_the_node_and_keep_the_next_pod_out():
    api = FakeApi()
    api.add_node(cpu_node())
    api.add_pod(cpu_pod("big", "1", pod_cpu="3"))  # containers ask 1 CPU, the pod 3
    loop = make(api)
    assert loop.schedule_due() == 1 and api.binds == [("ml/big", "n1")]
    api.add_pod(cpu_pod("next", "2"))
    loop.handle("pod", "ADDED", api.pods["ml/next"])
    loop.schedule_due()
    assert [k for k, _ in api.binds] == ["ml/big"]
    assert api.events[-1]["reason"] == "FailedScheduling" and "Insufficient cpu" in api.events[-1]["message"]


def resize(pod: dict, desired: str, allocated: str, reason: str | None) -> dict:
    p = copy.deepcopy(pod)
    p["spec"]["containers"][0]["resources"]["requests"]["cpu"] = desired
    p["metadata"]["resourceVersion"] = str(int(p["metadata"].get("resourceVersion") or 1) + 1)
    p["status"]["containerStatuses"] = [{"name": "c", "allocatedResources": {"cpu": allocated, "memory": "64Mi"},
                                         "resources": {"requests": {"cpu": allocated, "memory": "64Mi"}}}]
    p["status"]["conditions"] = [{"type": "PodResizePending", "status": "True", "reason": reason}] if reason else []
    return p


def test_a_pending_resize_holds_the_desired_size_and_an_infeasible_one_does_not():
    api = FakeApi()
    api.add_node(cpu_node())
    running = cpu_pod("web", "1", scheduler="default-scheduler", node="n1")
    api.add_pod(running)
    loop = make(api)
    # kubelet has not allocated the resize 1 -> 3 CPUs yet (Deferred): the pod counts 3, a 2-CPU pod waits
    grown = resize(running, "3", "1", "Deferred")
    api.pods["ml/web"] = grown
    loop.handle("pod", "MODIFIED", grown)
    api.add_pod(cpu_pod("batch", "2"))
    loop.handle("pod", "ADDED", api.pods["ml/batch"])
    loop.schedule_due()
    assert api.binds == []
    assert "Insufficient cpu" in api.events[-1]["message"]
    # kubelet finds it infeasible: only what it allocated counts, the 2-CPU pod fits
    stuck = resize(grown, "3", "1", "Infeasible")
    api.pods["ml/web"] = stuck
    loop.handle("pod", "MODIFIED", stuck)
    loop.schedule_due()  # the update woke the waiting pod
    assert api.binds == [("ml/batch", "n1")]


def test_a_resize_seen_at_start_up_is_counted_even_past_the_nodes_capacity():
    api = FakeApi()
    api.add_node(cpu_node(cpu="4"))
    a = resize(cpu_pod("a", "1", scheduler="default-scheduler", node="n1"), "3", "1", "Deferred")
    b = cpu_pod("b", "2", scheduler="default-scheduler", node="n1")
    api.add_pod(a)
    api.add_pod(b)
    api.add_pod(cpu_pod("c", "100m"))
    loop = make(api)
    # 3 + 2 > 4: both running pods still count, so nothing more fits there
    assert loop.stats.double_book_refused == 0
    loop.schedule_due()
    assert api.binds == []
    assert "Insufficient cpu" in api.events[-1]["message"]
