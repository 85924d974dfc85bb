"""``gpufleet explain-hpa``: from what the HPA, the metrics APIs and Prometheus answer to the cause a person acts on.

A fake API server (paths -> JSON or an error, as the aggregated API answers them) and a fake Prometheus (a function
of the PromQL text) stand in; the real-node tier runs the command against the real thing
(tests/e2e/test_autoscaling_node.py)."""

from __future__ import annotations

import pytest

from gpufleet.utilization.hpa_explain import ApiError, diagnose, gather
from gpufleet.utilization.sources import SourceError

NS = "ml"
HPA = "/apis/autoscaling/v2/namespaces/ml/horizontalpodautoscalers/infer"
PODS_METRIC = "/apis/custom.metrics.k8s.io/v1beta2/namespaces/ml/pods/*/gpu_utilization"
AVAILABLE = {"status": {"conditions": [{"type": "Available", "status": "True", "reason": "Passed"}]}}


def hpa(metrics, conditions=()):
    return {"spec": {"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "infer"}, "minReplicas": 1,
                     "maxReplicas": 6, "metrics": metrics},
            "status": {"currentReplicas": 2, "desiredReplicas": 2, "conditions": list(conditions)}}


POD_METRIC = {"type": "Pods", "pods": {"metric": {"name": "gpu_utilization"}, "target": {"type": "AverageValue", "averageValue": "70"}}}
QUEUE_METRIC = {"type": "External", "external": {"metric": {"name": "gpufleet_queue_pending_gpus", "selector": {"matchLabels": {"queue": "team-x"}}},
                                                 "target": {"type": "AverageValue", "averageValue": "2"}}}


class FakeKube:
    def __init__(self, answers):
        self.answers = answers
        self.asked: list[tuple[str, dict]] = []

    def get(self, path, params=None):
        self.asked.append((path, dict(params or {})))
        a = self.answers.get(path)
        if a is None:
            raise ApiError(404, f"{path} not found")
        if isinstance(a, ApiError):
            raise a
        return a


def cluster(metric_answer, metrics=(POD_METRIC,), apiservice=AVAILABLE, conditions=()):
    return FakeKube({
        HPA: hpa(list(metrics), conditions),
        "/apis/apps/v1/namespaces/ml/deployments/infer": {"spec": {"selector": {"matchLabels": {"app": "infer"}}}},
        "/api/v1/namespaces/ml/pods": {"items": [{"metadata": {"name": n}} for n in ("infer-a", "infer-b", "infer-c")]},
        "/apis/apiregistration.k8s.io/v1/apiservices/v1beta2.custom.metrics.k8s.io": apiservice,
        "/apis/apiregistration.k8s.io/v1/apiservices/v1beta1.external.metrics.k8s.io": apiservice,
        PODS_METRIC: metric_answer,
        "/apis/external.metrics.k8s.io/v1beta1/namespaces/ml/gpufleet_queue_pending_gpus": metric_answer,
    })


def values(*pairs):
    return {"items": [{"describedObject": {"kind": "Pod", "name": n}, "value": v} for n, v in pairs]}


def prom(series):
    """PromQL text -> result: the first key that is a prefix of the query answers."""
    def query(expr):
        for prefix, result in series.items():
            if expr.startswith(prefix):
                return [{"metric": m, "value": [0, "1"]} for m in result]
        return []
    return query


def test_all_pods_report_and_the_pods_are_asked_for_by_the_targets_selector():
    kube = cluster(values(("infer-a", "72"), ("infer-b", "68500m"), ("infer-c", "70")))
    lines = diagnose(gather(kube, NS, "infer"))
    assert "values: infer-a 72, infer-b 68.5, infer-c 70" in "\n".join(lines)
    assert not any("cause" in x for x in lines)
    assert (PODS_METRIC, {"labelSelector": "app=infer"}) in kube.asked


def test_pods_without_a_value_and_why_from_prometheus():
    kube = cluster(values(("infer-a", "72")))
    p = prom({"gpufleet:pod_gpu_utilization:percent": [{"pod": "infer-a"}],
              "DCGM_FI_DEV_GPU_UTIL": [{"pod": "infer-a"}, {"pod": "infer-b"}],
              "gpufleet_pod_gpu_allocated": [{"pod": "infer-a"}],
              "count by (Hostname)": [{"Hostname": "n1"}]})
    text = "\n".join(diagnose(gather(kube, NS, "infer", p, "http://prom:9090")))
    assert "values: infer-a 72" in text
    assert "cause: infer-b: utilisation but no gpufleet_pod_gpu_allocated: the agent cannot read" in text
    assert "cause: infer-c: no DCGM_FI_DEV_GPU_UTIL and no gpufleet_pod_gpu_allocated: it holds no GPU, or the agent " \
           "on its node is not scraped (agents seen: n1)" in text


