"""deploy/dra: the DaemonSet's args are the agent's flags and its mounts the paths those flags name, its RBAC is what
the driver calls, the DeviceClasses select this driver's devices; the device-plugin DaemonSet stays off DRA nodes."""

from __future__ import annotations

import argparse
from pathlib import Path

import yaml

from gpufleet.agent.dra.devices import DRIVER, DraOptions, build_devices
from gpufleet.agent.main import add_arguments
from gpufleet.agent.nvml import PROFILES

DEPLOY = Path(__file__).parents[2] / "deploy"


def load(rel: str) -> list[dict]:
    return [d for d in yaml.safe_load_all((DEPLOY / rel).read_text()) if d]


def test_daemonset_args_mounts_and_node_selection():
    docs = {d["kind"]: d for d in load("dra/daemonset.yaml")}
    spec = docs["DaemonSet"]["spec"]["template"]["spec"]
    c = spec["containers"][0]
    p = argparse.ArgumentParser()
    add_arguments(p)
    args = p.parse_args(c["args"][1:])
    assert args.dra and args.dra_driver_name == DRIVER
    mounts = {m["mountPath"]: m for m in c["volumeMounts"]}
    host = {v["name"]: v["hostPath"]["path"] for v in spec["volumes"] if "hostPath" in v}
    for path in (args.kubelet_plugins_dir, args.kubelet_registry_dir, args.cdi_dir, args.state_dir):
        m = mounts[path]
        assert host[m["name"]] == path and not m.get("readOnly")  # the same path inside and on the host
    assert spec["nodeSelector"] == {"gpufleet.io/gpu-mode": "dra"}
    cm = docs["ConfigMap"]["data"]["agent.yaml"]
    assert "recoverAfterSeconds" in cm
    # the device-plugin agent keeps off those nodes
    agent = next(d for d in load("agent/daemonset.yaml") if d["kind"] == "DaemonSet")
    terms = agent["spec"]["template"]["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    for t in terms["nodeSelectorTerms"]:
        assert {"key": "gpufleet.io/gpu-mode", "operator": "NotIn", "values": ["dra"]} in t["matchExpressions"]


def test_rbac_is_what_the_driver_calls():
    role = next(d for d in load("dra/daemonset.yaml") if d["kind"] == "ClusterRole")
    grants = {(g, r, v) for rule in role["rules"] for g in rule["apiGroups"] for r in rule["resources"] for v in rule["verbs"]}
    assert grants == {("resource.k8s.io", "resourceslices", v) for v in ("get", "list", "watch", "create", "update", "delete")} | {
        ("resource.k8s.io", "resourceclaims", "get"), ("", "nodes", "get"), ("", "nodes", "patch"),
        ("events.k8s.io", "events", "create")}


def test_device_classes_select_this_drivers_devices():
    classes = {d["metadata"]["name"]: d for d in load("dra/deviceclasses.yaml") + load("dra/shares/deviceclass.yaml")
               + load("dra/extended-resource/deviceclass.yaml")}
    assert set(classes) == {"gpu.gpufleet.io", "mig.gpufleet.io", "gpu-share.gpufleet.io", "gpu-extended.gpufleet.io"}
    assert classes["gpu-extended.gpufleet.io"]["spec"]["extendedResourceName"] == "nvidia.com/gpu"
    assert sum("extendedResourceName" in c["spec"] for c in classes.values()) == 1
    drv, gpus = PROFILES["a100-mig"]
    devs = build_devices(gpus, drv, DraOptions()).devices
    for name, c in classes.items():
        (sel,) = c["spec"]["selectors"]
        expr = " ".join(sel["cel"]["expression"].split())
        assert expr.startswith(f"device.driver == '{DRIVER}' && device.attributes['{DRIVER}'].type == "), name
        want = "mig" if name.startswith("mig") else "gpu"
        assert f".type == '{want}'" in expr
        assert any(d["attributes"]["type"]["string"] == want for d in devs)
    # the share class selects on the agent's `shareable` attribute (1.35's CEL does not know allowMultipleAllocations)
    share = classes["gpu-share.gpufleet.io"]["spec"]["selectors"][0]["cel"]["expression"]
    assert "allowMultipleAllocations" not in share and "shareable" in share
    assert all(("shareable" in d["attributes"]) == bool(d.get("allowMultipleAllocations")) for d in devs)
    assert any(d.get("allowMultipleAllocations") for d in devs)
    plain = build_devices(gpus, drv, DraOptions(shares=False)).devices
    assert not any("shareable" in d["attributes"] or "allowMultipleAllocations" in d for d in plain)


def test_no_class_names_a_field_a_1_35_kube_apiserver_refuses():
    """`kubectl apply -k deploy/dra` works on 1.35 too: no CEL of any class names a device field 1.35's CEL lacks
    (the apiserver tier checks the release itself: tests/agent/test_dra_apiserver.py)."""
    for p in ("dra/deviceclasses.yaml", "dra/shares/deviceclass.yaml", "dra/extended-resource/deviceclass.yaml"):
        for d in load(p):
            for sel in d["spec"]["selectors"]:
                assert "allowMultipleAllocations" not in sel["cel"]["expression"], p


def test_the_classes_1_35_cannot_take_are_apart_and_its_overlay_leaves_them_out():
    """deploy/dra/deviceclasses.yaml is what every supported release serves with its default gates; the share and
    extended-resource classes (accepted by 1.35 too, but serving nothing there) are separate files, and
    deploy/overlays/dra-k8s-1.35 renders deploy/dra without them (when a kubectl is at hand)."""
    from tests.dra_release import BASE_CLASSES, FULL_CLASSES

    base = [d for p in BASE_CLASSES for d in yaml.safe_load_all((DEPLOY.parent / p).read_text()) if d]
    assert {d["metadata"]["name"] for d in base} == {"gpu.gpufleet.io", "mig.gpufleet.io"}
    for d in base:
        assert "extendedResourceName" not in d["spec"]
        assert "allowMultipleAllocations" not in d["spec"]["selectors"][0]["cel"]["expression"]
    assert len(FULL_CLASSES) == 3 and all((DEPLOY.parent / p).is_file() for p in FULL_CLASSES)
    k = yaml.safe_load((DEPLOY / "dra" / "kustomization.yaml").read_text())
    assert k["resources"] == ["deviceclasses.yaml", "daemonset.yaml", "../node-restriction", "shares", "extended-resource"]
    import os
    import shutil
    import subprocess

    kubectl = os.environ.get("KUBECTL") or shutil.which("kubectl")
    if not kubectl:
        return
    def render(d: str) -> list[dict]:
        out = subprocess.run([kubectl, "kustomize", str(DEPLOY / d)], capture_output=True, text=True, check=True, timeout=60)
        return [x for x in yaml.safe_load_all(out.stdout) if x]
    full, old = render("dra"), render("overlays/dra-k8s-1.35")
    classes = lambda docs: {d["metadata"]["name"] for d in docs if d["kind"] == "DeviceClass"}  # noqa: E731
    assert classes(full) == {"gpu.gpufleet.io", "mig.gpufleet.io", "gpu-share.gpufleet.io", "gpu-extended.gpufleet.io"}
    assert classes(old) == {d["metadata"]["name"] for d in base}
    assert [d for d in full if d["kind"] != "DeviceClass"] == [d for d in old if d["kind"] != "DeviceClass"]
