"""An in-memory stand-in for the API calls the DRA driver makes (``gpufleet.agent.dra.kubeapi.DraApi``)."""

from __future__ import annotations

import copy
import itertools
import threading
import time

from gpufleet.agent.dra.kubeapi import Conflict, Gone, NotFound


class FakeDraApi:
    def __init__(self, node: str = "node-a", node_uid: str = "node-uid-1") -> None:
        self.nodes = {node: {"metadata": {"name": node, "uid": node_uid}}}
        self.claims: dict[str, dict] = {}  # namespace/name -> claim
        self.slices: dict[str, dict] = {}
        self.events: list[tuple[dict, str, str, str]] = []
        self.calls: dict[str, int] = {}
        self.fail = 0  # the next N calls raise ConnectionError
        # gated fields this "API server" drops on write, as kube-apiserver 1.35 does by default
        # ("consumable-capacity": allowMultipleAllocations and requestPolicy; "taints")
        self.drops: set[str] = set()
        self.probe_fails = False  # dry runs refused (an admission webhook that does not support them, say)
        self._rv = itertools.count(1)
        self._log: list[tuple[int, str, dict]] = []
        self._compacted = 0
        self._cv = threading.Condition()

    def _call(self, what: str) -> None:
        self.calls[what] = self.calls.get(what, 0) + 1
        if self.fail > 0:
            self.fail -= 1
            raise ConnectionError(f"injected API failure ({what})")

    def _touch(self, type_: str, obj: dict) -> None:
        rv = next(self._rv)
        obj["metadata"]["resourceVersion"] = str(rv)
        self._log.append((rv, type_, copy.deepcopy(obj)))
        self._cv.notify_all()

    def _strip(self, obj: dict) -> dict:
        o = copy.deepcopy(obj)
        for d in (o.get("spec") or {}).get("devices") or []:
            if "consumable-capacity" in self.drops:
                d.pop("allowMultipleAllocations", None)
                for c in (d.get("capacity") or {}).values():
                    c.pop("requestPolicy", None)
            if "taints" in self.drops:
                d.pop("taints", None)
        return o

    # --- what the driver calls ------------------------------------------------------------
    def get_claim(self, namespace: str, name: str) -> dict:
        with self._cv:
            self._call("get_claim")
            c = self.claims.get(f"{namespace}/{name}")
            if c is None:
                raise NotFound(f"resourceclaims {name} not found")
            return copy.deepcopy(c)

    def list_slices(self, node: str, driver: str) -> tuple[list[dict], str]:
        with self._cv:
            self._call("list_slices")
            items = [copy.deepcopy(s) for s in self.slices.values()
                     if s["spec"].get("nodeName") == node and s["spec"].get("driver") == driver]
            return items, str(next(self._rv))

    def create_slice(self, obj: dict) -> dict:
        with self._cv:
            self._call("create_slice")
            name = obj["metadata"]["name"]
            if name in self.slices:
                raise Conflict(f"resourceslices {name} already exists")
            o = self._strip(obj)
            o["metadata"].pop("resourceVersion", None)
            self.slices[name] = o
            self._touch("ADDED", o)
            return copy.deepcopy(o)

    def probe_slice(self, obj: dict) -> dict:
        with self._cv:
            self._call("probe_slice")
            if self.probe_fails:
                raise ConnectionError("dry run refused")
            o = self._strip(obj)
            o["metadata"]["name"] = o["metadata"].pop("generateName", "") + "x1y2z"
            return o

    def update_slice(self, obj: dict) -> dict:
        with self._cv:
            self._call("update_slice")
            name = obj["metadata"]["name"]
            cur = self.slices.get(name)
            if cur is None:
                raise NotFound(name)
            if obj["metadata"].get("resourceVersion") != cur["metadata"]["resourceVersion"]:
                raise Conflict(f"resourceslices {name}: the object has been modified")
            o = self._strip(obj)
            self.slices[name] = o
            self._touch("MODIFIED", o)
            return copy.deepcopy(o)

    def delete_slice(self, name: str) -> None:
        with self._cv:
            self._call("delete_slice")
            o = self.slices.pop(name, None)
            if o is None:
                raise NotFound(name)
            self._touch("DELETED", o)

    def get_node(self, name: str) -> dict:
        with self._cv:
            self._call("get_node")
            if name not in self.nodes:
                raise NotFound(name)
            return copy.deepcopy(self.nodes[name])

    def watch_slices(self, node: str, driver: str, resource_version: str, timeout_s: int):
        rv = int(resource_version or 0)
        end = time.monotonic() + timeout_s
        while time.monotonic() < end:
            with self._cv:
                if rv < self._compacted:
                    raise Gone("too old")
                batch = [(r, t, copy.deepcopy(o)) for r, t, o in self._log if r > rv
                         and o["spec"].get("nodeName") == node and o["spec"].get("driver") == driver]
                if not batch:
                    self._cv.wait(0.1)
                    continue
            for r, t, o in batch:
                rv = r
                yield t, o

    def event(self, regarding: dict, type_: str, reason: str, note: str, action: str = "PrepareResources") -> None:
        with self._cv:
            self.events.append((dict(regarding), type_, reason, note))

    # --- what kubelet, kube-scheduler or an admin would do ------------------------------------
    def wipe_slices(self, node: str) -> None:
        """kubelet at start: every slice of the node goes."""
        with self._cv:
            for name in [n for n, s in self.slices.items() if s["spec"].get("nodeName") == node]:
                self._touch("DELETED", self.slices.pop(name))

    def edit_slice(self, name: str, fn) -> None:
        with self._cv:
            fn(self.slices[name])
            self._touch("MODIFIED", self.slices[name])

    def add_claim(self, claim: dict) -> dict:
        m = claim["metadata"]
        self.claims[f"{m['namespace']}/{m['name']}"] = claim
        return claim


def claim(name: str, uid: str, results: list[dict], namespace: str = "default", pods: tuple[str, ...] = ("pod-1",),
          allocated: bool = True) -> dict:
    """A ResourceClaim as an allocator leaves it: status.allocation.devices.results and reservedFor."""
    status: dict = {"reservedFor": [{"resource": "pods", "name": p, "uid": f"{p}-uid"} for p in pods]}
    if allocated:
        status["allocation"] = {"devices": {"results": results}}
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": namespace, "uid": uid},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.gpufleet.io"}}]}},
            "status": status}


def result(device: str, request: str = "gpu", pool: str = "node-a", driver: str = "gpu.gpufleet.io", **extra) -> dict:
    return {"request": request, "driver": driver, "pool": pool, "device": device, **extra}
