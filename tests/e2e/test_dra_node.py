"""DRA on a real node: kubelet + containerd (CDI) + gpufleet's agent in --dra mode, the claims allocated by gpufleet's
scheduler or by the STOCK kube-scheduler (the same scenario, once each).

The agent (fake A100 node with MIG, fake device nodes and a fake sysfs for PCIe roots) publishes its
ResourceSlices; one scheduler allocates every claim from them (``gpufleet``: gpufleet's scheduler writes the
allocations and reservations, creates the claim of the extended-resource pod, binds; ``kube-scheduler``: no gpufleet
scheduler runs, so the slices are shown to be standard), kubelet calls the agent's kubelet plugin, containerd applies
its CDI specs. Pods: one GPU; two GPUs under a matchAttribute
(pcieRoot) constraint; a MIG slice; two 20 GiB shares on one GPU by consumable capacity; one claim shared by two
pods; `nvidia.com/gpu: 1` through the extended-resource DeviceClass; a claim no device meets.  The DeviceClasses are
those `kubectl apply -k` installs for the release (deploy/dra, or deploy/overlays/dra-k8s-1.35 on 1.35).

On 1.35 with its default gates (no consumable capacity, device taints or extended resources backed by DRA) the
shares and the extended-resource pod are what 1.35 cannot do: the agent must publish no shares and say so in a Node
Event per missing gate, and `nvidia.com/gpu: 1` stays Pending; everything else is asserted as on 1.36+.

Asserted for every Running pod: the container's NVIDIA_VISIBLE_DEVICES and /dev/nvidia* and kubelet's
PodResources name exactly the devices of its claims' allocations (on kubelet < 1.37, which may list a claim shared by
two pods twice, the same set: see KUBELET_DUPLICATES); then an agent restart and a kubelet restart
lose nothing (pods keep running, slices come back, new claims are prepared, old ones unprepared), and so does a
restart of gpufleet's scheduler (its state rebuilt from the claims alone: the next pod gets a free device); and a claim
allocated by hand to a device another pod holds is refused by the plugin (event naming both claims), its
container never created.  The report goes to $E2E_LOGS/<scheduler>/gpufleet-dra-e2e-report.txt.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
import yaml

from gpufleet.agent.nvml import FakeBackend

from tests.dra_release import full_dra, release_of

from .harness import KUBELET_ROOT, NODE, RealNode, module_node, wait
from .locations import locations

PROFILE = "a100-mig"
GPUS = FakeBackend(PROFILE).gpus()
DRIVER = "gpu.gpufleet.io"
REPO = Path(__file__).resolve().parents[2]
CDI_DIR = Path("/var/run/cdi")
# fake PCIe topology: whole GPUs 2-4 under one root complex, 5-7 under another
# GPUFLEET_E2E_DRA_ALPHA_GATES=1 on 1.35: the node runs with the gates docs/dra.md names turned on in every component
# (kube-apiserver, kube-scheduler, kube-controller-manager, kubelet), and the full scenario is expected, as on 1.36+
ALPHA_GATES = os.environ.get("GPUFLEET_E2E_DRA_ALPHA_GATES", "") not in ("", "0")
ALPHA_GATES_135 = ("DRAConsumableCapacity", "DRADeviceTaints", "DRAExtendedResource")
PCIE_ROOT = {2: "pci0000:00", 3: "pci0000:00", 4: "pci0000:00", 5: "pci0000:80", 6: "pci0000:80", 7: "pci0000:80",
             0: "pci0000:00", 1: "pci0000:80"}


def bdf(g) -> str:
    return g.pci_bus_id.lower()[4:] if len(g.pci_bus_id) == 16 else g.pci_bus_id.lower()


SCHEDULERS = ("gpufleet", "kube-scheduler")


@pytest.fixture(params=SCHEDULERS)
def dra_node(request):
    env: dict[str, str] = {}
    if ALPHA_GATES and not full_dra(release_of(Path(locations()["bin"]) / "kubelet")):  # 1.35 with docs/dra.md's gates on
        gates = ",".join(f"{g}=true" for g in ALPHA_GATES_135)
        env = {"APISERVER_EXTRA_ARGS": f"--feature-gates={gates}", "SCHEDULER_EXTRA_ARGS": f"--feature-gates={gates}",
               "KCM_EXTRA_ARGS": "--feature-gates=DRAExtendedResource=true,DRADeviceTaints=true",
               "KUBELET_FEATURE_GATES": "DRAExtendedResource=true"}
    cdi_existed = CDI_DIR.exists()
    try:
        with module_node("gpufleet-dra-e2e-", env=env, logs_subdir=request.param) as node:
            node.scheduler = request.param  # type: ignore[attr-defined]
            yield node
    finally:  # the plugin's CDI specs, once the node is down
        for p in CDI_DIR.glob("k8s.gpu.gpufleet.io-claim_*.json") if CDI_DIR.exists() else []:
            p.unlink()
        if not cdi_existed and CDI_DIR.exists() and not any(CDI_DIR.iterdir()):
            CDI_DIR.rmdir()


def prepare_host(node: RealNode) -> None:
    node.fakedev(len(GPUS))
    sysfs = node.data / "sys"
    (sysfs / "bus" / "pci" / "devices").mkdir(parents=True, exist_ok=True)
    for g in GPUS:
        root = PCIE_ROOT[g.index]
        (sysfs / "devices" / root / bdf(g)).mkdir(parents=True, exist_ok=True)
        link = sysfs / "bus" / "pci" / "devices" / bdf(g)
        if not link.is_symlink():
            os.symlink(f"../../../devices/{root}/{bdf(g)}", link)


def start_agent(node: RealNode) -> None:
    node.gpufleet("gpufleet-agent", ["agent", "--dra", "--nvml", f"fake:{PROFILE}", "--node-name", NODE,
                                     "--kubeconfig", str(node.kubeconfig), "--state-dir", str(node.data / "gpufleet-agent"),
                                     "--dev-root", str(node.data / "fakedev"), "--sysfs-root", str(node.data / "sys"),
                                     "--metrics-addr", "127.0.0.1:19400", "--interval", "1"])


def slices(node: RealNode) -> list[dict]:
    return [s for s in node.get_json("resourceslices")["items"] if s["spec"].get("driver") == DRIVER]


def device_uuids(node: RealNode) -> dict[str, tuple[str, int]]:
    """device name -> (UUID, GPU index) from the published slices."""
    out = {}
    for s in slices(node):
        for d in s["spec"].get("devices") or []:
            a = d["attributes"]
            out[d["name"]] = (a["uuid"]["string"], a["index"]["int"])
    return out


def template(name: str, request: dict, constraints: list | None = None) -> dict:
    spec: dict = {"devices": {"requests": [request]}}
    if constraints:
        spec["devices"]["constraints"] = constraints
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate", "metadata": {"name": name, "namespace": "default"},
            "spec": {"spec": spec}}


def start_scheduler(node: RealNode) -> None:
    node.gpufleet("gpufleet-scheduler", ["scheduler", "--kubeconfig", str(node.kubeconfig), "--metrics-addr", "127.0.0.1:19251",
                                         "--no-leader-elect"])


def pod(name: str, claims: list[dict] | None = None, limits: dict | None = None, scheduler: str = "kube-scheduler") -> dict:
    c: dict = {"name": "c", "image": "local/busybox:1", "imagePullPolicy": "Never",
               "command": ["sh", "-c", "env; echo DEVS; ls /dev; sleep 3600"],
               "resources": {"limits": {"cpu": "10m", "memory": "16Mi", **(limits or {})},
                             "requests": {"cpu": "10m", "memory": "16Mi"}}}
    spec: dict = {"terminationGracePeriodSeconds": 1, "containers": [c]}
    if scheduler == "gpufleet":
        spec["schedulerName"] = "gpufleet"
    if claims:
        spec["resourceClaims"] = claims
        c["resources"]["claims"] = [{"name": cl["name"]} for cl in claims]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "default"}, "spec": spec}


def workload(full: bool, scheduler: str) -> list[dict]:
    gpu = {"name": "gpu", "exactly": {"deviceClassName": "gpu.gpufleet.io"}}
    share = {"name": "gpu", "exactly": {"deviceClassName": "gpu-share.gpufleet.io", "capacity": {"requests": {"memory": "20Gi", "gpuMilli": "300"}},
                                        "selectors": [{"cel": {"expression": "device.attributes['gpu.gpufleet.io'].index == 7"}}]}}
    items = [
        template("one-gpu", gpu),
        template("two-gpus", {"name": "gpus", "exactly": {"deviceClassName": "gpu.gpufleet.io", "count": 2}},
                 [{"requests": ["gpus"], "matchAttribute": "resource.kubernetes.io/pcieRoot"}]),
        template("mig-1g", {"name": "mig", "exactly": {"deviceClassName": "mig.gpufleet.io", "selectors": [
            {"cel": {"expression": "device.attributes['gpu.gpufleet.io'].profile == '1g.10gb'"}}]}}),
        *([template("share-20g", share)] if full else []),
        template("h100", {"name": "gpu", "exactly": {"deviceClassName": "gpu.gpufleet.io", "selectors": [
            {"cel": {"expression": "device.attributes['gpu.gpufleet.io'].productName.contains('H100')"}}]}}),
        {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": "shared-gpu", "namespace": "default"},
         "spec": {"devices": {"requests": [gpu]}}},
    ]
    pods = [pod("one", [{"name": "gpu", "resourceClaimTemplateName": "one-gpu"}], scheduler=scheduler),
            pod("pair", [{"name": "gpus", "resourceClaimTemplateName": "two-gpus"}], scheduler=scheduler),
            pod("mig", [{"name": "mig", "resourceClaimTemplateName": "mig-1g"}], scheduler=scheduler),
            *([pod("share-a", [{"name": "gpu", "resourceClaimTemplateName": "share-20g"}], scheduler=scheduler),
               pod("share-b", [{"name": "gpu", "resourceClaimTemplateName": "share-20g"}], scheduler=scheduler)] if full else []),
            pod("shared-1", [{"name": "gpu", "resourceClaimName": "shared-gpu"}], scheduler=scheduler),
            pod("shared-2", [{"name": "gpu", "resourceClaimName": "shared-gpu"}], scheduler=scheduler),
            pod("extended", limits={"nvidia.com/gpu": "1"}, scheduler=scheduler),
            pod("impossible", [{"name": "gpu", "resourceClaimTemplateName": "h100"}], scheduler=scheduler)]
    return items + pods


def claims_of(node: RealNode, p: dict) -> list[str]:
    st = p.get("status") or {}
    names = [c["resourceClaimName"] for c in st.get("resourceClaimStatuses") or [] if c.get("resourceClaimName")]
    names += [c["resourceClaimName"] for c in p["spec"].get("resourceClaims") or [] if c.get("resourceClaimName")]
    ext = (st.get("extendedResourceClaimStatus") or {}).get("resourceClaimName")
    return names + ([ext] if ext else [])


def dynamic_resources() -> dict[tuple[str, str], list[tuple[str, str, str]]]:
    """(namespace, pod) -> kubelet's PodResources claim devices (driver, pool, device)."""
    import grpc

    from gpufleet.agent.podresources import podresources_pb2 as pb
    from gpufleet.agent.podresources import podresources_pb2_grpc as pbg

    with grpc.insecure_channel(f"unix://{KUBELET_ROOT}/pod-resources/kubelet.sock") as ch:
        resp = pbg.PodResourcesListerStub(ch).List(pb.ListPodResourcesRequest(), timeout=10)
    out: dict[tuple[str, str], list[tuple[str, str, str]]] = {}
    for p in resp.pod_resources:
        for c in p.containers:
            for dr in c.dynamic_resources:
                for cr in dr.claim_resources:
                    out.setdefault((p.namespace, p.name), []).append((cr.driver_name, cr.pool_name, cr.device_name))
    return out


