"""``gpufleet top``: the view from Node/Pod JSON and metrics, and its rendering."""

from __future__ import annotations

import json

from gpufleet.engine.inventory import gpus_to_json
from gpufleet.engine.model import Gpu
from tests.kube.fake_api import FakeApi
from gpufleet.utilization.top import render
from gpufleet.utilization.top_cli import USED_BY_NAMESPACE, USED_BY_NODE, snapshot


def node(name, gpus=4, unhealthy=(), product="NVIDIA A100-SXM4-80GB"):
    inv = gpus_to_json([Gpu(i, f"GPU-{name}-{i}", product, 81920, healthy=i not in unhealthy) for i in range(gpus)])
    return {"metadata": {"name": name, "labels": {}, "annotations": {"gpufleet.io/gpu-inventory": inv} if gpus else {}},
            "status": {"allocatable": {"cpu": "64", "memory": "512Gi", "nvidia.com/gpu": str(gpus)}}}


def pod(name, ns="ml", gpus=1, node_name=None, annotations=None, phase="Running", mig=None):
    limits = {"nvidia.com/gpu": str(gpus)} if gpus else {}
    if mig:
        limits = {f"nvidia.com/mig-{mig}": "1"}
    spec = {"containers": [{"name": "c", "resources": {"limits": limits}}]}
    if node_name:
        spec["nodeName"] = node_name
    return {"metadata": {"name": name, "namespace": ns, "annotations": annotations or {}}, "spec": spec, "status": {"phase": phase}}


def cluster():
    api = FakeApi()
    api.add_node(node("gpu-a", unhealthy=(3,)))
    api.add_node(node("gpu-b", gpus=8))
    api.add_node(node("cpu-1", gpus=0))
    api.add_pod(pod("train", gpus=2, node_name="gpu-a"))
    api.add_pod(pod("share", ns="web", node_name="gpu-a",
                    annotations={"gpufleet.io/assignment": json.dumps({"node": "gpu-a", "gpus": [{"index": 2, "uuid": ""}], "gpu_milli": 250})}))
    api.add_pod(pod("slice", ns="web", gpus=0, node_name="gpu-b", mig="3g.40gb"))
    api.add_pod(pod("done", gpus=8, node_name="gpu-b", phase="Succeeded"))
    api.add_pod(pod("waiting", gpus=4, phase="Pending"))
    api.add_pod(pod("broken", ns="web", node_name="gpu-b", annotations={"gpufleet.io/assignment": "{not json"}))
    api.add_pod(pod("cpu", gpus=0, node_name="cpu-1"))
    return api


def test_view_allocation_without_metrics():
    view = snapshot(cluster(), None)
    rows = {r.node: r for r in view.nodes}
    assert set(rows) == {"gpu-a", "gpu-b"}  # CPU nodes are not GPU rows
    assert rows["gpu-a"].allocated == 2.25 and rows["gpu-a"].unhealthy == 1 and rows["gpu-a"].pods == 2
    assert rows["gpu-b"].allocated == round(3 / 7, 3) and rows["gpu-a"].used is None
    ns = {r.namespace: r for r in view.namespaces}
    assert ns["ml"].allocated == 2 and ns["ml"].pending == 1 and ns["web"].allocated == round(0.25 + 3 / 7, 3)
    assert any("web/broken" in s for s in view.skipped)
    text = render(view)
    assert "gpu-a" in text and "TOTAL" in text and "allocated 22.3% of 12 GPUs, 1 unhealthy" in text
    assert "-" in text.splitlines()[1]  # no metrics: USED shows "-"


def test_view_with_metrics_from_prometheus():
    answers = {USED_BY_NODE: [({"Hostname": "gpu-a"}, "1.5"), ({"Hostname": "gpu-b"}, "0.2")],
               USED_BY_NAMESPACE: [({"namespace": "ml"}, "1.4"), ({"namespace": "web"}, "0.3")]}
    asked = []

    def fetch(url, timeout_s):
        from urllib.parse import parse_qs, urlparse

        q = parse_qs(urlparse(url).query)["query"][0]
        asked.append(q)
        return json.dumps({"status": "success", "data": {"resultType": "vector", "result": [
            {"metric": m, "value": [0, v]} for m, v in answers[q]]}}).encode()

    view = snapshot(cluster(), "http://prom:9090", fetch)
    assert asked == [USED_BY_NODE, USED_BY_NAMESPACE]
    rows = {r.node: r for r in view.nodes}
    assert rows["gpu-a"].used == 1.5 and rows["gpu-b"].used == 0.2
    text = render(view)
    line_a = next(line for line in text.splitlines() if line.startswith("gpu-a"))
    assert "1.50" in line_a and "67%" in line_a  # 1.5 busy of 2.25 allocated
    ml = next(line for line in text.splitlines() if line.startswith("ml "))
    assert "2.00" in ml and "1.40" in ml and "70%" in ml
    assert "busy 14.2%" in text  # 1.7 of 12 GPUs


def test_metrics_down_is_shown_not_fatal():
    def fetch(url, timeout_s):
        from gpufleet.utilization.sources import SourceError

        raise SourceError("GET http://prom: connection refused")

    view = snapshot(cluster(), "http://prom", fetch)
    assert any("connection refused" in s for s in view.skipped) and view.nodes[0].used is None


def test_render_truncates_rows():
    view = snapshot(cluster(), None)
    assert "1 more node(s)" in render(view, max_rows=1)


def test_a_memory_share_counts_its_fraction_of_the_gpu_not_a_whole_gpu():
    api = FakeApi()
    api.add_node(node("gpu-m", gpus=2))
    asg = {"node": "gpu-m", "gpus": [{"index": 0, "uuid": ""}], "gpu_milli": 0, "gpu_memory_mib": [20480]}
    api.add_pod(pod("mem", node_name="gpu-m", annotations={"gpufleet.io/assignment": json.dumps(asg)}))
    api.add_pod(pod("mem2", node_name="gpu-m", annotations={"gpufleet.io/assignment": json.dumps(asg)}))
    view = snapshot(api, None)
    assert view.nodes[0].allocated == 0.5  # 2 x 20 GiB of an 80 GiB GPU, not 2 GPUs
