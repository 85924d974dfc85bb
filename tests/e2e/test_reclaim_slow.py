"""`gpufleet reclaim` against a real Prometheus scraping the agent on a real node: a dry run, then ``--apply``,
which evicts the idle GPU pods through the Eviction API while a PodDisruptionBudget keeps its pod.

Reclaim's shortest window is 5 minutes and pods younger than the window are protected, so this takes about
7 minutes: it runs only with ``GPUFLEET_E2E_SLOW=1`` (besides everything the real-node tier needs).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time

import pytest

from .harness import wait
from .test_real_node import NODE, pod_manifest, real_node, start_agent  # noqa: F401 - the module's node fixture

pytestmark = [
    pytest.mark.skipif(os.environ.get("GPUFLEET_E2E_SLOW") != "1", reason="slow (7 min): set GPUFLEET_E2E_SLOW=1"),
    pytest.mark.skipif(shutil.which("prometheus") is None, reason="prometheus not on PATH (Debian package prometheus)"),
]


def test_reclaim_dry_run_then_apply_honours_a_pdb(real_node):  # noqa: F811
    node = real_node
    start_agent(node, [])
    assert wait(lambda: int((node.node()["status"].get("allocatable") or {}).get("nvidia.com/gpu", "0")) == 60, 90)
    node.gpufleet("gpufleet-scheduler", ["scheduler", "--kubeconfig", str(node.kubeconfig), "--metrics-addr",
                                         "127.0.0.1:19251", "--no-leader-elect", "--policy", "bestfit"])
    cfg = node.data / "prometheus.yml"
    cfg.write_text("global: {scrape_interval: 5s}\n"
                   "scrape_configs:\n  - job_name: gpufleet-agent\n    static_configs: [{targets: ['127.0.0.1:19400']}]\n")
    url = "http://127.0.0.1:19090"
    node.start("prometheus", ["prometheus", f"--config.file={cfg}", f"--storage.tsdb.path={node.data / 'prometheus'}",
                              "--web.listen-address=127.0.0.1:19090"])
    try:
        items = []
        for name, app in (("idle-a", "idle"), ("idle-b", "idle"), ("keep-c", "keep")):
            m = pod_manifest(name, "whole", 1)
            m["metadata"]["labels"]["app"] = app
            items.append(m)
        items.append({"apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": {"name": "keep", "namespace": "default"},
                      "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "keep"}}}})
        node.kubectl("create", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": items}))
        def running():
            return all((p.get("status") or {}).get("phase") == "Running"
                                      for p in node.pods() if p["metadata"]["name"] in ("idle-a", "idle-b", "keep-c"))
        assert wait(running, 120)
        time.sleep(330)  # one whole 5-minute window of samples, and the pods older than it
        policy = node.data / "reclaim.yaml"
        policy.write_text("default: {action: evict, idleUtilPercent: 5, window: 5m, grace: 0s}\n")
        base = [sys.executable, "-m", "gpufleet.cli.main", "reclaim", "--prometheus", url, "--kubeconfig", str(node.kubeconfig),
                "--policy-file", str(policy), "--json"]

        def reclaim(*extra: str) -> dict:
            r = subprocess.run(base + list(extra), env=node.env, capture_output=True, text=True, timeout=120, check=False)
            assert r.returncode == 0, r.stdout + r.stderr
            return json.loads(r.stdout)

        dry = reclaim()
        acts = {a["pod"]: a["action"] for a in dry.get("actions", [])}
        print("\nreclaim dry run:", json.dumps(dry)[:1500])
        assert all(p in acts for p in ("default/idle-a", "default/idle-b")), acts
        assert all(p.get("status", {}).get("phase") == "Running" for p in node.pods()
                   if p["metadata"]["name"] in ("idle-a", "idle-b", "keep-c")), "a dry run changed something"
        first = reclaim("--apply")  # warns (grace 0: the next round evicts)
        second = reclaim("--apply")
        print("reclaim --apply:", json.dumps(first)[:800], "\nreclaim --apply (again):", json.dumps(second)[:1500])
        def gone():
            return {p["metadata"]["name"] for p in node.pods()}.isdisjoint({"idle-a", "idle-b"})
        assert wait(gone, 60), [p["metadata"]["name"] for p in node.pods()]
        keep = node.get_json("pod", "keep-c")
        assert keep["status"].get("phase") == "Running" and not keep["metadata"].get("deletionTimestamp"), \
            "the PodDisruptionBudget's pod was evicted"
    finally:
        node.stop("prometheus")
