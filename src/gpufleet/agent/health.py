"""GPU health from NVML XID events, with recovery.

XIDs caused by applications (a bad kernel, a killed context) say nothing about
the hardware and must not take a GPU away from everyone: 13 (graphics engine
exception), 31 (GPU memory page fault), 43 (GPU stopped processing), 45
(preemptive cleanup), 68 (video processor exception), 109 (context switch
timeout) -- the same set NVIDIA's device plugin skips by default.  Any other
XID (48 double-bit ECC, 63/64 row remapping, 74 NVLink, 79 fallen off the bus,
92/94/95 ECC, ...) marks the GPU unhealthy.

Unlike NVIDIA's plugin, where unhealthy lasts until the plugin restarts, a GPU
recovers when NVML answers for it again and no fatal XID arrived for
``recover_after_s``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

from .nvml import Backend, XidEvent

APPLICATION_XIDS = frozenset({13, 31, 43, 45, 68, 109})


def is_fatal(xid: int) -> bool:
    return xid not in APPLICATION_XIDS


@dataclass
class HealthTracker:
    backend: Backend
    recover_after_s: float = 300.0
    clock: Callable[[], float] = time.time
    last_fatal: dict[int, float] = field(default_factory=dict)
    reasons: dict[int, str] = field(default_factory=dict)

    def update(self) -> dict[int, bool]:
        """Poll XIDs and device state; returns gpu index -> healthy."""
        now = self.clock()
        for ev in self.backend.poll_xids():
            self._record(ev, now)
        out = {}
        for g in self.backend.gpus():
            i = g.index
            t = self.last_fatal.get(i)
            ok = self.backend.device_ok(i)
            if not ok:
                self.last_fatal[i] = now
                self.reasons[i] = "NVML cannot query the device"
            healthy = ok and (t is None or now - t >= self.recover_after_s)
            if healthy and i in self.last_fatal:
                del self.last_fatal[i]
                self.reasons.pop(i, None)
            out[i] = healthy
        return out

    def _record(self, ev: XidEvent, now: float) -> None:
        if ev.gpu_index < 0 or not is_fatal(ev.xid):
            return
        self.last_fatal[ev.gpu_index] = now
        self.reasons[ev.gpu_index] = f"XID {ev.xid}"
