"""The GPU resource model against kubelet's device counting: kubelet never refuses what gpufleet placed.

kubelet admits a pod when it can hand it as many devices of each resource as it asks for; the scheduler
places pods on GPUs.  These tests drive the real scheduler loop (fake API server) and then play kubelet:
every bound pod asks the agent's device plugin (``GetPreferredAllocation`` then ``Allocate``) for its
devices out of what is still free, exactly as kubelet's device manager does.  Table-driven: node kinds
(gpufleet's agent with its default config, NVIDIA's plugin with replicas 1 / 4 / renamed / MIG strategies)
x request mixes.
"""

from __future__ import annotations

import json
import random

import pytest

from gpufleet.agent.config import AgentConfig
from gpufleet.agent.labels import inventory_json
from gpufleet.agent.nvml import FakeBackend
from gpufleet.agent.plugin import AssignmentRefused, DevicePlugin, GpuUse, PodAssignment, resources_for
from gpufleet.engine.inventory import assignment_from_json
from tests.kube.fake_api import FakeApi
from gpufleet.kube.convert import node_from_json
from gpufleet.kube.loop import SchedulerLoop
from gpufleet.policies import build_profile


class Clock:
    t = 0.0

    def __call__(self):
        return self.t


def agent_node(name="n1", profile="a100-mig", cfg=None):
    """A node as gpufleet's agent (default config unless given) publishes it, with kubelet's allocatable."""
    cfg = cfg or AgentConfig()
    be = FakeBackend(profile)
    gpus = be.gpus()
    res = resources_for(gpus, cfg.mig_strategy, cfg.replicas, cfg.rename_shared)
    alloc = {"cpu": "256", "memory": "2Ti", "pods": "500"}
    for r in res:
        dp = DevicePlugin(r, gpus, "/nonexistent", cfg.mig_strategy, cfg.replicas, slots=cfg.slots)
        alloc[r] = str(len(dp.devices))
    inv = inventory_json(gpus, {g.index: True for g in gpus}, gpu_slots=cfg.slots, gpu_resource=res[0])
    return {"metadata": {"name": name, "labels": {}, "annotations": {"gpufleet.io/gpu-inventory": inv}}, "spec": {},
            "status": {"allocatable": alloc, "conditions": [{"type": "Ready", "status": "True"}]}}


def nvidia_node(name="n1", gpus=4, replicas=1, strategy=None, rename=False, mig=None, mig_strategy="mixed"):
    """A node served by NVIDIA's device plugin + GFD (no gpufleet inventory)."""
    labels = {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB", "nvidia.com/gpu.memory": "81920",
              "nvidia.com/gpu.count": str(gpus), "nvidia.com/gpu.replicas": str(replicas),
              "nvidia.com/gpu.sharing-strategy": strategy or ("time-slicing" if replicas > 1 else "none"),
              "nvidia.com/mig.strategy": mig_strategy}
    alloc = {"cpu": "64", "memory": "512Gi", "pods": "110"}
    alloc["nvidia.com/gpu.shared" if rename else "nvidia.com/gpu"] = str(gpus * replicas)
    for prof, n in (mig or {}).items():
        alloc[f"nvidia.com/mig-{prof}"] = str(n)
    return {"metadata": {"name": name, "labels": labels, "annotations": {}}, "spec": {},
            "status": {"allocatable": alloc, "conditions": [{"type": "Ready", "status": "True"}]}}


def gpu_pod(name, kind, scheduler="gpufleet", node_name=None):
    """kind: ('whole', n) | ('milli', m) | ('mem', '10Gi') | ('mig', profile)."""
    k, v = kind
    ann: dict[str, str] = {}
    limits: dict[str, str] = {}
    if k == "whole":
        limits["nvidia.com/gpu"] = str(v)
    elif k == "milli":
        limits["nvidia.com/gpu"] = "1"
        ann["gpufleet.io/gpu-milli"] = str(v)
    elif k == "mem":
        limits["nvidia.com/gpu"] = "1"
        ann["gpufleet.io/gpu-memory"] = str(v)
    elif k == "mig":
        limits[f"nvidia.com/mig-{v}"] = "1"
    spec = {"schedulerName": scheduler, "containers": [{"name": "c", "resources": {
        "requests": {"cpu": "100m", "memory": "128Mi"}, "limits": limits}}]}
    if node_name:
        spec["nodeName"] = node_name
    return {"metadata": {"name": name, "namespace": "t", "annotations": ann, "uid": f"uid-{name}",
                         "creationTimestamp": f"2026-01-01T00:00:{len(name):02d}Z"}, "spec": spec, "status": {"phase": "Pending"}}


