"""The DRA kubelet plugin driven over real unix sockets the way kubelet drives it, without a cluster.

A fake kubelet does what kubelet's plugin watcher and DRA manager do: find the
registration socket in the registry directory, ``GetInfo``, check the type,
name and services, dial the advertised endpoint, ``NotifyRegistrationStatus``,
then call NodePrepareResources / NodeUnprepareResources and watch health, all
by the method paths kubelet 1.37 uses.
"""

from __future__ import annotations

import glob
import json
import os
import re
from pathlib import Path

import grpc
import pytest

from gpufleet.agent.dra import dra_health_v1_pb2 as hpb
from gpufleet.agent.dra import dra_v1_pb2 as pb
from gpufleet.agent.dra import pluginregistration_v1_pb2 as rpb
from gpufleet.agent.dra.cdi import CdiWriter
from gpufleet.agent.dra.devices import DraOptions
from gpufleet.agent.dra.driver import DraDriver
from gpufleet.agent.nvml import PROFILES

from .conftest import wait_for
from .dra_fake import FakeDraApi, claim, result

# kubelet's method paths (k8s.io/kubelet v0.37.2 api_grpc.pb.go)
PREPARE = "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodePrepareResources"
UNPREPARE = "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodeUnprepareResources"
GET_INFO = "/pluginregistration.Registration/GetInfo"
NOTIFY = "/pluginregistration.Registration/NotifyRegistrationStatus"
WATCH_HEALTH = "/v1.DRAResourceHealth/NodeWatchResources"
KUBELET_SERVICES = ["v1.DRAPlugin", "v1beta1.DRAPlugin"]
KUBELET_HEALTH = ["v1.DRAResourceHealth", "v1alpha1.DRAResourceHealth"]


def call(ch, path, req, resp_cls, timeout=10):
    return ch.unary_unary(path, request_serializer=lambda m: m.SerializeToString(),
                          response_deserializer=resp_cls.FromString)(req, timeout=timeout)


class FakeKubelet:
    """kubelet's plugin watcher + DRA plugin manager, reduced to the calls they make."""

    def __init__(self, registry_dir: str):
        self.registry_dir = registry_dir
        self.channel: grpc.Channel | None = None
        self.info: rpb.PluginInfo | None = None
        self.health_service = ""

    def discover(self) -> rpb.PluginInfo:
        socks = [p for p in glob.glob(os.path.join(self.registry_dir, "*")) if not os.path.basename(p).startswith(".")]
        assert len(socks) == 1, socks
        with grpc.insecure_channel(f"unix:{socks[0]}") as reg:
            info = call(reg, GET_INFO, rpb.InfoRequest(), rpb.PluginInfo)
            assert info.type == "DRAPlugin"
            chosen = next((s for s in info.supported_versions if s in KUBELET_SERVICES), None)
            assert chosen == "v1.DRAPlugin", info.supported_versions  # kubelet picks the first service it knows
            self.health_service = next((s for s in KUBELET_HEALTH if s in info.supported_versions), "")
            if self.channel is not None:
                self.channel.close()
            self.channel = grpc.insecure_channel("unix:" + info.endpoint)  # kubelet: "unix:" + endpoint
            grpc.channel_ready_future(self.channel).result(timeout=5)
            call(reg, NOTIFY, rpb.RegistrationStatus(plugin_registered=True), rpb.RegistrationStatusResponse)
        self.info = info
        return info

    def prepare(self, *claims):
        req = pb.NodePrepareResourcesRequest(claims=[pb.Claim(namespace=ns, name=n, uid=u) for ns, n, u in claims])
        return call(self.channel, PREPARE, req, pb.NodePrepareResourcesResponse)

    def unprepare(self, *claims):
        req = pb.NodeUnprepareResourcesRequest(claims=[pb.Claim(namespace=ns, name=n, uid=u) for ns, n, u in claims])
        return call(self.channel, UNPREPARE, req, pb.NodeUnprepareResourcesResponse)

    def close(self):
        if self.channel is not None:
            self.channel.close()


