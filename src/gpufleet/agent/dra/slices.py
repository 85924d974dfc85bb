"""The node's ResourceSlices: built from its devices, kept published.

One pool per node, named after the node (as NVIDIA's driver does), split into
slices of at most 64 devices (the API's limit once a device carries taints).
Consumers only trust a complete pool at its highest generation, so every write
round bumps the generation on all of the pool's slices.

Kubelet deletes a node's slices when it starts and a driver's slices 30 s
after its plugin disconnects; an admin may delete or edit them too.  The
publisher therefore remembers the resourceVersion of every slice it wrote and
rewrites the pool when the API shows anything else: a slice missing, one it
did not write (or changed by someone else), one left over.  A watch on the
node's slices (``run_watch``) makes that prompt; a periodic full check covers
a watch that broke.  API failures are logged and retried; they never stop the
kubelet plugin from serving claims already allocated.
"""

from __future__ import annotations

import copy
import hashlib
import logging
import threading
import time
from typing import Callable

from .features import Feature, lost
from .kubeapi import Conflict, DraApi, Gone, NotFound

log = logging.getLogger(__name__)

MAX_DEVICES_PER_SLICE = 64


def slice_name(node: str, driver: str, i: int) -> str:
    name = f"{node}-{driver}-{i}"
    if len(name) <= 253:
        return name
    digest = hashlib.sha256(f"{node}/{driver}".encode()).hexdigest()[:10]
    return f"{node[:200]}-{digest}-{i}"


