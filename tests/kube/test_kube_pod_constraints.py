"""Pod-to-pod and volume constraints through the live scheduler on a real kube-apiserver (envtest tier).

Deployment-like replicas with required anti-affinity, spread over three zones,
pod affinity to a running pod, host-port conflicts, a PersistentVolume with
node affinity.  Nodes carry ``kubernetes.io/hostname`` and zone labels as a
kubelet and a cloud provider would set them.
"""

from __future__ import annotations

import pytest

from gpufleet.kube.runner import wait_until

from .test_kube_scheduler import Sched, bound, events

pytestmark = pytest.mark.apiserver  # needs KUBEBUILDER_ASSETS (tests/apiserver_support.py)

HOST = "kubernetes.io/hostname"
ZONE = "topology.kubernetes.io/zone"


@pytest.fixture
def ns(core):
    import uuid

    name = f"pc-{uuid.uuid4().hex[:6]}"
    core.create_namespace({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
    return name


@pytest.fixture
def zoned_nodes(core):
    made: list[str] = []

    def make(prefix: str, zones: dict[str, str]) -> dict[str, str]:
        out = {}
        for short, zone in zones.items():
            name = f"{prefix}-{short}"
            core.create_node({"apiVersion": "v1", "kind": "Node",
                              "metadata": {"name": name, "labels": {HOST: name, ZONE: zone}}})
            made.append(name)
            res = {"cpu": "8", "memory": "32Gi", "pods": "110"}
            core.patch_node_status(name, {"status": {"capacity": res, "allocatable": res, "conditions": [
                {"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "test",
                 "lastHeartbeatTime": None, "lastTransitionTime": None}]}})
            out[name] = zone
        return out

    yield make
    for n in made:
        from kubernetes.client.exceptions import ApiException

        try:
            core.delete_node(n)
        except ApiException as exc:  # already gone
            print(f"node {n}: {exc.status}")


def cpu_pod(name: str, labels: dict, **spec) -> dict:
    # only zoned nodes (these tests' own): a node another test left behind never takes a replica or changes a count
    affinity = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": ZONE, "operator": "Exists"}]}]}}, **spec.pop("affinity", {})}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": labels},
            "spec": {"schedulerName": "gpufleet", "affinity": affinity, "containers": [{"name": "c", "image": "busybox",
                     "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}}}], **spec}}


def anti(app: str, key: str = HOST) -> dict:
    return {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
        {"labelSelector": {"matchLabels": {"app": app}}, "topologyKey": key}]}}


def failed(core, ns: str, pod: str) -> list[str]:
    return [e.message for e in events(core, ns) if e.reason == "FailedScheduling" and e.involved_object.name == pod]


def test_anti_affinity_spread_affinity_and_ports(control_plane, core, ns, zoned_nodes):
    zone = zoned_nodes(ns, {"a1": "a", "a2": "a", "b1": "b", "c1": "c"})
    s = Sched(str(control_plane.kubeconfig))
    try:
        # Deployment-like replicas with required hostname anti-affinity: one per node, the fifth waits
        for i in range(5):
            core.create_namespaced_pod(ns, cpu_pod(f"web-{i}", {"app": "web"}, affinity=anti("web")))
        assert wait_until(lambda: sum(n.startswith("web") for n in bound(core, ns)) == 4, 20)
        webs = [p for n, p in bound(core, ns).items() if n.startswith("web")]
        assert len({p.spec.node_name for p in webs}) == 4
        pending = next(f"web-{i}" for i in range(5) if f"web-{i}" not in bound(core, ns))
        assert wait_until(lambda: any("4 node(s) didn't match pod anti-affinity rules" in m for m in failed(core, ns, pending)), 10), \
            failed(core, ns, pending)
        # six replicas spread over the three zones with maxSkew 1: two per zone
        tsc = [{"maxSkew": 1, "topologyKey": ZONE, "whenUnsatisfiable": "DoNotSchedule",
                "labelSelector": {"matchLabels": {"app": "spread"}}}]
        for i in range(6):
            core.create_namespaced_pod(ns, cpu_pod(f"spread-{i}", {"app": "spread"}, topologySpreadConstraints=tsc))
        assert wait_until(lambda: sum(n.startswith("spread") for n in bound(core, ns)) == 6, 20)
        per_zone: dict[str, int] = {}
        for n, p in bound(core, ns).items():
            if n.startswith("spread"):
                per_zone[zone[p.spec.node_name]] = per_zone.get(zone[p.spec.node_name], 0) + 1
        assert per_zone == {"a": 2, "b": 2, "c": 2}
        # pod affinity to a running pod's zone
        core.create_namespaced_pod(ns, cpu_pod("db", {"app": "db"}, nodeSelector={HOST: f"{ns}-b1"}))
        assert wait_until(lambda: "db" in bound(core, ns), 20)
        aff = {"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
            {"labelSelector": {"matchLabels": {"app": "db"}}, "topologyKey": ZONE}]}}
        for i in range(3):
            core.create_namespaced_pod(ns, cpu_pod(f"near-{i}", {"app": "near"}, affinity=aff))
        assert wait_until(lambda: sum(n.startswith("near") for n in bound(core, ns)) == 3, 20)
        assert {zone[p.spec.node_name] for n, p in bound(core, ns).items() if n.startswith("near")} == {"b"}
        # host ports: the second pod asking for 8080 on the same node waits, naming the ports
        port = {"containers": [{"name": "c", "image": "busybox", "ports": [{"containerPort": 8080, "hostPort": 8080}],
                                "resources": {"requests": {"cpu": "100m"}}}], "nodeSelector": {HOST: f"{ns}-c1"}}
        for i in range(2):
            body = cpu_pod(f"port-{i}", {"app": "port"})
            body["spec"].update(port)
            core.create_namespaced_pod(ns, body)
        assert wait_until(lambda: sum(n.startswith("port") for n in bound(core, ns)) == 1, 20)
        waiting = next(f"port-{i}" for i in range(2) if f"port-{i}" not in bound(core, ns))
        assert wait_until(lambda: any("didn't have free ports for the requested pod ports" in m for m in failed(core, ns, waiting)), 10)
    finally:
        s.stop()


