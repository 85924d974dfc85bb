"""Wire formats shared by the scheduler and the node agent.

* ``gpufleet.io/gpu-inventory`` (node annotation, written by the agent): the
  node's GPUs as the agent discovered them through NVML.
* ``gpufleet.io/assignment`` (pod annotation, written by the scheduler at
  bind time): the exact devices a pod got; the agent's ``Allocate`` reads it
  and the scheduler rebuilds its state from it after a restart.

Both are JSON; parsing is strict and errors name the object and field.
"""

from __future__ import annotations

import json
from typing import Any, Mapping

from .errors import InvalidNodeSpec, InvalidPodSpec
from .model import Assignment, Gpu, MigInstance

INVENTORY_VERSION = 1


def gpus_to_json(gpus: tuple[Gpu, ...] | list[Gpu], extra: Mapping[int, Mapping[str, Any]] | None = None,
                 top: Mapping[str, Any] | None = None) -> str:
    out = []
    for g in gpus:
        d: dict[str, Any] = {
            "index": g.index,
            "uuid": g.uuid,
            "model": g.model,
            "memory_mib": g.memory_mib,
            "mig_enabled": g.mig_enabled,
            "mig_instances": [
                {"profile": m.profile, "memory_mib": m.memory_mib, "instance_id": m.instance_id} for m in g.mig_instances
            ],
            "nvlink_peers": list(g.nvlink_peers),
            "healthy": g.healthy,
        }
        if extra and g.index in extra:
            d.update(extra[g.index])
        out.append(d)
    return json.dumps({"version": INVENTORY_VERSION, "gpus": out, **(top or {})}, sort_keys=True, separators=(",", ":"))


def inventory_slots(node: str, text: str) -> tuple[int | None, str]:
    """``gpu_slots`` (kubelet devices per GPU; None when the agent did not say) and ``gpu_resource`` of an inventory."""
    field = "metadata.annotations[gpufleet.io/gpu-inventory]"
    try:
        data = json.loads(text)
    except (TypeError, ValueError) as exc:
        raise InvalidNodeSpec(node, field, f"not valid JSON: {exc}") from None
    if not isinstance(data, Mapping):
        raise InvalidNodeSpec(node, field, "must be an object with a 'gpus' list")
    slots = data.get("gpu_slots")
    if slots is not None:
        slots = _int(node, f"{field}.gpu_slots", slots, 1)
    res = data.get("gpu_resource", "nvidia.com/gpu")
    if not isinstance(res, str):
        raise InvalidNodeSpec(node, f"{field}.gpu_resource", f"must be a resource name, got {res!r}")
    return slots, res


def _int(node: str, field: str, v: Any, minimum: int = 0) -> int:
    if not isinstance(v, int) or isinstance(v, bool) or v < minimum:
        raise InvalidNodeSpec(node, field, f"must be an integer >= {minimum}, got {v!r}")
    return v


def gpus_from_json(node: str, text: str) -> tuple[Gpu, ...]:
    field = "metadata.annotations[gpufleet.io/gpu-inventory]"
    try:
        data = json.loads(text)
    except (TypeError, ValueError) as exc:
        raise InvalidNodeSpec(node, field, f"not valid JSON: {exc}") from None
    if not isinstance(data, Mapping) or not isinstance(data.get("gpus"), list):
        raise InvalidNodeSpec(node, field, "must be an object with a 'gpus' list")
    if data.get("version", INVENTORY_VERSION) != INVENTORY_VERSION:
        raise InvalidNodeSpec(node, f"{field}.version", f"unsupported version {data.get('version')!r}")
    gpus = []
    for i, g in enumerate(data["gpus"]):
        f = f"{field}.gpus[{i}]"
        if not isinstance(g, Mapping):
            raise InvalidNodeSpec(node, f, "must be an object")
        idx = _int(node, f"{f}.index", g.get("index"))
        if idx != i:
            raise InvalidNodeSpec(node, f"{f}.index", f"GPUs must be listed in index order, expected {i}, got {idx}")
        migs = []
        for k, m in enumerate(g.get("mig_instances") or []):
            if not isinstance(m, Mapping) or not isinstance(m.get("profile"), str):
                raise InvalidNodeSpec(node, f"{f}.mig_instances[{k}]", "needs a 'profile' string")
            migs.append(
                MigInstance(m["profile"], _int(node, f"{f}.mig_instances[{k}].memory_mib", m.get("memory_mib", 0)), _int(node, f"{f}.mig_instances[{k}].instance_id", m.get("instance_id", k)))
            )
        peers = g.get("nvlink_peers") or []
        if not isinstance(peers, list) or not all(isinstance(p, int) for p in peers):
            raise InvalidNodeSpec(node, f"{f}.nvlink_peers", "must be a list of GPU indices")
        gpus.append(
            Gpu(
                index=idx,
                uuid=str(g.get("uuid") or f"{node}-gpu{idx}"),
                model=str(g.get("model") or "unknown"),
                memory_mib=_int(node, f"{f}.memory_mib", g.get("memory_mib"), 1),
                mig_enabled=bool(g.get("mig_enabled", False)),
                mig_instances=tuple(migs),
                nvlink_peers=tuple(peers),
                healthy=bool(g.get("healthy", True)),
            )
        )
    return tuple(gpus)


