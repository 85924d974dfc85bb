"""The 1.3x pod semantics side by side: the same scenario under the stock kube-scheduler and under gpufleet.

Each scenario runs twice on one kube-apiserver (1.37 in CI; every scenario not marked ``needs_137`` also on
1.35, the oldest supported minor): once with its pods addressed to the stock kube-scheduler of the same
release running against it, once to gpufleet's scheduler; both must reach the outcome the scenario states
(which pods bind, on which node where only one is right, which wait).  Only the scenario's own nodes exist
while it runs, so the two schedulers see the same cluster.  Both run with ``TaintTolerationComparisonOperators``
and, on 1.37, the Workload API (``GenericWorkload``, ``scheduling.k8s.io/v1beta1``) on.  Nodes have no
kubelet: a running pod's in-place resize is played by writing what kubelet would (``pods/resize``, then
``pods/status``), and the PV controller's part likewise.

Needs ``$KUBEBUILDER_ASSETS`` with kube-apiserver, etcd and kube-scheduler of one release, 1.35 or later;
scenarios marked ``needs_137`` are deselected (and said so) on older assets.  The fields and what gpufleet
does with each: docs/pod-fields.md.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from gpufleet.kube.runner import wait_until

from tests.apiserver_support import ASSETS, HAVE_ASSETS, ControlPlane, _free_port, api_client, assets_release, stop_process
from .test_kube_scheduler import Sched

pytestmark = pytest.mark.apiserver  # needs KUBEBUILDER_ASSETS (tests/apiserver_support.py)

KUBE = "kube-scheduler"  # the stock scheduler's profile name (pods say schedulerName: kube-scheduler)
GPUFLEET = "gpufleet"
HOST = "kubernetes.io/hostname"
ZONE = "topology.kubernetes.io/zone"
SETTLE_S = 3.0  # how long a pod that must wait is watched not to bind
RELEASE = assets_release()
FLOOR = (1, 35)  # the oldest supported minor: every scenario not marked needs_137 runs there too
# each needs_137 scenario says which 1.37 feature 1.35 lacks (scripts/compat.py lists the reason in the table)
needs_137_features = pytest.mark.min_release(
    1, 37, reason="NodeDeclaredFeatures (node.status.declaredFeatures, restartPolicyRules) is GA in 1.37, "
    "not on by default in 1.35")
needs_137 = pytest.mark.min_release(
    1, 37, reason="the Workload / PodGroup API (scheduling.k8s.io/v1beta1, GenericWorkload) exists from 1.37 only")
needs_137_volumes = pytest.mark.min_release(
    1, 37, reason="VolumeLimitScaling (CSIDriver preventPodSchedulingIfMissing) is on by default from 1.37 (beta), not in 1.35")
# on for both schedulers: toleration comparison operators (alpha since 1.35); the Workload API (beta, off) on 1.37
GATES = (f"--feature-gates=TaintTolerationComparisonOperators=true{',GenericWorkload=true' if RELEASE >= (1, 37) else ''}",)
RUNTIME = ("--runtime-config=scheduling.k8s.io/v1beta1=true",) if RELEASE >= (1, 37) else ()


def _release(binary: Path) -> tuple[int, int]:
    out = subprocess.run([str(binary), "--version"], capture_output=True, text=True, timeout=30).stdout
    m = re.search(r"v(\d+)\.(\d+)", out)
    return (int(m.group(1)), int(m.group(2))) if m else (0, 0)


@pytest.fixture(scope="module")
def cp137():
    bins = Path(ASSETS)
    if not HAVE_ASSETS or not (bins / "kube-scheduler").is_file():
        pytest.skip("KUBEBUILDER_ASSETS with kube-apiserver, etcd and kube-scheduler not set")
    if _release(bins / "kube-scheduler") != RELEASE or RELEASE < FLOOR:
        pytest.skip(f"the side-by-side tier needs kube-apiserver and kube-scheduler of one release, {FLOOR[0]}.{FLOOR[1]} or later")
    d = Path(tempfile.mkdtemp(prefix="gpufleet-k137-"))
    cp = ControlPlane(ASSETS, d, extra_args=(*GATES, *RUNTIME))
    try:
        cp.start()
        yield cp
    finally:
        cp.stop()
        shutil.rmtree(d, ignore_errors=True)


@pytest.fixture(scope="module")
def schedulers(cp137):
    """kube-scheduler 1.37 (its own process, profile ``kube-scheduler``) and gpufleet (``gpufleet``), both running."""
    cfg = cp137.dir / "kube-scheduler.yaml"
    cfg.write_text(f"""apiVersion: kubescheduler.config.k8s.io/v1