SEEN: dict[str, tuple[dict[str, str], list[str]]] = {}  # pod -> (its GPU env, its /dev/nvidia*), for the report


def check_running(node: RealNode, names: list[str], problems: list[str]) -> dict[str, list[str]]:
    """Every pod: env, /dev and PodResources equal its claims' allocated devices. Returns pod -> devices."""
    uuids = device_uuids(node)
    out = {}
    for name in names:
        p = node.get_json("pod", name)
        if p["status"].get("phase") != "Running":
            problems.append(f"{name}: {p['status'].get('phase')} {json.dumps(p['status'].get('conditions'))[:300]}")
            continue
        devices: list[str] = []
        for cn in claims_of(node, p):
            c = node.get_json("resourceclaim", cn)
            devices += [r["device"] for r in c["status"]["allocation"]["devices"]["results"] if r["driver"] == DRIVER]
        out[name] = devices
        want = [uuids[d][0] for d in devices]
        want_idx = sorted({uuids[d][1] for d in devices})
        log = node.pod_logs("default", name)
        env = dict(line.split("=", 1) for line in log.split("DEVS")[0].splitlines() if "=" in line)
        devs = log.split("DEVS", 1)[1].split() if "DEVS" in log else []
        SEEN[name] = ({k: v for k, v in env.items() if k.startswith(("NVIDIA_", "CUDA_MPS", "GPUFLEET_"))},
                      sorted(d for d in devs if d.startswith("nvidia")))
        if env.get("NVIDIA_VISIBLE_DEVICES", "").split(",") != want:
            problems.append(f"{name}: NVIDIA_VISIBLE_DEVICES {env.get('NVIDIA_VISIBLE_DEVICES')} != allocated {want}")
        have_idx = sorted(int(d[6:]) for d in devs if d.startswith("nvidia") and d[6:].isdigit())
        if have_idx != want_idx or "nvidiactl" not in devs:
            problems.append(f"{name}: /dev nvidia{have_idx} (+ctl {'nvidiactl' in devs}) != allocated GPUs {want_idx}")
    problems += podresources_match(node, out)
    return out


