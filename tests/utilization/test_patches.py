"""``gpufleet recommend --patches``: a recommendation becomes the strategic-merge patch of its workload's pod template
(or the reason there is none).  Applied to a real kube-apiserver in tests/utilization/test_autoscaling_apiserver.py."""

from __future__ import annotations

import json

import pytest
import yaml

from gpufleet.utilization.patches import Patch, patch_for
from gpufleet.utilization.recommend import Recommendation, WorkloadUsage, recommend, workloads


def rec(workload, requested, gpus, milli=None, mem=None, note="") -> Recommendation:
    return Recommendation(workload, 2, requested, 10, 20, 30, 1000, 2000, 3000, gpus, milli, mem, 1.0, 100, note)


def pod(annotations=None, containers=None):
    return {"metadata": {"annotations": annotations or {}},
            "spec": {"containers": containers or [{"name": "srv", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}


def test_a_share_for_a_deployment():
    p = patch_for(rec("ml/Deployment/infer", 1.0, 0.3, 300, 12288), pod())
    assert isinstance(p, Patch) and (p.namespace, p.kind, p.name) == ("ml", "Deployment", "infer")
    assert p.body == {"spec": {"template": {
        "metadata": {"annotations": {"gpufleet.io/gpu-milli": "300", "gpufleet.io/gpu-memory": "12288Mi"}},
        "spec": {"containers": [{"name": "srv", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}}}
    assert p.file_name == "ml.deployment.infer.yaml"
    assert p.kubectl("/d/x.yaml") == "kubectl patch deployment infer -n ml --type strategic --patch-file /d/x.yaml"


def test_whole_gpus_drop_the_share_annotations_and_keep_requests_in_step():
    share = pod({"gpufleet.io/gpu-milli": "500", "gpufleet.io/gpu-memory": "20Gi", "other": "x"},
                [{"name": "sidecar", "resources": {"limits": {"cpu": "1"}}},
                 {"name": "main", "resources": {"limits": {"nvidia.com/gpu": "1"}, "requests": {"nvidia.com/gpu": "1", "cpu": "2"}}}])
    p = patch_for(rec("ml/StatefulSet/db", 0.5, 2.0), share)
    assert isinstance(p, Patch)
    assert p.body == {"spec": {"template": {
        "metadata": {"annotations": {"gpufleet.io/gpu-milli": None, "gpufleet.io/gpu-memory": None}},
        "spec": {"containers": [{"name": "main", "resources": {"limits": {"nvidia.com/gpu": "2"}, "requests": {"nvidia.com/gpu": "2"}}}]}}}}
    # no share annotations on the pod: none to remove
    p = patch_for(rec("ml/Deployment/t", 4.0, 2.0), pod())
    assert isinstance(p, Patch) and "metadata" not in p.body["spec"]["template"]


def test_cronjob_template_path():
    p = patch_for(rec("ml/CronJob/nightly", 1.0, 0.25, 250, 8192), pod())
    assert isinstance(p, Patch) and set(p.body["spec"]["jobTemplate"]["spec"]["template"]) == {"metadata", "spec"}


@pytest.mark.parametrize("r, p, why", [
    (rec("ml/Deployment/x", 1.0, 1.0, note="right-sized"), pod(), "no change: right-sized"),
    (rec("ml/Deployment/x", 1.0, 1.0, note="keep: only 3 utilisation samples (need 12)"), pod(), "no change: keep"),
    (rec("ml/Job/train", 8.0, 4.0), pod(), "a Job's pod template cannot change"),
    (rec("ml/Pod/solo", 1.0, 0.5, 500, 1024), pod(), "a bare pod's GPU request cannot change"),
    (rec("ml/RayCluster/r", 1.0, 0.5, 500, 1024), pod(), "owned by a RayCluster"),
    (rec("ml/Deployment/m", 3 / 7, 0.25, 250, 1024), pod(containers=[{"name": "c", "resources": {"limits": {"nvidia.com/mig-3g.40gb": "1"}}}]),
     "asks for a MIG instance"),
    (rec("ml/Deployment/two", 2.0, 1.0), pod(containers=[{"name": a, "resources": {"limits": {"nvidia.com/gpu": "1"}}} for a in "ab"]),
     "2 containers ask for GPUs"),
])
def test_no_patch_and_why(r, p, why):
    out = patch_for(r, p)
    assert isinstance(out, str) and out.startswith(why), out


def test_workloads_keep_one_of_their_pods_for_the_patch():
    def mk(name, milli):
        return {"metadata": {"name": name, "namespace": "ml", "annotations": {"gpufleet.io/gpu-milli": str(milli)},
                             "ownerReferences": [{"kind": "ReplicaSet", "name": "infer-abc", "controller": True}]},
                "spec": {"containers": [{"name": "srv", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}

    owners = {("ml", "ReplicaSet", "infer-abc"): {"metadata": {"ownerReferences": [{"kind": "Deployment", "name": "infer", "controller": True}]}}}
    ws = workloads([mk("a", 300), mk("b", 500)], owners, {"ml/a": [(0, 10.0)] * 20, "ml/b": [(0, 10.0)] * 20}, {}, {}, 60)
    assert len(ws) == 1 and ws[0].workload == "ml/Deployment/infer"
    assert ws[0].example_pod["metadata"]["name"] == "b"  # the largest request, the one compared with
    p = patch_for(recommend(ws[0]), ws[0].example_pod)
    assert isinstance(p, Patch) and p.body["spec"]["template"]["metadata"]["annotations"]["gpufleet.io/gpu-milli"] == "150"


def test_cli_writes_patches_and_prints_the_commands(tmp_path, monkeypatch, capsys):
    import gpufleet.utilization.recommend_cli as cli

    usage = [WorkloadUsage("ml/Deployment/infer", 2, 1.0, 1, 81920, [10.0] * 20, [4000.0] * 20, 1.0, pod()),
             WorkloadUsage("ml/Job/train", 1, 2.0, 2, 81920, [20.0] * 20, [4000.0] * 20, 1.0, pod())]
    monkeypatch.setattr(cli, "KubeReader", lambda kubeconfig: None)
    monkeypatch.setattr(cli, "gather", lambda *a, **k: (usage, []))
    out_dir = tmp_path / "patches"
    out_dir.mkdir()
    args = ["--prometheus", "http://p:9090", "--patches", str(out_dir)]
    parser = __import__("argparse").ArgumentParser()
    cli.add_arguments(parser)
    assert cli.run(parser.parse_args(args)) == 0
    out = capsys.readouterr().out
    f = out_dir / "ml.deployment.infer.yaml"
    assert f"kubectl patch deployment infer -n ml --type strategic --patch-file {f}" in out
    assert "no patch for ml/Job/train: a Job's pod template cannot change" in out
    body = yaml.safe_load(f.read_text())
    assert body["spec"]["template"]["metadata"]["annotations"]["gpufleet.io/gpu-milli"] == "150"
    assert sorted(p.name for p in out_dir.iterdir()) == ["ml.deployment.infer.yaml"]  # nothing half-written left
    assert cli.run(parser.parse_args([*args[:2], "--json"])) == 0
    doc = json.loads(capsys.readouterr().out)
    by = {r["workload"]: r for r in doc["recommendations"]}
    assert by["ml/Deployment/infer"]["patch"]["kind"] == "Deployment" and by["ml/Job/train"]["patch"] is None
    assert cli.run(parser.parse_args([*args[:2], "--patches", str(tmp_path / "nope")])) == 2
    assert "--patches" in capsys.readouterr().err