def test_persistent_volume_node_affinity_and_missing_claim(control_plane, core, ns, zoned_nodes):
    zoned_nodes(ns, {"x": "a", "y": "b"})
    pv = f"{ns}-pv"
    core.create_persistent_volume({
        "apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": pv},
        "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"], "storageClassName": "local",
                 "local": {"path": "/mnt/data"}, "claimRef": {"namespace": ns, "name": "data"},
                 "nodeAffinity": {"required": {"nodeSelectorTerms": [
                     {"matchExpressions": [{"key": HOST, "operator": "In", "values": [f"{ns}-y"]}]}]}}}})
    core.create_namespaced_persistent_volume_claim(ns, {
        "apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": "data"},
        "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": "local", "volumeName": pv,
                 "resources": {"requests": {"storage": "1Gi"}}}})
    s = Sched(str(control_plane.kubeconfig))
    try:
        vol = [{"name": "d", "persistentVolumeClaim": {"claimName": "data"}}]
        for i in range(3):
            core.create_namespaced_pod(ns, cpu_pod(f"user-{i}", {"app": "user"}, volumes=vol))
        core.create_namespaced_pod(ns, cpu_pod("lost", {"app": "lost"},
                                               volumes=[{"name": "d", "persistentVolumeClaim": {"claimName": "nope"}}]))
        assert wait_until(lambda: sum(n.startswith("user") for n in bound(core, ns)) == 3, 20)
        assert {p.spec.node_name for n, p in bound(core, ns).items() if n.startswith("user")} == {f"{ns}-y"}
        assert wait_until(lambda: any('persistentvolumeclaim "nope" not found' in m for m in failed(core, ns, "lost")), 10)
        assert "lost" not in bound(core, ns)
    finally:
        s.stop()
        core.delete_persistent_volume(pv)


