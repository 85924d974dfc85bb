"""`gpufleet agent` as a process against a fake kubelet (register, config reload, kubelet restart, SIGTERM); config and pod source."""

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
from gpufleet.agent.deviceplugin import api_pb2 as pb
from gpufleet.agent.plugin import InvalidAssignment
from gpufleet.agent.podsource import pick
from gpufleet.engine.errors import ConfigError

from .conftest import FakeKubelet, wait_for


def test_agent_process_serves_reloads_config_reregisters_and_stops_on_sigterm():
    d = tempfile.mkdtemp(dir="/tmp", prefix="ga")
    kubelet = FakeKubelet(d).start()
    cfg = os.path.join(d, "agent.yaml")
    with open(cfg, "w") as f:
        f.write("replicas: 2\nmigStrategy: mixed\n")
    log_path = os.path.join(d, "agent.log")
    env = dict(os.environ, NODE_NAME="")
    with open(log_path, "w") as log_file:
        proc = subprocess.Popen([sys.executable, "-m", "gpufleet.cli.main", "agent", "--nvml", "fake:a100-mig", "--config", cfg,
                                 "--device-plugin-dir", d, "--state-dir", os.path.join(d, "state"), "--metrics-addr", "",
                                 "--interval", "0.2"], env=env, stdout=log_file, stderr=subprocess.STDOUT, text=True)
    kubelet2 = None
    try:
        assert wait_for(lambda: len(kubelet.registered) >= 4, 20), "agent did not register its 4 resources"
        names = sorted(r.resource_name for r in kubelet.registered)
        assert names == ["nvidia.com/gpu", "nvidia.com/mig-1g.10gb", "nvidia.com/mig-2g.20gb", "nvidia.com/mig-3g.40gb"]
        ch, stub = kubelet.plugin("nvidia.com/gpu")
        assert len(next(stub.ListAndWatch(pb.Empty(), timeout=5)).devices) == 6 * 10  # 6 whole GPUs x 10 (sharesPerGpu > replicas)
        r = stub.Allocate(pb.AllocateRequest(container_requests=[pb.ContainerAllocateRequest(devices_ids=["GPU-a100-04::1"])]))
        assert r.container_responses[0].envs["NVIDIA_VISIBLE_DEVICES"] == "GPU-a100-04"
        ch.close()
        # a typo in the new config: reported, the running configuration keeps serving
        with open(cfg, "w") as f:
            f.write("replica: 4\n")
        assert wait_for(lambda: "unknown key(s) ['replica']" in open(log_path).read()), "config typo not reported"
        ch, stub = kubelet.plugin("nvidia.com/gpu")
        assert len(next(stub.ListAndWatch(pb.Empty(), timeout=5)).devices) == 6 * 10
        ch.close()
        # a good new config: plugins rebuilt and registered again
        n = len(kubelet.registered)
        with open(cfg, "w") as f:
            f.write("replicas: 4\nmigStrategy: single\n")
        assert wait_for(lambda: len(kubelet.registered) > n), "new config not applied"
        ch, stub = kubelet.plugin("nvidia.com/gpu")
        assert len(next(stub.ListAndWatch(pb.Empty(), timeout=5)).devices) == 6 * 10 + 10  # slots + single-strategy MIG
        ch.close()
        kubelet.stop()  # kubelet restarts: its socket is re-created
        time.sleep(0.3)
        kubelet2 = FakeKubelet(d).start()
        assert wait_for(lambda: len(kubelet2.registered) >= 1), "agent did not re-register after the kubelet restart"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=15) == 0
        out = open(log_path).read()
        assert "labels are off" in out and "FAKE NVML" in out
        assert not [f for f in os.listdir(d) if f.startswith("gpufleet-")], "plugin sockets left behind"
    finally:
        if proc.poll() is None:
            proc.kill()
        if kubelet2 is not None:
            kubelet2.stop()
        kubelet.stop()
        shutil.rmtree(d, ignore_errors=True)


def test_agent_exits_with_a_clear_message_on_bad_start(tmp_path):
    bad = tmp_path / "a.yaml"
    bad.write_text("migStrategy: mixd\n")
    for args, rc, msg in ((["--config", str(bad)], 2, "migStrategy must be mixed, single or none"),
                          (["--nvml", "fake:v100"], 2, "--nvml must be 'real' or fake:PROFILE"),
                          (["--nvml", "real"], 1, "no NVIDIA GPU/driver found")):
        p = subprocess.run([sys.executable, "-m", "gpufleet.cli.main", "agent", "--once", *args], capture_output=True, text=True,
                           timeout=60, env=dict(os.environ, GPUFLEET_FAKE_NVML="", GPUFLEET_NVML=""))
        if args == ["--nvml", "real"] and p.returncode == 0:
            assert "GPU(s)" in p.stdout  # a machine with a GPU: real discovery worked
            continue
        assert p.returncode == rc and msg in p.stdout + p.stderr, (args, p.stdout, p.stderr)