def build_slices(node: str, driver: str, devices: list[dict], generation: int, owner: dict | None = None) -> list[dict]:
    """The pool's slices (``resource.k8s.io/v1`` objects); at least one, so an empty pool is published as such."""
    chunks = [devices[i:i + MAX_DEVICES_PER_SLICE] for i in range(0, len(devices), MAX_DEVICES_PER_SLICE)] or [[]]
    out = []
    for i, chunk in enumerate(chunks):
        meta: dict = {"name": slice_name(node, driver, i), "labels": {"app.kubernetes.io/managed-by": "gpufleet-agent"}}
        if owner:
            meta["ownerReferences"] = [owner]
        spec: dict = {"driver": driver, "nodeName": node,
                      "pool": {"name": node, "generation": generation, "resourceSliceCount": len(chunks)}}
        if chunk:
            spec["devices"] = copy.deepcopy(chunk)
        out.append({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": meta, "spec": spec})
    return out


class SlicePublisher:
    """Keeps the API's slices of (node, driver) equal to the devices it is given."""

    def __init__(self, api: DraApi, node: str, driver: str, clock: Callable[[], float] = time.monotonic,
                 resync_s: float = 300.0) -> None:
        self.api = api
        self.node = node
        self.driver = driver
        self.clock = clock
        self.resync_s = resync_s
        self.devices: list[dict] | None = None  # desired; None until the driver sets them
        self.generation = 0
        self.written: dict[str, str] = {}  # slice name -> resourceVersion we wrote
        self._published: list[dict] | None = None  # the devices of the last complete write round
        self._owner: dict | None = None
        self._dirty = threading.Event()
        self._dirty.set()
        self._lock = threading.Lock()
        self._last_check = -1e18
        self.writes = 0  # create/update/delete calls made (tests, logs)
        self.rounds = 0  # write rounds (each one a new generation)
        self.last_error = ""
        self.lost: list[Feature] = []  # gated fields a write came back without (features.py); the driver clears it

    def set_devices(self, devices: list[dict]) -> None:
        with self._lock:
            if devices != self.devices:
                self.devices = copy.deepcopy(devices)
                self._dirty.set()

    def mark_dirty(self) -> None:
        self._dirty.set()

    def node_uid(self) -> str | None:
        ref = self._owner_ref()
        return ref["uid"] if ref else None

    def _owner_ref(self) -> dict | None:
        """The Node as the slices' owner, so they go when the node object goes (as kubelet plugins do)."""
        if self._owner is None:
            try:
                node = self.api.get_node(self.node)
                uid = (node.get("metadata") or {}).get("uid")
                if uid:
                    self._owner = {"apiVersion": "v1", "kind": "Node", "name": self.node, "uid": uid, "controller": True}
            except Exception as exc:  # no owner is only a garbage-collection nicety
                log.debug("cannot read node %s for the slices' owner: %s", self.node, exc)
        return self._owner

    def sync(self, force: bool = False) -> bool:
        """Check (when something changed, or every ``resync_s``) and write if needed; True when the API now matches."""
        due = self.clock() - self._last_check >= self.resync_s
        if not (force or due or self._dirty.is_set()) or self.devices is None:
            return self.last_error == ""
        self._dirty.clear()
        self._last_check = self.clock()
        try:
            self._reconcile()
            self.last_error = ""
            return True
        except Exception as exc:  # the API away or refusing: keep serving, retry next step
            self.last_error = str(exc)
            log.warning("publishing ResourceSlices for %s failed: %s; retrying", self.node, exc)
            self._dirty.set()
            return False

    def _reconcile(self) -> None:
        with self._lock:
            devices = copy.deepcopy(self.devices) or []
        items, _ = self.api.list_slices(self.node, self.driver)
        ours: dict[str, dict] = {str((o.get("metadata") or {}).get("name")): o for o in items}
        want_names = [slice_name(self.node, self.driver, i)
                      for i in range(max(1, -(-len(devices) // MAX_DEVICES_PER_SLICE)))]
        intact = (devices == self._published and set(ours) == set(want_names)
                  and all(self.written.get(n) == (ours[n].get("metadata") or {}).get("resourceVersion") for n in want_names))
        if intact:
            return
        top = max([int(((o.get("spec") or {}).get("pool") or {}).get("generation") or 0) for o in items] + [self.generation])
        self.generation = top + 1
        desired = build_slices(self.node, self.driver, devices, self.generation, self._owner_ref())
        why = ("devices changed" if devices != self._published else
               f"slices missing {sorted(set(want_names) - set(ours))}" if set(want_names) - set(ours) else
               "slices changed or left over by someone else")
        log.info("publishing %d device(s) in %d ResourceSlice(s), pool %s generation %d (%s)",
                 len(devices), len(desired), self.node, self.generation, why)
        written: dict[str, str] = {}
        for s in desired:
            name = s["metadata"]["name"]
            cur = ours.get(name)
            if cur is not None:
                s["metadata"]["resourceVersion"] = (cur.get("metadata") or {}).get("resourceVersion")
                try:
                    got = self.api.update_slice(s)
                except NotFound:
                    s["metadata"].pop("resourceVersion", None)
                    got = self.api.create_slice(s)
            else:
                try:
                    got = self.api.create_slice(s)
                except Conflict:  # created meanwhile (a racing round): the next round updates it
                    self._dirty.set()
                    continue
            self.writes += 1
            written[name] = str((got.get("metadata") or {}).get("resourceVersion") or "")
            for f in lost(s["spec"].get("devices") or [], (got.get("spec") or {}).get("devices") or []):
                if f not in self.lost:
                    log.warning("ResourceSlice %s came back without %s: the API server does not serve %s", name, f.field, f.name)
                    self.lost.append(f)
        for name in set(ours) - set(want_names):
            try:
                self.api.delete_slice(name)
                self.writes += 1
            except NotFound:
                pass
        self.written = written
        self._published = devices
        self.rounds += 1

    def notice(self, type_: str, obj: dict) -> None:
        """A watch event on one of the node's slices: anything we did not write triggers a check."""
        meta = obj.get("metadata") or {}
        name, rv = str(meta.get("name")), meta.get("resourceVersion")
        if type_ == "BOOKMARK":
            return
        if type_ == "DELETED" or self.written.get(name) != rv:
            if type_ == "DELETED":
                log.info("ResourceSlice %s was deleted (kubelet restart or disconnect, or an admin): republishing", name)
            self._dirty.set()

    def run_watch(self, stop: threading.Event, timeout_s: int = 300, backoff_s: float = 2.0) -> None:
        """Watch the node's slices until ``stop``; every event goes to ``notice``; relists on 410 or errors."""
        while not stop.is_set():
            try:
                items, rv = self.api.list_slices(self.node, self.driver)
                for o in items:
                    self.notice("ADDED", o)
                for t, o in self.api.watch_slices(self.node, self.driver, rv, timeout_s):
                    self.notice(t, o)
                    if stop.is_set():
                        return
            except Gone:
                continue
            except Exception as exc:
                log.debug("ResourceSlice watch for %s: %s; retrying", self.node, exc)
                stop.wait(backoff_s)

    def wait_dirty(self, timeout_s: float) -> bool:
        return self._dirty.wait(timeout_s)

    def delete_all(self) -> None:
        """Remove this node's slices of this driver (the agent leaving DRA mode for good; not on restart)."""
        items, _ = self.api.list_slices(self.node, self.driver)
        for o in items:
            try:
                self.api.delete_slice(o["metadata"]["name"])
            except NotFound:
                pass
        self.written = {}
        self._published = None


__all__ = ["MAX_DEVICES_PER_SLICE", "SlicePublisher", "build_slices", "slice_name"]
