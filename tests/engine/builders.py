"""Small builders for engine tests: nodes, pods as real Kubernetes JSON."""

from __future__ import annotations

from typing import Any

from gpufleet.engine.model import Gpu, MigInstance, Node


def gpu_node(name: str, gpus: int = 0, model: str = "T4", memory_mib: int = 16_384, cpu_milli: int = 32_000,
             mem_mib: int = 128_000, labels: dict | None = None, taints: tuple = (), unschedulable: bool = False,
             max_pods: int = 110, nvlink: bool = False) -> Node:
    gs = tuple(
        Gpu(i, f"GPU-{name}-{i}", model, memory_mib, nvlink_peers=tuple(j for j in range(gpus) if j != i) if nvlink else ())
        for i in range(gpus)
    )
    return Node(name=name, cpu_milli=cpu_milli, memory_mib=mem_mib, gpus=gs,
                labels={"kubernetes.io/hostname": name, **(labels or {})}, taints=tuple(taints),
                unschedulable=unschedulable, max_pods=max_pods)


def mig_node(name: str) -> Node:
    g = Gpu(0, f"GPU-{name}-0", "A100-SXM4-80GB", 81_920, mig_enabled=True,
            mig_instances=(MigInstance("1g.10gb", 9_728, 0), MigInstance("1g.10gb", 9_728, 1), MigInstance("3g.40gb", 40_192, 2)))
    return Node(name=name, cpu_milli=64_000, memory_mib=512_000, gpus=(g, Gpu(1, f"GPU-{name}-1", "A100-SXM4-80GB", 81_920)),
                labels={"kubernetes.io/hostname": name}, max_pods=110)


def pod(name: str = "p", cpu: str | None = "500m", memory: str | None = "1Gi", gpus: int | str | None = None,
        annotations: dict | None = None, extra_resources: dict | None = None, **spec: Any) -> dict:
    req: dict[str, Any] = {}
    if cpu is not None:
        req["cpu"] = cpu
    if memory is not None:
        req["memory"] = memory
    limits: dict[str, Any] = {}
    if gpus is not None:
        limits["nvidia.com/gpu"] = str(gpus)
    for k, v in (extra_resources or {}).items():
        limits[k] = v
    res: dict[str, Any] = {"requests": req}
    if limits:
        res["limits"] = limits
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "default", "annotations": dict(annotations or {})},
        "spec": {"containers": [{"name": "main", "image": "x", "resources": res}], **spec},
    }