def podresources_match(node: RealNode, want: dict[str, list[str]], timeout_s: float = 30.0) -> list[str]:
    """kubelet's PodResources name each pod's allocated devices. Just after a kubelet restart it may answer before it
    has taken its running pods back (kubelet 1.35 lists them with no devices for a moment), so it is asked again
    until it agrees or ``timeout_s`` passes; how long that took is reported (PODRESOURCES_CAUGHT_UP_S)."""
    t0 = time.monotonic()
    while True:
        pr = dynamic_resources()
        bad = []
        for name, devices in want.items():
            got = sorted(d for drv, pool, d in pr.get(("default", name), []) if drv == DRIVER and pool == NODE)
            if got != sorted(devices):
                if kubelet_lists_twice(node) and sorted(set(got)) == sorted(set(devices)):
                    KUBELET_DUPLICATES.add(f"{name}: {got}")
                else:
                    bad.append(f"{name}: PodResources {got} != allocated {sorted(devices)}")
        waited = time.monotonic() - t0
        if not bad or waited > timeout_s:
            if waited > 0.5:
                PODRESOURCES_CAUGHT_UP_S.append(round(waited, 1) if not bad else -1.0)
            return bad
        time.sleep(1.0)


PODRESOURCES_CAUGHT_UP_S: list[float] = []  # each check that had to ask again: seconds until kubelet agreed (-1: never)


