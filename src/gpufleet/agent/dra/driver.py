"""The agent in DRA mode: discovery and health in, ResourceSlices and a kubelet plugin out.

``gpufleet agent --dra`` keeps the agent's discovery, XID health tracking,
labels and metrics, and replaces the device plugins with this driver: the
node's GPUs and MIG instances are published as devices of ``gpu.gpufleet.io``
(``devices.py``, ``slices.py``) and kubelet prepares the claims allocated to
them through the plugin (``server.py``, ``prepare.py``, ``cdi.py``, with the
checkpoint in ``state.py``).  The agent's loop calls ``update`` with every
health round and ``step`` to keep the sockets and the slices in place.
"""

from __future__ import annotations

import datetime
import logging
import os
import threading
import time
from typing import Callable

from ..nvml import DriverInfo, GpuInfo
from .cdi import CdiWriter
from .devices import DeviceSet, DraOptions, Fault, Published, build_devices
from .kubeapi import DraApi
from .prepare import EventSink, Preparer
from .server import HealthService, KubeletPlugin
from .slices import SlicePublisher
from .state import Checkpoint

log = logging.getLogger(__name__)


def rfc3339(t: float) -> str:
    return datetime.datetime.fromtimestamp(int(t), datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


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
                log.info("GPU %d recovered: its device taint is removed", i)
            for i in set(faults) - set(self.faults):
                log.warning("GPU %d unhealthy (%s): its devices get a NoSchedule taint", i, faults[i].reason)
            self.faults = faults
            self.devices = build_devices(gpus, drv, self.opts, faults)
            devices = self.devices
        if self.publisher is not None:
            self.publisher.set_devices(devices.devices)
        if self.health is not None:
            self.health.update({name: (p.gpu_index not in faults, faults[p.gpu_index].reason if p.gpu_index in faults else "")
                                for name, p in devices.published.items()})

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
        if self.publisher is not None:
            self.publisher.sync()

    def registered(self) -> bool:
        st = self.plugin.registration.status
        return self.plugin.serving() and st is not None and st[0]

    def stop(self) -> None:
        self._watch_stop.set()
        self.plugin.stop()


__all__ = ["DraDriver", "rfc3339"]