def requested_resource(pod) -> tuple[str, int]:
    (r, v), = pod["spec"]["containers"][0]["resources"]["limits"].items()
    return r, int(v)


class Kubelet:
    """kubelet's device manager for one node: per resource the free device IDs; admission = enough free devices,
    then GetPreferredAllocation (the plugin's choice) and Allocate."""

    def __init__(self, profile="a100-mig", cfg=None):
        cfg = cfg or AgentConfig()
        gpus = FakeBackend(profile).gpus()
        self.plugins = {r: DevicePlugin(r, gpus, "/nonexistent", cfg.mig_strategy, cfg.replicas, slots=cfg.slots,
                                        device_specs="none")
                        for r in resources_for(gpus, cfg.mig_strategy, cfg.replicas, cfg.rename_shared)}
        self.free = {r: [d.id for d in p.devices] for r, p in self.plugins.items()}
        self.held: dict[str, tuple[str, list[str]]] = {}
        self.assigned: dict[str, list[int]] = {}  # pod -> the GPU indices its gpufleet.io/assignment names (not MIG)
        self.refused: list[str] = []

    def admit(self, pod) -> list[str] | None:
        key = f"{pod['metadata']['namespace']}/{pod['metadata']['name']}"
        r, n = requested_resource(pod)
        plugin = self.plugins.get(r)
        if plugin is None or len(self.free[r]) < n:  # UnexpectedAdmissionError: requested number of devices unavailable
            self.refused.append(f"{key}: {r} wants {n}, {len(self.free.get(r, []))} free")
            return None
        text = (pod["metadata"].get("annotations") or {}).get("gpufleet.io/assignment")
        kubelet = self

        class Src:
            def gpu_use(self, resource, count):
                # what PodResources and the API tell the real agent: devices held, GPUs named by assignments
                by_device = {d: k for k, (_r, ids) in kubelet.held.items() for d in ids}
                by_gpu: dict[int, set[str]] = {}
                for k, gis in kubelet.assigned.items():
                    for gi in gis:
                        by_gpu.setdefault(gi, set()).add(k)
                return GpuUse(by_device, by_gpu, (key, pod["metadata"]["uid"]))

            def pending_assignment(self, resource, count, exclude):
                if not text:
                    return None
                a = assignment_from_json(key, text)
                return PodAssignment(key, a, [g.get("uuid", "") for g in json.loads(text)["gpus"]], pod["metadata"]["uid"])

        plugin.pods = Src()
        ids = plugin.prefer(list(self.free[r]), [], n)
        assert len(ids) == n and all(i in self.free[r] for i in ids)
        resp = plugin.allocate_one(ids)
        for i in ids:
            self.free[r].remove(i)
        self.held[key] = (r, ids)
        if text and not json.loads(text).get("mig"):
            self.assigned[key] = [g["index"] for g in json.loads(text)["gpus"]]
        return resp.envs["NVIDIA_VISIBLE_DEVICES"].split(",")

    def release(self, key):
        r, ids = self.held.pop(key)
        self.assigned.pop(key, None)
        self.free[r].extend(ids)


def record_foreign(api, kubelet):
    """The agent's ForeignPodRecorder against this fake kubelet's PodResources."""
    from gpufleet.agent.exporter import ContainerRef
    from gpufleet.agent.reconcile import kubelet_assignments

    holders: dict[str, list] = {}
    for key, (_r, ids) in kubelet.held.items():
        ns, name = key.split("/")
        for i in ids:
            holders.setdefault(i.split("::")[0], []).append(ContainerRef(ns, name, "c"))
    for (ns, name), text in kubelet_assignments("n1", FakeBackend("a100-mig").gpus(), holders, list(api.pods.values())).items():
        p = api.pods[f"{ns}/{name}"]
        p["metadata"]["annotations"]["gpufleet.io/assignment"] = text
        api.update_pod(p)


