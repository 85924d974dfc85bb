"""Pod JSON -> PodRequest: Kubernetes semantics, and bad input named by pod and field."""

from __future__ import annotations

import pytest

from gpufleet.engine.errors import InvalidPodSpec, InvalidQuantity
from gpufleet.engine.podspec import parse_pod
from gpufleet.engine.podterms import UnsupportedPodField
from gpufleet.engine.quantity import to_mib, to_milli

from .builders import pod


@pytest.mark.parametrize("raw,milli", [("500m", 500), ("2", 2000), ("1e3", 1_000_000), ("0.25", 250), (3, 3000), ("1.0005", 1001)])
def test_cpu_quantities(raw, milli):
    assert to_milli(raw) == milli


@pytest.mark.parametrize("raw,mib", [("16Gi", 16384), ("1024Mi", 1024), ("1G", 954), ("1e9", 954), ("512Ki", 1)])
def test_memory_quantities(raw, mib):
    assert to_mib(raw) == mib


@pytest.mark.parametrize("raw", ["abc", "1.2.3", "", "5Zi", None, [1]])
def test_bad_quantities(raw):
    with pytest.raises(InvalidQuantity):
        to_milli(raw)


def test_containers_sum_and_init_max_and_overhead():
    p = pod(cpu="1", memory="1Gi", gpus=1)
    p["spec"]["containers"].append({"name": "side", "resources": {"requests": {"cpu": "500m", "memory": "512Mi"}}})
    p["spec"]["initContainers"] = [{"name": "init", "resources": {"requests": {"cpu": "4", "memory": "256Mi"}}}]
    p["spec"]["overhead"] = {"cpu": "100m", "memory": "10Mi"}
    r = parse_pod(p)
    assert r.cpu_milli == 4000 + 100  # init container dominates CPU
    assert r.memory_mib == 1024 + 512 + 10
    assert r.gpu_count == 1 and r.gpu_milli == 1000


def test_sidecar_init_container_counts_for_the_whole_life():
    p = pod(cpu="1", memory="1Gi")
    p["spec"]["initContainers"] = [
        {"name": "sidecar", "restartPolicy": "Always", "resources": {"requests": {"cpu": "1"}}},
        {"name": "init", "resources": {"requests": {"cpu": "1500m"}}},
    ]
    r = parse_pod(p)
    assert r.cpu_milli == 2500  # max(1 + 1 sidecar, 1 sidecar + 1.5 init)


@pytest.mark.parametrize("ann,milli,mem", [
    ({"gpufleet.io/gpu-milli": "250"}, 250, 0),
    ({"gpufleet.io/gpu-memory": "10Gi"}, None, 10240),
    ({"gpufleet.io/gpu-milli": "500", "gpufleet.io/gpu-memory": "8Gi"}, 500, 8192),
])
def test_fractional_annotations(ann, milli, mem):
    r = parse_pod(pod(gpus=1, annotations=ann))
    assert r.gpu_count == 1
    if milli is not None:
        assert r.gpu_milli == milli
    assert r.gpu_memory_mib == mem


def test_mig_and_models_and_selectors_and_tolerations_and_priority():
    p = pod(extra_resources={"nvidia.com/mig-1g.10gb": "1"},
            annotations={"gpufleet.io/gpu-models": "A100-SXM4-80GB,H100", "gpufleet.io/gpu-models-deny": "T4"},
            nodeSelector={"zone": "a"}, priority=1000,
            tolerations=[{"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}],
            affinity={"nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                    {"matchExpressions": [{"key": "gpus", "operator": "Gt", "values": ["3"]},
                                          {"key": "spot", "operator": "DoesNotExist"}]}]},
                "preferredDuringSchedulingIgnoredDuringExecution": [
                    {"weight": 10, "preference": {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}}]}})
    r = parse_pod(p)
    assert r.mig_profile == "1g.10gb" and r.gpu_count == 1
    assert r.gpu_models_allow == frozenset({"A100-SXM4-80GB", "H100"}) and r.gpu_models_deny == frozenset({"T4"})
    assert dict(r.node_selector) == {"zone": "a"}
    assert r.priority == 1000 and len(r.tolerations) == 1 and len(r.required_terms) == 1 and len(r.preferred_terms) == 1


