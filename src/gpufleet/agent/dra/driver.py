"""The agent in DRA mode: discovery and health in, ResourceSlices and a kubelet plugin out.

``gpufleet agent --dra`` keeps the agent's discovery, XID health tracking,
labels and metrics, and replaces the device plugins with this driver: the
node's GPUs and MIG instances are published as devices of ``gpu.gpufleet.io``
(``devices.py``, ``slices.py``) and kubelet prepares the claims allocated to
them through the plugin (``server.py``, ``prepare.py``, ``cdi.py``, with the
checkpoint in ``state.py``).  The agent's loop calls ``update`` with every
health round and ``step`` to keep the sockets and the slices in place.
What is published follows what the API server serves (``features.py``): on a
1.35 control plane GPUs are exclusive and unhealthy ones are left out.
"""

from __future__ import annotations

import dataclasses
import datetime
import logging
import os
import threading
import time
from typing import Callable

from ..nvml import DriverInfo, GpuInfo
from .cdi import CdiWriter
from .devices import DeviceSet, DraOptions, Fault, Published, build_devices
from .features import CONSUMABLE_CAPACITY, FEATURES, Feature, Served, not_served_message, probe_slice, served_again_message, served_by_probe
from .kubeapi import DraApi
from .prepare import EventSink, Preparer
from .server import HealthService, KubeletPlugin
from .slices import SlicePublisher
from .state import Checkpoint

log = logging.getLogger(__name__)