kind: KubeSchedulerConfiguration
clientConnection: {{kubeconfig: "{cp137.kubeconfig}"}}
leaderElection: {{leaderElect: false}}
profiles:
- schedulerName: {KUBE}
""")
    log = open(cp137.dir / "kube-scheduler.log", "wb")
    proc = subprocess.Popen([str(Path(ASSETS) / "kube-scheduler"), f"--config={cfg}", f"--secure-port={_free_port()}",
                             "--bind-address=127.0.0.1", f"--authentication-kubeconfig={cp137.kubeconfig}",
                             f"--authorization-kubeconfig={cp137.kubeconfig}", *GATES, "-v=2"],
                            stdout=log, stderr=subprocess.STDOUT)
    s = Sched(str(cp137.kubeconfig))
    try:
        yield proc
    finally:
        s.stop()
        stop_process(proc, 10)
        log.close()


@pytest.fixture(scope="module")
def api137(cp137):
    return api_client(cp137.kubeconfig)


@dataclass
class Cluster:
    """One run of a scenario for one scheduler: its nodes and pods, and the outcome it must reach."""

    api: object
    scheduler: str
    ns: str = field(default_factory=lambda: f"k137-{uuid.uuid4().hex[:6]}")
    nodes: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        from kubernetes import client

        self.core = client.CoreV1Api(self.api)
        self.custom = client.CustomObjectsApi(self.api)
        self.core.create_namespace({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": self.ns}})
        self.prefix = "k" if self.scheduler == KUBE else "g"

    def node_name(self, short: str) -> str:
        return f"{self.prefix}-{self.ns}-{short}"

    def node(self, short: str, cpu: str = "4", gpus: int = 0, labels: dict | None = None, taints: list | None = None,
             declared: list[str] | None = None) -> str:
        name = self.node_name(short)
        lab = {HOST: name, **(labels or {})}
        if gpus:
            lab.update({"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB", "nvidia.com/gpu.memory": "81920",
                        "nvidia.com/gpu.count": str(gpus), "nvidia.com/gpu.replicas": "1"})
        self.core.create_node({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": lab},
                               "spec": {"taints": taints or []}})
        self.nodes.append(name)
        res = {"cpu": cpu, "memory": "64Gi", "pods": "110", **({"nvidia.com/gpu": str(gpus)} if gpus else {})}
        status: dict = {"capacity": res, "allocatable": res, "conditions": [
            {"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "test",
             "lastHeartbeatTime": None, "lastTransitionTime": None}]}
        if declared is not None:
            status["declaredFeatures"] = declared
        self.core.patch_node_status(name, {"status": status})
        return name

    def pod(self, name: str, cpu: str = "100m", gpus: int = 0, labels: dict | None = None, node: str | None = None,
            container: dict | None = None, **spec) -> None:
        res: dict = {"requests": {"cpu": cpu, "memory": "64Mi"}}
        if gpus:
            res["limits"] = {"nvidia.com/gpu": str(gpus)}
        c = {"name": "c", "image": "busybox", "resources": res, **(container or {})}
        body = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": labels or {}},
                "spec": {"schedulerName": self.scheduler, "containers": [c], **spec}}
        if node:
            body["spec"]["nodeName"] = self.node_name(node)
        self.core.create_namespaced_pod(self.ns, body)

    def podgroup(self, name: str, min_count: int | None) -> None:
        policy = {"gang": {"minCount": min_count}} if min_count is not None else {"basic": {}}
        self.custom.create_namespaced_custom_object("scheduling.k8s.io", "v1beta1", self.ns, "podgroups", {
            "apiVersion": "scheduling.k8s.io/v1beta1", "kind": "PodGroup", "metadata": {"name": name},
            "spec": {"schedulingPolicy": policy}})

    def group_condition(self, name: str) -> tuple[str, str] | None:
        """(status, reason) of a PodGroup's PodGroupInitiallyScheduled condition, as the scheduler wrote it."""
        pg = self.custom.get_namespaced_custom_object("scheduling.k8s.io", "v1beta1", self.ns, "podgroups", name)
        for c in (pg.get("status") or {}).get("conditions") or []:
            if c.get("type") == "PodGroupInitiallyScheduled":
                return c.get("status"), c.get("reason")
        return None

    def placed(self) -> dict[str, str | None]:
        return {p.metadata.name: p.spec.node_name for p in self.core.list_namespaced_pod(self.ns).items}

    def expect(self, want: dict[str, str | None], bound_count: int | None = None) -> dict[str, str | None]:
        """Wait until every pod ``want`` places is bound (to that node; ``*``: any), then check for SETTLE_S
        that the pods it leaves waiting (None) stay so; ``bound_count``: how many of all pods are bound."""
        def short(n: str | None) -> str | None:
            return n[len(self.node_name("")):] if n else None

        def done() -> bool:
            now = self.placed()
            ok = all(now.get(p) is not None and (w == "*" or short(now[p]) == w) for p, w in want.items() if w)
            return ok and (bound_count is None or sum(v is not None for v in now.values()) >= bound_count)

        wait_until(done, 60)
        time.sleep(SETTLE_S)
        got = {p: short(n) for p, n in self.placed().items()}
        view = {p: ("*" if want.get(p) == "*" and n else n) for p, n in got.items() if p in want}
        assert view == want, f"{self.scheduler}: {got}"
        if bound_count is not None:
            assert sum(v is not None for v in got.values()) == bound_count, f"{self.scheduler}: {got}"
        return got

    def events(self) -> list[str]:
        return [f"{e.involved_object.name}: {e.reason}: {e.message}" for e in self.core.list_namespaced_event(self.ns).items]

    def cleanup(self) -> None:
        for p in self.core.list_namespaced_pod(self.ns).items:
            self.core.delete_namespaced_pod(p.metadata.name, self.ns, grace_period_seconds=0)
        wait_until(lambda: not self.core.list_namespaced_pod(self.ns).items, 30)
        for n in self.nodes:
            self.core.delete_node(n)