BAD = [
    (pod(cpu="lots"), "spec.containers[0].resources.requests.cpu"),
    (pod(cpu="-1"), "spec.containers[0].resources.requests.cpu"),
    (pod(gpus=1, annotations={"gpufleet.io/gpu-milli": "1500"}), "gpufleet.io/gpu-milli"),
    (pod(gpus=1, annotations={"gpufleet.io/gpu-milli": "-5"}), "gpufleet.io/gpu-milli"),
    (pod(gpus=1, annotations={"gpufleet.io/gpu-milli": "half"}), "gpufleet.io/gpu-milli"),
    (pod(gpus=1, annotations={"gpufleet.io/gpu-memory": "900Gi"}), "gpufleet.io/gpu-memory"),
    (pod(gpus=1, annotations={"gpufleet.io/gpu-memroy": "1Gi"}), "gpufleet.io/gpu-memroy"),
    (pod(gpus=2, annotations={"gpufleet.io/gpu-milli": "500"}), "gpufleet.io/gpu-milli"),
    (pod(extra_resources={"nvidia.com/mig-9g.999gb": "1"}), "nvidia.com/mig-9g.999gb"),
    (pod(priority="high"), "spec.priority"),
    (pod(tolerations=[{"key": "a", "operator": "Maybe"}]), "spec.tolerations[0].operator"),
    (pod(affinity={"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "k", "operator": "Gt", "values": ["x"]}]}]}}}), "values"),
]


@pytest.mark.parametrize("p,field", BAD)
def test_bad_pods_name_pod_and_field(p, field):
    p["metadata"]["name"] = "bad-pod"
    with pytest.raises(InvalidPodSpec) as exc:
        parse_pod(p)
    msg = str(exc.value)
    assert "default/bad-pod" in msg and field in msg


@pytest.mark.parametrize("spec,field", [
    ({"volumes": [{"name": "d", "gcePersistentDisk": {"pdName": "x"}}]}, "spec.volumes[0].gcePersistentDisk"),
])
def test_unsupported_fields_are_named(spec, field):
    with pytest.raises(UnsupportedPodField) as exc:
        parse_pod(pod("x", **spec))
    assert exc.value.field == field


@pytest.mark.parametrize("mutate,field", [
    (lambda p: p["spec"].update(affinity={"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [{"labelSelector": {}}]}}),
     "spec.affinity.podAntiAffinity.requiredDuringSchedulingIgnoredDuringExecution[0].topologyKey"),
    (lambda p: p["spec"].update(topologySpreadConstraints=[{"maxSkew": 0, "topologyKey": "z", "whenUnsatisfiable": "DoNotSchedule"}]),
     "spec.topologySpreadConstraints[0].maxSkew"),
    (lambda p: p["spec"].update(topologySpreadConstraints=[{"maxSkew": 1, "topologyKey": "z", "whenUnsatisfiable": "Maybe"}]),
     "spec.topologySpreadConstraints[0].whenUnsatisfiable"),
    (lambda p: p["spec"]["containers"][0].update(ports=[{"containerPort": 1, "hostPort": 70000}]),
     "spec.containers[0].ports[0].hostPort"),
    (lambda p: p["spec"].update(affinity={"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
        {"labelSelector": {"matchExpressions": [{"key": "a", "operator": "Gt", "values": ["1"]}]}, "topologyKey": "z"}]}}),
     "spec.affinity.podAffinity.requiredDuringSchedulingIgnoredDuringExecution[0].labelSelector.matchExpressions[0].operator"),
])
def test_bad_terms_name_the_field(mutate, field):
    p = pod("x")
    mutate(p)
    with pytest.raises(InvalidPodSpec) as exc:
        parse_pod(p)
    assert exc.value.field == field
