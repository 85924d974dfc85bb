"""Node labels with GPU Feature Discovery's names and values, and the inventory annotation.

``desired_labels`` is a pure function of what NVML reports; ``label_patch``
computes the merge patch that sets what changed and removes what no longer
holds (a ``null`` value deletes a label).  It only ever removes labels this
agent writes (``OWNED_LABELS`` and the per-profile MIG labels): the GPU
operator's ``nvidia.com/gpu.deploy.*`` and anyone else's labels are left alone.
``NodeLabeller`` applies the patch through the ``kubernetes`` client, only when
something changed.
"""

from __future__ import annotations

import logging
import re
from typing import Mapping

from ..engine import annotations as ann
from ..engine.inventory import gpus_to_json
from .nvml import DriverInfo, GpuInfo, engine_gpus

log = logging.getLogger(__name__)

OWNED_LABELS = frozenset({
    "nvidia.com/gpu.present", "nvidia.com/gpu.product", "nvidia.com/gpu.memory", "nvidia.com/gpu.count",
    "nvidia.com/gpu.family", "nvidia.com/gpu.compute.major", "nvidia.com/gpu.compute.minor",
    "nvidia.com/gpu.replicas", "nvidia.com/gpu.sharing-strategy",
    "nvidia.com/cuda.driver.major", "nvidia.com/cuda.driver.minor", "nvidia.com/cuda.driver.rev",
    "nvidia.com/cuda.driver-version.major", "nvidia.com/cuda.driver-version.minor",
    "nvidia.com/cuda.driver-version.revision", "nvidia.com/cuda.driver-version.full",
    "nvidia.com/cuda.runtime.major", "nvidia.com/cuda.runtime.minor",
    "nvidia.com/cuda.runtime-version.major", "nvidia.com/cuda.runtime-version.minor",
    "nvidia.com/cuda.runtime-version.full",
    "nvidia.com/mig.capable", "nvidia.com/mig.strategy",
})
_OWNED_MIG = re.compile(r"^nvidia\.com/mig-[0-9]+g\.[0-9]+gb(\+[a-z]+)?\.(count|memory|slices\.gi)$")


def owned(key: str) -> bool:
    return key in OWNED_LABELS or bool(_OWNED_MIG.match(key))


def _product(name: str) -> str:
    return "-".join(name.split())


def desired_labels(driver: DriverInfo, gpus: list[GpuInfo], mig_strategy: str = "mixed", replicas: int = 1,
                   rename_shared: bool = False) -> dict[str, str]:
    if not gpus:
        return {"nvidia.com/gpu.present": "false"}
    g0 = gpus[0]
    major, minor, rev = (driver.driver_version.split(".") + ["0", "0"])[:3]
    product, memory, count = _product(g0.name), g0.memory_mib, len(gpus)
    migs = [m for g in gpus for m in g.mig]
    if mig_strategy == "single" and migs:
        profiles = {m.profile for m in migs}
        if len(profiles) == 1:  # as GFD: single strategy labels the MIG device as "the GPU"
            product, memory, count = f"{product}-MIG-{migs[0].profile}", migs[0].memory_mib, len(migs)
        else:
            log.warning("MIG strategy single with several profiles %s: labelling the physical GPU", sorted(profiles))
    if replicas > 1 and not rename_shared:
        product += "-SHARED"
    out = {
        "nvidia.com/gpu.present": "true",
        "nvidia.com/gpu.product": product,
        "nvidia.com/gpu.memory": str(memory),
        "nvidia.com/gpu.count": str(count),
        "nvidia.com/gpu.family": g0.family,
        "nvidia.com/gpu.compute.major": str(g0.compute_capability[0]),
        "nvidia.com/gpu.compute.minor": str(g0.compute_capability[1]),
        "nvidia.com/gpu.replicas": str(replicas),
        "nvidia.com/gpu.sharing-strategy": "time-slicing" if replicas > 1 else "none",
        "nvidia.com/cuda.driver.major": major,
        "nvidia.com/cuda.driver.minor": minor,
        "nvidia.com/cuda.driver.rev": rev,
        "nvidia.com/cuda.driver-version.major": major,
        "nvidia.com/cuda.driver-version.minor": minor,
        "nvidia.com/cuda.driver-version.revision": rev,
        "nvidia.com/cuda.driver-version.full": driver.driver_version,
        "nvidia.com/cuda.runtime.major": str(driver.cuda_version[0]),
        "nvidia.com/cuda.runtime.minor": str(driver.cuda_version[1]),
        "nvidia.com/cuda.runtime-version.major": str(driver.cuda_version[0]),
        "nvidia.com/cuda.runtime-version.minor": str(driver.cuda_version[1]),
        "nvidia.com/cuda.runtime-version.full": f"{driver.cuda_version[0]}.{driver.cuda_version[1]}",
        "nvidia.com/mig.capable": "true" if any(g.mig_capable for g in gpus) else "false",
        "nvidia.com/mig.strategy": mig_strategy,
    }
    if mig_strategy == "mixed":
        for prof in sorted({m.profile for m in migs}):
            ms = [m for m in migs if m.profile == prof]
            out[f"nvidia.com/mig-{prof}.count"] = str(len(ms))
            out[f"nvidia.com/mig-{prof}.memory"] = str(ms[0].memory_mib)
            out[f"nvidia.com/mig-{prof}.slices.gi"] = prof.split("g.", 1)[0]
    return out