def test_a_metric_no_pod_reports_without_prometheus_says_how_to_find_out():
    lines = diagnose(gather(cluster(values()), NS, "infer"))
    assert "values: none" in lines[-2] and "run with --prometheus URL" in lines[-1]


def test_prometheus_down():
    def down(expr):
        raise SourceError("GET http://prom:9090/api/v1/query?...: [Errno 111] Connection refused")

    kube = cluster(ApiError(500, "Internal error occurred: unable to fetch metrics"),  # prometheus-adapter's words
                   conditions=[{"type": "ScalingActive", "status": "False", "reason": "FailedGetPodsMetric",
                                "message": "the HPA was unable to compute the replica count: unable to get metric gpu_utilization"}])
    text = "\n".join(diagnose(gather(kube, NS, "infer", down, "http://prom:9090")))
    assert "ScalingActive False (FailedGetPodsMetric)" in text
    assert "cause: Prometheus at http://prom:9090 does not answer" in text
    assert "cause: the adapter cannot query Prometheus" in text


def test_the_adapter_cannot_list_pods():
    text = "\n".join(diagnose(gather(cluster(ApiError(500, "Internal error occurred: unable to list matching resources")), NS, "infer")))
    assert "cause: the adapter cannot list the target's pods: its RBAC" in text


def test_an_adapter_rule_that_matches_nothing():
    kube = cluster(ApiError(404, 'the server could not find the metric gpu_utilization for pods'))
    p = prom({"count by (Hostname)": [{"Hostname": "n1"}], "DCGM_FI_DEV_GPU_UTIL": [{"pod": "infer-a"}]})
    text = "\n".join(diagnose(gather(kube, NS, "infer", p, "http://prom:9090")))
    assert "answers HTTP 404: the server could not find the metric gpu_utilization for pods" in text
    assert "cause: the adapter serves no metric 'gpu_utilization'" in text
    assert "Prometheus has no recorded series for it: are deploy/autoscaling/prometheus-rules.yaml loaded?" in text


def test_the_adapter_down():
    down = {"status": {"conditions": [{"type": "Available", "status": "False", "reason": "FailedDiscoveryCheck",
                                       "message": "failing or missing response from https://10.0.0.7:443"}]}}
    text = "\n".join(diagnose(gather(cluster(values(), apiservice=down), NS, "infer")))
    assert "cause: APIService v1beta2.custom.metrics.k8s.io is not available (FailedDiscoveryCheck): failing or missing" in text
    text = "\n".join(diagnose(gather(cluster(values(), apiservice=ApiError(404, "not found")), NS, "infer")))
    assert "cause: APIService v1beta2.custom.metrics.k8s.io is not registered" in text


def test_a_queue_the_scheduler_does_not_know():
    kube = cluster({"items": []}, metrics=[QUEUE_METRIC])
    p = prom({"gpufleet_queue_pending_gpus": [{"queue": "team-a"}, {"queue": "team-b"}],
              "gpufleet:queue_pending_gpus:max": [{"queue": "team-a"}, {"queue": "team-b"}],
              "gpufleet_pending_pods": [{}]})
    f = gather(kube, NS, "infer", p, "http://prom:9090")
    assert f.metrics[0].api == ("external.metrics.k8s.io", "v1beta1")
    text = "\n".join(diagnose(f))
    assert "External gpufleet_queue_pending_gpus {queue=team-x}" in text
    assert "cause: the scheduler exports no queue 'team-x' (queues it knows: team-a, team-b): no such Queue object" in text


@pytest.mark.parametrize("raw, recorded, schedulers, want", [
    ([], [], [], "the scheduler is not scraped"),
    ([{"queue": "team-x"}], [], [{}], "recording rules (deploy/autoscaling/prometheus-rules.yaml) are not loaded"),
])
def test_queue_causes(raw, recorded, schedulers, want):
    p = prom({"gpufleet_queue_pending_gpus": raw, "gpufleet:queue_pending_gpus:max": recorded, "gpufleet_pending_pods": schedulers})
    text = "\n".join(diagnose(gather(cluster({"items": []}, metrics=[QUEUE_METRIC]), NS, "infer", p, "http://p")))
    assert want in text


def test_no_such_hpa():
    f = gather(FakeKube({}), NS, "nope")
    assert f.hpa is None and diagnose(f) == [f"ml/nope: HorizontalPodAutoscaler not readable: {HPA.replace('infer', 'nope')} not found"]
