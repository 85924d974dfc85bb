"""VolumeBinding and NodeVolumeLimits: bound, immediate and WaitForFirstConsumer claims, RWOP, attach limits."""

from __future__ import annotations

import dataclasses

from gpufleet.engine.constraints import ClaimInfo, PersistentVolume
from gpufleet.engine.model import Requirement, SelectorTerm
from gpufleet.engine.plugins.volumes import (
    MAX_VOLUMES,
    VOLUME_AFFINITY,
    NodeVolumeLimits,
    VolumeBinding,
)
from gpufleet.engine.podspec import parse_pod
from gpufleet.engine.state import ClusterState
from gpufleet.engine.volumes import VolumeCatalog

from tests.builders import verdicts

from ..builders import gpu_node, kpod, place


def _catalog():
    zone_a = (SelectorTerm((Requirement("topology.kubernetes.io/zone", "In", ("a",)),)),)
    return VolumeCatalog(
        claims={"default/data": ClaimInfo("default", "data", "pv1", "Bound"),
                "default/fresh": ClaimInfo("default", "fresh", "", "Pending", "wffc"),
                "default/d1": ClaimInfo("default", "d1", "pv2", "Bound"),
                "default/d2": ClaimInfo("default", "d2", "pv3", "Bound")},
        volumes={"pv1": PersistentVolume("pv1", zone_a), "pv2": PersistentVolume("pv2", (), "ebs.csi"),
                 "pv3": PersistentVolume("pv3", (), "ebs.csi")},
        binding_modes={"wffc": "WaitForFirstConsumer"},
        attach_limits={"n1": {"ebs.csi": 1}},
    )


def test_volume_binding():
    st = ClusterState([gpu_node("n1", labels={"topology.kubernetes.io/zone": "a"}),
                       gpu_node("n2", labels={"topology.kubernetes.io/zone": "b"})])
    st.volumes = _catalog()
    assert verdicts(VolumeBinding(), parse_pod(kpod("x", claims=("data",))), st) == {"n1": None, "n2": VOLUME_AFFINITY}
    v = verdicts(VolumeBinding(), parse_pod(kpod("x", claims=("missing",))), st)
    assert v["n1"] == v["n2"] == 'persistentvolumeclaim "missing" not found'
    v = verdicts(VolumeBinding(), parse_pod(kpod("x", claims=("fresh",))), st)
    assert v["n1"] == v["n2"] == "node(s) didn't find available persistent volumes to bind"  # WFFC, no PV, no provisioner
    st.volumes.claims["default/later"] = ClaimInfo("default", "later", "", "Pending", "standard")
    v = verdicts(VolumeBinding(), parse_pod(kpod("x", claims=("later",))), st)
    assert v["n1"] == 'pod has unbound immediate PersistentVolumeClaims (persistentvolumeclaim "later")'
    assert verdicts(VolumeBinding(), parse_pod(kpod("x")), st) == {"n1": None, "n2": None}


def test_node_volume_limits():
    st = ClusterState([gpu_node("n1"), gpu_node("n2")])
    st.volumes = _catalog()
    assert verdicts(NodeVolumeLimits(), parse_pod(kpod("x", claims=("d1",))), st) == {"n1": None, "n2": None}
    place(st, kpod("holder", claims=("d1",)), "n1")
    assert verdicts(NodeVolumeLimits(), parse_pod(kpod("x", claims=("d1",))), st)["n1"] is None  # same volume again
    assert verdicts(NodeVolumeLimits(), parse_pod(kpod("x", claims=("d2",))), st) == {"n1": MAX_VOLUMES, "n2": None}


def test_read_write_once_pod_and_zone_labelled_volumes():
    from gpufleet.engine.plugins.volumes import RWOP_IN_USE
    from gpufleet.engine.volumes import claim_from_json, pv_from_json

    st = ClusterState([gpu_node("n1", labels={"topology.kubernetes.io/zone": "a"}),
                       gpu_node("n2", labels={"topology.kubernetes.io/zone": "b"}),
                       gpu_node("n3", labels={"topology.kubernetes.io/zone": "c"})])
    solo = claim_from_json({"metadata": {"name": "solo", "namespace": "default"},
                            "spec": {"volumeName": "pvz", "accessModes": ["ReadWriteOncePod"]}})
    pvz = pv_from_json({"metadata": {"name": "pvz", "labels": {"topology.kubernetes.io/zone": "a__b"}}, "spec": {}})
    st.volumes = VolumeCatalog(claims={"default/solo": solo}, volumes={"pvz": pvz})
    assert verdicts(VolumeBinding(), parse_pod(kpod("x", claims=("solo",))), st) == {"n1": None, "n2": None, "n3": VOLUME_AFFINITY}
    place(st, kpod("holder", claims=("solo",)), "n1")
    assert set(verdicts(VolumeBinding(), parse_pod(kpod("x", claims=("solo",))), st).values()) == {RWOP_IN_USE}


