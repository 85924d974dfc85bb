"""Record on pods that another scheduler bound which GPUs kubelet gave them.

A pod bound without gpufleet (kube-scheduler, another secondary scheduler) has
no ``gpufleet.io/assignment``: kubelet picks its devices (helped by this agent's
preference for GPUs nobody uses) and the gpufleet scheduler can only guess.  A
guess is not stable (it is re-made after every relist), so the agent reads
kubelet's PodResources, which names the devices of every pod, and writes what
kubelet actually handed out as the pod's assignment (``"source": "kubelet"``).
The scheduler then holds exactly those GPUs, also across its restarts.  A pod
that shares its GPU with others (kubelet gave it a device of a GPU in use) holds
one device there but no compute or memory that the scheduler could count.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Mapping

from ..engine import annotations as ann
from ..engine.inventory import assignment_to_json
from ..engine.model import Assignment
from .nvml import GpuInfo

log = logging.getLogger(__name__)


def kubelet_assignments(node: str, gpus: list[GpuInfo], holders: Mapping[str, list], pods: Iterable[Mapping]) -> dict[tuple[str, str], str]:
    """(namespace, pod) -> assignment JSON for this node's live pods that hold GPUs but carry no assignment (pure)."""
    whole = {g.uuid: g for g in gpus}
    mig = {m.uuid: (g, m) for g in gpus for m in g.mig}
    by_pod: dict[tuple[str, str], set[str]] = {}
    for uuid, refs in holders.items():
        for r in refs:
            by_pod.setdefault((r.namespace, r.pod), set()).add(uuid)
    out: dict[tuple[str, str], str] = {}
    for p in pods:
        meta, spec, status = p.get("metadata") or {}, p.get("spec") or {}, p.get("status") or {}
        if spec.get("nodeName") != node or status.get("phase") in ("Succeeded", "Failed"):
            continue
        if ann.ASSIGNMENT in (meta.get("annotations") or {}):
            continue
        held = by_pod.get((meta.get("namespace") or "default", meta.get("name") or ""))
        if not held:
            continue
        key = f"{meta.get('namespace') or 'default'}/{meta.get('name')}"
        migs = sorted((mig[u][0].index, mig[u][1].instance_id) for u in held if u in mig)
        idx = sorted(whole[u].index for u in held if u in whole)
        if migs and not idx:
            profiles = {mig[u][1].profile for u in held if u in mig}
            a = Assignment(key, node, 0, 0, mig=tuple(migs), mig_profile=profiles.pop() if len(profiles) == 1 else None)
            text = assignment_to_json(a)
        elif idx:
            alone = all({(r.namespace, r.pod) for r in holders.get(gpus_by_index(gpus)[i].uuid, [])} == {(meta.get("namespace") or "default", meta.get("name"))}
                        for i in idx)
            mems = tuple(gpus_by_index(gpus)[i].memory_mib if alone else 0 for i in idx)
            a = Assignment(key, node, 0, 0, gpu_indices=tuple(idx), gpu_milli=1000 if alone else 0, gpu_memory_mib=mems)
            text = assignment_to_json(a, {i: gpus_by_index(gpus)[i].uuid for i in idx})
        else:
            continue
        d = json.loads(text)
        d["source"] = "kubelet"
        out[(meta.get("namespace") or "default", meta.get("name") or "")] = json.dumps(d, sort_keys=True, separators=(",", ":"))
    return out


def gpus_by_index(gpus: list[GpuInfo]) -> dict[int, GpuInfo]:
    return {g.index: g for g in gpus}


class ForeignPodRecorder:
    """The agent loop's side: PodResources + the node's pods -> patch the assignment of pods that lack one."""

    def __init__(self, core_v1, node: str, pod_devices) -> None:
        self.core, self.node, self.pod_devices = core_v1, node, pod_devices
        self.recorded: set[tuple[str, str]] = set()

    def sync(self, gpus: list[GpuInfo]) -> int:
        try:
            holders = self.pod_devices.devices()
            items = self.core.list_pod_for_all_namespaces(field_selector=f"spec.nodeName={self.node}").items
            pods = [self.core.api_client.sanitize_for_serialization(x) for x in items]
        except Exception as exc:  # noqa: BLE001 - kubelet or API away: next round
            log.debug("recording kubelet's GPUs of foreign pods skipped: %s", exc)
            return 0
        n = 0
        for (ns, name), text in kubelet_assignments(self.node, gpus, holders, pods).items():
            try:
                self.core.patch_namespaced_pod(name, ns, {"metadata": {"annotations": {ann.ASSIGNMENT: text}}})
                log.info("pod %s/%s (bound by another scheduler): kubelet gave it %s; recorded as its assignment", ns, name, text)
                n += 1
            except Exception as exc:  # noqa: BLE001 - one pod's patch failing must not stop the loop
                log.warning("cannot record the GPUs of pod %s/%s: %s", ns, name, exc)
        return n
