"""``gpufleet_pod_gpu_allocated``: how much of each GPU a container holds, and its workload, for autoscaling on a
pod's use of its own part of a GPU (deploy/autoscaling divides the utilisation series by it)."""

from __future__ import annotations

import json
import shutil

import pytest

from gpufleet.agent.exporter import (
    ALLOCATED_LABELS,
    ALLOCATED_METRIC,
    CgroupResolver,
    GpuCollector,
    KubeletPodResources,
    KubeNodePods,
    PodMeta,
    held_fraction,
    pod_index_from_json,
    pod_meta_from_json,
    workload_of,
)
from gpufleet.agent.nvml import FakeBackend

from .test_exporter_prometheus import ASSIGNED, INDEX, PODS, Kubelet, backend, by, cgroup_v1, cgroup_v2, scrape


@pytest.fixture
def kubelet():
    k = Kubelet(PODS)
    k.start()
    yield k
    k.srv.stop(0).wait()
    shutil.rmtree(k.dir, ignore_errors=True)


@pytest.fixture
def proc(tmp_path):
    for pid, text in {100: cgroup_v2("train"), 200: cgroup_v2("a"), 300: cgroup_v1("b"), 400: cgroup_v2("x", "besteffort"),
                      500: cgroup_v2("y")}.items():
        (tmp_path / str(pid)).mkdir()
        (tmp_path / str(pid) / "cgroup").write_text(text)
    return str(tmp_path)


def owned(kind: str, name: str, labels: dict | None = None, controller: bool = True) -> dict:
    return {"metadata": {"name": "p", "labels": labels or {},
                         "ownerReferences": [{"kind": "Foo", "name": "other"}, {"kind": kind, "name": name, "controller": controller}]}}


@pytest.mark.parametrize("pod, want", [
    (owned("ReplicaSet", "infer-7d4b9c8f6", {"pod-template-hash": "7d4b9c8f6"}), ("Deployment", "infer")),
    (owned("ReplicaSet", "my-rs", {"pod-template-hash": "7d4b9c8f6"}), ("ReplicaSet", "my-rs")),  # not a Deployment's name
    (owned("ReplicaSet", "infer-7d4b9c8f6"), ("ReplicaSet", "infer-7d4b9c8f6")),  # no hash label: a bare ReplicaSet
    (owned("StatefulSet", "db"), ("StatefulSet", "db")),
    (owned("Job", "train-1"), ("Job", "train-1")),
    ({"metadata": {"name": "solo"}}, ("Pod", "solo")),
    ({"metadata": {"name": "p", "ownerReferences": [{"kind": "DaemonSet", "name": "ds"}]}}, ("DaemonSet", "ds")),  # no controller flag
])
def test_workload_of(pod, want):
    assert workload_of(pod) == want


def assignment(gpus, milli=0, mem=None, mig=None, profile=None) -> str:
    d: dict = {"node": "n", "gpus": [{"index": i, "uuid": u} for i, u in gpus], "gpu_milli": milli,
               "gpu_memory_mib": mem or [0] * len(gpus)}
    if mig:
        d["mig"] = [{"gpu": g, "instance_id": k} for g, k in mig]
        d["mig_profile"] = profile
    return json.dumps(d)


def pod(ns, name, ann=None, owner=None, labels=None):
    meta: dict = {"namespace": ns, "name": name, "annotations": {"gpufleet.io/assignment": ann} if ann else {},
                  "labels": labels or {}}
    if owner:
        meta["ownerReferences"] = [{"kind": owner[0], "name": owner[1], "controller": True}]
    return {"metadata": meta}


def test_pod_meta_from_assignments():
    meta = pod_meta_from_json([
        pod("a", "share", assignment([(2, "G2")], milli=300), ("StatefulSet", "s")),
        pod("a", "mem", assignment([(2, "G2")], mem=[4096])),
        pod("a", "mig", assignment([(1, "G1")], mig=[(1, 0), (1, 2)], profile="2g.20gb")),
        pod("a", "whole", assignment([(0, "G0"), (3, "G3")], milli=1000)),
        pod("a", "broken", "{not json"),
        pod("a", "none"),
    ])
    assert meta[("a", "share")] == PodMeta(300, {}, {}, "StatefulSet", "s")
    assert meta[("a", "mem")].gpu_memory_mib == {"G2": 4096} and meta[("a", "mem")].gpu_milli == 0
    assert meta[("a", "mig")].mig == {"G1": pytest.approx(4 / 7)}
    assert meta[("a", "whole")] == PodMeta(0, {}, {}, "Pod", "whole")
    assert meta[("a", "broken")] == PodMeta(0, {}, {}, "Pod", "broken")  # a malformed assignment is no assignment
    assert meta[("a", "none")] == PodMeta(0, {}, {}, "Pod", "none")


def test_held_fraction():
    a100 = FakeBackend("a100-mig").gpus()
    t4 = FakeBackend("t4").gpus()[0]
    whole = PodMeta()
    assert held_fraction(t4, t4.uuid, whole) == 1.0
    assert held_fraction(t4, t4.uuid, PodMeta(250)) == 0.25
    assert held_fraction(t4, t4.uuid, PodMeta(0, {t4.uuid: 3840})) == 0.25  # 3840 of the T4's 15360 MiB
    assert held_fraction(t4, t4.uuid, PodMeta(0, {"other": 3840})) == 1.0
    inst = a100[1].mig[0]  # 3g.40gb
    assert held_fraction(a100[1], inst.uuid, whole) == pytest.approx(3 / 7)
    assert held_fraction(a100[1], a100[1].uuid, PodMeta(0, {}, {a100[1].uuid: 2 / 7})) == pytest.approx(2 / 7)