def run_stream(api, loop, kubelet, pods, deletes=()):
    """Create pods, schedule, admit every newly bound pod on the kubelet; returns {pod key: visible UUIDs}."""
    seen: dict[str, list[str]] = {}
    for p in pods:
        api.add_pod(p)
    loop.resync()
    loop.schedule_due()
    loop.binder.drain(block_s=0.5)
    for key, p in api.pods.items():
        if p["spec"].get("nodeName") and key not in kubelet.held and key not in seen:
            got = kubelet.admit(p)
            if got is not None:
                seen[key] = got
    return seen


def expected_uuids(pod, inv_gpus) -> list[str]:
    a = json.loads(pod["metadata"]["annotations"]["gpufleet.io/assignment"])
    if a.get("mig"):
        return [next(m["uuid"] for m in inv_gpus[g]["mig"] if m["instance_id"] == i) for g, i in
                ((x["gpu"], x["instance_id"]) for x in a["mig"])]
    return [g["uuid"] for g in a["gpus"]]


MIXES = {
    "two 500-milli shares (the issue's case), then a 5-GPU pod": [("milli", 500), ("milli", 500), ("whole", 5)],
    "ten 100-milli shares on one GPU, then whole GPUs": [("milli", 100)] * 10 + [("whole", 2), ("whole", 3)],
    "memory shares": [("mem", "10Gi")] * 12 + [("whole", 1)],
    "MIG mixed + whole + shares": [("mig", "1g.10gb")] * 3 + [("mig", "2g.20gb"), ("whole", 4), ("milli", 250), ("mem", "20Gi")],
}


@pytest.mark.parametrize("mix", sorted(MIXES))
def test_kubelet_never_refuses_what_the_scheduler_placed_default_agent_config(mix):
    api = FakeApi()
    api.add_node(agent_node())
    loop = SchedulerLoop(api, build_profile("bestfit"), clock=Clock())
    loop.resync()
    kubelet = Kubelet()
    pods = [gpu_pod(f"p{i}", k) for i, k in enumerate(MIXES[mix])]
    got = run_stream(api, loop, kubelet, pods)
    assert not kubelet.refused, kubelet.refused
    assert got, "nothing was placed"
    inv = {g.index: {"uuid": g.uuid, "mig": [{"instance_id": m.instance_id, "uuid": m.uuid} for m in g.mig]}
           for g in FakeBackend("a100-mig").gpus()}
    for key, uuids in got.items():
        assert uuids == expected_uuids(api.pods[key], inv), key  # the container sees exactly its assignment's GPUs
        _res, ids = kubelet.held[key]
        assert sorted({i.split("::")[0] for i in ids}) == sorted(uuids)  # and kubelet's own record (PodResources) too