class Node:
    def __init__(self, root: Path, api: FakeDraApi):
        self.root, self.api = root, api
        self.drv, self.gpus = PROFILES["a100-mig"]
        self.driver: DraDriver | None = None

    def start_agent(self) -> DraDriver:
        d = DraDriver(self.api, "node-a", DraOptions(), str(self.root / "state"), CdiWriter(str(self.root / "cdi")),
                      plugins_dir=str(self.root / "plugins"), registry_dir=str(self.root / "reg"))
        d.events.api = None
        d.update(self.gpus, self.drv, {g.index: True for g in self.gpus}, {})
        d.start()
        d.step()
        self.driver = d
        return d


@pytest.fixture
def node(sockdir):
    api = FakeDraApi()
    n = Node(Path(sockdir), api)
    yield n
    if n.driver is not None:
        n.driver.stop()


def test_registration_prepare_unprepare_and_restarts(node):
    api = node.api
    d = node.start_agent()
    assert len(api.slices) == 1  # published
    kubelet = FakeKubelet(str(node.root / "reg"))
    try:
        info = kubelet.discover()
        assert info.name == "gpu.gpufleet.io" and info.endpoint == str(node.root / "plugins" / "gpu.gpufleet.io" / "dra.sock")
        assert os.path.basename(glob.glob(str(node.root / "reg" / "*"))[0]) == "gpu.gpufleet.io-reg.sock"
        assert kubelet.health_service == "v1.DRAResourceHealth"
        assert wait_for(d.registered)

        api.add_claim(claim("train", "uid-1", [result("gpu-2"), result("gpu-3")], pods=("trainer",)))
        api.add_claim(claim("late", "uid-2", [result("gpu-3")], pods=("other",)))
        api.add_claim(claim("share", "uid-3", [result("gpu-4", shareID="0f0e0d0c-0000-4000-8000-000000000001",
                                                      consumedCapacity={"memory": "20Gi", "gpuMilli": "250"})]))
        resp = kubelet.prepare(("default", "train", "uid-1"), ("default", "late", "uid-2"), ("default", "ghost", "uid-9"),
                               ("default", "share", "uid-3"))
        assert set(resp.claims) == {"uid-1", "uid-2", "uid-9", "uid-3"}  # every claim gets its own answer
        ok = resp.claims["uid-1"]
        assert ok.error == ""
        assert [(list(x.request_names), x.pool_name, x.device_name, list(x.cdi_device_ids)) for x in ok.devices] == [
            (["gpu"], "node-a", "gpu-2", ["k8s.gpu.gpufleet.io/claim=uid-1-gpu"]), (["gpu"], "node-a", "gpu-3", [])]
        assert "default/late" in resp.claims["uid-2"].error and "default/train" in resp.claims["uid-2"].error
        assert "ResourceClaim default/ghost not found" in resp.claims["uid-9"].error
        (sh,) = resp.claims["uid-3"].devices
        assert sh.share_id == "0f0e0d0c-0000-4000-8000-000000000001" and sh.HasField("share_id")
        assert not resp.claims["uid-1"].devices[0].HasField("share_id")
        spec = json.loads((node.root / "cdi" / "k8s.gpu.gpufleet.io-claim_uid-1.json").read_text())
        assert "NVIDIA_VISIBLE_DEVICES=GPU-a100-02,GPU-a100-03" in spec["devices"][0]["containerEdits"]["env"]

        # kubelet restarts: it wipes the node's slices and re-reads the registry directory
        api.wipe_slices("node-a")
        assert wait_for(lambda: d.publisher is not None and d.publisher._dirty.is_set())
        d.step()
        assert len(api.slices) == 1
        kubelet.discover()
        again = kubelet.prepare(("default", "train", "uid-1"))  # idempotent
        assert [x.device_name for x in again.claims["uid-1"].devices] == ["gpu-2", "gpu-3"]

        # the agent restarts: new sockets (kubelet's watcher registers them again), state from the checkpoint
        d.stop()
        assert not os.path.exists(d.plugin.reg_socket)
        del api.claims["default/train"]  # unprepare must not need the claim object
        d = node.start_agent()
        kubelet.discover()
        assert wait_for(d.registered)
        late = kubelet.prepare(("default", "late", "uid-2"))
        assert "default/train" in late.claims["uid-2"].error  # still held: nothing was lost
        un = kubelet.unprepare(("default", "train", "uid-1"), ("default", "never", "uid-0"))
        assert un.claims["uid-1"].error == "" and un.claims["uid-0"].error == ""
        assert [x.device_name for x in kubelet.prepare(("default", "late", "uid-2")).claims["uid-2"].devices] == ["gpu-3"]
        assert not (node.root / "cdi" / "k8s.gpu.gpufleet.io-claim_uid-1.json").exists()
    finally:
        kubelet.close()


