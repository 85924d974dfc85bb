"""Helpers for the live scheduler's DRA tests: DRA nodes publishing the agent's own slices, claims, pods, the
resourceclaim controller's part (claims from templates), and applying watch events."""

from __future__ import annotations

import copy
from pathlib import Path


from gpufleet.agent.dra.devices import DraOptions, build_devices
from gpufleet.agent.dra.slices import build_slices
from gpufleet.agent.nvml import PROFILES
from tests.kube.fake_api import FakeApi
from gpufleet.kube.loop import SchedulerLoop
from gpufleet.policies import build_profile

DRIVER = "gpu.gpufleet.io"
ROOT = Path(__file__).parents[2]
# PCIe roots of the fake a100-mig node: whole GPUs 2-4 on one, 5-7 on another
PCIE = {0: "pci0000:00", 1: "pci0000:80", 2: "pci0000:00", 3: "pci0000:00", 4: "pci0000:00", 5: "pci0000:80",
        6: "pci0000:80", 7: "pci0000:80"}


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def devices(node: str, profile: str = "a100-mig", opts: DraOptions | None = None) -> list[dict]:
    """The devices the agent publishes for a fake GPU profile, UUIDs made unique per node, PCIe roots added."""
    drv, gpus = PROFILES[profile]
    out = copy.deepcopy(build_devices(gpus, drv, opts or DraOptions()).devices)
    for d in out:
        for k, a in d["attributes"].items():
            if k.endswith(("uuid", "UUID")):
                a["string"] = f"{a['string']}-{node}"[-64:]
        idx = d["attributes"]["index"]["int"]
        d["attributes"]["resource.kubernetes.io/pcieRoot"] = {"string": PCIE[idx]}
    return out


def node_obj(name: str, cpu: str = "64") -> dict:
    return {"metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}}, "spec": {},
            "status": {"allocatable": {"cpu": cpu, "memory": "512Gi", "pods": "110"},
                       "conditions": [{"type": "Ready", "status": "True"}]}}


def add_dra_node(api: FakeApi, name: str, profile: str = "a100-mig", generation: int = 1, devs: list[dict] | None = None) -> None:
    for s in build_slices(name, DRIVER, devs if devs is not None else devices(name, profile), generation):
        api.put_object("resourceslice", s)
    api.add_node(node_obj(name))


def classes() -> list[dict]:
    """Every shipped DeviceClass (deploy/dra as applied on 1.36+)."""
    from tests.dra_release import all_device_classes

    return all_device_classes()


def dra_api(nodes: int = 1, profile: str = "a100-mig") -> FakeApi:
    api = FakeApi()
    for c in classes():
        api.put_object("deviceclass", c)
    for i in range(nodes):
        add_dra_node(api, f"d{i}", profile)
    return api


def request(name: str = "gpu", cls: str = "gpu.gpufleet.io", count: int = 1, selectors: list[str] | None = None,
            capacity: dict | None = None) -> dict:
    ex: dict = {"deviceClassName": cls}
    if count != 1:
        ex["count"] = count
    if selectors:
        ex["selectors"] = [{"cel": {"expression": e}} for e in selectors]
    if capacity:
        ex["capacity"] = {"requests": capacity}
    return {"name": name, "exactly": ex}


def claim(name: str, *requests: dict, constraints: list | None = None, ns: str = "ml") -> dict:
    spec: dict = {"devices": {"requests": list(requests or [request()])}}
    if constraints:
        spec["devices"]["constraints"] = constraints
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": ns, "uid": f"uid-claim-{name}"}, "spec": spec}


def template(name: str, *requests: dict, constraints: list | None = None, ns: str = "ml") -> dict:
    c = claim(name, *requests, constraints=constraints, ns=ns)
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
            "metadata": {"name": name, "namespace": ns}, "spec": {"spec": c["spec"]}}


