"""DRA objects as the API serves them (JSON), shaped like NVIDIA's GPU driver publishes them."""

from __future__ import annotations

from typing import Any

DRIVER = "gpu.nvidia.com"


def gpu_device(i: int, node: str = "n1", product: str = "NVIDIA A100-SXM4-80GB", memory: str = "80Gi", pcie_root: str | None = None,
               share: bool = False, taints: list | None = None, extra: dict | None = None, caps: dict | None = None) -> dict:
    attrs: dict[str, Any] = {
        "type": {"string": "gpu"}, "uuid": {"string": f"GPU-{node}-{i}"}, "productName": {"string": product},
        "brand": {"string": "Nvidia"}, "architecture": {"string": "Ampere"}, "driverVersion": {"version": "550.54.15"},
        "cudaComputeCapability": {"version": "8.0.0"}, "cudaDriverVersion": {"version": "12.4.0"},
        "resource.kubernetes.io/pcieRoot": {"string": pcie_root or f"pci0000:{i // 4:02x}"},
    }
    attrs.update(extra or {})
    capacity: dict[str, Any] = {"memory": {"value": memory}}
    capacity.update(caps or {})
    d: dict[str, Any] = {"name": f"gpu-{i}", "attributes": attrs, "capacity": capacity}
    if share:
        d["allowMultipleAllocations"] = True
    if taints:
        d["taints"] = taints
    return d


def mig_device(gpu: int, profile: str, idx: int, node: str = "n1", memory: str = "10Gi") -> dict:
    return {"name": f"gpu-{gpu}-mig-{profile.replace('.', '')}-{idx}", "attributes": {
        "type": {"string": "mig"}, "profile": {"string": profile}, "parentUUID": {"string": f"GPU-{node}-{gpu}"},
        "uuid": {"string": f"MIG-{node}-{gpu}-{idx}"}, "productName": {"string": "NVIDIA A100-SXM4-80GB"}},
        "capacity": {"memory": {"value": memory}}}


def slice_(node: str = "n1", devices: list | None = None, gpus: int = 0, name: str | None = None, generation: int = 1,
           count: int = 1, pool: str | None = None, driver: str = DRIVER, **kw: Any) -> dict:
    devs = list(devices or []) + [gpu_device(i, node, **kw) for i in range(gpus)]
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {"name": name or f"{node}-{driver}"},
            "spec": {"driver": driver, "nodeName": node, "pool": {"name": pool or node, "generation": generation,
                                                                  "resourceSliceCount": count}, "devices": devs}}


def device_class(name: str = "gpu.nvidia.com", expr: str = "device.attributes['gpu.nvidia.com'].type == 'gpu'",
                 extended: str | None = None, config: list | None = None) -> dict:
    spec: dict[str, Any] = {"selectors": [{"cel": {"expression": expr}}] if expr else []}
    if extended:
        spec["extendedResourceName"] = extended
    if config:
        spec["config"] = config
    return {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": name}, "spec": spec}


def request(name: str = "gpu", cls: str = "gpu.nvidia.com", count: int | None = None, selectors: list[str] | None = None,
            mode: str | None = None, capacity: dict | None = None, admin: bool | None = None, tolerations: list | None = None,
            first_available: list | None = None) -> dict:
    if first_available is not None:
        return {"name": name, "firstAvailable": first_available}
    ex: dict[str, Any] = {"deviceClassName": cls}
    if count is not None:
        ex["count"] = count
    if selectors:
        ex["selectors"] = [{"cel": {"expression": s}} for s in selectors]
    if mode:
        ex["allocationMode"] = mode
    if capacity:
        ex["capacity"] = {"requests": capacity}
    if admin is not None:
        ex["adminAccess"] = admin
    if tolerations:
        ex["tolerations"] = tolerations
    return {"name": name, "exactly": ex}


def claim(name: str = "c", requests: list | None = None, constraints: list | None = None, namespace: str = "default",
          uid: str | None = None, status: dict | None = None, config: list | None = None) -> dict:
    obj: dict[str, Any] = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                           "metadata": {"name": name, "namespace": namespace, "uid": uid or f"uid-{name}"},
                           "spec": {"devices": {"requests": requests if requests is not None else [request()]}}}
    if constraints:
        obj["spec"]["devices"]["constraints"] = constraints
    if config:
        obj["spec"]["devices"]["config"] = config
    if status:
        obj["status"] = status
    return obj
