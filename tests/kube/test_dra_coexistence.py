"""Coexistence with kube-scheduler 1.37's own allocator: a burst split between the two schedulers on shared pools.

The API has no reservation across schedulers: each allocates from what it has seen, so in a burst both can give one
device to two claims and both status writes succeed.  Here four DRA nodes (the agent's driver, 6 whole A100 each, the
shipped DeviceClasses) get a burst of 40 one-GPU pods (claims from a template, kube-controller-manager's resourceclaim
controller), every other one for gpufleet's scheduler and for the stock kube-scheduler, both running.  Reported: how
many pods each bound, how many devices were allocated twice; asserted: gpufleet counted every claim either scheduler
allocated, and -- the agent's kubelet plugin driven as kubelet does on each node, pods in the order they were bound --
a device given twice is prepared for one claim only, the other refused (``DeviceAlreadyAllocated``): none ran twice.

    KUBEBUILDER_ASSETS=... python -m pytest -s tests/kube/test_dra_coexistence.py   # prints the figures
"""

from __future__ import annotations

import dataclasses
import subprocess
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import yaml

from gpufleet.agent.dra.cdi import CdiWriter
from gpufleet.agent.dra.devices import DraOptions
from gpufleet.agent.dra.driver import DraDriver
from gpufleet.agent.dra.kubeapi import KubeDraApi
from gpufleet.agent.dra.prepare import PrepareError
from gpufleet.agent.nvml import PROFILES
from gpufleet.kube.api import KubernetesApi
from gpufleet.kube.loop import SchedulerLoop
from gpufleet.kube.runner import Runner
from gpufleet.policies import build_profile

from tests.apiserver_support import ASSETS, _free_port, stop_process
from tests.agent.test_dra_kube_scheduler import wait_for

pytestmark = pytest.mark.apiserver  # needs KUBEBUILDER_ASSETS (tests/apiserver_support.py)

ROOT = Path(__file__).parents[2]
DRIVER = "gpu.gpufleet.io"
RES = "/apis/resource.k8s.io/v1"
NS = "dra-coex"
NODES = [f"coex-{i}" for i in range(4)]
GF, KS = "gf-coex", "ks-coex"
PODS = 40


def gpus_of(node: str):
    """The fake A100 node's GPUs with UUIDs of this node's own."""
    drv, gpus = PROFILES["a100-mig"]
    return drv, [dataclasses.replace(g, uuid=f"{g.uuid}-{node}", mig=tuple(dataclasses.replace(m, uuid=f"{m.uuid}-{node}") for m in g.mig))
                 for g in gpus]


@pytest.fixture(scope="module")
def coex(admin, control_plane, claim_controller):
    from kubernetes import client

    if not (Path(ASSETS) / "kube-scheduler").is_file():
        pytest.skip("no kube-scheduler in KUBEBUILDER_ASSETS")
    core = client.CoreV1Api(admin)
    api = KubeDraApi(admin, instance="coex")
    core.create_namespace({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}})
    co = client.CustomObjectsApi(admin)
    classes = []  # the DeviceClasses this module made (deleted at the end)
    for c in (x for x in yaml.safe_load_all((ROOT / "deploy/dra/deviceclasses.yaml").read_text()) if x):
        try:
            co.create_cluster_custom_object("resource.k8s.io", "v1", "deviceclasses", c)
            classes.append(c["metadata"]["name"])
        except client.ApiException as exc:
            if exc.status != 409:
                raise
    drivers = {}
    root = Path(tempfile.mkdtemp(dir="/tmp", prefix="coex"))
    for n in NODES:
        core.create_node({"apiVersion": "v1", "kind": "Node", "metadata": {"name": n, "labels": {"kubernetes.io/hostname": n}}})
        res = {"cpu": "64", "memory": "512Gi", "pods": "110"}
        core.patch_node_status(n, {"status": {"capacity": res, "allocatable": res, "conditions": [
            {"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "test", "lastHeartbeatTime": None,
             "lastTransitionTime": None}]}})
        (root / n / "sys").mkdir(parents=True)
        d = DraDriver(api, n, DraOptions(sysfs_root=str(root / n / "sys")), str(root / n / "state"), CdiWriter(str(root / n / "cdi")),
                      plugins_dir=str(root / n / "plugins"), registry_dir=str(root / n / "reg"))
        drv, gpus = gpus_of(n)
        d.update(gpus, drv, {g.index: True for g in gpus}, {})
        assert d.publisher.sync(force=True), d.publisher.last_error
        drivers[n] = d
    api._request("POST", f"{RES}/namespaces/{NS}/resourceclaimtemplates", {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate", "metadata": {"name": "one"},
        "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.gpufleet.io"}}]}}}})
    # the stock kube-scheduler, its own profile
    kd = Path(tempfile.mkdtemp(prefix="coex-ks-"))
    (kd / "ks.yaml").write_text(f"""apiVersion: kubescheduler.config.k8s.io/v1
kind: KubeSchedulerConfiguration
clientConnection: {{kubeconfig: "{control_plane.kubeconfig}", qps: 1000, burst: 1000}}
leaderElection: {{leaderElect: false}}
profiles:
- schedulerName: {KS}
""")
    log = open(kd / "kube-scheduler.log", "wb")
    ks = subprocess.Popen([str(Path(ASSETS) / "kube-scheduler"), f"--config={kd / 'ks.yaml'}", f"--secure-port={_free_port()}",
                           "--bind-address=127.0.0.1", f"--authentication-kubeconfig={control_plane.kubeconfig}",
                           f"--authorization-kubeconfig={control_plane.kubeconfig}", "-v=1"], stdout=log, stderr=subprocess.STDOUT)
    gapi = KubernetesApi(str(control_plane.kubeconfig), pool_size=20)
    loop = SchedulerLoop(gapi, build_profile("default"), scheduler_name=GF, bind_workers=8, event_thread=True,
                         backoff_initial_s=0.2, backoff_max_s=2.0)
    runner = Runner(gapi, loop, watch_timeout_s=20)
    stop = threading.Event()
    t = threading.Thread(target=runner.run, args=(stop,), daemon=True)
    t.start()
    assert runner.ready.wait(30)
    try:
        yield api, core, drivers, loop
    finally:
        stop.set()
        t.join(15)
        stop_process(ks, 10)
        log.close()
        for p in core.list_namespaced_pod(NS).items:
            core.delete_namespaced_pod(p.metadata.name, NS, grace_period_seconds=0)
        for n in NODES:
            for s in api.list_slices(n, DRIVER)[0]:
                api.delete_slice(s["metadata"]["name"])
            core.delete_node(n)
        for name in classes:
            co.delete_cluster_custom_object("resource.k8s.io", "v1", "deviceclasses", name)


