"""The DaemonSet manifest: its config parses, its args are the agent's flags, its RBAC is least privilege."""

from __future__ import annotations

import argparse
from pathlib import Path

import yaml

from gpufleet.agent.config import load_agent_config
from gpufleet.agent.main import add_arguments

MANIFEST = Path(__file__).parents[2] / "deploy/agent/daemonset.yaml"


def docs():
    return {d["kind"]: d for d in yaml.safe_load_all(MANIFEST.read_text())}


def test_config_map_is_a_valid_agent_config(tmp_path):
    p = tmp_path / "agent.yaml"
    p.write_text(docs()["ConfigMap"]["data"]["agent.yaml"])
    cfg = load_agent_config(p)
    assert cfg.mig_strategy == "mixed" and cfg.replicas == 1


def test_daemonset_args_mounts_and_security():
    ds = docs()["DaemonSet"]["spec"]["template"]["spec"]
    c = ds["containers"][0]
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(c["args"][1:])  # "agent" is the sub-command
    assert args.config == "/etc/gpufleet/agent.yaml"
    mounts = {m["mountPath"] for m in c["volumeMounts"]}
    assert {"/var/lib/kubelet/device-plugins", args.device_plugin_dir, args.state_dir, "/etc/gpufleet"} <= mounts
    hostpaths = {v["hostPath"]["path"] for v in ds["volumes"] if "hostPath" in v}
    assert "/var/lib/kubelet/device-plugins" in hostpaths and args.state_dir in hostpaths
    sc = c["securityContext"]
    assert not sc["privileged"] and not sc["allowPrivilegeEscalation"] and sc["capabilities"]["drop"] == ["ALL"]
    assert sc["readOnlyRootFilesystem"]
    assert any(e["name"] == "NODE_NAME" for e in c["env"])
    assert any(t["key"] == "nvidia.com/gpu" for t in ds["tolerations"])


def test_the_endpoint_container_shares_the_agents_endpoint_dir_and_nothing_more():
    from gpufleet.agent import endpoint

    ds = docs()["DaemonSet"]["spec"]["template"]["spec"]
    agent, ep = ds["containers"]
    assert (agent["name"], ep["name"]) == ("agent", "endpoint")
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    a = parser.parse_args(agent["args"][1:])
    parser = argparse.ArgumentParser()
    endpoint.add_arguments(parser)
    e = parser.parse_args(ep["args"][1:])
    assert a.endpoint_dir == e.endpoint_dir and e.device_plugin_dir == a.device_plugin_dir
    assert e.endpoint_dir.startswith(a.state_dir + "/")  # on the state hostPath both mount
    mounts = {m["name"]: m["mountPath"] for m in ep["volumeMounts"]}
    assert mounts == {"device-plugins": a.device_plugin_dir, "state": a.state_dir}  # no NVML, no config, no API token use
    assert "env" not in ep and "ports" not in ep
    sc = ep["securityContext"]
    assert not sc["privileged"] and not sc["allowPrivilegeEscalation"] and sc["capabilities"]["drop"] == ["ALL"]
    assert sc["readOnlyRootFilesystem"]


def test_rbac_is_least_privilege():
    rules = docs()["ClusterRole"]["rules"]
    # what the agent calls (labels, podsource, reconcile, report_refused); narrowed to its own node by
    # deploy/node-restriction (tests/deploy/test_least_privilege.py asks the apiserver)
    assert {(r["resources"][0], tuple(r["verbs"])) for r in rules} == {
        ("nodes", ("get", "patch")), ("pods", ("list", "watch", "patch")), ("events", ("create",))}