# the pods of test_exporter's node, with assignments: share-x 300 milli, share-y a 3840 MiB memory share (a quarter
# of a T4), train a Deployment's pod, the time-sliced pods none (each sees the whole GPU)
META_PODS = [
    pod("ml", "train", None, ("ReplicaSet", "train-5f6d"), {"pod-template-hash": "5f6d"}),
    pod("ml", "a"), pod("web", "b"),
    pod("web", "share-x", assignment([(2, "GPU-t4-02")], milli=300), ("ReplicaSet", "srv-abc12")),
    pod("web", "share-y", assignment([(2, "GPU-t4-02")], mem=[3840])),
]


def collector(kubelet, proc, meta, assignments=lambda: ASSIGNED):
    resolver = CgroupResolver(lambda: pod_index_from_json(INDEX), proc_root=proc)
    return GpuCollector(backend(), "node-1", KubeletPodResources(kubelet.sock), resolver, assignments=assignments, pod_meta=meta)


def test_allocated_per_container_and_use_of_its_own_part(kubelet, proc):
    seen = []
    fams = scrape(collector(kubelet, proc, lambda want: seen.append(set(want)) or pod_meta_from_json(META_PODS)))
    assert seen == [{("ml", "train"), ("ml", "a"), ("web", "b"), ("web", "share-x"), ("web", "share-y")}]
    for s in fams[ALLOCATED_METRIC].samples:
        assert set(s.labels) == set(ALLOCATED_LABELS)
    held = by(fams, ALLOCATED_METRIC, "gpu", "namespace", "pod", "container", "workload_kind", "workload")
    assert held == {("0", "ml", "train", "main", "Deployment", "train"): 1.0,
                    ("1", "ml", "a", "worker", "Pod", "a"): 1.0, ("1", "web", "b", "infer", "Pod", "b"): 1.0,
                    ("2", "web", "share-x", "srv", "ReplicaSet", "srv-abc12"): 0.3,
                    ("2", "web", "share-y", "srv", "Pod", "share-y"): 0.25}
    util = by(fams, "DCGM_FI_DEV_GPU_UTIL", "namespace", "pod")
    # share-x keeps 30% of the GPU busy: all of the 0.3 it holds; share-y 20% of the GPU: 80% of its quarter
    assert util[("web", "share-x")] / 0.3 == pytest.approx(100)
    assert util[("web", "share-y")] / 0.25 == pytest.approx(80)


def test_no_allocations_without_a_trustworthy_denominator(kubelet, proc):
    # no pod metadata source (an agent without API access): no series at all
    assert ALLOCATED_METRIC not in scrape(collector(kubelet, proc, None))

    def down(_want):
        raise OSError("apiserver away")

    assert ALLOCATED_METRIC not in scrape(collector(kubelet, proc, down))

    def no_assignments():
        raise OSError("apiserver away")

    # the pods could be listed once, but the assignments not now: kubelet's device guess is not used as the truth
    assert ALLOCATED_METRIC not in scrape(collector(kubelet, proc, lambda w: pod_meta_from_json(META_PODS), no_assignments))
    # a pod the list does not have yet gets no series (the others do)
    fams = scrape(collector(kubelet, proc, lambda w: pod_meta_from_json(META_PODS[1:])))
    assert "train" not in {s.labels["pod"] for s in fams[ALLOCATED_METRIC].samples}
    assert len(fams[ALLOCATED_METRIC].samples) == 4


def test_mig_instances_count_as_their_slices():
    k = Kubelet([("ml", "mig", [("c", "nvidia.com/mig-3g.40gb", ["MIG-a100-1-0"])]),
                 ("ml", "small", [("c", "nvidia.com/mig-1g.10gb", ["MIG-a100-0-3"])])])
    k.start()
    try:
        col = GpuCollector(FakeBackend("a100-mig"), "n", KubeletPodResources(k.sock),
                           pod_meta=lambda w: pod_meta_from_json([pod("ml", "mig"), pod("ml", "small")]))
        held = by(scrape(col), ALLOCATED_METRIC, "gpu", "pod")
        assert held == {("1", "mig"): pytest.approx(3 / 7, abs=1e-6), ("0", "small"): pytest.approx(1 / 7, abs=1e-6)}
    finally:
        k.srv.stop(0).wait()
        shutil.rmtree(k.dir, ignore_errors=True)


class FakeCore:
    """list_pod_for_all_namespaces as the official client answers it (objects with sanitize_for_serialization)."""

    def __init__(self, pods):
        self.pods, self.calls = pods, 0
        self.api_client = self

    def sanitize_for_serialization(self, x):
        return x

    def list_pod_for_all_namespaces(self, field_selector):
        self.calls += 1
        assert field_selector == "spec.nodeName=n1"
        return type("L", (), {"items": list(self.pods)})()


def test_node_pods_are_read_again_when_kubelet_reports_a_new_pod(monkeypatch):
    import gpufleet.agent.exporter as ex

    now = [1000.0]
    monkeypatch.setattr(ex.time, "monotonic", lambda: now[0])
    core = FakeCore([pod("ml", "a")])
    np_ = KubeNodePods(core, "n1", ttl_s=15, min_refresh_s=2)
    assert set(np_.pod_meta({("ml", "a")})) == {("ml", "a")} and core.calls == 1
    core.pods.append(pod("ml", "b"))  # a new replica kubelet already runs
    now[0] += 1
    assert ("ml", "b") not in np_.pod_meta({("ml", "b")}) and core.calls == 1  # not more often than every 2 s
    now[0] += 1.5
    assert ("ml", "b") in np_.pod_meta({("ml", "b")}) and core.calls == 2
    now[0] += 3
    np_.pod_meta({("ml", "a")})
    assert core.calls == 2  # nothing new: the list is kept for its TTL