def assignment_to_json(a: Assignment, gpu_uuids: Mapping[int, str] | None = None) -> str:
    d: dict[str, Any] = {
        "node": a.node,
        "gpus": [{"index": j, "uuid": (gpu_uuids or {}).get(j, "")} for j in a.gpu_indices],
        "gpu_milli": a.gpu_milli,
        "gpu_memory_mib": list(a.gpu_memory_mib),
    }
    if a.mig:
        d["mig"] = [{"gpu": g, "instance_id": i} for g, i in a.mig]
        d["mig_profile"] = a.mig_profile
    if a.queue:  # the team queue the pod was admitted under: the node agent's cost series carry it
        d["queue"] = a.queue
    return json.dumps(d, sort_keys=True, separators=(",", ":"))


def assignment_from_json(pod: str, text: str, cpu_milli: int = 0, memory_mib: int = 0, priority: int = 0) -> Assignment:
    field = "metadata.annotations[gpufleet.io/assignment]"
    try:
        d = json.loads(text)
    except (TypeError, ValueError) as exc:
        raise InvalidPodSpec(pod, field, f"not valid JSON: {exc}") from None
    if not isinstance(d, Mapping) or not isinstance(d.get("node"), str):
        raise InvalidPodSpec(pod, field, "must be an object with a 'node' string")
    gpus = d.get("gpus") or []
    if not isinstance(gpus, list) or not all(isinstance(g, Mapping) and isinstance(g.get("index"), int) for g in gpus):
        raise InvalidPodSpec(pod, f"{field}.gpus", "must be a list of {index, uuid}")
    milli = d.get("gpu_milli", 0)
    if not isinstance(milli, int) or not 0 <= milli <= 1000:
        raise InvalidPodSpec(pod, f"{field}.gpu_milli", f"must be an integer 0..1000, got {milli!r}")
    mems = d.get("gpu_memory_mib") or [0] * len(gpus)
    if not isinstance(mems, list) or len(mems) != len(gpus) or not all(isinstance(m, int) and m >= 0 for m in mems):
        raise InvalidPodSpec(pod, f"{field}.gpu_memory_mib", "must list one non-negative integer per GPU")
    migs = d.get("mig") or []
    if not isinstance(migs, list) or not all(
        isinstance(m, Mapping) and isinstance(m.get("gpu"), int) and isinstance(m.get("instance_id"), int) for m in migs
    ):
        raise InvalidPodSpec(pod, f"{field}.mig", "must be a list of {gpu, instance_id} integers")
    mig = tuple((m["gpu"], m["instance_id"]) for m in migs)
    return Assignment(
        pod_key=pod,
        node=d["node"],
        cpu_milli=cpu_milli,
        memory_mib=memory_mib,
        gpu_indices=tuple(g["index"] for g in gpus),
        gpu_milli=milli,
        gpu_memory_mib=tuple(mems),
        mig=mig,
        mig_profile=d.get("mig_profile"),
        priority=priority,
    )


def gpu_uuids_of(text: str) -> list[str]:
    """UUIDs named by an assignment annotation (for the agent's Allocate)."""
    d = json.loads(text)
    return [g.get("uuid", "") for g in d.get("gpus") or []]
