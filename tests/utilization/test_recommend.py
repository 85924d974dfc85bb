"""Right-sizing recommendations: percentiles -> whole GPUs or a share, GPU-hours freed, workload grouping."""

from __future__ import annotations

import json

import pytest

from gpufleet.utilization.recommend import Recommendation, WorkloadUsage, recommend, render_table, workloads
from gpufleet.utilization.podjson import top_owner


def test_idle_whole_gpu_becomes_a_share():
    r = recommend(WorkloadUsage("ml/Deployment/infer", pods=4, requested_gpus=1, devices=1, gpu_memory_mib=81920,
                                util_pct=[10, 12, 15, 20, 18] * 20, mem_used_mib=[9000, 10000] * 50, pod_hours=96))
    assert r.util_p95 == 20 and r.util_max == 20 and r.mem_p95_mib == 10000
    assert r.recommended_milli == 250 and r.recommended_memory_mib == 12032  # 1.2 x 10000 MiB, rounded up to 256
    assert 'gpufleet.io/gpu-milli: "250"' in r.request_text() and r.gpu_hours_freed == pytest.approx(0.75 * 96)


def test_busy_job_keeps_its_gpus_and_half_busy_job_shrinks():
    busy = recommend(WorkloadUsage("ml/Job/train", 1, 8, 8, 81920, [95] * 100, [70000] * 100, 10))
    assert busy.recommended_gpus == 8 and busy.gpu_hours_freed == 0 and busy.note == "right-sized"
    half = recommend(WorkloadUsage("ml/Job/sweep", 2, 8, 8, 81920, [45] * 100, [30000] * 100, 20))
    assert half.recommended_gpus == 5 and half.gpu_hours_freed == 3 * 20  # 8 x 45% x 1.2 = 4.3 -> 5
    # memory stops consolidation: 8 x 60 GiB does not fit on 5 GPUs
    full = recommend(WorkloadUsage("ml/Job/sweep2", 1, 8, 8, 81920, [45] * 100, [60000] * 100, 10))
    assert full.recommended_gpus == 8 and full.note in ("memory-bound", "right-sized")


def test_memory_bound_single_gpu_is_kept_whole_and_never_asks_for_two():
    r = recommend(WorkloadUsage("ml/Deployment/llm", 1, 1, 1, 81920, [5] * 100, [75000] * 100, 10))
    assert r.recommended_gpus == 1.0 and r.recommended_milli is None and r.gpu_hours_freed == 0


def test_squeezed_share_is_told_to_grow():
    r = recommend(WorkloadUsage("ml/Deployment/small", 2, 0.25, 1, 15360, [38, 40, 42] * 10, [2000] * 30, 10))
    assert r.recommended_milli == 550 and r.gpu_hours_freed < 0 and r.note.startswith("under-sized")


def test_not_enough_data_keeps_the_request():
    r = recommend(WorkloadUsage("ml/Pod/x", 1, 2, 2, 81920, [1, 1], [100, 100], 0.1))
    assert r.recommended_gpus == 2 and r.gpu_hours_freed == 0 and "only 2" in r.note


def test_owner_chain():
    rs = {"metadata": {"name": "web-7d9", "ownerReferences": [{"kind": "Deployment", "name": "web", "controller": True}]}}
    pod = {"metadata": {"name": "web-7d9-abc", "namespace": "ml", "ownerReferences": [{"kind": "ReplicaSet", "name": "web-7d9", "controller": True}]}}
    assert top_owner(pod, {("ml", "ReplicaSet", "web-7d9"): rs}) == ("Deployment", "web")
    assert top_owner(pod, {}) == ("ReplicaSet", "web-7d9")  # owner not listed: the best known answer
    assert top_owner({"metadata": {"name": "solo", "namespace": "x"}}, {}) == ("Pod", "solo")
    loop = {"metadata": {"name": "a", "ownerReferences": [{"kind": "ReplicaSet", "name": "a"}]}}
    assert top_owner({"metadata": {"name": "p", "ownerReferences": [{"kind": "ReplicaSet", "name": "a"}]}},
                     {("default", "ReplicaSet", "a"): loop}) == ("ReplicaSet", "a")


