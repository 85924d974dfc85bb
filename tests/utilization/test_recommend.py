"""Right-sizing recommendations."""

from __future__ import annotations

from gpufleet.utilization.recommend import WorkloadUsage, owner_of, recommend


def test_idle_whole_gpu_becomes_a_share():
    r = recommend(WorkloadUsage("ml/Deployment/infer", pods=4, requested_gpus=1, gpu_memory_mib=81920,
                                util_pct=[10, 12, 15, 20, 18] * 20, mem_used_mib=[9000, 10000] * 50, window_h=24))
    assert r.recommended_milli is not None and r.recommended_milli <= 300
    assert r.recommended_memory_mib >= 12000 and "gpufleet.io/gpu-milli" in r.request_text()
    assert r.gpu_hours_freed > 4 * 24 * 0.6


def test_busy_multi_gpu_job_keeps_its_gpus_and_memory_bound_work_keeps_memory():
    busy = recommend(WorkloadUsage("ml/Job/train", 1, 8, 81920, [95] * 100, [70000] * 100, 10))
    assert busy.recommended_gpus == 8 and busy.gpu_hours_freed == 0
    half = recommend(WorkloadUsage("ml/Job/sweep", 2, 8, 81920, [45] * 100, [60000] * 100, 10))
    assert half.recommended_gpus == 5 and half.gpu_hours_freed == 3 * 2 * 10
    memory_bound = recommend(WorkloadUsage("ml/Deployment/llm", 1, 1, 81920, [5] * 100, [75000] * 100, 10))
    assert memory_bound.recommended_gpus == 1.0 and memory_bound.recommended_milli is None


def test_owner_chain():
    rs = {"metadata": {"name": "web-7d9", "ownerReferences": [{"kind": "Deployment", "name": "web", "controller": True}]}}
    pod = {"metadata": {"name": "web-7d9-abc", "namespace": "ml", "ownerReferences": [{"kind": "ReplicaSet", "name": "web-7d9", "controller": True}]}}
    assert owner_of(pod, {("ml", "ReplicaSet", "web-7d9"): rs}) == "ml/Deployment/web"
    assert owner_of({"metadata": {"name": "solo", "namespace": "x"}}, {}) == "x/Pod/solo"


def test_top_snapshot_and_render_from_a_fake_api():
    from gpufleet.kube.api import FakeApi
    from gpufleet.utilization.top import render
    from gpufleet.utilization.top_cli import snapshot

    from ..kube.test_loop import node, pod

    api = FakeApi()
    api.add_node(node("n1", gpus=4))
    api.add_node(node("cpu", gpus=0))
    p = pod("a", gpus=2, node_name="n1")
    api.add_pod(p)
    s = pod("b", gpus=1, node_name="n1", annotations={"gpufleet.io/assignment": '{"node":"n1","gpus":[{"index":3,"uuid":""}],"gpu_milli":250}'})
    api.add_pod(s)
    rows, ns = snapshot(api, None)
    assert len(rows) == 1 and rows[0].allocated_milli == 2250 and ns == {"ml": (2.25, None)}
    text = render(rows, ns)
    assert "n1" in text and "56.2%" in text and "ml" in text
