"""The trace, DRA-shaped: nodes publish ResourceSlices as gpufleet's DRA driver does, pods ask by ResourceClaim.

Why: the claim that the default policy places DRA pods as well as device-plugin pods has to be
measured on the same trace with the same engine.  Every node's GPUs become devices of the driver
``gpu.gpufleet.io`` in the shape its agent publishes (``type``, ``uuid``, ``productName``, the
``resource.kubernetes.io/pcieRoot`` of each group of four GPUs, capacity ``memory`` and ``gpuMilli``
with ``allowMultipleAllocations``); every GPU pod gets one claim (from a template, so it is its own):

* whole GPUs: ``count: n`` of the class ``gpu.gpufleet.io`` (no capacity: the whole device);
* a share of ``m`` milli: ``capacity.requests {gpuMilli: m, memory: m/1000 of the smallest GPU}``
  (consumable capacity: several claims on one device);
* pinned GPU models: a request selector on ``productName``;
* with ``constrained``, multi-GPU claims also ask ``matchAttribute: resource.kubernetes.io/pcieRoot``
  (the GPUs under one PCIe root) where a node could give that many;
* a GPU in MIG mode publishes its instances (``type: mig``, ``uuid``, ``parentUUID``, ``profile``, ``memory``),
  and a pod asking a MIG profile gets ``count`` instances of the class ``mig.gpufleet.io`` with a selector on
  ``profile`` (the ``migNN`` variants of ``bench/variants.py``).

The pods then go through the same engine with the DynamicResources plugin: CEL selectors, the
allocator, claims holding their devices.  ``bench/dra_variants.py`` runs the comparison.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Sequence

from ...engine.dra.objects import DeviceClass, ResourceClaim, ResourceSlice, parse_claim, parse_device_class, parse_slice
from ...engine.dra.pods import PodClaim, PodClaims
from ...engine.dra.usage import DraCatalog, DraState
from ...engine.model import GPU_MILLI, Node, PodRequest

DRIVER = "gpu.gpufleet.io"
MIG_CLASS = "mig.gpufleet.io"
GPUS_PER_ROOT = 4
MIB = 2**20


def node_slice(node: Node) -> ResourceSlice:
    return parse_slice(node_slice_json(node))


def node_slice_json(node: Node) -> dict:
    """The node's ResourceSlice as the API serves it (what the live scheduler reads)."""
    devices: list[dict] = []
    for g in node.gpus:
        if g.mig_enabled:  # its instances, as the agent publishes them (a GPU in MIG mode: its instances only)
            for inst in sorted(g.mig_instances, key=lambda m: (m.profile, m.instance_id)):
                devices.append({
                    "name": f"gpu-{g.index}-mig-{inst.profile.replace('.', '')}-{inst.instance_id}"[:63],
                    "attributes": {"type": {"string": "mig"}, "uuid": {"string": f"MIG-{g.uuid}-{inst.instance_id}"[:64]},
                                   "parentUUID": {"string": g.uuid[:64]}, "profile": {"string": inst.profile},
                                   "productName": {"string": g.model[:64]}, "index": {"int": g.index}},
                    "capacity": {"memory": {"value": str(inst.memory_mib * MIB)}}})
            continue
        mem = g.memory_mib * MIB
        devices.append({
            "name": f"gpu-{g.index}", "allowMultipleAllocations": True,
            "attributes": {"type": {"string": "gpu"}, "uuid": {"string": g.uuid[:64]}, "productName": {"string": g.model[:64]},
                           "index": {"int": g.index},
                           "resource.kubernetes.io/pcieRoot": {"string": f"pci-{node.name}-{g.index // GPUS_PER_ROOT}"[:64]}},
            "capacity": {
                "memory": {"value": str(mem), "requestPolicy": {"default": str(mem), "validRange": {"min": "1Mi", "max": str(mem), "step": "1Mi"}}},
                "gpuMilli": {"value": str(GPU_MILLI), "requestPolicy": {"default": "0", "validRange": {"min": "0", "max": str(GPU_MILLI), "step": "1"}}},
            }})
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {"name": f"{node.name}-{DRIVER}"}, "spec": {
        "driver": DRIVER, "nodeName": node.name, "pool": {"name": node.name, "generation": 1, "resourceSliceCount": 1},
        "devices": devices}}


