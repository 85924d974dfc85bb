"""The agent's cost series: the admitted queue on the allocation series; each GPU's capacity type and price."""

from __future__ import annotations

import json
import os

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from gpufleet.agent.allocation import PriceFile, families
from gpufleet.agent.exporter import ContainerRef, GpuCollector, pod_meta_from_json
from gpufleet.agent.nvml import FakeBackend
from gpufleet.engine.prices import PriceBook


def _pod(ns, name, assignment=None, queue=None):
    meta = {"namespace": ns, "name": name, "annotations": {}}
    if assignment is not None:
        meta["annotations"]["gpufleet.io/assignment"] = json.dumps(assignment)
    if queue:
        meta["annotations"]["gpufleet.io/queue"] = queue
    return {"metadata": meta}


def test_the_admitted_queue_wins_over_the_pods_annotation():
    meta = pod_meta_from_json([
        _pod("ml", "a", {"node": "n", "gpus": [{"index": 0, "uuid": "G"}], "gpu_milli": 500, "queue": "team-ml"}, queue="x"),
        _pod("ml", "b", queue="team-x"),
        _pod("ml", "c"),
    ])
    assert (meta[("ml", "a")].queue, meta[("ml", "b")].queue, meta[("ml", "c")].queue) == ("team-ml", "team-x", "")


def _scrape(collector):
    reg = CollectorRegistry()
    reg.register(collector)
    return {f.name: f for f in text_string_to_metric_families(generate_latest(reg).decode())}


class _Pods:
    def __init__(self, holders):
        self.holders = holders

    def devices(self):
        return self.holders


class _Cost:
    node = "gpu-1"

    def __init__(self, labels, prices_path=None):
        self._l, self._f = labels, PriceFile(prices_path)

    def node_labels(self):
        return self._l

    def prices(self):
        return self._f.get()


def _collector(be, pods, holders, labels, prices_path=None):
    from gpufleet.agent.exporter import pod_meta_from_json as meta

    return GpuCollector(be, "gpu-1", _Pods(holders), pod_meta=lambda wanted: meta(pods), cost=_Cost(labels, prices_path))


def test_collector_exports_allocation_with_queue_info_and_price(tmp_path):
    be = FakeBackend("h100-nvlink")
    g = be.gpus()[0]
    pods = [_pod("ml", "w", {"node": "gpu-1", "gpus": [{"index": 0, "uuid": g.uuid}], "gpu_milli": 500,
                             "gpu_memory_mib": [0], "queue": "team-ml"})]
    labels = {"karpenter.sh/capacity-type": "spot", "node.kubernetes.io/instance-type": "p5.48xlarge"}
    f = tmp_path / "prices.yaml"
    f.write_text("instanceTypes:\n  p5.48xlarge: {spotPerGpuHour: 2.5}\n")
    c = _collector(be, pods, {g.uuid: [ContainerRef("ml", "w", "c")]}, labels, str(f))
    fams = _scrape(c)
    (a,) = fams["gpufleet_pod_gpu_allocated"].samples
    assert a.value == 0.5 and a.labels["queue"] == "team-ml" and a.labels["gpu"] == "0"
    info = fams["gpufleet_gpu_info"].samples
    assert len(info) == 8 and {s.labels["capacity_type"] for s in info} == {"spot"}
    assert {s.labels["instance_type"] for s in info} == {"p5.48xlarge"} and {s.labels["node"] for s in info} == {"gpu-1"}
    prices = fams["gpufleet_gpu_price_per_hour"].samples
    assert len(prices) == 8 and {s.value for s in prices} == {2.5} and fams["gpufleet_price_file_ok"].samples[0].value == 1
    # a bad new version is refused, the last good one kept, and said so
    f.write_text("instanceTypes:\n  p5.48xlarge: {spotPerGpuHour: -1}\n")
    os.utime(f, ns=(1, 1))
    fams = _scrape(c)
    assert {s.value for s in fams["gpufleet_gpu_price_per_hour"].samples} == {2.5}
    assert fams["gpufleet_price_file_ok"].samples[0].value == 0


def test_an_absent_price_file_means_the_builtin_list_prices(tmp_path):
    be = FakeBackend("h100-nvlink")
    c = _collector(be, [], {}, {}, str(tmp_path / "not-created.yaml"))  # an optional ConfigMap not created
    fams = _scrape(c)
    assert {s.value for s in fams["gpufleet_gpu_price_per_hour"].samples} == {6.88}
    assert fams["gpufleet_price_file_ok"].samples[0].value == 1


def test_unknown_price_has_no_series_and_no_cost_series_without_the_pods():
    be = FakeBackend("h100-nvlink")
    labels = {"cloud.google.com/gke-spot": "true"}  # spot, no spot price anywhere: unknown, so absent (not 0)
    fams = _scrape(_collector(be, [], {}, labels))
    assert "gpufleet_gpu_price_per_hour" not in fams or not fams["gpufleet_gpu_price_per_hour"].samples
    assert len(fams["gpufleet_gpu_info"].samples) == 8

    class Down:
        def devices(self):
            raise OSError("kubelet away")

    fams = _scrape(GpuCollector(be, "gpu-1", Down(), pod_meta=lambda w: {}, cost=_Cost(labels)))
    assert "gpufleet_gpu_info" not in fams  # who holds what is unknown: no capacity claimed either


def test_families_builtin_price_and_spot_labels_from_the_price_file():
    be = FakeBackend("t4")
    fams = {f.name: f for f in families(be.gpus(), "h", "h", {}, None)}
    assert not fams["gpufleet_gpu_price_per_hour"].samples  # no price book: no price series
    fams = {f.name: f for f in families(be.gpus(), "h", "h", {}, PriceBook())}
    assert {s.value for s in fams["gpufleet_gpu_price_per_hour"].samples} == {0.526}  # built-in T4 (g4dn.xlarge)
    from gpufleet.engine.prices import parse_prices_text

    book = parse_prices_text("spotLabels: [pool=cheap]\nmodels:\n  Tesla T4: {spotPerGpuHour: 0.2}\n", "p.yaml")
    fams = {f.name: f for f in families(be.gpus(), "h", "h", {"pool": "cheap"}, book)}
    assert {s.labels["capacity_type"] for s in fams["gpufleet_gpu_info"].samples} == {"spot"}
    assert {s.value for s in fams["gpufleet_gpu_price_per_hour"].samples} == {0.2}