def test_config_typo_is_a_clear_error(tmp_path):
    p = tmp_path / "a.yaml"
    p.write_text("replica: 2\n")
    with pytest.raises(ConfigError, match="unknown key.*replica"):
        load_agent_config(p)
    p.write_text("replicas: 0\n")
    with pytest.raises(ConfigError, match="replicas must be"):
        load_agent_config(p)


def pod(name, annotation, node="n1", phase="Pending", created="2026-01-01T00:00:00Z", uid=""):
    return {"metadata": {"name": name, "namespace": "ml", "creationTimestamp": created, "uid": uid,
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


def test_pod_source_matches_resource_count_profile_and_node():
    two = json.dumps({"node": "n1", "gpus": [{"index": 1, "uuid": "GPU-a"}, {"index": 2, "uuid": "GPU-b"}], "gpu_milli": 1000})
    mig = json.dumps({"node": "n1", "gpus": [{"index": 0, "uuid": "GPU-a100-00"}], "gpu_milli": 0,
                      "mig": [{"gpu": 0, "instance_id": 3}], "mig_profile": "1g.10gb"})
    wrong_node = json.dumps({"node": "n2", "gpus": [{"index": 1, "uuid": "GPU-a"}]})
    pods = [pod("two", two, uid="u-two"), pod("mig", mig), pod("moved", wrong_node, created="2025-01-01T00:00:00Z")]
    assert pick(pods, "n1", "nvidia.com/gpu", 2, set()).pod_key == "ml/two"
    assert pick(pods, "n1", "nvidia.com/gpu", 1, set()) is None  # a 2-GPU pod is not a 1-device request
    assert pick(pods, "n1", "nvidia.com/gpu", 2, {"ml/two#u-two"}) is None  # served (checkpoint keys carry the UID)
    assert pick(pods, "n1", "nvidia.com/gpu", 2, {"ml/two"}).pod_key == "ml/two"  # same name, other UID: a new pod
    got = pick(pods, "n1", "nvidia.com/mig-1g.10gb", 1, set())
    assert got.pod_key == "ml/mig" and got.assignment.mig == ((0, 3),)
    assert pick(pods, "n1", "nvidia.com/mig-2g.20gb", 1, set()) is None


def test_pod_source_returns_an_unusable_assignment_of_a_pod_asking_for_those_devices():
    def asking(name, annotation, resource="nvidia.com/gpu", n="1", **kw):
        p = pod(name, annotation, **kw)
        p["spec"]["containers"] = [{"name": "c", "resources": {"limits": {resource: n}}}]
        return p

    good = json.dumps({"node": "n1", "gpus": [{"index": 1, "uuid": "GPU-t4-01"}], "gpu_milli": 500})
    moved = json.dumps({"node": "n2", "gpus": [{"index": 1, "uuid": "GPU-t4-01"}], "gpu_milli": 500})
    pods = [asking("broken", "{not json", created="2025-01-01T00:00:00Z"), asking("moved", moved, created="2025-01-02T00:00:00Z"),
            asking("mig", "{not json", resource="nvidia.com/mig-1g.10gb"), asking("ok", good)]
    assert pick(pods, "n1", "nvidia.com/gpu", 1, set()).pod_key == "ml/ok"  # a usable assignment first
    bad = pick(pods, "n1", "nvidia.com/gpu", 1, {"ml/ok"})
    assert isinstance(bad, InvalidAssignment) and bad.pod_key == "ml/broken" and "malformed" in bad.message
    bad = pick(pods, "n1", "nvidia.com/gpu", 1, {"ml/ok", "ml/broken"})
    assert bad.pod_key == "ml/moved" and "stale" in bad.message
    assert pick(pods, "n1", "nvidia.com/gpu", 2, set()) is None  # nobody asks for 2 devices
    assert pick(pods, "n1", "nvidia.com/mig-1g.10gb", 1, set()).pod_key == "ml/mig"


def test_pod_source_follows_binding_order_for_pods_created_in_the_same_second():
    a = json.dumps({"node": "n1", "gpus": [{"index": 1, "uuid": "GPU-t4-01"}], "gpu_milli": 500})
    b = json.dumps({"node": "n1", "gpus": [{"index": 2, "uuid": "GPU-t4-02"}], "gpu_milli": 300})
    pods = [pod("a", a), pod("b", b)]  # same creationTimestamp (one `kubectl create` of a list)
    pods[0]["metadata"]["resourceVersion"] = "912"  # bound second
    pods[1]["metadata"]["resourceVersion"] = "905"  # bound first: kubelet admits it first
    assert pick(pods, "n1", "nvidia.com/gpu", 1, set()).pod_key == "ml/b"
    assert pick(pods, "n1", "nvidia.com/gpu", 1, {"ml/b"}).pod_key == "ml/a"


def test_pod_source_takes_the_pod_kubelet_is_admitting_from_its_pod_list():
    a = json.dumps({"node": "n1", "gpus": [{"index": 1, "uuid": "GPU-t4-01"}], "gpu_milli": 500})
    b = json.dumps({"node": "n1", "gpus": [{"index": 2, "uuid": "GPU-t4-02"}], "gpu_milli": 300})
    pods = [pod("a", a), pod("b", b)]
    pods[0]["metadata"]["resourceVersion"] = "905"
    pods[1]["metadata"]["resourceVersion"] = "912"
    # kubelet added b to its pod list and is admitting it (a is not there yet): b, whatever the binding order
    assert pick(pods, "n1", "nvidia.com/gpu", 1, set(), admitting={("ml", "b")}).pod_key == "ml/b"
    # kubelet is admitting a pod another scheduler bound (no assignment): none of ours, kubelet's choice stands
    assert pick(pods, "n1", "nvidia.com/gpu", 1, set(), admitting={("ml", "foreign")}) is None


class _Refused(Exception):
    """What the kubernetes client raises with no API server to answer (urllib3's MaxRetryError has no status)."""


class _ApiError(Exception):
    def __init__(self, status):
        super().__init__(f"HTTP {status}")
        self.status = status


class FlakyCore:
    """``list_pod_for_all_namespaces`` raises the given errors in turn, then answers with ``pods``."""

    def __init__(self, errors, pods):
        self.errors, self.pods, self.calls = list(errors), pods, 0
        self.api_client = type("C", (), {"sanitize_for_serialization": staticmethod(lambda x: x)})()

    def list_pod_for_all_namespaces(self, field_selector):
        self.calls += 1
        if self.errors:
            raise self.errors.pop(0)
        return type("L", (), {"items": self.pods})()


@pytest.mark.parametrize("errors, api_wait_s, found, calls", [
    ([], 30.0, True, 1),
    # a kube-apiserver restart while kubelet admits the pod: wait for it, then the scheduler's GPUs
    ([_Refused("connection refused")] * 3, 30.0, True, 4),
    ([_ApiError(503), _ApiError(429)], 30.0, True, 3),
    # away for longer than the wait: the source cannot tell (worth another wait), after about api_wait_s
    ([_Refused("connection refused")] * 100, 5.0, "retry", None),
    # refused for good (403): nothing to wait for
    ([_ApiError(403)], 30.0, "final", 1),
    ([_Refused("connection refused")], 0.0, "retry", 1),
])
def test_pod_source_waits_for_an_api_server_that_does_not_answer(errors, api_wait_s, found, calls):
    from gpufleet.agent.plugin import PodsUnknown
    from gpufleet.agent.podsource import KubePodSource

    a = json.dumps({"node": "n1", "gpus": [{"index": 1, "uuid": "GPU-t4-01"}], "gpu_milli": 500})
    now = [0.0]
    core = FlakyCore(errors, [pod("a", a)])
    src = KubePodSource(core, "n1", api_wait_s=api_wait_s, sleep=lambda s: now.__setitem__(0, now[0] + s),
                        clock=lambda: now[0])
    if found is True:
        pa = src.pending_assignment("nvidia.com/gpu", 1, set())
        assert pa is not None and pa.pod_key == "ml/a"
    else:
        with pytest.raises(PodsUnknown) as e:
            src.pending_assignment("nvidia.com/gpu", 1, set())
        assert e.value.retry == (found == "retry") and "cannot list pods on n1" in str(e.value)
    if calls is not None:
        assert core.calls == calls
    else:
        assert now[0] == pytest.approx(api_wait_s) and core.calls > 3  # backed off up to the limit, not beyond


def test_a_served_pod_kubelet_admits_again_gets_its_own_gpus_not_the_next_pods():
    # a kubelet stopped mid-admission (its Allocate cancelled after the agent served w0) and the new kubelet
    # admits w0 again: kubelet lists it without devices, so it is w0 again, not w1 (seen on the real node)
    w0 = json.dumps({"node": "n1", "gpus": [{"index": 3, "uuid": "GPU-t4-03"}], "gpu_milli": 1000})
    w1 = json.dumps({"node": "n1", "gpus": [{"index": 4, "uuid": "GPU-t4-04"}], "gpu_milli": 1000})
    pods = [pod("w0", w0), pod("w1", w1)]
    pods[0]["metadata"]["resourceVersion"] = "905"
    pods[1]["metadata"]["resourceVersion"] = "912"
    waiting = {("ml", "w0"), ("ml", "w1")}
    again = pick(pods, "n1", "nvidia.com/gpu", 1, {"ml/w0"}, admitting=waiting)
    assert again.pod_key == "ml/w0" and again.again and again.gpu_uuids == ["GPU-t4-03"]
    assert not pick(pods, "n1", "nvidia.com/gpu", 1, set(), admitting=waiting).again
    # once kubelet recorded w0's devices it is no longer waiting: the next Allocate is w1's
    assert pick(pods, "n1", "nvidia.com/gpu", 1, {"ml/w0"}, admitting={("ml", "w1")}).pod_key == "ml/w1"
    # without kubelet's list, binding order and the served set decide, as before
    assert pick(pods, "n1", "nvidia.com/gpu", 1, {"ml/w0"}).pod_key == "ml/w1"
