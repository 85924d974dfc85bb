"""What the utilisation tools need from raw Pod JSON, in one place.

``reclaim``, ``recommend`` and ``top`` all ask the same questions of a pod:
how much GPU does it hold, who owns it, when was it created.  Answering them
once keeps the three views consistent (a 250-milli share counts as 0.25 GPU
everywhere, a MIG 3g.40gb slice as 3/7 of a GPU).  Bad values raise
``InvalidPodSpec`` naming the pod and the field; callers skip that pod.
"""

from __future__ import annotations

import datetime as _dt
from typing import Any, Mapping

from ..engine import annotations as ann
from ..engine.errors import InvalidPodSpec
from ..engine.gpu_models import mig_fraction
from ..engine.inventory import assignment_from_json
from ..engine.podspec import GPU_RESOURCE, MIG_PREFIX, effective_requests, pod_key

def gpus_held(pod: Mapping[str, Any], gpu_total_mib: Mapping[tuple[str, int], int] | None = None) -> float:
    """GPUs the pod holds, fractional for shares and MIG slices (0.0: no GPU).

    The scheduler's ``gpufleet.io/assignment`` wins (it names the devices);
    otherwise ``nvidia.com/gpu`` requests, scaled by ``gpufleet.io/gpu-milli``
    when the pod asks for a share, plus MIG instances by their slice count.
    A memory share counts as its fraction of the GPU's memory when ``gpu_total_mib``
    knows that GPU, else as a whole GPU.
    """
    key = pod_key(pod)
    meta = pod.get("metadata") or {}
    annotations = meta.get("annotations") or {}
    if ann.ASSIGNMENT in annotations:
        asg = assignment_from_json(key, annotations[ann.ASSIGNMENT])
        if asg.mig:
            return round(len(asg.mig) * mig_fraction(asg.mig_profile or ""), 4)
        if not asg.gpu_milli and asg.gpu_memory_mib and gpu_total_mib is not None:
            # a memory share: the fraction of each GPU's memory it reserved (``gpu_total_mib``: (node, GPU index) -> MiB)
            frac = 0.0
            for i, mem in zip(asg.gpu_indices, asg.gpu_memory_mib):
                gpu_mib = gpu_total_mib.get((asg.node, i), 0)
                frac += min(1.0, mem / gpu_mib) if gpu_mib > 0 and mem > 0 else 1.0
            return round(frac, 4)
        milli = asg.gpu_milli or 1000
        return round(len(asg.gpu_indices) * milli / 1000.0, 4)
    req = effective_requests(pod)
    total = 0.0
    gpus = req.get(GPU_RESOURCE, 0)
    if gpus:
        share = annotations.get(ann.GPU_MILLI)
        if share is not None and gpus == 1:
            try:
                milli = int(str(share).strip())
            except ValueError:
                raise InvalidPodSpec(key, f"metadata.annotations[{ann.GPU_MILLI}]", f"must be an integer 1..1000, got {share!r}") from None
            if not 1 <= milli <= 1000:
                raise InvalidPodSpec(key, f"metadata.annotations[{ann.GPU_MILLI}]", f"must be within 1..1000, got {milli}")
            total += milli / 1000.0
        else:
            total += gpus
    for name, n in req.items():
        if name.startswith(MIG_PREFIX) and n > 0:
            total += n * mig_fraction(name[len(MIG_PREFIX):])
    return round(total, 4)


def requested_gpu_devices(pod: Mapping[str, Any]) -> int:
    """Devices the pod asked kubelet for (``nvidia.com/gpu`` + MIG instances)."""
    req = effective_requests(pod)
    return req.get(GPU_RESOURCE, 0) + sum(v for k, v in req.items() if k.startswith(MIG_PREFIX))


def parse_time(pod: str, field: str, raw: Any) -> float:
    """RFC 3339 (as the API server writes it) or unix seconds -> unix seconds."""
    if isinstance(raw, (int, float)) and not isinstance(raw, bool):
        return float(raw)
    if isinstance(raw, _dt.datetime):
        return raw.timestamp()
    if not isinstance(raw, str) or not raw.strip():
        raise InvalidPodSpec(pod, field, f"must be a timestamp, got {raw!r}")
    s = raw.strip()
    try:
        return float(s)
    except ValueError:
        pass
    try:
        d = _dt.datetime.fromisoformat(s.replace("Z", "+00:00"))
    except ValueError:
        raise InvalidPodSpec(pod, field, f"not an RFC 3339 timestamp or unix seconds: {raw!r}") from None
    if d.tzinfo is None:
        d = d.replace(tzinfo=_dt.timezone.utc)
    return d.timestamp()


def created_s(pod: Mapping[str, Any]) -> float:
    meta = pod.get("metadata") or {}
    return parse_time(pod_key(pod), "metadata.creationTimestamp", meta.get("creationTimestamp"))


def controller_of(obj: Mapping[str, Any]) -> tuple[str, str] | None:
    """(kind, name) of the object's controller owner reference, else its first owner, else None."""
    refs = (obj.get("metadata") or {}).get("ownerReferences") or []
    refs = [r for r in refs if isinstance(r, Mapping) and r.get("kind") and r.get("name")]
    if not refs:
        return None
    ref = next((r for r in refs if r.get("controller")), refs[0])
    return str(ref["kind"]), str(ref["name"])


def top_owner(pod: Mapping[str, Any], owners: Mapping[tuple[str, str, str], Mapping[str, Any]]) -> tuple[str, str]:
    """(kind, name) of the workload: Pod -> ReplicaSet -> Deployment, Pod -> Job -> CronJob, StatefulSet...

    ``owners`` maps (namespace, kind, name) to the owner objects' JSON; the
    chain stops at the first owner not in it (its name is still the best
    known answer), and never loops.
    """
    meta = pod.get("metadata") or {}
    ns = meta.get("namespace") or "default"
    cur: tuple[str, str] = ("Pod", meta.get("name") or "<unnamed>")
    obj: Mapping[str, Any] | None = pod
    seen = {cur}
    while obj is not None:
        ref = controller_of(obj)
        if ref is None or ref in seen:
            break
        cur = ref
        seen.add(ref)
        obj = owners.get((ns, ref[0], ref[1]))
    return cur

