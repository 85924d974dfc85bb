"""CRD manifests: valid apiextensions.k8s.io/v1 with structural OpenAPI schemas; the examples
validate against them and parse into the engine's objects.  With KUBEBUILDER_ASSETS set, a real
kube-apiserver accepts the CRDs and the example objects."""

from __future__ import annotations

import copy
import os
from pathlib import Path

import pytest
import yaml

from gpufleet.engine.gang import PodGroup
from gpufleet.engine.queues import NamespaceQueues, Queue, QueueTree
from gpufleet.engine.state import ClusterState

CRDS = Path(__file__).parents[2] / "deploy" / "crds"
TYPES = {"object", "array", "string", "integer", "number", "boolean"}


def load(name):
    return yaml.safe_load((CRDS / name).read_text())


def examples():
    return [d for d in yaml.safe_load_all((CRDS / "examples" / "queues.yaml").read_text()) if d]


def structural(schema, path="schema"):
    """The structural-schema rules that matter here: every node has a type (or is int-or-string /
    preserves unknown fields), objects declare properties or additionalProperties, arrays items."""
    if schema.get("x-kubernetes-int-or-string"):
        assert schema.get("anyOf") == [{"type": "integer"}, {"type": "string"}], path
        return
    assert schema.get("type") in TYPES, f"{path}: type missing or unknown"
    if schema["type"] == "object" and not schema.get("x-kubernetes-preserve-unknown-fields") and path != "schema.metadata":
        assert "properties" in schema or "additionalProperties" in schema, f"{path}: object without fields"
    for k, sub in (schema.get("properties") or {}).items():
        structural(sub, f"{path}.{k}")
    if isinstance(schema.get("additionalProperties"), dict):
        structural(schema["additionalProperties"], f"{path}.*")
    if schema["type"] == "array":
        structural(schema["items"], f"{path}[]")
    for r in schema.get("required", []):
        assert r in schema.get("properties", {}), f"{path}: required {r} is not a property"


@pytest.mark.parametrize("name,kind,scope", [("queue.yaml", "Queue", "Cluster"), ("podgroup.yaml", "PodGroup", "Namespaced")])
def test_crd_structure(name, kind, scope):
    crd = load(name)
    assert crd["apiVersion"] == "apiextensions.k8s.io/v1" and crd["kind"] == "CustomResourceDefinition"
    spec = crd["spec"]
    assert spec["group"] == "gpufleet.io" and spec["scope"] == scope and spec["names"]["kind"] == kind
    assert crd["metadata"]["name"] == f"{spec['names']['plural']}.gpufleet.io"
    assert [v["name"] for v in spec["versions"]] == ["v1alpha1"]
    assert sum(v["storage"] for v in spec["versions"]) == 1 and all(v["served"] for v in spec["versions"])
    for v in spec["versions"]:
        schema = v["schema"]["openAPIV3Schema"]
        structural(schema)
        assert "spec" in schema["properties"] and "status" in schema["properties"]
        assert v["subresources"] == {"status": {}}
        for col in v.get("additionalPrinterColumns", []):
            assert col["jsonPath"].startswith(".") and col["type"] in TYPES


def _jsonschema(s):
    """OpenAPI v3 (Kubernetes flavour) -> plain JSON schema for the jsonschema library."""
    s = copy.deepcopy(s)
    if isinstance(s, dict):
        s.pop("x-kubernetes-int-or-string", None)
        s.pop("x-kubernetes-preserve-unknown-fields", None)
        return {k: _jsonschema(v) for k, v in s.items()}
    if isinstance(s, list):
        return [_jsonschema(x) for x in s]
    return s


def test_examples_validate_and_parse():
    jsonschema = pytest.importorskip("jsonschema")
    schemas = {load(n)["spec"]["names"]["kind"]: _jsonschema(load(n)["spec"]["versions"][0]["schema"]["openAPIV3Schema"])
               for n in ("queue.yaml", "podgroup.yaml")}
    docs = examples()
    for d in docs:
        if d["kind"] in schemas:
            jsonschema.validate(d, schemas[d["kind"]])
    bad = {"apiVersion": "gpufleet.io/v1alpha1", "kind": "Queue", "metadata": {"name": "x"},
           "spec": {"quota": {"nvidia.com/gpu": "eight"}, "weight": 0}}
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(bad, schemas["Queue"])
    queues = [Queue.from_json(d) for d in docs if d["kind"] == "Queue"]
    tree = QueueTree(queues, ClusterState([]))
    assert tree.path("vision") == ["vision", "research"] and tree.nominal("research", "gpu_milli") == 16_000
    assert tree.queues["vision"].quota["mig:1g.10gb"] == 14 and tree.queues["vision"].borrowing_limit == {"gpu_milli": 4000}
    ns = NamespaceQueues(queues, [d for d in docs if d["kind"] == "Namespace"])
    assert ns.queue_for_namespace("vision-dev") == "vision" and ns.queue_for_namespace("nlp-serve") == "nlp"
    pg = [PodGroup.from_json(d) for d in docs if d["kind"] == "PodGroup"][0]
    assert (pg.key, pg.min_member, pg.timeout_s) == ("nlp-train/llama-ft", 4, 300.0)


ASSETS = os.environ.get("KUBEBUILDER_ASSETS", "")


@pytest.mark.integration
@pytest.mark.skipif(not (ASSETS and all((Path(ASSETS) / b).is_file() for b in ("etcd", "kube-apiserver"))),
                    reason="KUBEBUILDER_ASSETS with kube-apiserver and etcd not set")
def test_apiserver_accepts_crds_and_examples(tmp_path):
    import time

    from kubernetes import client, config

    from ..apiserver_support import ControlPlane

    cp = ControlPlane(ASSETS, tmp_path)
    try:
        cp.start()
        api = config.new_client_from_config(str(cp.kubeconfig))
        ext = client.ApiextensionsV1Api(api)
        for n in ("queue.yaml", "podgroup.yaml"):
            ext.create_custom_resource_definition(load(n))
        for n in ("queues.gpufleet.io", "podgroups.gpufleet.io"):
            for _ in range(100):
                conds = ext.read_custom_resource_definition(n).status.conditions or []
                if any(c.type == "Established" and c.status == "True" for c in conds):
                    break
                time.sleep(0.1)
            else:
                raise AssertionError(f"{n} not established")
        co = client.CustomObjectsApi(api)
        core = client.CoreV1Api(api)
        for d in examples():
            if d["kind"] == "Namespace":
                core.create_namespace(d)
        core.create_namespace({"metadata": {"name": "nlp-train"}})
        for d in examples():
            if d["kind"] == "Queue":
                co.create_cluster_custom_object("gpufleet.io", "v1alpha1", "queues", d)
            elif d["kind"] == "PodGroup":
                co.create_namespaced_custom_object("gpufleet.io", "v1alpha1", d["metadata"]["namespace"], "podgroups", d)
        got = co.get_cluster_custom_object("gpufleet.io", "v1alpha1", "queues", "research")
        assert Queue.from_json(got).quota["gpu_milli"] == 16_000
        assert co.get_cluster_custom_object("gpufleet.io", "v1alpha1", "queues", "nlp")["spec"]["weight"] == 1  # defaulted
        bad = {"apiVersion": "gpufleet.io/v1alpha1", "kind": "Queue", "metadata": {"name": "bad"}, "spec": {"weight": 0}}
        with pytest.raises(client.ApiException) as e:
            co.create_cluster_custom_object("gpufleet.io", "v1alpha1", "queues", bad)
        assert e.value.status == 422
    finally:
        cp.stop()