def test_attach_limits_from_node_allocatable():
    from gpufleet.engine.volumes import pv_from_json

    n1 = dataclasses.replace(gpu_node("n1"), scalars=(("attachable-volumes-aws-ebs", 1),))
    n2 = dataclasses.replace(gpu_node("n2"), scalars=(("attachable-volumes-csi-ebs.csi.aws.com", 2),))
    st = ClusterState([n1, n2])
    ebs = [pv_from_json({"metadata": {"name": f"pv{i}"}, "spec": {"awsElasticBlockStore": {"volumeID": f"v{i}"}}}) for i in (1, 2)]
    assert ebs[0].driver == "ebs.csi.aws.com"
    st.volumes = VolumeCatalog(claims={f"default/c{i}": ClaimInfo("default", f"c{i}", f"pv{i}", "Bound") for i in (1, 2)},
                               volumes={p.name: p for p in ebs})
    place(st, kpod("a", claims=("c1",)), "n1")
    place(st, kpod("b", claims=("c1",)), "n2")
    assert verdicts(NodeVolumeLimits(), parse_pod(kpod("x", claims=("c2",))), st) == {"n1": MAX_VOLUMES, "n2": None}


def test_wait_for_first_consumer_static_and_dynamic():
    from gpufleet.engine.constraints import StorageClassInfo
    from gpufleet.engine.plugins.volumes import NO_PV_TO_BIND
    from gpufleet.engine.volumes import claim_from_json, plan_bindings, pv_from_json

    host = "kubernetes.io/hostname"
    nodes = [gpu_node(f"n{i}", labels={"topology.kubernetes.io/zone": "ab"[i % 2]}) for i in range(3)]
    st = ClusterState(nodes)

    def local_pv(name, node, size="100Gi", ref=None):
        spec = {"storageClassName": "local", "capacity": {"storage": size}, "accessModes": ["ReadWriteOnce"],
                "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [{"key": host, "operator": "In", "values": [node]}]}]}}}
        if ref:
            spec["claimRef"] = {"namespace": "default", "name": ref}
        return pv_from_json({"metadata": {"name": name}, "spec": spec})

    def claim(name, sc, size="50Gi"):
        return claim_from_json({"metadata": {"name": name, "namespace": "default"},
                                "spec": {"storageClassName": sc, "accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": size}}}})

    pvs = [local_pv("small", "n0", "10Gi"), local_pv("big", "n1", "200Gi"), local_pv("mid", "n1", "60Gi"), local_pv("other", "n2", ref="someone")]
    cat = VolumeCatalog(claims={"default/scratch": claim("scratch", "local"), "default/cloud": claim("cloud", "zonal")},
                        volumes={p.name: p for p in pvs},
                        classes={"local": StorageClassInfo("local", "WaitForFirstConsumer", "kubernetes.io/no-provisioner"),
                                 "zonal": StorageClassInfo("zonal", "WaitForFirstConsumer", "ebs.csi.aws.com",
                                                           (SelectorTerm((Requirement("topology.kubernetes.io/zone", "In", ("a",)),)),))})
    st.volumes = cat
    # static: only n1 has a PV big enough and free (n0's is too small, n2's is claimed by someone else)
    assert verdicts(VolumeBinding(), parse_pod(kpod("x", claims=("scratch",))), st) == {"n0": NO_PV_TO_BIND, "n1": None, "n2": NO_PV_TO_BIND}
    plan = plan_bindings(cat, "default", ("scratch",), nodes[1])
    assert [(c.name, pv) for c, pv in plan] == [("scratch", "mid")]  # the smallest that fits
    cat.assumed["mid"] = "default/elsewhere"  # promised to another claim: the next smallest
    assert [pv for _, pv in plan_bindings(cat, "default", ("scratch",), nodes[1])] == ["big"]
    # dynamic: the provisioner may create it in zone a only
    assert verdicts(VolumeBinding(), parse_pod(kpod("x", claims=("cloud",))), st) == {"n0": None, "n1": NO_PV_TO_BIND, "n2": None}
    assert [(c.name, pv) for c, pv in plan_bindings(cat, "default", ("cloud",), nodes[0])] == [("cloud", "")]
    assert plan_bindings(cat, "default", ("cloud",), nodes[1]) is None


