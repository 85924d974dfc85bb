"""``gpufleet recommend --patches``: right-sized GPU requests as strategic-merge patches a user applies directly.

Why patches of the workload, not VerticalPodAutoscaler objects: a VPA recommends and sets cpu and memory only
(``controlledResources`` takes nothing else), it never writes pod annotations (where a gpufleet share's size lives:
``gpufleet.io/gpu-milli`` / ``gpu-memory``), and a running pod's GPU request cannot change in place (in-place resize
is cpu and memory too).  The request must change in the pod template, and the workload then rolls its pods out by
its own rules (maxUnavailable, PDBs) -- which is what one ``kubectl patch`` of the Deployment does.

Per workload the patch sets the pod template's share annotations and the GPU container's ``nvidia.com/gpu``
(limits, and requests where the template has them): a share is ``nvidia.com/gpu: 1`` plus both annotations; whole
GPUs are ``nvidia.com/gpu: N`` with the share annotations removed (``null`` in a strategic-merge patch).  Workloads
whose template cannot change or is not ours to change get no patch and the reason: Jobs (immutable template), bare
pods, pods owned by other controllers (change them the way that controller expects), MIG requests (resize by
choosing another profile), pods with several GPU containers (the split is the user's call).  Pure.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from ..engine import annotations as ann
from ..engine.podspec import GPU_RESOURCE, MIG_PREFIX
from .recommend import Recommendation

# kind -> path of the pod template in the object, and the resource name kubectl patch takes
TEMPLATE_PATH = {"Deployment": ("spec", "template"), "StatefulSet": ("spec", "template"), "DaemonSet": ("spec", "template"),
                 "ReplicaSet": ("spec", "template"), "CronJob": ("spec", "jobTemplate", "spec", "template")}


@dataclass(frozen=True)
class Patch:
    namespace: str
    kind: str
    name: str
    body: dict  # strategic-merge patch

    @property
    def file_name(self) -> str:
        return f"{self.namespace}.{self.kind.lower()}.{self.name}.yaml"

    def kubectl(self, path: str) -> str:
        return f"kubectl patch {self.kind.lower()} {self.name} -n {self.namespace} --type strategic --patch-file {path}"

    def to_json(self) -> dict[str, Any]:
        return {"namespace": self.namespace, "kind": self.kind, "name": self.name, "type": "strategic", "patch": self.body}


def _gpu_containers(pod: Mapping[str, Any]) -> list[dict]:
    out = []
    for c in (pod.get("spec") or {}).get("containers") or []:
        res = c.get("resources") or {}
        names = set(res.get("limits") or {}) | set(res.get("requests") or {})
        if any(n == GPU_RESOURCE or n.startswith(MIG_PREFIX) for n in names):
            out.append(c)
    return out


def patch_for(rec: Recommendation, pod: Mapping[str, Any]) -> Patch | str:
    """The patch that applies ``rec`` to the workload of ``pod`` (one of its pods), or why there is none."""
    if rec.note.startswith("keep") or rec.note == "right-sized" or abs(rec.recommended_gpus - rec.requested_gpus) < 1e-9:
        return f"no change: {rec.note or 'right-sized'}"
    ns, kind, name = rec.workload.split("/", 2)
    if kind == "Job":
        return "a Job's pod template cannot change: change where the Job comes from (its CronJob, pipeline or chart)"
    if kind == "Pod":
        return "a bare pod's GPU request cannot change: re-create it with the recommended request"
    if kind not in TEMPLATE_PATH:
        return f"owned by a {kind}: change its pod template the way that controller expects"
    gpu = _gpu_containers(pod)
    if len(gpu) != 1:
        return f"{len(gpu)} containers ask for GPUs: split the recommendation between them by hand"
    c = gpu[0]
    res = c.get("resources") or {}
    if any(n.startswith(MIG_PREFIX) for n in {**(res.get("limits") or {}), **(res.get("requests") or {})}):
        return "asks for a MIG instance: resize by choosing another MIG profile"
    annotations = ((pod.get("metadata") or {}).get("annotations") or {})
    if rec.recommended_milli is not None:
        count = "1"
        new_ann: dict[str, str | None] = {ann.GPU_MILLI: str(rec.recommended_milli),
                                          ann.GPU_MEMORY: f"{rec.recommended_memory_mib}Mi"}
    else:
        count = str(int(rec.recommended_gpus))
        new_ann = {k: None for k in (ann.GPU_MILLI, ann.GPU_MEMORY) if k in annotations}
    resources: dict[str, dict[str, str]] = {"limits": {GPU_RESOURCE: count}}
    if GPU_RESOURCE in (res.get("requests") or {}):
        resources["requests"] = {GPU_RESOURCE: count}
    template: dict[str, Any] = {"spec": {"containers": [{"name": c["name"], "resources": resources}]}}
    if new_ann:
        template["metadata"] = {"annotations": new_ann}
    body: dict[str, Any] = template
    for key in reversed(TEMPLATE_PATH[kind]):
        body = {key: body}
    return Patch(ns, kind, name, body)


__all__ = ["Patch", "TEMPLATE_PATH", "patch_for"]