def test_random_stream_with_deletions_and_foreign_pods_ours_never_refused_never_overcommitted():
    rng = random.Random(12)
    api = FakeApi()
    api.add_node(agent_node())
    loop = SchedulerLoop(api, build_profile("bestfit"), clock=Clock())
    loop.resync()
    kubelet = Kubelet()
    kinds = [("whole", 1), ("whole", 2), ("whole", 4), ("milli", 100), ("milli", 300), ("milli", 500),
             ("mem", "8Gi"), ("mem", "30Gi"), ("mig", "1g.10gb"), ("mig", "2g.20gb"), ("mig", "3g.40gb")]
    n = foreign_admitted = 0
    for rnd in range(12):
        batch = [gpu_pod(f"r{n + i}", rng.choice(kinds)) for i in range(rng.randint(3, 8))]
        n += len(batch)
        if rnd % 4 == 1:  # a pod another scheduler bound (kube-scheduler): no assignment, kubelet's/agent's choice
            f = gpu_pod(f"foreign{rnd}", ("whole", 1), scheduler="default-scheduler", node_name="n1")
            plugin = kubelet.plugins["nvidia.com/gpu"]
            used = {plugin.by_id[d].gpu_index for _r, ids in kubelet.held.values() for d in ids if d in plugin.by_id}
            used |= {gi for gis in kubelet.assigned.values() for gi in gis}
            try:
                admitted = kubelet.admit(f) is not None
            except AssignmentRefused:
                # the node guard: another scheduler's pod gets a GPU nobody uses, or is refused (never shared unasked)
                whole = {d.gpu_index for d in plugin.devices}  # the GPUs not MIG-partitioned
                assert used >= whole, f"refused {f['metadata']['name']} with GPUs {whole - used} free"
                admitted = False
            if admitted:
                foreign_admitted += 1
                api.add_pod(f)
                loop.resync()
                loop.schedule_due()
                record_foreign(api, kubelet)  # what the agent's loop does a moment later
        run_stream(api, loop, kubelet, batch)
        assert not kubelet.refused, kubelet.refused
        # physical GPUs: never more than 1000 milli and the GPU's memory
        milli: dict[int, int] = {}
        for key, (r, ids) in kubelet.held.items():
            p = api.pods[key]
            a = (p["metadata"].get("annotations") or {}).get("gpufleet.io/assignment")
            if a and not json.loads(a).get("mig"):
                d = json.loads(a)
                for g in d["gpus"]:
                    milli[g["index"]] = milli.get(g["index"], 0) + d["gpu_milli"]
            elif not a and r == "nvidia.com/gpu":
                for i in ids:  # a foreign pod holds its whole GPU
                    gi = kubelet.plugins[r].by_id[i].gpu_index
                    milli[gi] = milli.get(gi, 0) + 1000
        assert all(v <= 1000 for v in milli.values()), milli
        # deletions: a third of the running pods go away
        for key in rng.sample(sorted(kubelet.held), len(kubelet.held) // 3):
            kubelet.release(key)
            api.delete_pod(key)
    assert n > 50 and foreign_admitted >= 1, (n, foreign_admitted)


NVIDIA_NODES = [
    # (node kwargs, request mix, how many of them may bind)
    ({"gpus": 4, "replicas": 1}, [("milli", 500)] * 6, 4),       # replicas 1: never two shares on one GPU
    ({"gpus": 2, "replicas": 4}, [("milli", 250)] * 10, 8),      # 4 replicas per GPU: 8 shares
    ({"gpus": 2, "replicas": 4, "strategy": "mps"}, [("mem", "10Gi")] * 9, 8),
    ({"gpus": 4, "replicas": 4, "rename": True}, [("milli", 500), ("whole", 1)], 0),  # only nvidia.com/gpu.shared
    ({"gpus": 2, "mig": {"1g.10gb": 3}}, [("mig", "1g.10gb")] * 4, 3),  # mixed strategy: instances as advertised
    ({"gpus": 2, "replicas": 1}, [("whole", 1), ("milli", 300), ("milli", 300)], 2),
]


@pytest.mark.parametrize("kw, mix, want", NVIDIA_NODES)
def test_nvidia_plugin_nodes_get_only_what_that_plugin_can_serve(kw, mix, want):
    api = FakeApi()
    api.add_node(nvidia_node(**kw))
    loop = SchedulerLoop(api, build_profile("bestfit"), clock=Clock())
    loop.resync()
    for i, k in enumerate(mix):
        api.add_pod(gpu_pod(f"p{i}", k))
    loop.resync()
    loop.schedule_due()
    loop.binder.drain(block_s=0.5)
    bound = [p for p in api.pods.values() if p["spec"].get("nodeName")]
    assert len(bound) == want
    # kubelet's count for the plugin's resource is never exceeded
    node = nvidia_node(**kw)
    for res in {requested_resource(p)[0] for p in bound}:
        assert sum(requested_resource(p)[1] for p in bound if requested_resource(p)[0] == res) <= int(node["status"]["allocatable"].get(res, 0))


def test_explain_says_a_share_needs_a_free_replica_on_a_replicas_1_node():
    api = FakeApi()
    api.add_node(nvidia_node(gpus=1, replicas=1))
    loop = SchedulerLoop(api, build_profile("bestfit"), clock=Clock())
    loop.resync()
    api.add_pod(gpu_pod("a", ("milli", 500)))
    loop.resync()
    loop.schedule_due()
    loop.binder.drain(block_s=0.5)
    _summary, by_node = loop.explain(gpu_pod("b", ("milli", 300)))
    assert "kubelet device" in by_node["n1"] and "nvidia.com/gpu.replicas" in by_node["n1"], by_node


@pytest.mark.parametrize("labels, alloc, want_gpus, want_slots, want_mig", [
    ({"nvidia.com/gpu.replicas": "1"}, {"nvidia.com/gpu": "8"}, 8, 1, 0),
    ({"nvidia.com/gpu.replicas": "4", "nvidia.com/gpu.sharing-strategy": "time-slicing"}, {"nvidia.com/gpu": "32"}, 8, 4, 0),
    ({}, {"nvidia.com/gpu": "2"}, 2, 1, 0),  # no GFD at all: one device per GPU
    ({"nvidia.com/gpu.count": "8", "nvidia.com/mig.strategy": "mixed"},
     {"nvidia.com/gpu": "6", "nvidia.com/mig-1g.10gb": "7", "nvidia.com/mig-3g.40gb": "1"}, 6, 1, 8),
    ({"nvidia.com/mig.strategy": "single"}, {"nvidia.com/gpu": "14", "nvidia.com/mig-1g.10gb": "9"}, 14, 1, 0),
])
def test_node_model_from_nvidia_plugin_labels(labels, alloc, want_gpus, want_slots, want_mig):
    n = node_from_json({"metadata": {"name": "x", "labels": labels}, "status": {"allocatable": {"cpu": "8", **alloc}}})
    whole = [g for g in n.gpus if not g.mig_enabled]
    assert (len(whole), n.gpu_slots, sum(len(g.mig_instances) for g in n.gpus)) == (want_gpus, want_slots, want_mig)


@pytest.mark.parametrize("labels, field", [
    ({"nvidia.com/gpu.replicas": "zero"}, "nvidia.com/gpu.replicas"),
    ({"nvidia.com/gpu.replicas": "0"}, "nvidia.com/gpu.replicas"),
    ({"nvidia.com/gpu.sharing-strategy": "magic"}, "nvidia.com/gpu.sharing-strategy"),
])
def test_bad_gfd_labels_name_the_label(labels, field):
    from gpufleet.engine.errors import InvalidNodeSpec

    with pytest.raises(InvalidNodeSpec, match=field.replace(".", r"\.")):
        node_from_json({"metadata": {"name": "x", "labels": labels}, "status": {"allocatable": {"nvidia.com/gpu": "4"}}})


def test_agent_inventory_sets_slots_and_old_inventories_mean_one_device_per_gpu():
    n = node_from_json(agent_node())
    assert n.gpu_slots == 10
    old = agent_node()
    inv = json.loads(old["metadata"]["annotations"]["gpufleet.io/gpu-inventory"])
    del inv["gpu_slots"]
    old["metadata"]["annotations"]["gpufleet.io/gpu-inventory"] = json.dumps(inv)
    assert node_from_json(old).gpu_slots == 1


def test_allocatable_dropping_while_the_agent_restarts_keeps_the_bound_pods_and_blocks_new_ones():
    api = FakeApi()
    n = agent_node()
    api.add_node(n)
    loop = SchedulerLoop(api, build_profile("bestfit"), clock=Clock())
    loop.resync()
    api.add_pod(gpu_pod("w", ("whole", 2)))
    loop.resync()
    loop.schedule_due()
    loop.binder.drain(block_s=0.5)
    assert api.pods["t/w"]["spec"].get("nodeName") == "n1"
    # the agent restarts: kubelet has no healthy nvidia.com/gpu device; the node's allocatable says 0
    n["status"]["allocatable"]["nvidia.com/gpu"] = "0"
    api.update_node(n)
    loop.resync()
    assert "t/w" in loop.cache.state.assignments  # still holds its GPUs
    api.add_pod(gpu_pod("x", ("milli", 300)))
    loop.resync()
    loop.schedule_due()
    loop.binder.drain(block_s=0.5)
    assert not api.pods["t/x"]["spec"].get("nodeName")  # kubelet would refuse it now
    _summary, by_node = loop.explain(api.pods["t/x"])
    assert "kubelet" in by_node["n1"], by_node
    n["status"]["allocatable"]["nvidia.com/gpu"] = "60"
    api.update_node(n)
    loop.resync()
    loop.schedule_due()
    loop.binder.drain(block_s=0.5)
    a = json.loads(api.pods["t/x"]["metadata"]["annotations"]["gpufleet.io/assignment"])
    w = json.loads(api.pods["t/w"]["metadata"]["annotations"]["gpufleet.io/assignment"])
    assert not {g["index"] for g in a["gpus"]} & {g["index"] for g in w["gpus"]}
