"""`gpufleet agent` as a process against a fake kubelet: registers, re-registers after a kubelet restart, stops on SIGTERM."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import pytest

from gpufleet.agent.config import load_agent_config
from gpufleet.agent.podsource import pick
from gpufleet.engine.errors import ConfigError

from .conftest import FakeKubelet


def wait_for(cond, timeout_s=15.0):
    end = time.time() + timeout_s
    while time.time() < end:
        if cond():
            return True
        time.sleep(0.1)
    return False


def test_agent_registers_and_reregisters_after_kubelet_restart():
    d = tempfile.mkdtemp(dir="/tmp", prefix="ga")
    kubelet = FakeKubelet(d)
    kubelet.start()
    cfg = os.path.join(d, "agent.yaml")
    with open(cfg, "w") as f:
        f.write("replicas: 2\nmigStrategy: mixed\n")
    env = dict(os.environ, NODE_NAME="")
    proc = subprocess.Popen([sys.executable, "-m", "gpufleet.cli.main", "agent", "--nvml", "fake:a100-mig", "--config", cfg,
                             "--device-plugin-dir", d, "--metrics-addr", ""], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        assert wait_for(lambda: len(kubelet.registered) >= 4), "agent did not register its 4 resources"
        names = sorted(r.resource_name for r in kubelet.registered)
        assert names == ["nvidia.com/gpu", "nvidia.com/mig-1g.10gb", "nvidia.com/mig-2g.20gb", "nvidia.com/mig-3g.40gb"]
        kubelet.stop()  # kubelet restarts: its socket is re-created
        time.sleep(0.3)
        kubelet2 = FakeKubelet(d)
        kubelet2.start()
        try:
            assert wait_for(lambda: len(kubelet2.registered) >= 4), "agent did not re-register after the kubelet restart"
        finally:
            kubelet2.stop()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=15) == 0
        assert "labels are off" in proc.stdout.read()
    finally:
        if proc.poll() is None:
            proc.kill()
        shutil.rmtree(d, ignore_errors=True)


def test_config_typo_is_a_clear_error(tmp_path):
    p = tmp_path / "a.yaml"
    p.write_text("replica: 2\n")
    with pytest.raises(ConfigError, match="unknown key.*replica"):
        load_agent_config(p)
    p.write_text("replicas: 0\n")
    with pytest.raises(ConfigError, match="replicas must be"):
        load_agent_config(p)


def pod(name, annotation, node="n1", phase="Pending", created="2026-01-01T00:00:00Z"):
    return {"metadata": {"name": name, "namespace": "ml", "creationTimestamp": created,
                         "annotations": {"gpufleet.io/assignment": annotation}},
            "spec": {"nodeName": node}, "status": {"phase": phase}}


def test_pod_source_picks_oldest_pending_and_skips_malformed():
    good = json.dumps({"node": "n1", "gpus": [{"index": 1, "uuid": "GPU-t4-01"}], "gpu_milli": 500})
    pods = [
        pod("broken", "{not json", created="2025-01-01T00:00:00Z"),
        pod("running", good, phase="Running", created="2025-01-02T00:00:00Z"),
        pod("elsewhere", good, node="n2"),
        pod("newer", good, created="2026-02-01T00:00:00Z"),
        pod("older", good, created="2026-01-15T00:00:00Z"),
    ]
    pa = pick(pods, "n1", "nvidia.com/gpu", 1, set())
    assert pa.pod_key == "ml/older" and pa.gpu_uuids == ["GPU-t4-01"] and pa.assignment.gpu_milli == 500
    assert pick(pods, "n1", "nvidia.com/gpu", 1, {"ml/older"}).pod_key == "ml/newer"
    assert pick(pods, "n1", "nvidia.com/mig-1g.10gb", 1, set()) is None