def _pod(name, ns="ml", owner=None, gpus=1, node="n1", annotations=None):
    meta = {"name": name, "namespace": ns, "annotations": annotations or {}}
    if owner:
        meta["ownerReferences"] = [{"kind": owner[0], "name": owner[1], "controller": True}]
    return {"metadata": meta, "spec": {"nodeName": node, "containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}]}}


def test_workloads_group_by_owner_and_count_pod_hours():
    owners = {
        ("ml", "ReplicaSet", "infer-1"): {"metadata": {"name": "infer-1", "ownerReferences": [{"kind": "Deployment", "name": "infer", "controller": True}]}},
        ("ml", "Job", "nightly-29"): {"metadata": {"name": "nightly-29", "ownerReferences": [{"kind": "CronJob", "name": "nightly", "controller": True}]}},
    }
    pods = [_pod("infer-1-a", owner=("ReplicaSet", "infer-1")), _pod("infer-1-b", owner=("ReplicaSet", "infer-1")),
            _pod("nightly-29-x", owner=("Job", "nightly-29"), gpus=4, node="n2"),
            _pod("db-0", owner=("StatefulSet", "db")), _pod("cpu", gpus=0),
            _pod("share", annotations={"gpufleet.io/gpu-milli": "300"}),
            _pod("broken", annotations={"gpufleet.io/gpu-milli": "much"})]
    util = {"ml/infer-1-a": [(t, 10.0) for t in range(0, 3600, 300)], "ml/infer-1-b": [(t, 30.0) for t in range(0, 1800, 300)],
            "ml/nightly-29-x": [(t, 90.0) for t in range(0, 3600, 300)]}
    mem = {"ml/infer-1-a": [(0, 5000.0)]}
    skipped: list[str] = []
    ws = {w.workload: w for w in workloads(pods, owners, util, mem, {"n1": 15360, "n2": 81920}, 300.0, skipped)}
    assert set(ws) == {"ml/Deployment/infer", "ml/CronJob/nightly", "ml/StatefulSet/db", "ml/Pod/share"}
    inf = ws["ml/Deployment/infer"]
    assert inf.pods == 2 and inf.requested_gpus == 1 and inf.gpu_memory_mib == 15360
    assert sorted(set(inf.util_pct)) == [10.0, 30.0] and inf.pod_hours == pytest.approx(1.5)
    assert ws["ml/CronJob/nightly"].requested_gpus == 4 and ws["ml/CronJob/nightly"].devices == 4
    assert ws["ml/Pod/share"].requested_gpus == 0.3 and ws["ml/Pod/share"].devices == 1
    assert len(skipped) == 1 and "broken" in skipped[0]
    recs = [recommend(w) for w in ws.values()]
    text = render_table(recs)
    assert "ml/Deployment/infer" in text and "GPU-hours" in text
    json.dumps([r.to_json() for r in recs])  # serialisable
    assert all(isinstance(r, Recommendation) for r in recs)


def test_cli_against_fake_cluster_and_recorded_prometheus(monkeypatch, capsys):
    from gpufleet.cli.main import main
    from gpufleet.utilization import recommend_cli, sources

    class Kube:
        def __init__(self, kubeconfig):
            pass

        def pods(self):
            return [_pod("infer-1-a", owner=("ReplicaSet", "infer-1"))]

        def owners(self):
            return [{"kind": "ReplicaSet", "metadata": {"namespace": "ml", "name": "infer-1",
                                                        "ownerReferences": [{"kind": "Deployment", "name": "infer", "controller": True}]}}]

        def nodes(self):
            return [{"metadata": {"name": "n1", "labels": {"nvidia.com/gpu.product": "Tesla-T4"}},
                     "status": {"allocatable": {"nvidia.com/gpu": "4", "cpu": "8", "memory": "32Gi"}}}]

    def fetch(url, timeout_s):
        metric = "FB_USED" if "FB_USED" in url else "GPU_UTIL"
        v = "6000" if metric == "FB_USED" else "12"
        return json.dumps({"status": "success", "data": {"resultType": "matrix", "result": [
            {"metric": {"namespace": "ml", "pod": "infer-1-a"}, "values": [[1000 + i * 300, v] for i in range(288)]}]}}).encode()

    monkeypatch.setattr(recommend_cli, "KubeReader", Kube)
    monkeypatch.setattr(sources, "http_get", fetch)
    assert main(["recommend", "--prometheus", "http://prom", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    (r,) = doc["recommendations"]
    # 12% SM would fit 150 milli, but 6000 MiB x 1.2 of a 15 GiB T4 (from the node's GFD labels) needs half of it
    assert r["workload"] == "ml/Deployment/infer" and r["recommended_milli"] == 500 and r["recommended_memory_mib"] == 7424
    assert r["gpu_hours_freed"] == pytest.approx(0.5 * 24)
    assert main(["recommend", "--prometheus", "http://prom", "--window", "a while"]) == 2
