"""The scheduler loop against an in-process fake API server."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone

import pytest

from gpufleet.engine.inventory import gpus_to_json
from gpufleet.engine.model import Gpu
from tests.kube.fake_api import FakeApi
from gpufleet.kube.convert import node_from_json
from gpufleet.kube.loop import SchedulerLoop
from gpufleet.policies import build_profile, profile_config


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


def node(name, gpus=2, product="NVIDIA-A100-SXM4-80GB", inventory=False, cpu="16", ready=True):
    meta = {"name": name, "labels": {"nvidia.com/gpu.product": product, "nvidia.com/gpu.memory": "81920"}, "annotations": {}}
    if inventory:
        meta["annotations"]["gpufleet.io/gpu-inventory"] = gpus_to_json([Gpu(i, f"GPU-{name}-{i}", product, 81920) for i in range(gpus)], top={"gpu_slots": 10})
    return {"metadata": meta, "spec": {},
            "status": {"allocatable": {"cpu": cpu, "memory": "64Gi", "pods": "110", "nvidia.com/gpu": str(gpus * (10 if inventory else 1))},
                       "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}}


def pod(name, gpus=1, milli=None, scheduler="gpufleet", node_name=None, annotations=None, cpu="1"):
    a = dict(annotations or {})
    if milli:
        a["gpufleet.io/gpu-milli"] = str(milli)
    spec = {"schedulerName": scheduler, "containers": [{"name": "c", "resources": {
        "requests": {"cpu": cpu, "memory": "1Gi"}, "limits": {"nvidia.com/gpu": str(gpus)} if gpus else {}}}]}
    if node_name:
        spec["nodeName"] = node_name
    return {"metadata": {"name": name, "namespace": "ml", "annotations": a, "uid": f"uid-{name}"}, "spec": spec, "status": {"phase": "Pending"}}


def make(api, clock=None, policy="bestfit"):
    loop = SchedulerLoop(api, build_profile(policy), clock=clock or Clock())
    loop.resync()
    return loop


def test_binds_with_assignment_annotation_and_scheduled_event():
    api = FakeApi()
    api.add_node(node("n1", inventory=True))
    api.add_pod(pod("a"))
    api.add_pod(pod("other", scheduler="default-scheduler"))
    loop = make(api)
    assert loop.schedule_due() == 1
    assert api.binds == [("ml/a", "n1")]
    a = json.loads(api.pods["ml/a"]["metadata"]["annotations"]["gpufleet.io/assignment"])
    assert a["node"] == "n1" and len(a["gpus"]) == 1 and a["gpus"][0]["uuid"].startswith("GPU-n1-")
    assert [e["reason"] for e in api.events] == ["Scheduled"]
    assert "ml/other" not in dict(api.binds)


def test_failed_scheduling_event_has_aggregated_reasons_and_backoff():
    api = FakeApi()
    api.add_node(node("n1", gpus=1))
    api.add_node(node("n2", gpus=1))
    api.add_pod(pod("big", gpus=4))
    clock = Clock()
    loop = make(api, clock)
    loop.schedule_due()
    ev = api.events[-1]
    assert ev["reason"] == "FailedScheduling" and ev["message"].startswith("0/2 nodes are available: 2 Insufficient nvidia.com/gpu")
    assert loop.schedule_due() == 0  # backing off
    clock.t += 1.1
    assert loop.schedule_due() == 1
    clock.t += 1.1
    assert loop.schedule_due() == 0  # backoff doubled to 2 s


def test_cluster_change_retries_waiting_pods():
    api = FakeApi()
    api.add_node(node("n1", gpus=1))
    api.add_pod(pod("big", gpus=4))
    loop = make(api)
    loop.schedule_due()
    assert not api.binds
    big = node("n2", gpus=8)
    api.add_node(big)
    loop.handle("node", "ADDED", big)
    assert loop.schedule_due() == 1 and api.binds == [("ml/big", "n2")]


def test_bad_pod_gets_warning_and_loop_continues():
    api = FakeApi()
    api.add_node(node("n1"))
    api.add_pod(pod("bad", annotations={"gpufleet.io/gpu-milli": "2000"}))
    api.add_pod(pod("good"))
    loop = make(api)
    loop.schedule_due()
    reasons = {e["pod"]: e for e in api.events}
    assert "gpufleet.io/gpu-milli" in reasons["ml/bad"]["message"] and reasons["ml/bad"]["type"] == "Warning"
    assert ("ml/good", "n1") in api.binds


def test_restart_rebuilds_state_and_never_double_books():
    api = FakeApi()
    api.add_node(node("n1", gpus=2, inventory=True))
    for i in range(2):
        api.add_pod(pod(f"s{i}", milli=500))  # both share GPU 0 (best fit)
    loop = make(api)
    loop.schedule_due()
    before = {k: json.loads(p["metadata"]["annotations"]["gpufleet.io/assignment"]) for k, p in api.pods.items()}
    # a new scheduler process: everything comes from the API server
    api.add_pod(pod("whole1", gpus=1))
    api.add_pod(pod("whole2", gpus=1))
    loop2 = make(api)
    loop2.schedule_due()
    used = {}
    for p in api.pods.values():
        a = json.loads(p["metadata"]["annotations"].get("gpufleet.io/assignment", "null") or "null")
        if a:
            for g in a["gpus"]:
                used[g["index"]] = used.get(g["index"], 0) + a["gpu_milli"]
    assert all(v <= 1000 for v in used.values()), used
    assert sum(1 for k, _ in api.binds if k.startswith("ml/whole")) == 1  # only one whole GPU was left
    assert all(json.loads(api.pods[k]["metadata"]["annotations"]["gpufleet.io/assignment"]) == v for k, v in before.items())


def test_a_restarted_scheduler_serves_pending_pods_in_creation_order_not_by_name():
    # found on the real node: after a restart every pending pod is seen at once; whole-12 (newer) took
    # the one free GPU from whole-9 because "whole-12" < "whole-9"
    api = FakeApi()
    api.add_node(node("n1", gpus=1, inventory=True))
    for name, ts in (("whole-9", "2026-01-01T00:00:01Z"), ("whole-12", "2026-01-01T00:00:05Z")):
        p = pod(name)
        p["metadata"]["creationTimestamp"] = ts
        api.add_pod(p)
    loop = make(api)  # a fresh process: both pods first seen now
    loop.schedule_due()
    assert api.binds == [("ml/whole-9", "n1")]


def test_a_fresh_default_scheduler_learns_from_the_waiting_pods_before_placing_any():
    # found on the real node: with a backlog, the default placed the first shares against a workload of
    # the few pods it had tried (no whole-GPU pod yet) and spread them over fresh GPUs; a whole pod went pending
    api = FakeApi()
    api.add_node(node("n1", gpus=8, inventory=True))
    pods = [pod("memory-1", annotations={"gpufleet.io/gpu-memory": "10Gi"}), pod("memory-4", annotations={"gpufleet.io/gpu-memory": "40Gi"}),
            pod("memory-6", annotations={"gpufleet.io/gpu-memory": "10Gi"}), pod("milli-0", milli=500), pod("milli-2", milli=250),
            pod("milli-3", milli=300)] + [pod(f"whole-{i}") for i in range(5)]
    for i, p in enumerate(pods):
        p["metadata"]["creationTimestamp"] = f"2026-01-01T00:00:{i:02d}Z"
        api.add_pod(p)
    loop = make(api, policy="default")
    loop.schedule_due()
    assert len(api.binds) == len(pods)
    share_gpus = {g["index"] for k, p in api.pods.items() if "whole" not in k
                  for g in json.loads(p["metadata"]["annotations"]["gpufleet.io/assignment"])["gpus"]}
    assert len(share_gpus) <= 2, share_gpus  # 1,050 milli and 60 GiB of shares: two GPUs hold them, six stay whole


def test_the_live_default_keeps_cpu_for_free_gpus_where_cpu_binds_and_says_so():
    # the default's CPU reserve on the live path: the GPU pods waiting ask 33 cores per GPU (no node has that many:
    # they are learned from, not placed), far more CPU than the cluster has once its GPUs are in use; so a CPU-only
    # pod may not take the CPU a GPU node's free GPUs need, and goes to the CPU-only node or waits
    api = FakeApi()
    api.add_node(node("g0", gpus=4, inventory=True, cpu="32"))
    api.add_node(node("g1", gpus=4, inventory=True, cpu="24"))
    api.add_node(node("c0", gpus=0, cpu="16"))
    waiting = [pod(f"gpu-{i}", gpus=1, cpu="33") for i in range(64)] + [pod("cpu-16", gpus=0, cpu="16"), pod("cpu-20", gpus=0, cpu="20")]
    for p in waiting:  # no creationTimestamp: each has waited since the loop first saw it
        api.add_pod(p)
    clock = Clock()
    loop = make(api, clock, policy="default")
    loop.schedule_due()
    assert api.binds == [("ml/cpu-16", "c0")]
    ev = [e for e in api.events if e["pod"] == "ml/cpu-20"][-1]
    assert ev["reason"] == "FailedScheduling"
    assert ev["message"] == ("0/3 nodes are available: 2 node(s) kept their CPU for their free GPUs (CPU is short cluster-wide), "
                             "1 Insufficient cpu."), ev["message"]
    clock.t += 600  # ten minutes on: the pod may use the reserve (GPU demand that stopped coming holds no CPU for good)
    loop.schedule_due()
    assert api.binds[-1] == ("ml/cpu-20", "g0")


def test_the_live_default_keeps_whole_gpus_for_whole_gpu_pods_while_they_are_scarce_and_says_so():
    # the default's whole-GPU reserve on the live path: the pods seen (pinned to a pool that does not exist, so
    # learned from, not placed) ask whole GPUs (2/3 of the demand) and 810-milli shares, whose 190 left nothing seen
    # fills; once fewer than 50% x 2/3 of the GPUs are whole, an 810 waits for a GPU in use and a whole-GPU pod that
    # came later goes first
    api = FakeApi()
    api.add_node(node("n1", gpus=8, inventory=True, cpu="64"))
    seen = [pod(f"seen-whole-{i}") for i in range(40)] + [pod(f"seen-810-{i}", milli=810) for i in range(24)]
    for p in seen:
        p["spec"]["nodeSelector"] = {"pool": "elsewhere"}
    order = seen + [pod(f"whole-{i}") for i in range(6)] + [pod("share", milli=810), pod("whole-late")]
    start = datetime.now(timezone.utc) - timedelta(seconds=len(order) + 30)  # each created a second after the last
    for i, p in enumerate(order):
        p["metadata"]["creationTimestamp"] = (start + timedelta(seconds=i)).strftime("%Y-%m-%dT%H:%M:%SZ")
        api.add_pod(p)
    clock = Clock()
    cfg = dict(profile_config("default")["profiles"][0])
    cfg["pluginConfig"] = {"WholeGpuReserve": {"whole_reserve": 0.5}}
    loop = make(api, clock, policy={"profiles": [cfg]})
    loop.schedule_due()
    assert [k for k, _ in api.binds] == [f"ml/whole-{i}" for i in range(6)] + ["ml/whole-late"]
    ev = [e for e in api.events if e["pod"] == "ml/share"][-1]
    assert ev["reason"] == "FailedScheduling"
    assert ev["message"] == "0/1 nodes are available: 1 node(s) kept their whole GPUs for pods that fill them (whole GPUs are scarce).", ev["message"]
    clock.t += 600  # ten minutes on: the share may take a whole GPU (demand for whole GPUs that stopped coming keeps none for good)
    loop.schedule_due()
    assert api.binds[-1] == ("ml/share", "n1")


def test_pods_bound_by_others_hold_their_gpus():
    api = FakeApi()
    api.add_node(node("n1", gpus=2))
    api.add_pod(pod("theirs", gpus=2, scheduler="default-scheduler", node_name="n1"))
    api.add_pod(pod("mine", gpus=1))
    loop = make(api)
    loop.schedule_due()
    assert not api.binds and "Insufficient nvidia.com/gpu" in api.events[-1]["message"]
    api.delete_pod("ml/theirs")
    for t, obj in api.watch("pod", loop.cache.rv["pod"]):
        loop.handle("pod", t, obj)
    assert loop.schedule_due() == 1 and api.binds == [("ml/mine", "n1")]


def test_bind_failure_unreserves_and_retries():
    api = FakeApi()
    api.add_node(node("n1", gpus=1))
    api.add_pod(pod("a"))
    clock = Clock()
    loop = make(api, clock)
    api.fail_binds = 1
    loop.schedule_due()
    assert not api.binds and "binding to n1 failed" in api.events[-1]["message"]
    assert (loop.cache.state.gpu_free_milli[0, 0]) == 1000  # unreserved
    clock.t += 5
    loop.schedule_due()
    assert api.binds == [("ml/a", "n1")]


def test_explain_node_by_node():
    api = FakeApi()
    api.add_node(node("n1", gpus=1))
    api.add_node(node("n2", gpus=4))
    loop = make(api)
    summary, by_node = loop.explain(pod("x", gpus=2))
    assert summary.startswith("fits") and by_node == {"n1": "Insufficient nvidia.com/gpu", "n2": "fits"}


@pytest.mark.parametrize("bad,field", [
    ({"status": {"allocatable": {"cpu": "lots"}}}, "status.allocatable.cpu"),
    ({"metadata": {"name": "x", "annotations": {"gpufleet.io/gpu-inventory": "{not json"}}}, "gpufleet.io/gpu-inventory"),
    ({"metadata": {"name": "x", "labels": {"nvidia.com/gpu.memory": "big"}}, "status": {"allocatable": {"nvidia.com/gpu": "1"}}}, "nvidia.com/gpu.memory"),
])
def test_bad_nodes_name_the_field(bad, field):
    from gpufleet.engine.errors import InvalidNodeSpec

    obj = {"metadata": {"name": "x"}, **bad}
    with pytest.raises(InvalidNodeSpec) as exc:
        node_from_json(obj)
    assert field in str(exc.value) and "x" in str(exc.value)


def test_gfd_labels_model_a_node_without_inventory():
    n = node_from_json(node("n1", gpus=4, product="NVIDIA-H100-80GB-HBM3"))
    assert len(n.gpus) == 4 and n.gpus[0].model == "NVIDIA-H100-80GB-HBM3" and n.gpus[0].memory_mib == 81920


def test_leader_election_one_leader_and_failover():
    from gpufleet.kube.leader import LeaseElector, MemoryLeaseStore

    store = MemoryLeaseStore()
    clock = Clock()
    a = LeaseElector(store, "a", lease_s=15, clock=clock)
    b = LeaseElector(store, "b", lease_s=15, clock=clock)
    assert a.step() and not b.step()
    clock.t += 10
    assert a.step() and not b.step()  # renewed
    clock.t += 16  # a stopped renewing
    assert b.step() and store.rec.holder == "b" and store.rec.transitions == 1
    assert not a.step()
    b.release()
    assert a.step()


def test_metrics_health_and_ready_endpoints():
    import threading
    import urllib.error
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    from gpufleet.kube.cli import Metrics, serve_http

    m = Metrics()
    ready = threading.Event()
    srv = serve_http("127.0.0.1:0", m, ready)
    base = f"http://127.0.0.1:{srv.server_address[1]}"
    try:
        with pytest.raises(urllib.error.HTTPError) as exc:
            urllib.request.urlopen(base + "/readyz", timeout=5)
        assert exc.value.code == 503
        ready.set()
        assert urllib.request.urlopen(base + "/readyz", timeout=5).status == 200
        assert urllib.request.urlopen(base + "/healthz", timeout=5).read() == b"ok"
        m.attempts.labels("scheduled").inc()
        text = urllib.request.urlopen(base + "/metrics", timeout=5).read().decode()
        names = {f.name for f in text_string_to_metric_families(text)}
        assert {"gpufleet_schedule_attempts", "gpufleet_pending_pods", "gpufleet_binds", "gpufleet_scheduling_attempt_duration_seconds"} <= names
    finally:
        srv.shutdown()


def test_deploy_manifest_is_valid_and_config_builds():
    from pathlib import Path

    import yaml

    from gpufleet.engine.config import load_config
    from gpufleet.policies import registry

    docs = list(yaml.safe_load_all((Path(__file__).parents[2] / "deploy/scheduler/scheduler.yaml").read_text()))
    kinds = {d["kind"] for d in docs}
    assert {"ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "ConfigMap", "Deployment", "Service"} <= kinds
    role = next(d for d in docs if d["kind"] == "ClusterRole")
    verbs = {(r["resources"][0], v) for r in role["rules"] for v in r["verbs"]}
    assert ("pods/binding", "create") in verbs and not any(v == "*" for _, v in verbs)
    # victims go through the Eviction API, never a plain delete; the only delete is of an extended-resource claim (DRA)
    # made for a try that failed
    assert {r for r, v in verbs if v == "delete"} == {"resourceclaims"}
    assert ("pods/eviction", "create") in verbs
    cm = next(d for d in docs if d["kind"] == "ConfigMap")
    assert load_config(yaml.safe_load(cm["data"]["config.yaml"]), registry())


def test_explain_shows_dry_run_preemption():
    api = FakeApi()
    api.add_node(node("n1", gpus=2))
    api.add_pod(pod("low", gpus=2, scheduler="default-scheduler", node_name="n1"))
    loop = make(api)
    hi = pod("hi", gpus=1)
    hi["spec"]["priority"] = 1000
    summary, _ = loop.explain(hi)
    assert "preemption (dry run)" in summary and "evict ml/low" in summary
    assert "ml/low" in loop.cache.state.assignments  # nothing changed
