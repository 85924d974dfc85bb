"""Node labels with GPU Feature Discovery's names and values, and the inventory annotation.

``desired_labels`` is a pure function of what NVML reports; ``label_patch``
computes the merge patch that sets what changed and removes what no longer
holds (a ``null`` value deletes a label), touching only labels we own.
"""

from __future__ import annotations

from typing import Mapping

from ..engine import annotations as ann
from ..engine.inventory import gpus_to_json
from .nvml import DriverInfo, GpuInfo

OWNED_PREFIXES = ("nvidia.com/gpu.", "nvidia.com/cuda.", "nvidia.com/mig.", "nvidia.com/gfd.")


def _product(name: str) -> str:
    return name.replace(" ", "-")


def desired_labels(driver: DriverInfo, gpus: list[GpuInfo], mig_strategy: str = "mixed", replicas: int = 1) -> dict[str, str]:
    if not gpus:
        return {"nvidia.com/gpu.present": "false"}
    g0 = gpus[0]
    major, minor, *rest = (driver.driver_version.split(".") + ["0", "0"])[:3]
    out = {
        "nvidia.com/gpu.present": "true",
        "nvidia.com/gpu.product": _product(g0.name) + ("-SHARED" if replicas > 1 else ""),
        "nvidia.com/gpu.memory": str(g0.memory_mib),
        "nvidia.com/gpu.count": str(len(gpus)),
        "nvidia.com/gpu.family": g0.family,
        "nvidia.com/gpu.compute.major": str(g0.compute_capability[0]),
        "nvidia.com/gpu.compute.minor": str(g0.compute_capability[1]),
        "nvidia.com/cuda.driver.major": major,
        "nvidia.com/cuda.driver.minor": minor,
        "nvidia.com/cuda.driver.rev": rest[0] if rest else "0",
        "nvidia.com/cuda.runtime.major": str(driver.cuda_version[0]),
        "nvidia.com/cuda.runtime.minor": str(driver.cuda_version[1]),
        "nvidia.com/mig.capable": "true" if g0.compute_capability in ((8, 0), (9, 0)) else "false",  # A100/A30, H100/H200
        "nvidia.com/mig.strategy": mig_strategy,
    }
    if replicas > 1:
        out["nvidia.com/gpu.replicas"] = str(replicas)
    return out


def label_patch(current: Mapping[str, str], desired: Mapping[str, str], inventory: str | None = None,
                current_inventory: str | None = None) -> dict | None:
    """A JSON merge patch for the Node, or None when nothing changes."""
    labels: dict[str, str | None] = {}
    for k, v in desired.items():
        if current.get(k) != v:
            labels[k] = v
    for k in current:
        if k.startswith(OWNED_PREFIXES) and k not in desired:
            labels[k] = None
    patch: dict = {}
    if labels:
        patch.setdefault("metadata", {})["labels"] = labels
    if inventory is not None and inventory != current_inventory:
        patch.setdefault("metadata", {})["annotations"] = {ann.INVENTORY: inventory}
    return patch or None


def inventory_json(gpus: list[GpuInfo], health: Mapping[int, bool]) -> str:
    extra = {g.index: {"pci_bus_id": g.pci_bus_id, "numa_node": g.numa_node} for g in gpus}
    return gpus_to_json([g.to_engine(health.get(g.index, True)) for g in gpus], extra)