@pytest.fixture(params=[KUBE, GPUFLEET])
def cluster(request, api137, schedulers):
    c = Cluster(api137, request.param)
    try:
        yield c
    finally:
        c.cleanup()


# --- pod-level resources (PodLevelResources, beta, on) ----------------------------------------


def test_pod_level_requests_take_the_node(cluster):
    cluster.node("n1", cpu="4")
    cluster.pod("big", cpu="1", resources={"requests": {"cpu": "3"}})  # containers 1 CPU, the pod 3
    cluster.expect({"big": "n1"})
    cluster.pod("next", cpu="2")
    cluster.expect({"big": "n1", "next": None})


def test_pod_level_limits_default_requests_to_the_containers_sum(cluster):
    cluster.node("n1", cpu="4")
    cluster.pod("a", cpu="1", resources={"limits": {"cpu": "4", "memory": "1Gi"}})  # request defaults to 1 CPU, not 4
    cluster.pod("b", cpu="3")
    cluster.expect({"a": "n1", "b": "n1"})


# --- in-place resize (InPlacePodVerticalScaling, GA) --------------------------------------------


def _kubelet_status(cluster: Cluster, pod: str, allocated: str, actual: str, condition: dict | None) -> None:
    """What kubelet writes during a resize: allocated and actuated cpu, and the resize condition."""
    from kubernetes import client

    res = {"cpu": allocated, "memory": "64Mi"}
    status: dict = {"phase": "Running", "containerStatuses": [{
        "name": "c", "image": "busybox", "imageID": "", "ready": True, "restartCount": 0, "started": True,
        "state": {"running": {"startedAt": "2026-01-01T00:00:00Z"}},
        "allocatedResources": res, "resources": {"requests": {"cpu": actual, "memory": "64Mi"}}}]}
    conds = [{"type": "PodScheduled", "status": "True"}, {"type": "Ready", "status": "True"}]
    if condition:
        conds.append({**condition, "status": "True", "lastProbeTime": None, "lastTransitionTime": None})
    status["conditions"] = conds
    client.CoreV1Api(cluster.api).patch_namespaced_pod_status(pod, cluster.ns, {"status": status})