# kubelet before 1.37 appends a claim's devices to its cache on every NodePrepareResources call made before the claim
# is marked prepared, and two pods sharing a claim admitted together both make that call: PodResources then lists
# the claim's device twice for each (kubelet's race; 1.37 resets the list before it adds). gpufleet's plugin prepared
# it once and its exporter counts each holder once, so on those kubelets the devices are compared as a set and the
# duplicates are reported, not failed.
KUBELET_DUPLICATES: set[str] = set()


def kubelet_lists_twice(node: RealNode) -> bool:
    return release_of(Path(node.loc["bin"]) / "kubelet") < (1, 37)


def settled(node: RealNode, names: list[str], timeout_s: float = 60) -> bool:
    """Until ``check_running`` finds nothing wrong (or the time is up): the real check follows."""
    def clean() -> bool:
        trial: list[str] = []
        check_running(node, names, trial)
        return not trial
    return wait(clean, timeout_s, 2)


def unprepared(node: RealNode, name: str, problems: list[str], after: str) -> None:
    """Delete a pod; its claim must be unprepared by the plugin (CDI spec gone) and deallocated."""
    uids = [node.get_json("resourceclaim", cn)["metadata"]["uid"] for cn in claims_of(node, node.get_json("pod", name))]
    node.kubectl("delete", "pod", name, "--grace-period=1")
    if not wait(lambda: not any((CDI_DIR / f"k8s.gpu.gpufleet.io-claim_{u}.json").exists() for u in uids), 90):
        problems.append(f"pod {name} deleted after {after}: its claim was not unprepared (CDI spec left)")


