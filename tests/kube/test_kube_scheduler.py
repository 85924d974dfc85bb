"""The live scheduler and the extender against a real kube-apiserver + etcd (envtest tier).

Each test uses its own namespace and node names; nodes are deleted afterwards
(there is no namespace controller, so namespaces stay).  The scheduler runs on
a thread through the same ``Runner`` the CLI uses, with the real client.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from pathlib import Path

import pytest
import yaml

from gpufleet.kube.api import KubernetesApi
from gpufleet.kube.cli import Metrics, load_profile
from gpufleet.kube.leader import KubernetesLeaseStore, LeaseElector
from gpufleet.kube.loop import SchedulerLoop
from gpufleet.kube.runner import Runner, wait_until

pytestmark = pytest.mark.apiserver  # needs KUBEBUILDER_ASSETS (tests/apiserver_support.py)

ROOT = Path(__file__).parents[2]


@pytest.fixture
def ns(core):
    from kubernetes import client

    name = f"it-{uuid.uuid4().hex[:6]}"
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
    return name


def pod_body(name: str, gpus: int = 1, milli: int | None = None, scheduler: str = "gpufleet", annotations: dict | None = None) -> dict:
    ann = dict(annotations or {})
    if milli:
        ann["gpufleet.io/gpu-milli"] = str(milli)
    limits = {"nvidia.com/gpu": str(gpus)} if gpus else {}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "annotations": ann},
            "spec": {"schedulerName": scheduler, "containers": [{"name": "c", "image": "busybox",
                                                                 "resources": {"requests": {"cpu": "1", "memory": "1Gi"}, "limits": limits}}]}}


class Sched:
    """A scheduler on a thread, as ``gpufleet scheduler`` runs it."""

    def __init__(self, kubeconfig: str, identity: str = "s1", lease: tuple[str, str] | None = None, lease_s: int = 3):
        self.api = KubernetesApi(kubeconfig, pool_size=20)
        self.metrics = Metrics()
        self.loop = SchedulerLoop(self.api, load_profile("default", None), on_attempt=self.metrics.on_attempt,
                                  bind_workers=8, event_thread=True, backoff_initial_s=0.2, backoff_max_s=2.0)
        self.elector = None
        if lease:
            self.elector = LeaseElector(KubernetesLeaseStore(self.api.api, lease[0], lease[1]), identity,
                                        lease_s=lease_s, renew_deadline_s=2.0, retry_s=0.3)
        self.runner = Runner(self.api, self.loop, self.elector, self.metrics, watch_timeout_s=20)
        self.stop_ev = threading.Event()
        self.thread = threading.Thread(target=self.runner.run, args=(self.stop_ev,), daemon=True)
        self.thread.start()
        assert self.runner.ready.wait(20), "scheduler never synced"

    def stop(self, release: bool = True) -> None:
        if not release and self.elector is not None:
            self.elector.release = lambda: None  # a crash: the lease is left to expire
        self.stop_ev.set()
        self.thread.join(15)
        assert not self.thread.is_alive()


def bound(core, ns: str) -> dict[str, dict]:
    return {p.metadata.name: p for p in core.list_namespaced_pod(ns).items if p.spec.node_name}


def assignment(p) -> dict:
    return json.loads((p.metadata.annotations or {})["gpufleet.io/assignment"])


def events(core, ns: str) -> list:
    return core.list_namespaced_event(ns).items


def gpu_use(core, ns: str) -> dict[tuple[str, int], int]:
    use: dict[tuple[str, int], int] = {}
    for p in bound(core, ns).values():
        a = assignment(p)
        assert a["node"] == p.spec.node_name
        for g in a["gpus"]:
            use[(a["node"], g["index"])] = use.get((a["node"], g["index"]), 0) + a["gpu_milli"]
    return use


def test_binds_with_assignment_annotation_and_events(control_plane, core, ns, nodes):
    nodes(f"{ns}-inv", 2, inventory=True)
    nodes(f"{ns}-gfd", 2, replicas=2)  # NVIDIA's plugin with time-slicing: two pods per GPU there
    for i in range(3):
        core.create_namespaced_pod(ns, pod_body(f"whole-{i}"))
    for i in range(2):
        core.create_namespaced_pod(ns, pod_body(f"half-{i}", milli=500))
    core.create_namespaced_pod(ns, pod_body("not-mine", scheduler="other-scheduler"))
    s = Sched(str(control_plane.kubeconfig))
    try:
        assert wait_until(lambda: len(bound(core, ns)) == 5, 20), bound(core, ns).keys()
        b = bound(core, ns)
        assert "not-mine" not in b
        use = gpu_use(core, ns)
        assert all(v <= 1000 for v in use.values()) and sum(use.values()) == 4000
        uuids = [g["uuid"] for p in b.values() if p.spec.node_name.endswith("-inv") for g in assignment(p)["gpus"]]
        assert uuids and all(u.startswith(f"GPU-{ns}-inv-") for u in uuids)
        assert wait_until(lambda: sum(e.reason == "Scheduled" for e in events(core, ns)) == 5, 10)
        ev = next(e for e in events(core, ns) if e.reason == "Scheduled")
        assert ev.involved_object.kind == "Pod" and "Successfully assigned" in ev.message
        assert s.loop.stats.attempts["scheduled"] == 5
    finally:
        s.stop()


def test_failed_scheduling_reasons_bad_pod_and_retry_on_node_added(control_plane, core, ns, nodes):
    from gpufleet.kube.explain_cli import explain

    nodes(f"{ns}-small", 2)
    core.create_namespaced_pod(ns, pod_body("big", gpus=4))
    core.create_namespaced_pod(ns, pod_body("bad", annotations={"gpufleet.io/gpu-milli": "5000"}))
    core.create_namespaced_pod(ns, pod_body("fine"))
    s = Sched(str(control_plane.kubeconfig))
    try:
        def failed(name):
            return [e for e in events(core, ns) if e.reason == "FailedScheduling" and e.involved_object.name == name]

        assert wait_until(lambda: failed("big") and failed("bad"), 15)
        assert failed("big")[0].message.startswith("0/") and "Insufficient nvidia.com/gpu" in failed("big")[0].message
        assert failed("bad")[0].type == "Warning" and "gpufleet.io/gpu-milli" in failed("bad")[0].message
        assert wait_until(lambda: "fine" in bound(core, ns), 10)  # the bad pod did not stop the loop
        code, text = explain(s.api, load_profile("default", None), f"{ns}/big")
        assert code == 0 and f"{ns}-small" in text and "Insufficient nvidia.com/gpu" in text
        nodes(f"{ns}-big", 8)
        assert wait_until(lambda: "big" in bound(core, ns), 10)
        assert bound(core, ns)["big"].spec.node_name == f"{ns}-big"
        assert "bad" not in bound(core, ns)
    finally:
        s.stop()


def test_restart_rebuilds_state_and_never_double_books(control_plane, core, ns, nodes):
    nodes(f"{ns}-n", 4, inventory=True)
    for i in range(3):
        core.create_namespaced_pod(ns, pod_body(f"a-{i}", milli=300))
    core.create_namespaced_pod(ns, pod_body("w-0"))
    s = Sched(str(control_plane.kubeconfig))
    assert wait_until(lambda: len(bound(core, ns)) == 4, 15)
    s.stop()
    before = {k: assignment(p) for k, p in bound(core, ns).items()}
    # a fresh process: more whole-GPU pods than are left
    for i in range(1, 5):
        core.create_namespaced_pod(ns, pod_body(f"w-{i}"))
    s2 = Sched(str(control_plane.kubeconfig))
    try:
        free_whole = 4 - len({(n, g) for (n, g), v in gpu_use(core, ns).items() if v > 0})
        assert wait_until(lambda: len(bound(core, ns)) == 4 + free_whole, 15)
        time.sleep(0.5)
        use = gpu_use(core, ns)
        assert all(v <= 1000 for v in use.values()), use
        after = bound(core, ns)
        assert all(assignment(after[k]) == v for k, v in before.items())
        assert len(after) == 4 + free_whole  # the rest stay pending
        assert s2.loop.stats.double_book_refused == 0
    finally:
        s2.stop()


def test_leader_election_and_failover(control_plane, core, ns, nodes):
    from kubernetes import client

    nodes(f"{ns}-n", 8)
    lease = (f"gpufleet-{ns}", ns)
    a = Sched(str(control_plane.kubeconfig), "replica-a", lease)
    assert wait_until(lambda: a.elector.is_leader, 10)
    b = Sched(str(control_plane.kubeconfig), "replica-b", lease)
    try:
        core.create_namespaced_pod(ns, pod_body("p0"))
        assert wait_until(lambda: "p0" in bound(core, ns), 10)
        assert a.elector.is_leader and not b.elector.is_leader and b.loop.stats.binds == 0
        coord = client.CoordinationV1Api(core.api_client)
        assert coord.read_namespaced_lease(*lease).spec.holder_identity == "replica-a"
        # a crashes without releasing: b takes over once the lease expires
        a.stop(release=False)
        t0 = time.monotonic()
        core.create_namespaced_pod(ns, pod_body("p1"))
        assert wait_until(lambda: b.elector.is_leader, 10)
        took = time.monotonic() - t0
        assert 2.0 < took < 8.0, took  # waited for the 3 s lease, not longer than needed
        assert wait_until(lambda: "p1" in bound(core, ns), 10)
        lz = coord.read_namespaced_lease(*lease)
        assert lz.spec.holder_identity == "replica-b" and lz.spec.lease_transitions == 1
        # a graceful stop hands over at once
        c = Sched(str(control_plane.kubeconfig), "replica-c", lease)
        b.stop(release=True)
        t0 = time.monotonic()
        assert wait_until(lambda: c.elector.is_leader, 5) and time.monotonic() - t0 < 2.0
        core.create_namespaced_pod(ns, pod_body("p2"))
        assert wait_until(lambda: "p2" in bound(core, ns), 10)
        assert all(v <= 1000 for v in gpu_use(core, ns).values())
        c.stop()
    finally:
        for x in (a, b):
            if x.thread.is_alive():
                x.stop()


def sa_kubeconfig(control_plane, admin, manifest: str, account: str, ns: str) -> str:
    """Apply a manifest's RBAC objects (renamed into ``ns``) and return a kubeconfig with that ServiceAccount's token."""
    from kubernetes import client, utils

    for d in yaml.safe_load_all((ROOT / manifest).read_text()):
        if not d or d["kind"] not in ("ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"):
            continue
        d = json.loads(json.dumps(d))
        if d["kind"] in ("ClusterRole", "ClusterRoleBinding"):
            d["metadata"]["name"] += f"-{ns}"
        if "namespace" in d["metadata"]:
            d["metadata"]["namespace"] = ns
        if d["kind"] == "ClusterRoleBinding":
            d["roleRef"]["name"] += f"-{ns}"
        for s in d.get("subjects", []):
            s["namespace"] = ns
        if d["kind"] == "Role":
            for r in d["rules"]:
                if "resourceNames" in r:
                    r["resourceNames"] = [f"gpufleet-{ns}"]
        utils.create_from_dict(admin, d)
    tok = client.CoreV1Api(admin).create_namespaced_service_account_token(
        account, ns, {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {"expirationSeconds": 3600}})
    kc = yaml.safe_load(control_plane.kubeconfig.read_text())
    kc["users"] = [{"name": "sa", "user": {"token": tok.status.token}}]
    kc["contexts"][0]["context"]["user"] = "sa"
    path = control_plane.dir / f"kubeconfig-{account}-{ns}"
    path.write_text(yaml.safe_dump(kc))
    return str(path)


def test_least_privilege_rbac_from_the_manifest_is_enough(control_plane, admin, core, ns, nodes):
    """Run the scheduler as the manifest's ServiceAccount with only the manifest's RBAC."""
    path = sa_kubeconfig(control_plane, admin, "deploy/scheduler/scheduler.yaml", "gpufleet-scheduler", ns)
    nodes(f"{ns}-n", 2)
    core.create_namespaced_pod(ns, pod_body("p", milli=250))
    core.create_namespaced_pod(ns, pod_body("too-big", gpus=3))
    s = Sched(str(path), "rbac-replica", (f"gpufleet-{ns}", ns))
    try:
        assert wait_until(lambda: s.elector.is_leader, 10)
        assert wait_until(lambda: "p" in bound(core, ns), 10)
        assert wait_until(lambda: any(e.reason == "FailedScheduling" for e in events(core, ns)), 10)
        assert s.loop.stats.events_dropped == 0
    finally:
        s.stop()


def test_extender_filter_prioritize_bind_on_a_real_apiserver(control_plane, admin, core, ns, nodes):
    """The extender's verbs, run as the extender manifest's ServiceAccount with only its RBAC."""
    import urllib.request

    from gpufleet.kube.extender import Extender, ExtenderLoop, serve

    nodes(f"{ns}-one", 1, inventory=True)
    nodes(f"{ns}-eight", 8, inventory=True)
    core.create_namespaced_pod(ns, pod_body("train", gpus=4, scheduler="default-scheduler"))
    api = KubernetesApi(sa_kubeconfig(control_plane, admin, "deploy/extender/extender.yaml", "gpufleet-extender", ns))
    loop = ExtenderLoop(api, load_profile("default", None))
    lock = threading.Lock()
    runner = Runner(api, loop, lock=lock, watch_timeout_s=20)
    stop = threading.Event()
    t = threading.Thread(target=runner.run, args=(stop,), daemon=True)
    t.start()
    srv = serve(Extender(loop, lock), "127.0.0.1:0", runner.ready)
    base = f"http://127.0.0.1:{srv.server_address[1]}"

    def post(verb, body):
        req = urllib.request.Request(f"{base}/{verb}", data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=10) as r:
            return json.loads(r.read())

    try:
        assert runner.ready.wait(20)
        pod = api.get_pod(ns, "train")
        names = [f"{ns}-one", f"{ns}-eight"]
        f = post("filter", {"Pod": pod, "NodeNames": names})
        assert f["NodeNames"] == [f"{ns}-eight"] and "Insufficient nvidia.com/gpu" in f["FailedNodes"][f"{ns}-one"]
        assert post("prioritize", {"Pod": pod, "NodeNames": [f"{ns}-eight"]}) == [{"Host": f"{ns}-eight", "Score": 10}]
        r = post("bind", {"PodName": "train", "PodNamespace": ns, "PodUID": pod["metadata"]["uid"], "Node": f"{ns}-eight"})
        assert r["Error"] == ""
        p = core.read_namespaced_pod("train", ns)
        a = assignment(p)
        assert p.spec.node_name == f"{ns}-eight" and len(a["gpus"]) == 4 and a["gpus"][0]["uuid"].startswith(f"GPU-{ns}-eight-")
        core.create_namespaced_pod(ns, pod_body("second", gpus=8, scheduler="default-scheduler"))
        f2 = post("filter", {"Pod": api.get_pod(ns, "second"), "NodeNames": names})
        assert f2["NodeNames"] == []  # the 4 bound GPUs are taken
    finally:
        srv.shutdown()
        stop.set()
        t.join(10)


def test_the_cli_process_end_to_end(control_plane, core, ns, nodes):
    """``gpufleet scheduler`` as a process: binds, serves /metrics and /readyz, releases its lease on SIGTERM."""
    import signal
    import subprocess
    import sys
    import urllib.request

    from kubernetes import client

    from tests.apiserver_support import _free_port

    nodes(f"{ns}-n", 2)
    core.create_namespaced_pod(ns, pod_body("p", milli=500))
    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-m", "gpufleet.cli.main", "scheduler", "--kubeconfig", str(control_plane.kubeconfig),
                             f"--metrics-addr=127.0.0.1:{port}", "--lease-namespace", ns, "--lease-name", "cli-lease",
                             "--identity", "cli-1", "--lease-duration", "3", "--log-level", "WARNING"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        assert wait_until(lambda: "p" in bound(core, ns), 20)

        def get(path):
            try:
                return urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=2).read().decode()
            except Exception:
                return ""

        assert get("/readyz") == "ok" and get("/healthz") == "ok"
        assert wait_until(lambda: "gpufleet_binds_total 1.0" in get("/metrics"), 5)
        m = get("/metrics")
        assert 'gpufleet_schedule_attempts_total{result="scheduled"} 1.0' in m and "gpufleet_leader 1.0" in m
        assert "gpufleet_pod_scheduling_duration_seconds_count 1.0" in m
        coord = client.CoordinationV1Api(core.api_client)
        assert coord.read_namespaced_lease("cli-lease", ns).spec.holder_identity == "cli-1"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(15) == 0
        assert coord.read_namespaced_lease("cli-lease", ns).spec.holder_identity == ""
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_finished_and_deleted_pods_free_their_gpus(control_plane, core, ns, nodes):
    nodes(f"{ns}-n", 1)
    core.create_namespaced_pod(ns, pod_body("first"))
    s = Sched(str(control_plane.kubeconfig))
    try:
        assert wait_until(lambda: "first" in bound(core, ns), 10)
        core.create_namespaced_pod(ns, pod_body("second"))
        assert wait_until(lambda: any(e.reason == "FailedScheduling" and e.involved_object.name == "second" for e in events(core, ns)), 10)
        # the pod finishes (a kubelet would write this): it leaves the live-pod watch as DELETED
        core.patch_namespaced_pod_status("first", ns, {"status": {"phase": "Succeeded"}})
        assert wait_until(lambda: "second" in bound(core, ns), 10)
        core.create_namespaced_pod(ns, pod_body("third"))
        core.delete_namespaced_pod("second", ns, grace_period_seconds=0)
        assert wait_until(lambda: "third" in bound(core, ns), 10)
        assert gpu_use(core, ns) == {(f"{ns}-n", 0): 2000}  # first (finished), third; second is gone
    finally:
        s.stop()




def compact_etcd(etcd_url: str) -> int:
    """Compact etcd to its current revision through its HTTP gateway; returns that revision."""
    import base64
    import urllib.request

    def post(path: str, body: dict) -> dict:
        req = urllib.request.Request(etcd_url + path, json.dumps(body).encode(), {"Content-Type": "application/json"})
        return json.loads(urllib.request.urlopen(req, timeout=5).read())

    rev = int(post("/v3/kv/range", {"key": base64.b64encode(b"/").decode()})["header"]["revision"])
    post("/v3/kv/compaction", {"revision": str(rev), "physical": True})
    return rev


def test_expired_watch_410_gone_relists_and_scheduling_goes_on(tmp_path):
    """After etcd compaction, a watch from an older resourceVersion answers 410 Gone: the runner relists
    that kind and goes on.  Its own apiserver without the watch cache, so watches reach etcd."""
    from kubernetes import client, config

    from gpufleet.kube.api import Gone

    from tests.apiserver_support import ASSETS, ControlPlane

    cp = ControlPlane(ASSETS, tmp_path, extra_args=("--watch-cache=false",))
    cp.start()
    try:
        core = client.CoreV1Api(config.new_client_from_config(str(cp.kubeconfig)))
        api = KubernetesApi(str(cp.kubeconfig))
        _, old_rv = api.list_pods()
        core.create_namespace({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "it"}})
        res = {"cpu": "8", "memory": "64Gi", "pods": "110", "nvidia.com/gpu": "2"}
        core.create_node({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1", "labels": {
            "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB", "nvidia.com/gpu.memory": "81920"}}})
        core.patch_node_status("n1", {"status": {"capacity": res, "allocatable": res}})
        core.create_namespaced_pod("it", pod_body("before"))
        compact_etcd(cp.etcd_url)
        for kind in ("pod", "namespace"):  # the client's watch and the raw watch of the policy kinds
            with pytest.raises(Gone):
                for _ in api.watch(kind, old_rv, 5):
                    pass

        class StaleFirstWatch(KubernetesApi):
            stale = True

            def watch(self, kind, resource_version, timeout_s=60):
                if kind == "pod" and self.stale:  # the first pod watch starts from the compacted version
                    self.stale = False
                    resource_version = old_rv
                return super().watch(kind, resource_version, timeout_s)

        sapi = StaleFirstWatch(str(cp.kubeconfig))
        loop = SchedulerLoop(sapi, load_profile("default", None), backoff_initial_s=0.2, backoff_max_s=1.0)
        runner = Runner(sapi, loop, watch_timeout_s=20)
        stop = threading.Event()
        t = threading.Thread(target=runner.run, args=(stop,), daemon=True)
        t.start()
        try:
            assert runner.ready.wait(20)
            assert wait_until(lambda: runner.relists.get("pod") == 1, 10)
            assert wait_until(lambda: "before" in bound(core, "it"), 10)
            core.create_namespaced_pod("it", pod_body("after"))
            assert wait_until(lambda: "after" in bound(core, "it"), 10)
        finally:
            stop.set()
            t.join(15)
    finally:
        cp.stop()