def test_a_pv_matches_a_claim_only_with_its_volume_mode_and_attributes_class():
    """kube-scheduler's FindMatchingVolume: volumeMode and volumeAttributesClassName (GA in 1.34) must be equal,
    and a PV being deleted is never bound."""
    from gpufleet.engine.volumes import claim_from_json, pv_from_json

    def pv(name, **spec):
        meta = {"name": name}
        if spec.pop("deleting", False):
            meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
        return pv_from_json({"metadata": meta, "spec": {"storageClassName": "local", "capacity": {"storage": "10Gi"},
                                                        "accessModes": ["ReadWriteOnce"], **spec}})

    def claim(**spec):
        return claim_from_json({"metadata": {"name": "c", "namespace": "default"}, "spec": {
            "storageClassName": "local", "accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}, **spec}})

    pvs = [pv("fs"), pv("block", volumeMode="Block"), pv("gold", volumeAttributesClassName="gold"),
           pv("gone", deleting=True)]
    cat = VolumeCatalog(volumes={p.name: p for p in pvs})
    assert [p.name for p in cat.candidates(claim())] == ["fs"]
    assert [p.name for p in cat.candidates(claim(volumeMode="Block"))] == ["block"]
    assert [p.name for p in cat.candidates(claim(volumeAttributesClassName="gold"))] == ["gold"]


def test_a_driver_that_must_be_installed_keeps_pods_off_nodes_without_it():
    """VolumeLimitScaling (beta, on in 1.37): a CSIDriver with preventPodSchedulingIfMissing is needed on the node
    (its CSINode lists it), for a bound claim's PV and for an unbound claim's StorageClass provisioner alike."""
    from gpufleet.engine.constraints import StorageClassInfo
    from gpufleet.engine.plugins.volumes import NOT_INSTALLED
    from gpufleet.engine.volumes import claim_from_json, csidriver_required, csinode_drivers, pv_from_json

    st = ClusterState([gpu_node("with"), gpu_node("without")])
    bound_pv = pv_from_json({"metadata": {"name": "pv1"}, "spec": {"csi": {"driver": "disk.example.com", "volumeHandle": "v1"}}})
    claims = {"default/bound": claim_from_json({"metadata": {"name": "bound", "namespace": "default"},
                                                 "spec": {"volumeName": "pv1"}, "status": {"phase": "Bound"}}),
              "default/new": claim_from_json({"metadata": {"name": "new", "namespace": "default"},
                                               "spec": {"storageClassName": "fast", "accessModes": ["ReadWriteOnce"]}})}
    cat = VolumeCatalog(claims=claims, volumes={"pv1": bound_pv},
                        classes={"fast": StorageClassInfo("fast", "WaitForFirstConsumer", "disk.example.com")},
                        node_drivers=dict([csinode_drivers({"metadata": {"name": "with"}, "spec": {"drivers": [{"name": "disk.example.com"}]}}),
                                           csinode_drivers({"metadata": {"name": "without"}, "spec": {"drivers": []}})]))
    st.volumes = cat
    why = NOT_INSTALLED.format(driver="disk.example.com")
    for claim in ("bound", "new"):
        pod_ = parse_pod(kpod("x", claims=(claim,)))
        assert verdicts(NodeVolumeLimits(), pod_, st) == {"with": None, "without": None}  # the driver does not ask for it
        cat.required_drivers = frozenset(d for d, need in [csidriver_required(
            {"metadata": {"name": "disk.example.com"}, "spec": {"preventPodSchedulingIfMissing": True}})] if need)
        assert verdicts(NodeVolumeLimits(), pod_, st) == {"with": None, "without": why}
        cat.required_drivers = frozenset()


def test_a_claims_label_selector_picks_the_volumes_it_may_get():
    from gpufleet.engine.volumes import claim_from_json, pv_from_json

    def pv(name, labels):
        return pv_from_json({"metadata": {"name": name, "labels": labels}, "spec": {
            "storageClassName": "local", "capacity": {"storage": "10Gi"}, "accessModes": ["ReadWriteOnce"]}})

    def claim(selector):
        return claim_from_json({"metadata": {"name": "c", "namespace": "default"}, "spec": {
            "storageClassName": "local", "accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}},
            "selector": selector}})

    cat = VolumeCatalog(volumes={p.name: p for p in (pv("fast", {"tier": "nvme"}), pv("slow", {"tier": "hdd"}))})
    assert [p.name for p in cat.candidates(claim(None))] == ["fast", "slow"]
    assert [p.name for p in cat.candidates(claim({"matchLabels": {"tier": "nvme"}}))] == ["fast"]
    assert [p.name for p in cat.candidates(claim({"matchExpressions": [{"key": "tier", "operator": "NotIn", "values": ["nvme"]}]}))] == ["slow"]
    bad = claim({"matchExpressions": [{"key": "tier", "operator": "Gt", "values": ["1"]}]})
    assert "spec.selector" in bad.bad_selector and cat.candidates(bad) == []  # never silently any volume