def _remove_resize_conditions(cluster: Cluster, pod: str) -> None:
    p = cluster.core.read_namespaced_pod_status(pod, cluster.ns)
    keep = [c for c in p.status.conditions if c.type not in ("PodResizePending", "PodResizeInProgress")]
    body = [{"op": "replace", "path": "/status/conditions", "value": cluster.api.sanitize_for_serialization(keep)}]
    cluster.core.patch_namespaced_pod_status(pod, cluster.ns, body)


def _resize(cluster: Cluster, pod: str, cpu: str) -> None:
    cluster.core.patch_namespaced_pod_resize(pod, cluster.ns, {"spec": {"containers": [
        {"name": "c", "resources": {"requests": {"cpu": cpu, "memory": "64Mi"}}}]}})


def test_a_pending_resize_holds_the_desired_size_until_it_is_infeasible(cluster):
    cluster.node("n1", cpu="4")
    cluster.pod("web", cpu="1", node="n1")  # running there (bound before this scenario)
    _kubelet_status(cluster, "web", "1", "1", None)
    _resize(cluster, "web", "3")  # desired 3 CPUs; kubelet defers it: allocated still 1
    _kubelet_status(cluster, "web", "1", "1", {"type": "PodResizePending", "reason": "Deferred", "message": "node is full"})
    cluster.pod("batch", cpu="2")
    cluster.expect({"web": "n1", "batch": None})  # 4 - 3 < 2: the resize holds its desired size
    _kubelet_status(cluster, "web", "1", "1", {"type": "PodResizePending", "reason": "Infeasible", "message": "too big"})
    cluster.expect({"web": "n1", "batch": "n1"})  # infeasible: only the allocated CPU counts


def test_a_resize_down_in_progress_holds_the_old_size_until_actuated(cluster):
    cluster.node("n1", cpu="4")
    cluster.pod("web", cpu="3", node="n1")
    _kubelet_status(cluster, "web", "3", "3", None)
    _resize(cluster, "web", "1")  # down to 1 CPU: allocated, not actuated yet
    _kubelet_status(cluster, "web", "1", "3", {"type": "PodResizeInProgress", "reason": "", "message": ""})
    cluster.pod("batch", cpu="2")
    cluster.expect({"web": "n1", "batch": None})
    _remove_resize_conditions(cluster, "web")
    _kubelet_status(cluster, "web", "1", "1", None)  # kubelet actuated it
    cluster.expect({"web": "n1", "batch": "n1"})


# --- node declared features (NodeDeclaredFeatures, GA in 1.37) ----------------------------------


@needs_137_features
def test_a_pod_needing_a_node_feature_goes_only_where_it_is_declared(cluster):
    cluster.node("old", cpu="8", declared=[])
    cluster.node("new", cpu="8", declared=["RestartAllContainersOnContainerExits"])
    rule = {"restartPolicy": "Never", "restartPolicyRules": [
        {"action": "RestartAllContainers", "exitCodes": {"operator": "In", "values": [42]}}]}
    for i in range(3):
        cluster.pod(f"r{i}", cpu="100m", container=rule)
    cluster.pod("plain", cpu="7", nodeSelector={HOST: cluster.node_name("old")})
    cluster.expect({"r0": "new", "r1": "new", "r2": "new", "plain": "old"})


# --- native gangs (Workload / PodGroup API, GenericWorkload, beta in 1.37) ------------------------


def _members(cluster: Cluster, group: str, names: list[str], gpus: int) -> None:
    for n in names:
        cluster.pod(n, cpu="1", gpus=gpus, schedulingGroup={"podGroupName": group})