# The agent in DRA mode publishes no inventory annotation (its ResourceSlices are the node's inventory, and a
# scheduler must not place device-plugin pods there): one left from device-plugin mode is removed.
NO_INVENTORY = ""


def label_patch(current: Mapping[str, str], desired: Mapping[str, str], inventory: str | None = None,
                current_inventory: str | None = None) -> dict | None:
    """A JSON merge patch for the Node, or None when nothing changes."""
    labels: dict[str, str | None] = {}
    for k, v in desired.items():
        if current.get(k) != v:
            labels[k] = v
    for k in current:
        if owned(k) and k not in desired:
            labels[k] = None
    patch: dict = {}
    if labels:
        patch.setdefault("metadata", {})["labels"] = labels
    if inventory == NO_INVENTORY:
        if current_inventory is not None:
            patch.setdefault("metadata", {})["annotations"] = {ann.INVENTORY: None}
    elif inventory is not None and inventory != current_inventory:
        patch.setdefault("metadata", {})["annotations"] = {ann.INVENTORY: inventory}
    return patch or None


def inventory_json(gpus: list[GpuInfo], health: Mapping[int, bool], gpu_slots: int = 1,
                   gpu_resource: str = "nvidia.com/gpu") -> str:
    """The inventory annotation: the GPUs, and how many kubelet devices stand for each (one per pod on it)."""
    extra = {g.index: {"pci_bus_id": g.pci_bus_id, "numa_node": g.numa_node} for g in gpus}
    return gpus_to_json(list(engine_gpus(gpus, health)), extra, top={"gpu_slots": gpu_slots, "gpu_resource": gpu_resource})


class NodeLabeller:
    """Keeps this node's GPU labels and inventory annotation current (through a CoreV1Api-like client)."""

    def __init__(self, core_v1, node: str) -> None:
        self.core, self.node = core_v1, node
        self.patches = 0

    def sync(self, desired: Mapping[str, str], inventory: str) -> dict | None:
        """Read the node, patch what differs; returns the patch sent (None: nothing to do or it failed)."""
        try:
            n = self.core.read_node(self.node)
            meta = n.metadata
            patch = label_patch(meta.labels or {}, desired, inventory, (meta.annotations or {}).get(ann.INVENTORY))
            if patch:
                self.core.patch_node(self.node, patch)
                self.patches += 1
                log.info("node %s: labels/inventory updated (%d label change(s))", self.node, len(patch["metadata"].get("labels", {})))
            return patch
        except Exception as exc:  # API away: try again next round, the device plugin is unaffected
            log.warning("labelling node %s failed: %s", self.node, exc)
            return None


RESTART_TAINT = "gpufleet.io/agent-restarting"


def taints_with(taints: list[dict], on: bool) -> list[dict] | None:
    """The node's taints with (on) or without the agent's restart taint; None when nothing changes (pure)."""
    has = any(t.get("key") == RESTART_TAINT for t in taints)
    if on == has:
        return None
    if on:
        return taints + [{"key": RESTART_TAINT, "value": "true", "effect": "NoSchedule"}]
    return [t for t in taints if t.get("key") != RESTART_TAINT]


def set_restart_taint(core_v1, node: str, on: bool) -> bool | None:
    """While the agent is away kubelet has no healthy device of its resources and refuses every pod that needs one
    (UnexpectedAdmissionError); a NoSchedule taint keeps schedulers from binding there meanwhile.  Returns
    whether the node was changed, None when the API could not be reached."""
    try:
        n = core_v1.read_node(node)
        cur = [core_v1.api_client.sanitize_for_serialization(t) for t in (n.spec.taints or [])]
        new = taints_with(cur, on)
        if new is None:
            return False
        core_v1.patch_node(node, {"spec": {"taints": new}})
        log.info("node %s: %s taint %s", node, "set" if on else "removed", RESTART_TAINT)
        return True
    except Exception as exc:  # noqa: BLE001 - API away: the device plugin is unaffected
        log.warning("node %s: cannot %s taint %s: %s", node, "set" if on else "remove", RESTART_TAINT, exc)
        return None


def announce_registered(core_v1, node: str, when: str) -> bool:
    """Write when the device plugins last registered with kubelet (``gpufleet.io/device-plugin-registered``,
    RFC 3339 on this node's clock): the scheduler holds GPU pods off a node where kubelet refused one because the
    plugin was down, until this says the plugin is back (kube/plugin_down).  False when the API could not be reached."""
    from ..engine import annotations as ann

    try:
        core_v1.patch_node(node, {"metadata": {"annotations": {ann.PLUGIN_REGISTERED: when}}}, _request_timeout=5)
        return True
    except Exception as exc:  # noqa: BLE001 - API away: tried again next round
        log.warning("node %s: cannot record the device plugin's registration: %s", node, exc)
        return False