def check_served(node: RealNode, full: bool, problems: list[str]) -> None:
    """The agent published what the release serves: shares only on 1.36+; on 1.35 a Node Event per missing gate."""
    devs = [d for s in slices(node) for d in s["spec"].get("devices") or [] if "-mig-" not in d["name"]]
    shared = sum(bool(d.get("allowMultipleAllocations")) for d in devs)
    if shared != (len(devs) if full else 0):
        problems.append(f"{shared} of {len(devs)} whole GPUs published as shareable (want {'all' if full else 'none'})")
    if full:
        return

    def said() -> set[str]:
        evs = node.get_json("events", "-n", "default")["items"]
        return {g for e in evs if e.get("reason") == "DRAFeatureNotServed" for g in ("DRAConsumableCapacity", "DRADeviceTaints")
                if g in (e.get("note") or e.get("message") or "")}
    if not wait(lambda: said() == {"DRAConsumableCapacity", "DRADeviceTaints"}, 30, 1):
        problems.append(f"Node Events DRAFeatureNotServed name {sorted(said())}, want both gates")


def test_dra_claims_on_a_real_node(dra_node):
    node = dra_node
    sched: str = node.scheduler  # type: ignore[attr-defined]
    timings: dict = {"node up s": round(node.up_s, 1)}
    KUBELET_DUPLICATES.clear()
    report: list[str] = [f"claims allocated by {sched}"]
    problems: list[str] = []
    prepare_host(node)
    if sched == "gpufleet":
        start_scheduler(node)
    t = time.monotonic()
    start_agent(node)
    assert wait(lambda: len(device_uuids(node)) == 16, 60), f"slices: {slices(node)}"
    timings["agent start -> slices published s"] = round(time.monotonic() - t, 1)
    release = release_of(Path(node.loc["bin"]) / "kubelet")
    full = full_dra(release) or ALPHA_GATES
    report.append(f"Kubernetes {release[0]}.{release[1]}: " + (
        "every DRA feature served" if full_dra(release) else
        f"the alpha gates {', '.join(ALPHA_GATES_135)} turned on" if full else
        "no consumable capacity, device taints or extended resources (alpha gates off)"))
    check_served(node, full, problems)
    kdir = REPO / "deploy" / ("dra" if full else "overlays/dra-k8s-1.35")  # as a user of that release (and gates) installs it
    classes = [d for d in yaml.safe_load_all(node.kubectl("kustomize", str(kdir))) if d and d["kind"] == "DeviceClass"]
    node.kubectl("apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": classes}))
    report.append(f"DeviceClasses from {kdir.relative_to(REPO)}: {sorted(c['metadata']['name'] for c in classes)}")
    t = time.monotonic()
    items = workload(full, sched)
    shares = ["share-a", "share-b"] if full else []
    first = [i for i in items if i["kind"] != "Pod" or i["metadata"]["name"] in shares]  # GPU 7 for the shares
    node.kubectl("create", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": first}))
    wait(lambda: all(node.get_json("pod", n)["status"].get("phase") == "Running" for n in shares), 120, 1)
    node.kubectl("create", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List",
                                                          "items": [i for i in items if i not in first]}))
    running = ["one", "pair", "mig", *shares, "shared-1", "shared-2", *(["extended"] if full else [])]
    ok = wait(lambda: all(node.get_json("pod", n)["status"].get("phase") == "Running" for n in running), 180, 1)
    timings[f"{len(running)} pods with claims created -> Running s"] = round(time.monotonic() - t, 1) if ok else None
    held = check_running(node, running, problems)
    report.append("devices: " + json.dumps(held))
    uuids = device_uuids(node)
    if held.get("pair") and len({PCIE_ROOT[uuids[d][1]] for d in held["pair"]}) != 1:
        problems.append(f"pair: GPUs {held['pair']} not on one PCIe root")
    if full and (held.get("share-a") != held.get("share-b") or held.get("share-a") != ["gpu-7"]):
        problems.append(f"shares not on one GPU: {held.get('share-a')} {held.get('share-b')}")
    if held.get("shared-1") != held.get("shared-2"):
        problems.append(f"the shared claim's pods differ: {held.get('shared-1')} {held.get('shared-2')}")
    for n in shares:
        e = SEEN.get(n, ({}, []))[0]
        if (e.get("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"), e.get("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT")) != ("30", "0=20480MB"):
            problems.append(f"{n}: the share's MPS limits are not in its environment: {e}")
    report += [f"  {n}: {json.dumps(SEEN[n])}" for n in running if n in SEEN]
    if not full:  # nvidia.com/gpu on a DRA node needs DRAExtendedResource: no class maps it, no device plugin serves it
        ext = node.get_json("pod", "extended")
        msgs = [e["message"] for e in node.get_json("events", "--field-selector", "involvedObject.name=extended")["items"]
                if e.get("reason") == "FailedScheduling"]
        if ext["status"].get("phase") != "Pending" or not any("nvidia.com/gpu" in m for m in msgs):
            problems.append(f"extended on 1.35: {ext['status'].get('phase')}, {msgs[-1:]} (want Pending, Insufficient nvidia.com/gpu)")
        report.append(f"extended (1.35): {msgs[-1][:200] if msgs else 'no FailedScheduling event'}")
    imp = node.get_json("pod", "impossible")
    if imp["status"].get("phase") != "Pending" or imp["spec"].get("nodeName"):
        problems.append(f"impossible: {imp['status'].get('phase')} on {imp['spec'].get('nodeName')}")
    def failed() -> list[dict]:
        return [e for e in node.get_json("events", "--field-selector", "involvedObject.name=impossible")["items"]
                if e.get("reason") == "FailedScheduling"]
    wait(lambda: any("claim default/impossible-gpu-" in e["message"] for e in failed()), 60, 1)  # once its claim exists
    ev = failed()
    report.append(f"impossible: {ev[-1]['message'][:300] if ev else 'no FailedScheduling event'}")
    for cn in claims_of(node, imp):
        if (node.get_json("resourceclaim", cn).get("status") or {}).get("allocation"):
            problems.append(f"impossible: its claim {cn} was allocated")
    if sched == "gpufleet" and not any("request gpu" in e["message"] and "claim default/impossible-gpu-" in e["message"] for e in ev):
        problems.append(f"impossible: no FailedScheduling event naming its claim and request: {[e['message'] for e in ev]}")

    # the agent restarts: nothing lost; a claim prepared before is unprepared after, a new one prepared
    node.stop("gpufleet-agent")
    t = time.monotonic()
    start_agent(node)
    check_running(node, running, problems)
    unprepared(node, "one", problems, "the agent restart")
    node.kubectl("create", "-f", "-", input=json.dumps(pod("after-agent", [{"name": "gpu", "resourceClaimTemplateName": "one-gpu"}], scheduler=sched)))
    ok = wait(lambda: node.get_json("pod", "after-agent")["status"].get("phase") == "Running", 120, 1)
    timings["agent restart -> new claim's pod Running s"] = round(time.monotonic() - t, 1) if ok else None
    running = [n for n in running if n != "one"] + ["after-agent"]

    # kubelet restarts: it wipes the node's slices; the agent republishes; pods keep running; claims still prepared
    gen = max(s["spec"]["pool"]["generation"] for s in slices(node))
    argv = node.stop("kubelet")
    time.sleep(2)
    t = time.monotonic()
    node.start("kubelet", argv)
    ok = wait(lambda: slices(node) and max(s["spec"]["pool"]["generation"] for s in slices(node)) > gen
              and len(device_uuids(node)) == 16, 120, 0.5)
    timings["kubelet restart -> slices republished s"] = round(time.monotonic() - t, 1) if ok else None
    if not ok:
        problems.append(f"slices after the kubelet restart: {[(s['metadata']['name'], s['spec']['pool']) for s in slices(node)]}")
    settled(node, running)  # kubelet answers PodResources and pod logs again a few seconds after its restart
    check_running(node, running, problems)
    gone = "extended" if full else "mig"
    unprepared(node, gone, problems, "the kubelet restart")
    node.kubectl("create", "-f", "-", input=json.dumps(pod("after-kubelet", [{"name": "gpu", "resourceClaimTemplateName": "one-gpu"}], scheduler=sched)))
    ok = wait(lambda: node.get_json("pod", "after-kubelet")["status"].get("phase") == "Running", 150, 1)
    timings["kubelet restart -> new claim's pod Running s"] = round(time.monotonic() - t, 1) if ok else None
    running = [n for n in running if n != gone] + ["after-kubelet"]
    check_running(node, running, problems)

    freed: list[str] = []
    if sched == "gpufleet":  # gpufleet's scheduler restarts: what it knows comes back from the claims alone
        freed = held.get("pair") or []
        unprepared(node, "pair", problems, "the kubelet restart")  # its two GPUs free, every other whole GPU held
        running.remove("pair")
        wait(lambda: not any(p["metadata"]["name"] == "pair" for p in node.pods()), 60, 1)
        t = time.monotonic()
        node.restart("gpufleet-scheduler")
        node.kubectl("create", "-f", "-", input=json.dumps(pod("after-scheduler", [{"name": "gpu", "resourceClaimTemplateName": "one-gpu"}],
                                                                scheduler=sched)))
        ok = wait(lambda: node.get_json("pod", "after-scheduler")["status"].get("phase") == "Running", 120, 1)
        timings["scheduler restart -> new claim's pod Running s"] = round(time.monotonic() - t, 1) if ok else None
        running.append("after-scheduler")
    held = check_running(node, running, problems)
    owners: dict[str, set[str]] = {}
    for n, devs in held.items():
        for d in devs:
            owners.setdefault(d, set()).add(n.removesuffix("-1").removesuffix("-2").removesuffix("-a").removesuffix("-b"))
    if any(len(o) > 1 for o in owners.values()):  # only the shared claim's pods and the two shares share a device
        problems.append(f"a device held by two pods that share no claim: {owners}")
    if sched == "gpufleet" and not set(held.get("after-scheduler") or ["none"]) <= set(freed):
        problems.append(f"after the scheduler restart the new pod got {held.get('after-scheduler')}, not a GPU freed before it ({freed})")
    report.append("devices at the end: " + json.dumps(held))

    # coexistence: a claim allocated by another allocator to the GPU pod "after-agent" holds, for a pod bound here
    held_dev = [r["device"] for cn in claims_of(node, node.get_json("pod", "after-agent"))
                for r in node.get_json("resourceclaim", cn)["status"]["allocation"]["devices"]["results"]]
    intruder = pod("intruder", [{"name": "gpu", "resourceClaimName": "stolen"}])
    intruder["spec"]["nodeName"] = NODE
    node.kubectl("create", "-f", "-", input=json.dumps(
        {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": "stolen", "namespace": "default"},
         "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.gpufleet.io"}}]}}}))
    node.kubectl("create", "-f", "-", input=json.dumps(intruder))
    ipod = node.get_json("pod", "intruder")
    claim = node.get_json("resourceclaim", "stolen")
    claim["status"] = {"allocation": {"devices": {"results": [{"request": "gpu", "driver": DRIVER, "pool": NODE, "device": held_dev[0]}]},
                                      "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
                                          {"key": "metadata.name", "operator": "In", "values": [NODE]}]}]}},
                       "reservedFor": [{"resource": "pods", "name": "intruder", "uid": ipod["metadata"]["uid"]}]}
    node.kubectl("replace", "--subresource=status", "-f", "-", input=json.dumps(claim))

    def refused() -> bool:
        evs = node.get_json("events")["items"]
        return any(e.get("reason") == "DeviceAlreadyAllocated" and (e.get("regarding") or e.get("involvedObject") or {}).get("name")
                   in ("stolen", "intruder") for e in evs)
    if not wait(refused, 90, 1):
        problems.append("the doubly allocated claim was not refused with a DeviceAlreadyAllocated event")
    time.sleep(5)
    ipod = node.get_json("pod", "intruder")
    if ipod["status"].get("phase") == "Running" or any((s.get("state") or {}).get("running")
                                                       for s in ipod["status"].get("containerStatuses") or []):
        problems.append("the doubly allocated pod's container runs")
    msgs = [e.get("note") or e.get("message") for e in node.get_json("events")["items"] if e.get("reason") == "DeviceAlreadyAllocated"]
    report.append(f"double allocation refused: {msgs[:1]}")
    (node.logs / "events.txt").write_text(node.kubectl("get", "events", "-A", "--sort-by=.lastTimestamp", check=False))
    report.append("timings: " + json.dumps(timings))
    if PODRESOURCES_CAUGHT_UP_S:
        report.append(f"PodResources agreed only after asking again for {PODRESOURCES_CAUGHT_UP_S} s (-1: never)")
    if KUBELET_DUPLICATES:
        report.append(f"kubelet {release[0]}.{release[1]} lists a shared claim's device twice in PodResources (its "
                      f"race, fixed in 1.37): {sorted(KUBELET_DUPLICATES)}")
    report += [f"PROBLEM {p}" for p in problems]
    text = "\n".join(report)
    (node.logs / "gpufleet-dra-e2e-report.txt").write_text(text + "\n")
    print("\n" + text)
    assert not problems, "\n".join(problems)