@needs_137
def test_a_gang_that_does_not_fit_binds_nothing_until_it_does(cluster):
    cluster.node("n1", cpu="16", gpus=4)
    cluster.node("n2", cpu="16", gpus=4)
    cluster.podgroup("train", 3)
    _members(cluster, "train", ["w0", "w1", "w2"], gpus=4)
    cluster.expect({"w0": None, "w1": None, "w2": None})  # two of three would fit: none binds
    assert wait_until(lambda: cluster.group_condition("train") == ("False", "Unschedulable"), 20), cluster.group_condition("train")
    cluster.node("n3", cpu="16", gpus=4)
    got = cluster.expect({"w0": "*", "w1": "*", "w2": "*"})
    assert len(set(got.values())) == 3
    assert wait_until(lambda: cluster.group_condition("train") == ("True", "Scheduled"), 20), cluster.group_condition("train")


@needs_137
def test_a_gang_binds_once_its_last_member_exists(cluster):
    cluster.node("n1", cpu="16", gpus=4)
    cluster.podgroup("job", 2)
    _members(cluster, "job", ["w0"], gpus=2)
    cluster.expect({"w0": None})
    assert cluster.group_condition("job") is None  # waiting for its members: nothing written yet
    _members(cluster, "job", ["w1"], gpus=2)
    cluster.expect({"w0": "n1", "w1": "n1"})


@needs_137
def test_members_wait_for_their_pod_group_to_appear(cluster):
    cluster.node("n1", cpu="16", gpus=4)
    _members(cluster, "late", ["w0", "w1"], gpus=1)
    cluster.expect({"w0": None, "w1": None})
    cluster.podgroup("late", 2)
    cluster.expect({"w0": "n1", "w1": "n1"})


@needs_137
def test_members_must_share_their_pod_groups_priority(cluster):
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    sched = client.SchedulingV1Api(cluster.api)
    pc = f"{cluster.prefix}-{cluster.ns}-high"
    sched.create_priority_class({"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass", "metadata": {"name": pc},
                                 "value": 1000})
    try:
        cluster.node("n1", cpu="16", gpus=4)
        for group in ("mixed", "same"):
            cluster.custom.create_namespaced_custom_object("scheduling.k8s.io", "v1beta1", cluster.ns, "podgroups", {
                "apiVersion": "scheduling.k8s.io/v1beta1", "kind": "PodGroup", "metadata": {"name": group},
                "spec": {"schedulingPolicy": {"gang": {"minCount": 1}}, "priorityClassName": pc}})
        _members(cluster, "mixed", ["m0"], gpus=1)  # priority 0 in a group of priority 1000: the group is refused
        cluster.pod("s0", cpu="1", gpus=1, schedulingGroup={"podGroupName": "same"}, priorityClassName=pc)
        cluster.expect({"m0": None, "s0": "n1"})
    finally:
        try:
            sched.delete_priority_class(pc)
        except ApiException as exc:
            print(f"cleanup: {exc.status}")


@needs_137
def test_a_basic_pod_group_places_its_pods_one_by_one(cluster):
    cluster.node("n1", cpu="16", gpus=4)
    cluster.node("n2", cpu="16", gpus=4)
    cluster.podgroup("svc", None)
    _members(cluster, "svc", ["s0", "s1", "s2"], gpus=4)
    cluster.expect({}, bound_count=2)


# --- fields gpufleet already honoured, now checked against kube-scheduler 1.37 ---------------------


def _anti(labels: dict, **term) -> dict:
    return {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
        {"labelSelector": {"matchLabels": labels}, "topologyKey": HOST, **term}]}}


def test_match_label_keys_in_pod_anti_affinity(cluster):
    cluster.node("n1")
    cluster.node("n2")
    aff = _anti({"app": "web"}, matchLabelKeys=["version"])  # one pod per node per version
    for name, v in (("v1-a", "v1"), ("v1-b", "v1"), ("v1-c", "v1"), ("v2-a", "v2")):
        cluster.pod(name, labels={"app": "web", "version": v}, affinity=aff)
    cluster.expect({"v1-a": "*", "v1-b": "*", "v1-c": None, "v2-a": "*"})


