"""The install path: every kustomize base builds, runs the image this repository builds, and matches the Containerfile.

Static checks always run; ``kubectl kustomize`` (kustomize as kubectl ships it) runs when a kubectl is found
(``$KUBECTL`` or on PATH) and the test is skipped otherwise.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).parents[2]
DEPLOY = ROOT / "deploy"
VERSION = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
IMAGE = f"ghcr.io/gpufleet/gpufleet:{VERSION}"
BASES = ["", "crds", "scheduler", "extender", "agent", "reclaim", "overlays/nvidia-runtimeclass", "autoscaling", "dra",
         "dra/shares", "dra/extended-resource", "overlays/dra-k8s-1.35", "overlays/k8s-1.35",
         "overlays/recreate-refused-pods", "overlays/recreate-refused-pods/rbac", "overlays/k8s-1.35-recreate-refused-pods"]
# the one workload that is not gpufleet's image: the ecosystem's metrics adapter, at the version
# scripts/build-prometheus-adapter.sh builds for the autoscaling tests
ADAPTER_VERSION = re.search(r"^VERSION=(v[0-9.]+)$", (ROOT / "scripts" / "build-prometheus-adapter.sh").read_text(), re.MULTILINE)[1]  # type: ignore[index]
THIRD_PARTY = {"prometheus-adapter": f"registry.k8s.io/prometheus-adapter/prometheus-adapter:{ADAPTER_VERSION}"}


def kustomizations() -> list[Path]:
    return sorted(DEPLOY.rglob("kustomization.yaml"))


def test_every_kustomization_lists_what_exists():
    assert {p.parent.relative_to(DEPLOY).as_posix().removeprefix(".") for p in kustomizations()} >= set(BASES)
    for k in kustomizations():
        doc = yaml.safe_load(k.read_text())
        assert doc["kind"] == "Kustomization", k
        for r in doc.get("resources", []):
            target = k.parent / r
            assert target.is_file() or (target / "kustomization.yaml").is_file(), f"{k}: resource {r} does not exist"


def containers(docs: list[dict]) -> list[tuple[str, dict, dict]]:
    out = []
    for d in docs:
        if d and d.get("kind") in ("Deployment", "DaemonSet"):
            spec = d["spec"]["template"]["spec"]
            out += [(d["metadata"]["name"], spec, c) for c in spec["containers"]]
    return out


def all_docs() -> list[dict]:
    return [d for p in DEPLOY.rglob("*.yaml") if "kustomization" not in p.name for d in yaml.safe_load_all(p.read_text()) if d]


def test_workloads_run_this_version_of_the_image_as_the_image_expects():
    cs = containers(all_docs())
    assert {n: c["image"] for n, _, c in cs if n in THIRD_PARTY} == THIRD_PARTY
    cs = [x for x in cs if x[0] not in THIRD_PARTY]
    assert {n for n, _, _ in cs} == {"gpufleet-scheduler", "gpufleet-extender", "gpufleet-agent", "gpufleet-agent-dra",
                                     "gpufleet-reclaim"}
    for name, spec, c in cs:
        assert c["image"] == IMAGE, (name, c["image"])  # bump pyproject's version and the manifests together
        command = name.removeprefix("gpufleet-").removesuffix("-dra") + ("-endpoint" if c["name"] == "endpoint" else "")
        assert c["args"][0] == command and "command" not in c  # the entrypoint
        sc = c["securityContext"]
        assert sc["readOnlyRootFilesystem"] and not sc["allowPrivilegeEscalation"]
        if not name.startswith("gpufleet-agent"):  # the image's numeric user; the agent alone runs as root (kubelet's dirs)
            assert sc["runAsNonRoot"] and "runAsUser" not in sc and spec["serviceAccountName"] == name


def test_agent_pod_has_what_a_gpu_node_needs():
    ds = next(d for d in yaml.safe_load_all((DEPLOY / "agent/daemonset.yaml").read_text()) if d["kind"] == "DaemonSet")
    spec = ds["spec"]["template"]["spec"]
    c = spec["containers"][0]
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert env["NVIDIA_VISIBLE_DEVICES"] == "all" and "utility" in env["NVIDIA_DRIVER_CAPABILITIES"]
    host = {v["name"]: v["hostPath"]["path"] for v in spec["volumes"] if "hostPath" in v}
    mounts = {m["name"]: m for m in c["volumeMounts"]}
    assert host["device-plugins"] == mounts["device-plugins"]["mountPath"] == "/var/lib/kubelet/device-plugins"
    assert host["pod-resources"] == mounts["pod-resources"]["mountPath"] == "/var/lib/kubelet/pod-resources"
    assert mounts["pod-resources"]["readOnly"]
    assert spec["hostPID"] is True  # NVML reports host PIDs (per-pod attribution on shared GPUs)
    assert c["securityContext"]["runAsUser"] == 0 and c["securityContext"]["capabilities"]["drop"] == ["ALL"]
    ov = yaml.safe_load((DEPLOY / "overlays/nvidia-runtimeclass/kustomization.yaml").read_text())
    assert "runtimeClassName: nvidia" in ov["patches"][0]["patch"]


def test_containerfile_is_what_the_manifests_expect():
    cf = (ROOT / "Containerfile").read_text()
    assert re.search(r"^ARG BASE=docker\.io/library/python:3\.\d+-slim$", cf, re.MULTILINE)
    assert len(re.findall(r"^FROM \$\{BASE\}", cf, re.MULTILINE)) == 2  # build stage + runtime stage
    final = cf.split("\nFROM ${BASE}\n", 1)[1]
    assert re.search(r"^USER 10001:10001$", final, re.MULTILINE)  # numeric: kubelet checks runAsNonRoot without /etc/passwd
    assert 'ENTRYPOINT ["/opt/gpufleet/bin/gpufleet"]' in final and 'CMD ["simulate"]' in final
    assert re.findall(r"^COPY .*", final, re.MULTILINE) == ["COPY --from=build /opt/gpufleet /opt/gpufleet"]  # the venv only
    assert "PYTHONDONTWRITEBYTECODE=1" in final  # read-only root filesystems
    assert "ca-certificates.crt" not in final


def kubectl() -> str | None:
    return os.environ.get("KUBECTL") or shutil.which("kubectl")


@pytest.mark.skipif(not kubectl(), reason="no kubectl ($KUBECTL or on PATH) to run kustomize")
@pytest.mark.parametrize("base", [*BASES, "../tests/deploy/e2e-overlay"])
def test_kubectl_kustomize_builds(base):
    r = subprocess.run([kubectl(), "kustomize", str(DEPLOY / base)], capture_output=True, text=True, timeout=60, check=False)
    assert r.returncode == 0, r.stderr
    docs = [d for d in yaml.safe_load_all(r.stdout) if d]
    assert docs and all(d.get("apiVersion") and d.get("kind") and d["metadata"].get("name") for d in docs)
    images = {c["image"] for _, _, c in containers(docs)}
    if base.endswith("e2e-overlay"):
        assert images == {"localhost/gpufleet:e2e-test"}
    elif base == "autoscaling":
        assert images == {THIRD_PARTY["prometheus-adapter"]}
    elif images:
        assert images == {IMAGE}
    if base == "":
        kinds = {(d["kind"], d["metadata"]["name"]) for d in docs}
        assert {("Deployment", "gpufleet-scheduler"), ("DaemonSet", "gpufleet-agent"),
                ("CustomResourceDefinition", "queues.gpufleet.io")} <= kinds


def test_reclaim_rbac_is_what_it_calls():
    docs = list(yaml.safe_load_all((DEPLOY / "reclaim/reclaim.yaml").read_text()))
    role = next(d for d in docs if d["kind"] == "ClusterRole")
    grants = {(g, r, v) for rule in role["rules"] for g in rule["apiGroups"] for r in rule["resources"] for v in rule["verbs"]}
    assert grants == {("", "pods", "list"), ("", "pods", "patch"), ("", "pods/eviction", "create"),
                      ("", "events", "create"), ("", "nodes", "list"), ("policy", "poddisruptionbudgets", "list")}
    c = next(d for d in docs if d["kind"] == "Deployment")["spec"]["template"]["spec"]["containers"][0]
    assert "--apply" not in c["args"]  # dry run as shipped
    import argparse

    from gpufleet.utilization.reclaim_cli import add_arguments

    p = argparse.ArgumentParser()
    add_arguments(p)
    args = p.parse_args(c["args"][1:])
    assert args.interval > 0 and args.policy_file == "/etc/gpufleet/reclaim.yaml"


@pytest.mark.skipif(not kubectl(), reason="no kubectl ($KUBECTL or on PATH) to run kustomize")
def test_the_1_35_overlay_is_deploy_without_what_1_35_does_not_serve():
    """deploy/overlays/k8s-1.35 renders exactly what deploy does, less the MutatingAdmissionPolicy and its binding."""
    def render(d: str) -> list[dict]:
        r = subprocess.run([kubectl(), "kustomize", str(DEPLOY / d)], capture_output=True, text=True, timeout=60, check=True)
        return [x for x in yaml.safe_load_all(r.stdout) if x]
    full, old = render(""), render("overlays/k8s-1.35")
    assert {d["kind"] for d in full} - {d["kind"] for d in old} == {"MutatingAdmissionPolicy", "MutatingAdmissionPolicyBinding"}
    assert [d for d in full if not d["kind"].startswith("MutatingAdmissionPolicy")] == old


@pytest.mark.skipif(not kubectl(), reason="no kubectl ($KUBECTL or on PATH) to run kustomize")
def test_the_recreate_overlay_is_deploy_plus_pod_create_for_the_scheduler_only():
    """deploy/overlays/recreate-refused-pods renders what deploy does, plus one rule: the scheduler may create pods
    (kube/plugin_down re-creates refused bare pods; docs/safety.md)."""
    def render(d: str) -> list[dict]:
        r = subprocess.run([kubectl(), "kustomize", str(DEPLOY / d)], capture_output=True, text=True, timeout=60, check=True)
        return [x for x in yaml.safe_load_all(r.stdout) if x]
    full, more = render(""), render("overlays/recreate-refused-pods")
    extra = [d for d in more if d not in full]
    assert [d for d in more if d in full] == full and {d["kind"] for d in extra} == {"ClusterRole", "ClusterRoleBinding"}
    role = next(d for d in extra if d["kind"] == "ClusterRole")
    assert role["rules"] == [{"apiGroups": [""], "resources": ["pods"], "verbs": ["create"]}]
    binding = next(d for d in extra if d["kind"] == "ClusterRoleBinding")
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "gpufleet-scheduler", "namespace": "kube-system"}]


@pytest.mark.skipif(not kubectl(), reason="no kubectl ($KUBECTL or on PATH) to run kustomize")
def test_the_1_35_recreate_overlay_is_the_1_35_install_plus_pod_create_and_the_flag():
    """deploy/overlays/k8s-1.35-recreate-refused-pods renders deploy/overlays/k8s-1.35, plus pods create for the scheduler
    and --recreate-other-schedulers-pods on its container, which the scheduler's parser takes."""
    import argparse

    from gpufleet.kube.cli import add_arguments

    def render(d: str) -> list[dict]:
        r = subprocess.run([kubectl(), "kustomize", str(DEPLOY / d)], capture_output=True, text=True, timeout=60, check=True)
        return [x for x in yaml.safe_load_all(r.stdout) if x]
    base, more = render("overlays/k8s-1.35"), render("overlays/k8s-1.35-recreate-refused-pods")
    extra = [d for d in more if d not in base]
    assert {(d["kind"], d["metadata"]["name"]) for d in extra} == {
        ("ClusterRole", "gpufleet-scheduler-recreate-refused-pods"),
        ("ClusterRoleBinding", "gpufleet-scheduler-recreate-refused-pods"), ("Deployment", "gpufleet-scheduler")}
    assert [d for d in base if d in more] == [d for d in base if d["kind"] != "Deployment" or d["metadata"]["name"] != "gpufleet-scheduler"]
    old = next(d for d in base if d["kind"] == "Deployment" and d["metadata"]["name"] == "gpufleet-scheduler")
    new = next(d for d in extra if d["kind"] == "Deployment")
    args = new["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args == old["spec"]["template"]["spec"]["containers"][0]["args"] + ["--recreate-other-schedulers-pods"]
    p = argparse.ArgumentParser()
    add_arguments(p)
    got = p.parse_args(args[1:])
    assert got.recreate_other_schedulers_pods and got.recreate_refused_pods
    assert next(d for d in extra if d["kind"] == "ClusterRole")["rules"] == [
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["create"]}]