def rfc3339(t: float) -> str:
    return datetime.datetime.fromtimestamp(int(t), datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


PROBE_RETRY_S = 30.0  # a failed feature probe is tried again this soon (a good one every resync_s)


class DraDriver:
    def __init__(self, api: DraApi | None, node: str, opts: DraOptions, state_dir: str, cdi: CdiWriter,
                 plugins_dir: str = "/var/lib/kubelet/plugins", registry_dir: str = "/var/lib/kubelet/plugins_registry",
                 health_stream: bool = True, clock: Callable[[], float] = time.time, resync_s: float = 300.0) -> None:
        self.api = api
        self.node = node
        self.opts = opts
        self.clock = clock
        self.checkpoint = Checkpoint(os.path.join(state_dir, f"dra-{opts.driver}.checkpoint.json"), opts.driver, node)
        self.events = EventSink(api)
        self.preparer = Preparer(api, self.checkpoint, cdi, node, opts.driver, self.inventory, self.events)
        self.health = HealthService(node) if health_stream else None
        self.plugin = KubeletPlugin(opts.driver, self.preparer, plugins_dir, registry_dir, self.health)
        self.publisher = SlicePublisher(api, node, opts.driver, resync_s=resync_s) if api is not None else None
        self.devices = DeviceSet()
        self.faults: dict[int, Fault] = {}
        self.served = Served()  # what the API server keeps of the slices (features.py); all until it says otherwise
        self.served_known = False
        self.resync_s = resync_s
        self._next_probe = -1e18
        self._inputs: tuple[list[GpuInfo], DriverInfo] | None = None
        self._lock = threading.Lock()
        self._watch_stop = threading.Event()
        self._watch: threading.Thread | None = None
        self.restarts = 0

    # --- what is published ----------------------------------------------------------------
    def inventory(self) -> tuple[dict[str, Published], dict[int, Fault]]:
        with self._lock:
            return dict(self.devices.published), dict(self.faults)

    def uuid_of(self, driver: str, pool: str, device: str) -> str | None:
        """The GPU or MIG UUID behind one of this driver's devices (PodResources -> per-pod metrics)."""
        if driver != self.opts.driver or pool != self.node:
            return None
        with self._lock:
            p = self.devices.published.get(device)
        return p.uuid if p is not None else None

    def update(self, gpus: list[GpuInfo], drv: DriverInfo, health: dict[int, bool], reasons: dict[int, str]) -> None:
        """A health round (or a new discovery): recompute devices, taints and the health stream."""
        now = self.clock()
        with self._lock:
            faults: dict[int, Fault] = {}
            for g in gpus:
                if health.get(g.index, True):
                    continue
                old = self.faults.get(g.index)
                reason = reasons.get(g.index) or "unhealthy"
                faults[g.index] = Fault(reason, old.since if old is not None and old.reason == reason else rfc3339(now))
            for i in set(self.faults) - set(faults):
                log.info("GPU %d recovered: %s", i, "its device taint is removed" if self.served.device_taints else
                         "published again")
            for i in set(faults) - set(self.faults):
                log.warning("GPU %d unhealthy (%s): %s", i, faults[i].reason,
                            "its devices get a NoSchedule taint" if self.served.device_taints else
                            "its devices are left out of the ResourceSlices (the API server does not serve device taints)")
            self.faults = faults
            self._inputs = (gpus, drv)
        self._rebuild()

    def _rebuild(self) -> None:
        with self._lock:
            if self._inputs is None:
                return
            gpus, drv = self._inputs
            faults = self.faults
            opts = self.opts if self.served.consumable_capacity else dataclasses.replace(self.opts, shares=False)
            self.devices = build_devices(gpus, drv, opts, faults, taints=self.served.device_taints)
            devices = self.devices
        if self.publisher is not None:
            self.publisher.set_devices(devices.devices)
        if self.health is not None:
            self.health.update({name: (p.gpu_index not in faults, faults[p.gpu_index].reason if p.gpu_index in faults else "")
                                for name, p in devices.published.items()})

    # --- what the API server serves -------------------------------------------------------
    def _probe(self) -> None:
        """Ask the API server (dry run) which gated fields it keeps: at start, then every ``resync_s``."""
        if self.api is None or self.clock() < self._next_probe:
            return
        sent = probe_slice(self.node, self.opts.driver)
        try:
            served = served_by_probe(sent, self.api.probe_slice(sent))
        except Exception as exc:  # the API away or refusing dry runs: keep what is known, the writes are checked too
            self._next_probe = self.clock() + PROBE_RETRY_S
            log.debug("DRA feature probe (dry-run ResourceSlice create) failed: %s; retrying", exc)
            return
        self._next_probe = self.clock() + self.resync_s
        self._set_served(served)

    def _set_served(self, served: Served) -> None:
        was, known = self.served, self.served_known
        self.served, self.served_known = served, True
        changed = [f for f in FEATURES if served.has(f) != was.has(f) or (not known and not served.has(f))]
        for f in changed:
            self._say(f, served.has(f))
        if any(served.has(f) != was.has(f) for f in FEATURES):
            self._rebuild()

    def _say(self, f: Feature, served: bool) -> None:
        if f is CONSUMABLE_CAPACITY and not self.opts.shares:
            return  # shares were not asked for (--no-dra-shares): nothing lost, nothing gained
        msg = served_again_message(f) if served else not_served_message(f)
        (log.info if served else log.warning)("%s", msg)
        uid = self.publisher.node_uid() if self.publisher is not None else None
        self.events.post({"apiVersion": "v1", "kind": "Node", "name": self.node, "uid": uid or ""},
                         "Normal" if served else "Warning", "DRAFeatureServed" if served else "DRAFeatureNotServed", msg,
                         action="PublishResourceSlices")

    # --- lifecycle ------------------------------------------------------------------------
    def start(self) -> None:
        self.preparer.clean_orphans()
        self.plugin.start()
        if self.publisher is not None and self._watch is None:
            self._watch_stop.clear()
            self._watch = threading.Thread(target=self.publisher.run_watch, args=(self._watch_stop,), name="dra-slices",
                                           daemon=True)
            self._watch.start()

    def step(self) -> None:
        if not self.plugin.serving():
            if self.plugin.started:
                log.warning("DRA plugin sockets %s / %s vanished: serving and registering again", self.plugin.socket,
                            self.plugin.reg_socket)
            self.plugin.stop(remove_sockets=False)
            self.plugin.start()
            self.restarts += 1
        self.publish()

    def publish(self, force: bool = False) -> bool:
        """Keep the slices published as the API server serves them; True when the API matches."""
        if self.publisher is None:
            return False
        self._probe()
        ok = self.publisher.sync(force=force)
        if self.publisher.lost:  # a write came back without a gated field: the server stopped serving it
            lost, self.publisher.lost = self.publisher.lost, []
            served = self.served
            for f in lost:
                served = served.without(f)
            self._set_served(served)
            ok = self.publisher.sync(force=True)
        return ok

    def registered(self) -> bool:
        st = self.plugin.registration.status
        return self.plugin.serving() and st is not None and st[0]

    def stop(self) -> None:
        self._watch_stop.set()
        self.plugin.stop()


__all__ = ["DraDriver", "rfc3339"]
