"""deploy/autoscaling and examples/autoscaling against a real kube-apiserver: every object is accepted as written
(APIServices, RBAC, the adapter, HPAs of autoscaling/v2, the Queue); ``gpufleet explain-hpa`` reads the real HPA
and APIService and says the adapter is not there; a ``gpufleet recommend --patches`` patch applies with
``kubectl patch`` and changes exactly the pod template's GPU request.

(No controller-manager, kubelet or adapter here: the HPA controller acting on the metrics is the real-node tier's,
tests/e2e/test_autoscaling_node.py.)
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from gpufleet.cli.main import main
from gpufleet.utilization.patches import Patch, patch_for
from gpufleet.utilization.recommend import Recommendation

ROOT = Path(__file__).parents[2]
KUBECTL = os.environ.get("KUBECTL") or shutil.which("kubectl")
pytestmark = [pytest.mark.apiserver, pytest.mark.skipif(not KUBECTL, reason="no kubectl ($KUBECTL or on PATH)")]
APISERVICES = ["v1beta2.custom.metrics.k8s.io", "v1beta1.custom.metrics.k8s.io", "v1beta1.external.metrics.k8s.io"]


def kubectl(cp, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    r = subprocess.run([str(KUBECTL), "--kubeconfig", str(cp.kubeconfig), *args], capture_output=True, text=True, timeout=120,
                       check=False)
    assert not check or r.returncode == 0, f"kubectl {' '.join(args)}: {r.stdout}{r.stderr}"
    return r


@pytest.fixture(scope="module")
def installed(control_plane):
    kubectl(control_plane, "apply", "-k", str(ROOT / "deploy" / "crds"))
    kubectl(control_plane, "wait", "--for=condition=Established", "crd/queues.gpufleet.io", "--timeout=60s")
    try:
        yield control_plane
    finally:  # an APIService without a backend slows every later discovery: remove them; the examples' Queue would
        # widen every later test's borrowing pool (its quota joins all root queues' quota)
        kubectl(control_plane, "delete", "apiservice", *APISERVICES, "--ignore-not-found", check=False)
        kubectl(control_plane, "delete", "--ignore-not-found", "--wait=false", "-f", str(ROOT / "examples" / "autoscaling"),
                check=False)


def test_manifests_and_examples_are_accepted_as_written(installed):
    cp = installed
    out = kubectl(cp, "apply", "-k", str(ROOT / "deploy" / "autoscaling")).stdout
    for svc in APISERVICES:
        assert f"apiservice.apiregistration.k8s.io/{svc} created" in out or svc in out
    for f in sorted((ROOT / "examples" / "autoscaling").glob("*.yaml")):
        kubectl(cp, "apply", "-f", str(f))
    hpa = json.loads(kubectl(cp, "get", "hpa", "-n", "ml-serving", "llm-inference", "-o", "json").stdout)
    assert hpa["spec"]["metrics"][0]["pods"]["target"]["averageValue"] == "70" and hpa["spec"]["minReplicas"] == 1
    q = json.loads(kubectl(cp, "get", "hpa", "-n", "team-a", "team-a-stager", "-o", "json").stdout)
    assert q["spec"]["metrics"][0]["external"]["metric"]["selector"] == {"matchLabels": {"queue": "team-a"}}
    assert kubectl(cp, "get", "queue", "team-a", "-o", "name").stdout.strip() == "queue.gpufleet.io/team-a"


def run(argv) -> int:
    try:
        return main(argv)
    except SystemExit as exc:
        return int(exc.code or 0)


def test_explain_hpa_reads_the_real_objects(installed, capsys):
    cp = installed
    kubectl(cp, "apply", "-k", str(ROOT / "deploy" / "autoscaling"))
    kubectl(cp, "apply", "-f", str(ROOT / "examples" / "autoscaling" / "gpu-inference-hpa.yaml"))

    def available() -> str:
        a = json.loads(kubectl(cp, "get", "apiservice", "v1beta2.custom.metrics.k8s.io", "-o", "json").stdout)
        return next((c["status"] for c in (a.get("status") or {}).get("conditions") or [] if c["type"] == "Available"), "")

    import time

    for _ in range(60):  # the apiserver's availability controller marks it (no endpoints: no adapter pod runs here)
        if available() == "False":
            break
        time.sleep(0.5)
    assert run(["explain-hpa", "ml-serving/llm-inference", "--kubeconfig", str(cp.kubeconfig)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("ml-serving/llm-inference: Deployment llm-inference"), out
    assert "metric 1: Pods gpu_utilization, target AverageValue 70" in out
    assert "cause: APIService v1beta2.custom.metrics.k8s.io is not available (" in out, out
    assert run(["explain-hpa", "ml-serving/nope", "--kubeconfig", str(cp.kubeconfig)]) == 1
    assert "HorizontalPodAutoscaler not readable" in capsys.readouterr().out


def test_a_recommend_patch_applies_with_kubectl_patch(installed, tmp_path):
    cp = installed
    kubectl(cp, "apply", "-f", str(ROOT / "examples" / "autoscaling" / "gpu-inference-hpa.yaml"))

    def template() -> dict:
        return json.loads(kubectl(cp, "get", "deployment", "-n", "ml-serving", "llm-inference", "-o", "json").stdout)["spec"]["template"]

    pod = template()  # what recommend reads from a pod of it: annotations and containers
    for r in (Recommendation("ml-serving/Deployment/llm-inference", 1, 0.5, 10, 20, 25, 1000, 2000, 3000, 0.3, 300, 12288, 1.0, 100),
              Recommendation("ml-serving/Deployment/llm-inference", 1, 0.3, 90, 180, 190, 1000, 2000, 3000, 2.0, None, None, -1.0, 100)):
        p = patch_for(r, pod)
        assert isinstance(p, Patch)
        f = tmp_path / p.file_name
        f.write_text(yaml.safe_dump(p.body))
        cmd = p.kubectl(str(f)).split()
        assert cmd[:2] == ["kubectl", "patch"]
        kubectl(cp, *cmd[1:])
        pod = template()
        limits = pod["spec"]["containers"][0]["resources"]["limits"]
        ann = pod["metadata"].get("annotations") or {}
        if r.recommended_milli:
            assert ann["gpufleet.io/gpu-milli"] == "300" and ann["gpufleet.io/gpu-memory"] == "12288Mi" and limits["nvidia.com/gpu"] == "1"
        else:
            assert "gpufleet.io/gpu-milli" not in ann and "gpufleet.io/gpu-memory" not in ann and limits["nvidia.com/gpu"] == "2"
        assert limits["memory"] == "64Mi"  # the rest of the container untouched
        assert pod["spec"]["schedulerName"] == "gpufleet"