def test_sockets_wiped_under_the_agent_are_recreated(node):
    d = node.start_agent()
    os.unlink(d.plugin.reg_socket)
    assert not d.plugin.serving()
    d.step()
    assert d.plugin.serving() and d.restarts == 1
    kubelet = FakeKubelet(str(node.root / "reg"))
    try:
        kubelet.discover()
    finally:
        kubelet.close()


def test_health_stream_follows_xids_and_recovery(node):
    d = node.start_agent()
    kubelet = FakeKubelet(str(node.root / "reg"))
    try:
        kubelet.discover()
        stream = kubelet.channel.unary_stream(WATCH_HEALTH, request_serializer=lambda m: m.SerializeToString(),
                                              response_deserializer=hpb.NodeWatchResourcesResponse.FromString)(
            hpb.NodeWatchResourcesRequest(), timeout=30)
        first = next(stream)
        health = {x.device.device_name: x.health for x in first.devices}
        assert health["gpu-2"] == hpb.HEALTHY and len(health) == 16
        assert all(x.device.pool_name == "node-a" and x.health_check_timeout_seconds == 60 for x in first.devices)
        ok = {g.index: g.index != 1 for g in node.gpus}
        d.update(node.gpus, node.drv, ok, {1: "XID 79"})
        msg = next(stream)
        bad = {x.device.device_name: (x.health, x.message) for x in msg.devices if x.health != hpb.HEALTHY}
        assert bad == {n: (hpb.UNHEALTHY, "XID 79") for n in ("gpu-1-mig-3g40gb-0", "gpu-1-mig-2g20gb-1", "gpu-1-mig-2g20gb-2")}
        d.step()
        (s,) = node.api.slices.values()
        tainted = [x["name"] for x in s["spec"]["devices"] if x.get("taints")]
        assert tainted == ["gpu-1-mig-3g40gb-0", "gpu-1-mig-2g20gb-1", "gpu-1-mig-2g20gb-2"]
        d.update(node.gpus, node.drv, {g.index: True for g in node.gpus}, {})
        assert all(x.health == hpb.HEALTHY for x in next(stream).devices)
        d.step()
        (s,) = node.api.slices.values()
        assert not any(x.get("taints") for x in s["spec"]["devices"])
        stream.cancel()
    finally:
        kubelet.close()


def _fields(proto: str) -> dict[str, set[tuple[str, int]]]:
    """message -> {(field, number)} of a .proto file (comments removed)."""
    text = re.sub(r"//[^\n]*|/\*.*?\*/", "", proto, flags=re.S)
    out = {}
    for m in re.finditer(r"message\s+(\w+)\s*\{([^{}]*)\}", text):
        out[m.group(1)] = {(f.group(1), int(f.group(2))) for f in re.finditer(r"(\w+)\s*=\s*(\d+)\s*;", m.group(2))}
    return out


@pytest.mark.parametrize("ours, theirs", [("dra_v1.proto", "dra/v1/api.proto"),
                                          ("pluginregistration_v1.proto", "pluginregistration/v1/api.proto"),
                                          ("dra_health_v1.proto", "dra-health/v1/api.proto")])
def test_protos_match_kubelets(ours, theirs):
    """Our .proto files against k8s.io/kubelet's, when the Go module cache has them (the lead's 1.37 build)."""
    cache = os.environ.get("GOMODCACHE") or os.path.expanduser("~/go/pkg/mod")
    found = sorted(glob.glob(os.path.join(cache, "k8s.io", "kubelet@v0.37.*", "pkg", "apis", theirs)))
    if not found:
        pytest.skip("k8s.io/kubelet v0.37 sources not in the Go module cache")
    mine = (Path(__file__).parents[2] / "src" / "gpufleet" / "agent" / "dra" / ours).read_text()
    ref = Path(found[-1]).read_text()
    assert re.search(r"^package\s+([\w.]+);", mine, re.M).group(1) == re.search(r"^package\s+([\w.]+);", ref, re.M).group(1)
    assert _fields(mine) == _fields(ref)
