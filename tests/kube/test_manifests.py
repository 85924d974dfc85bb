"""Deployment manifests: they parse, build, grant exactly what the code uses, and wire the extender's verbs."""

from __future__ import annotations

from pathlib import Path

import yaml

from gpufleet.engine.config import load_config
from gpufleet.policies import registry

DEPLOY = Path(__file__).parents[2] / "deploy"


def docs(path: str) -> list[dict]:
    return [d for d in yaml.safe_load_all((DEPLOY / path).read_text()) if d]


def grants(role: dict) -> set[tuple[str, str, str]]:
    return {(g, r, v) for rule in role["rules"] for g in rule["apiGroups"] for r in rule["resources"] for v in rule["verbs"]}


def test_kustomizations_list_existing_files():
    for base in ("scheduler", "extender"):
        k = yaml.safe_load((DEPLOY / base / "kustomization.yaml").read_text())
        assert k["kind"] == "Kustomization" and all(
            (DEPLOY / base / r).is_file() or (DEPLOY / base / r / "kustomization.yaml").is_file() for r in k["resources"])


DRA_READ = {("resource.k8s.io", r) for r in ("resourceslices", "deviceclasses", "resourceclaims", "resourceclaimtemplates")}


def test_scheduler_rbac_is_exactly_what_it_calls():
    d = docs("scheduler/scheduler.yaml")
    cluster = next(x for x in d if x["kind"] == "ClusterRole")
    watched = {("", "namespaces"), ("gpufleet.io", "queues"), ("gpufleet.io", "podgroups"), ("policy", "poddisruptionbudgets"),
               ("", "persistentvolumeclaims"), ("", "persistentvolumes"),  # VolumeBinding
               ("storage.k8s.io", "storageclasses"), ("storage.k8s.io", "csinodes"), ("storage.k8s.io", "csidrivers"),
               ("scheduling.k8s.io", "podgroups")}  # Kubernetes' own gangs (spec.schedulingGroup)
    assert grants(cluster) == {("", "nodes", "list"), ("", "nodes", "watch"), ("", "pods", "get"), ("", "pods", "list"),
                               ("", "pods", "watch"), ("", "pods/eviction", "create"),  # preemption and reclaim
                               ("", "pods/binding", "create"), ("", "pods/status", "patch"),  # nominatedNodeName
                               ("events.k8s.io", "events", "create"),
                               ("scheduling.k8s.io", "podgroups/status", "patch"),  # PodGroupInitiallyScheduled
                               ("", "persistentvolumeclaims", "patch"), ("", "persistentvolumes", "patch"),
                               # DRA (kube/dra): the claim's finalizer (patch), read back after a conflict (get), its
                               # allocation and reservedFor (status patch, checked as resourceclaims/binding too)
                               ("resource.k8s.io", "resourceclaims", "get"), ("resource.k8s.io", "resourceclaims", "patch"),
                               # extended resources backed by DRA: the pod's claim created, deleted after a failed try
                               ("resource.k8s.io", "resourceclaims", "create"), ("resource.k8s.io", "resourceclaims", "delete"),
                               ("resource.k8s.io", "resourceclaims/status", "patch"),
                               ("resource.k8s.io", "resourceclaims/binding", "patch")} | {
        (g, r, v) for g, r in watched | DRA_READ for v in ("list", "watch")}
    from gpufleet.kube.api import KIND_PATHS  # every kind the loop lists is granted

    for path in KIND_PATHS.values():
        group = "" if path.startswith("/api/") else path.split("/")[2]
        assert (group, path.rsplit("/", 1)[1], "list") in grants(cluster)
    lease = next(x for x in d if x["kind"] == "Role")
    assert grants(lease) == {("coordination.k8s.io", "leases", v) for v in ("create", "get", "update")}
    named = [r for r in lease["rules"] if "resourceNames" in r]
    assert named and set(named[0]["verbs"]) == {"get", "update"} and named[0]["resourceNames"] == ["gpufleet-scheduler"]
    dep = next(x for x in d if x["kind"] == "Deployment")
    c = dep["spec"]["template"]["spec"]["containers"][0]
    assert c["args"][0] == "scheduler" and dep["spec"]["template"]["spec"]["serviceAccountName"] == "gpufleet-scheduler"
    assert {"Service", "ConfigMap", "ServiceAccount", "ClusterRoleBinding", "RoleBinding"} <= {x["kind"] for x in d}


def test_extender_manifest_and_kube_scheduler_config():
    d = docs("extender/extender.yaml")
    assert grants(next(x for x in d if x["kind"] == "ClusterRole")) == {
        ("", "nodes", "list"), ("", "nodes", "watch"), ("", "pods", "get"), ("", "pods", "list"), ("", "pods", "watch"), ("", "pods", "patch"),
        ("", "pods/binding", "create")} | {(g, r, v) for g, r in DRA_READ for v in ("list", "watch")}
    cm = next(x for x in d if x["kind"] == "ConfigMap")
    assert load_config(yaml.safe_load(cm["data"]["config.yaml"]), registry())
    dep = next(x for x in d if x["kind"] == "Deployment")
    assert dep["spec"]["replicas"] == 1 and dep["spec"]["template"]["spec"]["containers"][0]["args"][0] == "extender"
    # one replica with Recreate (never two snapshots binding), replaced 30 s after its node is lost, not 300 s
    assert dep["spec"]["strategy"] == {"type": "Recreate"}
    assert {(t["key"], t["effect"], t["tolerationSeconds"]) for t in dep["spec"]["template"]["spec"]["tolerations"]} == {
        ("node.kubernetes.io/unreachable", "NoExecute", 30), ("node.kubernetes.io/not-ready", "NoExecute", 30)}
    svc = next(x for x in d if x["kind"] == "Service")
    cfg = docs("extender/kube-scheduler-config.yaml")[0]
    assert cfg["kind"] == "KubeSchedulerConfiguration" and cfg["apiVersion"] == "kubescheduler.config.k8s.io/v1"
    ext = cfg["extenders"][0]
    assert (ext["filterVerb"], ext["prioritizeVerb"], ext["bindVerb"]) == ("filter", "prioritize", "bind")
    assert ext["nodeCacheCapable"] is True and ext["managedResources"][0]["name"] == "nvidia.com/gpu"
    assert f"{svc['metadata']['name']}.{svc['metadata']['namespace']}.svc:{svc['spec']['ports'][0]['port']}" in ext["urlPrefix"]


def test_the_deployed_scheduler_config_is_the_builtin_default_profile():
    # its ConfigMap once carried a copy of the default profile without half its filters (pod affinity, topology
    # spread, ports, volumes): a scheduler deployed from it ignored those constraints.  (The extender's keeps the
    # GPU filters only: kube-scheduler judges the rest before calling it, and it watches no volumes.)
    from gpufleet.policies import profile_config

    cm = next(x for x in docs("scheduler/scheduler.yaml") if x["kind"] == "ConfigMap")
    assert yaml.safe_load(cm["data"]["config.yaml"]) == profile_config("default")