def test_mismatch_label_keys_keep_tenants_apart(cluster):
    cluster.node("n1")
    cluster.node("n2")
    aff = {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
        {"labelSelector": {"matchExpressions": [{"key": "tenant", "operator": "Exists"}]}, "topologyKey": HOST,
         "mismatchLabelKeys": ["tenant"]}]}}
    cluster.pod("x", labels={"tenant": "x"}, affinity=aff)
    cluster.expect({"x": "*"})
    cluster.pod("y", labels={"tenant": "y"}, affinity=aff)
    cluster.expect({"x": "*", "y": "*"})
    cluster.pod("x2", labels={"tenant": "x"}, affinity=aff)  # only next to x
    cluster.pod("z", labels={"tenant": "z"}, affinity=aff)  # no node without another tenant
    got = cluster.expect({"x": "*", "y": "*", "x2": "*", "z": None})
    assert got["x2"] == got["x"] != got["y"]


def _spread(labels: dict, **kw) -> list[dict]:
    return [{"maxSkew": 1, "topologyKey": ZONE, "whenUnsatisfiable": "DoNotSchedule", "labelSelector": {"matchLabels": labels}, **kw}]


def test_min_domains_in_topology_spread(cluster):
    cluster.node("a1", labels={ZONE: "a"})
    cluster.node("b1", labels={ZONE: "b"})
    for i in range(3):  # two zones, minDomains 3: at most one pod per zone
        cluster.pod(f"p{i}", labels={"app": "md"}, topologySpreadConstraints=_spread({"app": "md"}, minDomains=3))
    cluster.expect({}, bound_count=2)


def test_node_taints_and_affinity_policies_in_topology_spread(cluster):
    taint = [{"key": "dedicated", "value": "x", "effect": "NoSchedule"}]
    cluster.node("a1", labels={ZONE: "a"}, taints=taint)
    cluster.node("b1", labels={ZONE: "b"})
    # Honor: the tainted zone is not a domain, so every pod may go to zone b
    for i in range(2):
        cluster.pod(f"h{i}", labels={"app": "h"}, topologySpreadConstraints=_spread({"app": "h"}, nodeTaintsPolicy="Honor"))
    # Ignore (the default): zone a counts with 0 pods, so zone b takes one
    for i in range(2):
        cluster.pod(f"i{i}", labels={"app": "i"}, topologySpreadConstraints=_spread({"app": "i"}))
    # nodeAffinityPolicy Ignore: zone a counts although the pods may not go there
    not_a = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": ZONE, "operator": "NotIn", "values": ["a"]}]}]}}}
    for i in range(2):
        cluster.pod(f"f{i}", labels={"app": "f"}, affinity=not_a,
                    topologySpreadConstraints=_spread({"app": "f"}, nodeAffinityPolicy="Ignore"))
    got = cluster.expect({"h0": "b1", "h1": "b1"}, bound_count=4)
    assert sum(1 for p, n in got.items() if p.startswith("i") and n) == 1
    assert sum(1 for p, n in got.items() if p.startswith("f") and n) == 1


def test_scheduling_gates(cluster):
    cluster.node("n1")
    cluster.pod("gated", schedulingGates=[{"name": "example.com/quota"}])
    cluster.pod("free")
    cluster.expect({"gated": None, "free": "n1"})
    cluster.core.patch_namespaced_pod("gated", cluster.ns, {"spec": {"schedulingGates": None}})
    cluster.expect({"gated": "n1", "free": "n1"})


# --- VolumeAttributesClass (GA 1.34) in VolumeBinding ---------------------------------------------