def classes(mig: bool = False) -> list[DeviceClass]:
    return [parse_device_class(c) for c in classes_json(mig)]


def classes_json(mig: bool = False) -> list[dict]:
    """Whole GPUs and shares (``gpu.gpufleet.io``), and with ``mig`` MIG instances (``mig.gpufleet.io``), as deploy/dra."""
    out = [{"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": DRIVER}, "spec": {
        "selectors": [{"cel": {"expression": f"device.driver == '{DRIVER}' && device.attributes['{DRIVER}'].type == 'gpu'"}}]}}]
    if mig:
        out.append({"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": MIG_CLASS}, "spec": {
            "selectors": [{"cel": {"expression": f"device.driver == '{DRIVER}' && device.attributes['{DRIVER}'].type == 'mig'"}}]}})
    return out


def catalog(nodes: Sequence[Node]) -> DraState:
    mig = any(g.mig_enabled for n in nodes for g in n.gpus)
    return DraState(DraCatalog([node_slice(n) for n in nodes if n.gpus], classes(mig)))


class ClaimShaper:
    """Turns a trace pod's GPU request into one ResourceClaim (and keeps the GPU fields for scoring)."""

    def __init__(self, nodes: Sequence[Node], constrained: bool = False):
        self.min_mem_mib = min((g.memory_mib for n in nodes for g in n.gpus), default=0)
        self.constrained = constrained
        self.max_per_root = GPUS_PER_ROOT
        self._specs: dict[tuple, ResourceClaim] = {}  # claim spec by pod shape: parsed once

    def __call__(self, r: PodRequest) -> PodRequest:
        if r.gpu_count == 0:
            return r
        ex: dict = {"deviceClassName": DRIVER}
        if r.mig_profile:  # MIG instances of one profile (the MIG class, a selector on the profile)
            ex = {"deviceClassName": MIG_CLASS, "count": r.gpu_count,
                  "selectors": [{"cel": {"expression": f"device.attributes['{DRIVER}'].profile == '{r.mig_profile}'"}}]}
            mem = r.gpu_memory_mib
        elif r.gpu_milli >= GPU_MILLI:
            ex["count"] = r.gpu_count
            mem = 0
        else:
            mem = max(1, r.gpu_milli * self.min_mem_mib // GPU_MILLI)
            ex["capacity"] = {"requests": {"gpuMilli": str(r.gpu_milli), "memory": f"{mem}Mi"}}
        if r.gpu_models_allow:
            names = ", ".join(f"'{m}'" for m in sorted(r.gpu_models_allow))
            ex["selectors"] = ex.get("selectors", []) + [
                {"cel": {"expression": f"device.attributes['{DRIVER}'].productName in [{names}]"}}]
        spec: dict = {"devices": {"requests": [{"name": "gpu", "exactly": ex}]}}
        if self.constrained and not r.mig_profile and r.gpu_milli >= GPU_MILLI and 1 < r.gpu_count <= self.max_per_root:
            spec["devices"]["constraints"] = [{"matchAttribute": "resource.kubernetes.io/pcieRoot"}]
        key = (r.gpu_count, r.gpu_milli, r.gpu_models_allow, r.mig_profile)
        proto = self._specs.get(key)
        if proto is None:
            proto = self._specs[key] = parse_claim({"metadata": {"name": "proto"}, "spec": spec})
        claim = replace(proto, name=f"{r.name}-gpu", namespace=r.namespace, uid=f"claim-{r.name}")
        return replace(r, gpu_memory_mib=mem, dra=PodClaims(r.uid or r.name, (PodClaim("gpu", claim),)))


__all__ = ["ClaimShaper", "DRIVER", "MIG_CLASS", "catalog", "classes", "classes_json", "node_slice", "node_slice_json"]