def test_wait_for_first_consumer_local_volume_and_provisioning(control_plane, admin, core, ns, zoned_nodes):
    """A local PV of a WaitForFirstConsumer class is chosen for the pod's node and promised to the claim; the
    test then plays the PV controller (and, for the provisioned claim, the external provisioner)."""
    from kubernetes import client

    storage = client.StorageV1Api(admin)
    zoned_nodes(ns, {"x": "a", "y": "b"})
    local, csi = f"{ns}-local", f"{ns}-csi"
    storage.create_storage_class({"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass", "metadata": {"name": local},
                                  "provisioner": "kubernetes.io/no-provisioner", "volumeBindingMode": "WaitForFirstConsumer"})
    storage.create_storage_class({"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass", "metadata": {"name": csi},
                                  "provisioner": "disk.csi.example.com", "volumeBindingMode": "WaitForFirstConsumer",
                                  "allowedTopologies": [{"matchLabelExpressions": [{"key": ZONE, "values": ["a"]}]}]})
    pv = f"{ns}-local-y"
    core.create_persistent_volume({"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": pv},
        "spec": {"capacity": {"storage": "100Gi"}, "accessModes": ["ReadWriteOnce"], "storageClassName": local,
                 "local": {"path": "/mnt/nvme"}, "nodeAffinity": {"required": {"nodeSelectorTerms": [
                     {"matchExpressions": [{"key": HOST, "operator": "In", "values": [f"{ns}-y"]}]}]}}}})
    for name, sc in (("scratch", local), ("data", csi)):
        core.create_namespaced_persistent_volume_claim(ns, {"apiVersion": "v1", "kind": "PersistentVolumeClaim",
            "metadata": {"name": name}, "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": sc,
                                                  "resources": {"requests": {"storage": "10Gi"}}}})
    s = Sched(str(control_plane.kubeconfig))
    made = []
    try:
        for name, claim in (("local-user", "scratch"), ("cloud-user", "data")):
            core.create_namespaced_pod(ns, cpu_pod(name, {"app": name}, volumes=[{"name": "d", "persistentVolumeClaim": {"claimName": claim}}]))
        # the scheduler promises the local PV to the claim, and asks for the other claim to be provisioned in zone a
        assert wait_until(lambda: (core.read_persistent_volume(pv).spec.claim_ref or client.V1ObjectReference()).name == "scratch", 20)
        sel = "volume.kubernetes.io/selected-node"
        assert wait_until(lambda: sel in (core.read_namespaced_persistent_volume_claim("data", ns).metadata.annotations or {}), 20)
        assert core.read_namespaced_persistent_volume_claim("data", ns).metadata.annotations[sel] == f"{ns}-x"
        assert not bound(core, ns)  # both wait for their volumes
        # the PV controller binds the local claim; the provisioner creates a PV on the selected node and binds it
        core.patch_namespaced_persistent_volume_claim("scratch", ns, {"spec": {"volumeName": pv}})
        prov = f"{ns}-pvc-data"
        made.append(prov)
        core.create_persistent_volume({"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": prov},
            "spec": {"capacity": {"storage": "10Gi"}, "accessModes": ["ReadWriteOnce"], "storageClassName": csi,
                     "csi": {"driver": "disk.csi.example.com", "volumeHandle": "vol-1"},
                     "claimRef": {"namespace": ns, "name": "data"},
                     "nodeAffinity": {"required": {"nodeSelectorTerms": [
                         {"matchExpressions": [{"key": ZONE, "operator": "In", "values": ["a"]}]}]}}}})
        core.patch_namespaced_persistent_volume_claim("data", ns, {"spec": {"volumeName": prov}})
        assert wait_until(lambda: len(bound(core, ns)) == 2, 20)
        b = bound(core, ns)
        assert b["local-user"].spec.node_name == f"{ns}-y" and b["cloud-user"].spec.node_name == f"{ns}-x"
    finally:
        s.stop()
        for name in [pv, *made]:
            core.delete_persistent_volume(name)
        storage.delete_storage_class(local)
        storage.delete_storage_class(csi)