def test_a_claim_gets_only_a_volume_of_its_attributes_class(cluster):
    from kubernetes import client

    storage = client.StorageV1Api(cluster.api)
    sc, plain, gold = (f"{cluster.prefix}-{cluster.ns}-{x}" for x in ("local", "plain", "gold"))
    storage.create_storage_class({"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass", "metadata": {"name": sc},
                                  "provisioner": "kubernetes.io/no-provisioner", "volumeBindingMode": "WaitForFirstConsumer"})
    try:
        # the plain volume is the smaller one: chosen first if the attributes class were not matched
        for pv, node, vac, size in ((plain, "n1", None, "5Gi"), (gold, "n2", "gold", "10Gi")):
            cluster.node(node)
            spec = {"capacity": {"storage": size}, "accessModes": ["ReadWriteOnce"], "storageClassName": sc,
                    "csi": {"driver": "disk.csi.example.com", "volumeHandle": pv},  # an attributes class needs CSI
                    "nodeAffinity": {"required": {"nodeSelectorTerms": [
                        {"matchExpressions": [{"key": HOST, "operator": "In", "values": [cluster.node_name(node)]}]}]}}}
            if vac:
                spec["volumeAttributesClassName"] = vac
            cluster.core.create_persistent_volume({"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": pv}, "spec": spec})
            cluster.core.patch_persistent_volume_status(pv, {"status": {"phase": "Available"}})  # as the PV controller would
        cluster.core.create_namespaced_persistent_volume_claim(cluster.ns, {"apiVersion": "v1", "kind": "PersistentVolumeClaim",
            "metadata": {"name": "data"}, "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": sc,
                                                    "volumeAttributesClassName": "gold", "resources": {"requests": {"storage": "1Gi"}}}})
        cluster.pod("user", volumes=[{"name": "d", "persistentVolumeClaim": {"claimName": "data"}}])

        def promised(pv: str) -> str | None:
            ref = cluster.core.read_persistent_volume(pv).spec.claim_ref
            return ref.name if ref else None

        assert wait_until(lambda: promised(gold) == "data", 30), (cluster.scheduler, cluster.events())
        assert promised(plain) is None
        # play the PV controller: the claim is bound to the promised volume
        cluster.core.patch_namespaced_persistent_volume_claim("data", cluster.ns, {
            "metadata": {"annotations": {"pv.kubernetes.io/bind-completed": "yes"}}, "spec": {"volumeName": gold}})
        cluster.expect({"user": "n2"})
    finally:
        from kubernetes.client.exceptions import ApiException

        for p in cluster.core.list_namespaced_pod(cluster.ns).items:
            cluster.core.delete_namespaced_pod(p.metadata.name, cluster.ns, grace_period_seconds=0)
        for delete in (lambda: cluster.core.delete_namespaced_persistent_volume_claim("data", cluster.ns),
                       lambda: cluster.core.delete_persistent_volume(plain), lambda: cluster.core.delete_persistent_volume(gold),
                       lambda: storage.delete_storage_class(sc)):
            try:
                delete()
            except ApiException as exc:  # not made: the test failed before
                print(f"cleanup: {exc.status}")


# --- VolumeLimitScaling (beta, on in 1.37): CSIDriver preventPodSchedulingIfMissing ----------------