def pod(i: int) -> dict:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": f"b{i:03d}", "namespace": NS},
            "spec": {"schedulerName": GF if i % 2 == 0 else KS,
                     "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "one"}],
                     "containers": [{"name": "c", "image": "busybox", "resources": {
                         "requests": {"cpu": "100m", "memory": "64Mi"}, "claims": [{"name": "gpu"}]}}]}}


def test_a_burst_split_between_gpufleet_and_kube_scheduler_never_runs_a_device_twice(coex):
    api, core, drivers, loop = coex
    with ThreadPoolExecutor(8) as ex:
        list(ex.map(lambda i: core.create_namespaced_pod(NS, pod(i), _preload_content=False), range(PODS)))

    def bound() -> dict:
        return {p.metadata.name: p for p in core.list_namespaced_pod(NS).items if p.spec.node_name}
    last, since = -1, time.monotonic()
    end = time.monotonic() + 120
    while time.monotonic() < end:  # until no pod was bound for 8 s (every GPU taken, the rest unschedulable)
        n = len(bound())
        if n != last:
            last, since = n, time.monotonic()
        elif time.monotonic() - since > 8:
            break
        time.sleep(0.5)
    pods = bound()
    claims = {c["metadata"]["name"]: c for c in api._request("GET", f"{RES}/namespaces/{NS}/resourceclaims")["items"]}
    holders: dict[tuple[str, str], list[str]] = {}
    by: dict[str, str] = {}
    for p in pods.values():
        (st,) = p.status.resource_claim_statuses
        c = claims[st.resource_claim_name]
        by[st.resource_claim_name] = p.spec.scheduler_name
        for r in c["status"]["allocation"]["devices"]["results"]:
            holders.setdefault((r["pool"], r["device"]), []).append(st.resource_claim_name)
    doubles = {d: cs for d, cs in holders.items() if len(cs) > 1}
    allocated = {k for k, c in claims.items() if (c.get("status") or {}).get("allocation")}

    # gpufleet counts every claim any scheduler allocated
    assert wait_for(lambda: {f"{NS}/{k}" for k in allocated} <= set(loop.cache.state.claim_holds), 20), \
        sorted({f"{NS}/{k}" for k in allocated} - set(loop.cache.state.claim_holds))

    # kubelet on each node prepares its pods' claims in the order they were bound: a device given twice runs once
    order = sorted(pods.values(), key=lambda p: min((c.last_transition_time for c in p.status.conditions or []
                                                     if c.type == "PodScheduled"), default=p.metadata.creation_timestamp))
    prepared: dict[tuple[str, str], list[str]] = {}
    refused: list[str] = []
    for p in order:
        (st,) = p.status.resource_claim_statuses
        c = claims[st.resource_claim_name]
        try:
            got = drivers[p.spec.node_name].preparer.prepare(NS, c["metadata"]["uid"], st.resource_claim_name)
        except PrepareError as exc:
            assert "already" in exc.message or "DeviceAlreadyAllocated" in exc.reason, exc.message
            refused.append(st.resource_claim_name)
            continue
        assert got
        for r in c["status"]["allocation"]["devices"]["results"]:
            prepared.setdefault((r["pool"], r["device"]), []).append(st.resource_claim_name)
    n_gf = sum(1 for p in pods.values() if p.spec.scheduler_name == GF)
    print(f"\ncoexistence burst: {PODS} one-GPU pods on {len(NODES)} nodes x 6 GPUs, half for gpufleet, half for kube-scheduler 1.37: "
          f"bound {n_gf} by gpufleet, {len(pods) - n_gf} by kube-scheduler; {len(doubles)} device(s) allocated twice "
          f"(each by one of each scheduler: {sum(1 for cs in doubles.values() if {by[c] for c in cs} == {GF, KS})}); claims refused by the plugin: {len(refused)}; "
          f"devices prepared for more than one claim: {sum(1 for v in prepared.values() if len(v) > 1)}")
    assert all(len(v) == 1 for v in prepared.values())  # none ran twice
    assert len(refused) == sum(len(cs) - 1 for cs in doubles.values())
    assert len(pods) >= len(NODES) * 6 - len(doubles)  # every GPU given out (the burst exceeds them)
