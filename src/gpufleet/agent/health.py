"""GPU health from NVML XID events, with recovery.

An XID is the driver's error report for a GPU.  Those an application causes
(a bad kernel, an illegal address, a killed context) say nothing about the
hardware and must not take a GPU away from everyone; the others mark the GPU
unhealthy, which the device plugin reports through ``ListAndWatch`` so that
kubelet stops giving it to new pods.  ``APPLICATION_XIDS`` is the set NVIDIA's
k8s-device-plugin skips by default (its ``applicationErrorXids``), the
meanings are from NVIDIA's "XID Errors" table (docs.nvidia.com/deploy/xid-errors):

====  ==============================================  ==========
XID   meaning                                         effect
====  ==============================================  ==========
13    graphics engine exception (kernel bug)          none
31    GPU memory page fault (illegal address)         none
43    GPU stopped processing (user app fault)         none
45    preemptive cleanup (context killed)             none
68    video processor exception                       none
109   context switch timeout                          none
48    double-bit ECC error                            unhealthy
63    ECC page retirement / row remap recorded        unhealthy
64    ECC page retirement / row remap failure         unhealthy
74    NVLink error                                    unhealthy
79    GPU has fallen off the bus                      unhealthy
92    high single-bit ECC error rate                  unhealthy
94    contained ECC error                             unhealthy
95    uncontained ECC error                           unhealthy
any   other XID                                       unhealthy
====  ==============================================  ==========

Unlike NVIDIA's plugin, where unhealthy lasts until the plugin restarts, a GPU
recovers when NVML answers for it again and no fatal XID arrived for
``recover_after_s`` (the condition cleared: a reset, a transient bus error).
XIDs with no device (index -1) are logged and ignored.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Callable

from .nvml import Backend, XidEvent

log = logging.getLogger(__name__)

APPLICATION_XIDS = frozenset({13, 31, 43, 45, 68, 109})
HARDWARE_XIDS = frozenset({48, 63, 64, 74, 79, 92, 94, 95})  # documented examples; every non-application XID counts


def is_fatal(xid: int) -> bool:
    return xid not in APPLICATION_XIDS


@dataclass
class HealthTracker:
    backend: Backend
    recover_after_s: float = 300.0
    clock: Callable[[], float] = time.time
    indices: tuple[int, ...] | None = None  # GPUs to watch; default: what the backend lists once
    last_fatal: dict[int, float] = field(default_factory=dict)
    reasons: dict[int, str] = field(default_factory=dict)
    last_xid: dict[int, int] = field(default_factory=dict)  # every XID seen, for metrics
    recent_xids: list[XidEvent] = field(default_factory=list)  # those the last update polled (for the exporter)
    _state: dict[int, bool] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.indices is None:
            self.indices = tuple(g.index for g in self.backend.gpus())

    def update(self) -> dict[int, bool]:
        """Poll XIDs and device state; returns gpu index -> healthy."""
        now = self.clock()
        self.recent_xids = list(self.backend.poll_xids())
        for ev in self.recent_xids:
            self._record(ev, now)
        out = {}
        for i in self.indices or ():
            ok = self.backend.device_ok(i)
            if not ok:
                self.last_fatal[i] = now
                self.reasons[i] = "NVML cannot query the device"
            t = self.last_fatal.get(i)
            healthy = ok and (t is None or now - t >= self.recover_after_s)
            if healthy and i in self.last_fatal:
                del self.last_fatal[i]
                self.reasons.pop(i, None)
            if self._state.get(i, True) != healthy:
                if healthy:
                    log.info("GPU %d healthy again (no fatal XID for %.0f s, NVML answers)", i, self.recover_after_s)
                else:
                    log.warning("GPU %d unhealthy: %s", i, self.reasons.get(i, "unknown"))
            self._state[i] = healthy
            out[i] = healthy
        return out

    def _record(self, ev: XidEvent, now: float) -> None:
        if ev.gpu_index < 0:
            log.warning("XID %d for no particular GPU: ignored", ev.xid)
            return
        self.last_xid[ev.gpu_index] = ev.xid
        if not is_fatal(ev.xid):
            log.info("GPU %d: application XID %d, stays healthy", ev.gpu_index, ev.xid)
            return
        self.last_fatal[ev.gpu_index] = now
        self.reasons[ev.gpu_index] = f"XID {ev.xid}"
