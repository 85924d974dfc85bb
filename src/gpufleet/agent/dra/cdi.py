"""CDI specs: how a prepared claim's GPUs reach the container (the runtime applies them, not kubelet).

kubelet hands the runtime the CDI device IDs that ``NodePrepareResources``
returned (CRI ``CDI_devices``); containerd 2.x (CDI on by default) looks them up
in ``/var/run/cdi`` and applies their container edits.  One transient spec file
per claim (``k8s.gpu.gpufleet.io-claim_<claim UID>.json``, a name never reused
because runtimes cache specs), with one CDI device per request of the claim:

* ``NVIDIA_VISIBLE_DEVICES`` = the UUIDs of the request's GPUs / MIG instances
  (what the NVIDIA container runtime acts on, and what the workload reads);
* the device nodes: ``/dev/nvidia<minor>`` of each GPU and the control devices
  (``nvidiactl``, ``nvidia-uvm``, ``nvidia-uvm-tools``), per ``device_specs``
  as for the device plugin (``all``, only those that ``existing`` here, ``none``);
* for a share (less than a whole GPU): MPS limits, as the device plugin sets
  them, ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`` (milli / 10) and
  ``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`` (``<ordinal>=<MiB>MB``), plus the MPS pipe
  directory and its mount when configured;
* ``GPUFLEET_DRA_CLAIM`` = namespace/name, for logs and metrics.

One CDI device per request, not per GPU: a container that uses a request gets
one ``NVIDIA_VISIBLE_DEVICES`` naming all of its GPUs (the CDI ID is returned
with the request's first device only, so it is never injected twice).
"""

from __future__ import annotations

import json
import logging
import os
import re
from pathlib import Path

from ...files import replace_atomically
from .state import PreparedClaim, PreparedDevice

log = logging.getLogger(__name__)

VENDOR = "k8s.gpu.gpufleet.io"
CLASS = "claim"
CDI_VERSION = "0.6.0"
CONTROL_DEVICES = ("nvidiactl", "nvidia-uvm", "nvidia-uvm-tools")
DEVICE_SPEC_MODES = ("all", "existing", "none")
MIB = 1024 * 1024
_SPEC_FILE = re.compile(rf"^{re.escape(VENDOR)}-{CLASS}_([0-9a-zA-Z-]+)\.json$")


def cdi_device_name(claim_uid: str, request: str) -> str:
    return f"{claim_uid}-{request}"


def cdi_id(claim_uid: str, request: str) -> str:
    return f"{VENDOR}/{CLASS}={cdi_device_name(claim_uid, request)}"


class CdiWriter:
    def __init__(self, cdi_dir: str, dev_root: str = "/dev", device_specs: str = "all", mps_pipe_dir: str = "",
                 minor_of=None) -> None:
        if device_specs not in DEVICE_SPEC_MODES:
            raise ValueError(f"device_specs must be one of {DEVICE_SPEC_MODES}, got {device_specs!r}")
        self.dir = Path(cdi_dir)
        self.dev_root = dev_root
        self.device_specs = device_specs
        self.mps_pipe_dir = mps_pipe_dir
        self.minor_of = minor_of or (lambda gpu_index: gpu_index)  # GPU index -> N of /dev/nvidiaN

    def path(self, claim_uid: str) -> Path:
        return self.dir / f"{VENDOR}-{CLASS}_{claim_uid}.json"

    def _nodes(self, gpu_indices: list[int]) -> list[dict]:
        if self.device_specs == "none":
            return []
        names = [f"nvidia{self.minor_of(i)}" for i in gpu_indices] + list(CONTROL_DEVICES)
        out = []
        for n in names:
            host = os.path.join(self.dev_root, n)
            if self.device_specs == "existing" and not os.path.exists(host):
                continue
            out.append({"path": f"/dev/{n}", "hostPath": host})
        return out

    def edits(self, claim: PreparedClaim, devices: list[PreparedDevice]) -> dict:
        uuids = list(dict.fromkeys(d.uuid for d in devices))
        gpus = list(dict.fromkeys(d.gpu_index for d in devices))
        env = {"NVIDIA_VISIBLE_DEVICES": ",".join(uuids), "GPUFLEET_DRA_CLAIM": claim.key}
        shares = [d for d in devices if not d.whole and not d.admin]
        mounts = []
        if shares:
            milli = [d.gpu_milli for d in shares if d.gpu_milli > 0]
            if milli:
                env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(max(1, min(milli) // 10))
            ordinal = {u: k for k, u in enumerate(uuids)}
            limits = [f"{ordinal[d.uuid]}={d.memory_bytes // MIB}MB" for d in shares if d.memory_bytes > 0]
            if limits:
                env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] = ",".join(limits)
            if self.mps_pipe_dir:
                env["CUDA_MPS_PIPE_DIRECTORY"] = self.mps_pipe_dir
                mounts.append({"hostPath": self.mps_pipe_dir, "containerPath": self.mps_pipe_dir, "options": ["rbind", "rw"]})
        edits: dict = {"env": [f"{k}={v}" for k, v in env.items()]}
        nodes = self._nodes(gpus)
        if nodes:
            edits["deviceNodes"] = nodes
        if mounts:
            edits["mounts"] = mounts
        return edits

    def spec(self, claim: PreparedClaim) -> dict:
        by_request: dict[str, list[PreparedDevice]] = {}
        for d in claim.devices:
            by_request.setdefault(d.request, []).append(d)
        return {"cdiVersion": CDI_VERSION, "kind": f"{VENDOR}/{CLASS}",
                "devices": [{"name": cdi_device_name(claim.uid, r), "containerEdits": self.edits(claim, ds)}
                            for r, ds in by_request.items()]}

    def write(self, claim: PreparedClaim) -> Path:
        """Write (or re-write) the claim's spec atomically; OSError if the directory cannot take it."""
        p = self.path(claim.uid)
        self.dir.mkdir(parents=True, exist_ok=True)
        replace_atomically(p, json.dumps(self.spec(claim), indent=1, sort_keys=True))  # CDI caches skip its dot file
        return p

    def remove(self, claim_uid: str) -> None:
        try:
            self.path(claim_uid).unlink()
        except FileNotFoundError:
            pass

    def exists(self, claim_uid: str) -> bool:
        return self.path(claim_uid).is_file()

    def orphans(self, keep: set[str]) -> list[str]:
        """Claim UIDs of this vendor's spec files that no prepared claim owns (left by a crash mid-prepare)."""
        try:
            names = os.listdir(self.dir)
        except OSError:
            return []
        out = []
        for n in names:
            m = _SPEC_FILE.match(n)
            if m and m.group(1) not in keep:
                out.append(m.group(1))
        return out


__all__ = ["CDI_VERSION", "CLASS", "CdiWriter", "VENDOR", "cdi_device_name", "cdi_id"]