def pod(name: str, claims: dict[str, str] | None = None, templates: dict[str, str] | None = None, scheduler: str = "gpufleet",
        cpu: str = "1", limits: dict | None = None, ns: str = "ml", priority: int = 0, annotations: dict | None = None) -> dict:
    """``claims``: pod claim name -> ResourceClaim name; ``templates``: pod claim name -> template name."""
    rcs = [{"name": k, "resourceClaimName": v} for k, v in (claims or {}).items()]
    rcs += [{"name": k, "resourceClaimTemplateName": v} for k, v in (templates or {}).items()]
    res: dict = {"requests": {"cpu": cpu, "memory": "1Gi"}, "limits": dict(limits or {})}
    if rcs:
        res["claims"] = [{"name": r["name"]} for r in rcs]
    spec: dict = {"schedulerName": scheduler, "priority": priority, "containers": [{"name": "c", "resources": res}]}
    if rcs:
        spec["resourceClaims"] = rcs
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": ns, "uid": f"uid-{name}", "annotations": dict(annotations or {})},
            "spec": spec, "status": {"phase": "Pending"}}


def claim_controller(api: FakeApi) -> int:
    """kube-controller-manager's resourceclaim controller, once: a claim from each pod's templates (owned by the pod,
    named in pod.status.resourceClaimStatuses); returns how many it made."""
    made = 0
    for p in list(api.pods.values()):
        m = p["metadata"]
        statuses = {s["name"] for s in (p.get("status") or {}).get("resourceClaimStatuses") or []}
        new = []
        for pc in p["spec"].get("resourceClaims") or []:
            t = pc.get("resourceClaimTemplateName")
            if not t or pc["name"] in statuses:
                continue
            tmpl = api.objects["resourceclaimtemplate"].get(f"{m['namespace']}/{t}")
            if tmpl is None:
                continue
            c = api.create_object("resourceclaim", m["namespace"], {
                "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                "metadata": {"generateName": f"{m['name']}-{pc['name']}-",
                             "annotations": {"resource.kubernetes.io/pod-claim-name": pc["name"]},
                             "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": m["name"], "uid": m["uid"],
                                                  "controller": True}]},
                "spec": copy.deepcopy(tmpl["spec"]["spec"])})
            new.append({"name": pc["name"], "resourceClaimName": c["metadata"]["name"]})
            made += 1
        if new:
            p.setdefault("status", {}).setdefault("resourceClaimStatuses", []).extend(new)
            api.update_pod(p)
    return made


def sync(api: FakeApi, loop: SchedulerLoop) -> None:
    """Apply every watch event since the loop's resourceVersions (what the runner's reflectors do)."""
    for kind in loop.cache.watch_kinds:
        for t, obj in api.watch(kind, loop.cache.rv[kind]):
            loop.handle(kind, t, obj)


def make_loop(api: FakeApi, policy: str = "default", clock: Clock | None = None, **kw) -> SchedulerLoop:
    loop = SchedulerLoop(api, build_profile(policy), clock=clock or Clock(), **kw)
    loop.resync()
    return loop


def run(api: FakeApi, loop: SchedulerLoop, rounds: int = 4) -> None:
    clock = loop.clock
    for _ in range(rounds):
        sync(api, loop)
        loop.schedule_due()
        if isinstance(clock, Clock):
            clock.t += 61
    sync(api, loop)


def allocation(api: FakeApi, key: str) -> dict | None:
    return ((api.objects["resourceclaim"].get(key) or {}).get("status") or {}).get("allocation")


def devices_of(api: FakeApi, key: str) -> list[str]:
    a = allocation(api, key)
    return [r["device"] for r in a["devices"]["results"]] if a else []


def claim_of(api: FakeApi, pod_key: str, name: str = "gpu") -> str:
    """The claim a pod's template made (ns/name)."""
    p = api.pods[pod_key]
    ns = p["metadata"]["namespace"]
    for s in p["status"].get("resourceClaimStatuses") or []:
        if s["name"] == name:
            return f"{ns}/{s['resourceClaimName']}"
    for pc in p["spec"].get("resourceClaims") or []:
        if pc["name"] == name and pc.get("resourceClaimName"):
            return f"{ns}/{pc['resourceClaimName']}"
    raise KeyError(name)