@needs_137_volumes
def test_a_driver_that_must_be_installed_keeps_pods_off_nodes_without_it(cluster):
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    storage = client.StorageV1Api(cluster.api)
    driver, pv = f"{cluster.prefix}-{cluster.ns}.csi.example.com", f"{cluster.prefix}-{cluster.ns}-pv"
    made: list = []
    try:
        storage.create_csi_driver({"apiVersion": "storage.k8s.io/v1", "kind": "CSIDriver", "metadata": {"name": driver},
                                   "spec": {"attachRequired": True, "preventPodSchedulingIfMissing": True}})
        made.append(lambda: storage.delete_csi_driver(driver))
        for short, has, cpu in (("with", driver, "2"), ("without", "other.csi.example.com", "8")):
            name = cluster.node(short, cpu=cpu)
            storage.create_csi_node({"apiVersion": "storage.k8s.io/v1", "kind": "CSINode", "metadata": {"name": name},
                                     "spec": {"drivers": [{"name": has, "nodeID": name}]}})
            made.append(lambda name=name: storage.delete_csi_node(name))
        cluster.core.create_persistent_volume({"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": pv},
            "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"], "storageClassName": "",
                     "csi": {"driver": driver, "volumeHandle": pv}, "claimRef": {"namespace": cluster.ns, "name": "data"}}})
        made.append(lambda: cluster.core.delete_persistent_volume(pv))
        cluster.core.create_namespaced_persistent_volume_claim(cluster.ns, {"apiVersion": "v1", "kind": "PersistentVolumeClaim",
            "metadata": {"name": "data", "annotations": {"pv.kubernetes.io/bind-completed": "yes"}},
            "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": "", "volumeName": pv,
                     "resources": {"requests": {"storage": "1Gi"}}}})
        uid = cluster.core.read_namespaced_persistent_volume_claim("data", cluster.ns).metadata.uid
        cluster.core.patch_persistent_volume(pv, {"spec": {"claimRef": {"uid": uid}}})
        cluster.core.patch_persistent_volume_status(pv, {"status": {"phase": "Bound"}})
        cluster.core.patch_namespaced_persistent_volume_claim_status("data", cluster.ns, {"status": {"phase": "Bound"}})
        prefer_without = {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 100, "preference": {
            "matchExpressions": [{"key": HOST, "operator": "In", "values": [cluster.node_name("without")]}]}}]}}
        for i in range(3):  # they would rather go to the node without the driver, which also has room for all three
            cluster.pod(f"user{i}", cpu="1", volumes=[{"name": "d", "persistentVolumeClaim": {"claimName": "data"}}],
                        affinity=prefer_without)
        got = cluster.expect({}, bound_count=2)  # the node with the driver takes two; the third waits
        assert {n for n in got.values() if n} == {"with"}, got
    finally:
        for p in cluster.core.list_namespaced_pod(cluster.ns).items:
            cluster.core.delete_namespaced_pod(p.metadata.name, cluster.ns, grace_period_seconds=0)
        for delete in [lambda: cluster.core.delete_namespaced_persistent_volume_claim("data", cluster.ns), *reversed(made)]:
            try:
                delete()
            except ApiException as exc:
                print(f"cleanup: {exc.status}")


# --- toleration operators Gt / Lt (TaintTolerationComparisonOperators, alpha in 1.35) ---------------


def test_toleration_comparison_operators(cluster):
    for short, v in (("m40", "40"), ("m80", "80")):
        cluster.node(short, taints=[{"key": "example.com/mem", "value": v, "effect": "NoSchedule"}])
    cluster.pod("big", tolerations=[{"key": "example.com/mem", "operator": "Gt", "value": "50", "effect": "NoSchedule"}])
    cluster.pod("small", tolerations=[{"key": "example.com/mem", "operator": "Lt", "value": "50", "effect": "NoSchedule"}])
    cluster.pod("none")
    cluster.expect({"big": "m80", "small": "m40", "none": None})


# --- matchLabelKeys in topology spread; sidecar containers -----------------------------------------


def test_match_label_keys_in_topology_spread(cluster):
    cluster.node("a1", labels={ZONE: "a"})
    cluster.node("b1", labels={ZONE: "b"})
    for i in range(2):  # the previous rollout, all in zone a
        cluster.pod(f"old{i}", labels={"app": "web", "hash": "old"}, nodeSelector={ZONE: "a"})
    cluster.expect({"old0": "a1", "old1": "a1"})
    tsc = _spread({"app": "web"}, matchLabelKeys=["hash"])  # only this rollout's pods count
    for i in range(2):
        cluster.pod(f"new{i}", labels={"app": "web", "hash": "new"}, topologySpreadConstraints=tsc)
    got = cluster.expect({"old0": "a1", "old1": "a1", "new0": "*", "new1": "*"})
    assert {got["new0"], got["new1"]} == {"a1", "b1"}  # counting the old pods too would put both in zone b


def test_sidecars_run_beside_init_containers(cluster):
    cluster.node("n1", cpu="4")
    cluster.pod("app", cpu="1", initContainers=[
        {"name": "side", "image": "busybox", "restartPolicy": "Always", "resources": {"requests": {"cpu": "1"}}},
        {"name": "init", "image": "busybox", "resources": {"requests": {"cpu": "3"}}}])  # max(1 + 1, 1 + 3) = 4 CPUs
    cluster.expect({"app": "n1"})
    cluster.pod("next", cpu="100m")
    cluster.expect({"app": "n1", "next": None})
