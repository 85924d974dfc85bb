"""What the scheduler reads from Pod objects beyond the engine's request: the slim copy it holds of a bound
pod (what its resources, constraints and victim order are computed from), and its timestamps and version.

Why a module of its own: the cache, the queue, the binder and the extender all read pod objects; this is the
one place that knows which fields matter and how they are read.
"""

from __future__ import annotations

from ..engine import annotations as ann


def slim_pod(pod: dict) -> dict:
    """What a bound pod's resources are computed from; the rest is dropped (clusters have many pods)."""
    m = pod.get("metadata") or {}
    spec = pod.get("spec") or {}

    def ctr(c: dict) -> dict:
        out = {"name": c.get("name"), "resources": c.get("resources") or {}}
        if "restartPolicy" in c:
            out["restartPolicy"] = c["restartPolicy"]
        ports = [p for p in c.get("ports") or [] if isinstance(p, dict) and p.get("hostPort")]
        if ports:
            out["ports"] = ports
        return out

    ann_ = {k: v for k, v in (m.get("annotations") or {}).items() if k.startswith(ann.PREFIX)}
    s = {k: spec[k] for k in ("nodeName", "schedulerName", "priority", "overhead", "hostNetwork", "resources", "schedulingGroup",
                              "resourceClaims") if k in spec}
    # what other pods' constraints see: inter-pod (anti-)affinity terms (symmetry) and claimed volumes
    aff = {k: v for k, v in (spec.get("affinity") or {}).items() if k in ("podAffinity", "podAntiAffinity")}
    if aff:
        s["affinity"] = aff
    vols = [v for v in spec.get("volumes") or [] if isinstance(v, dict) and ("persistentVolumeClaim" in v or "ephemeral" in v)]
    if vols:
        s["volumes"] = [{"name": v.get("name"), **({"persistentVolumeClaim": v["persistentVolumeClaim"]} if "persistentVolumeClaim" in v else {"ephemeral": {}})} for v in vols]
    s["containers"] = [ctr(c) for c in spec.get("containers") or [] if isinstance(c, dict)]
    if spec.get("initContainers"):
        s["initContainers"] = [ctr(c) for c in spec["initContainers"] if isinstance(c, dict)]
    meta = {k: m[k] for k in ("name", "namespace", "uid", "resourceVersion", "labels", "ownerReferences", "deletionTimestamp",
                              "creationTimestamp") if k in m}
    meta["annotations"] = ann_
    status = _resize_status(pod.get("status") or {})
    for k in ("resourceClaimStatuses", "extendedResourceClaimStatus"):  # the ResourceClaims it uses (DRA)
        if (pod.get("status") or {}).get(k):
            status[k] = pod["status"][k]
    return {"metadata": meta, "spec": s, "status": status}


def _resize_status(st: dict) -> dict:
    """The status a running pod's held resources are counted from (in-place resize): phase, the resize
    conditions, what kubelet allocated and actuated per container and for the pod; and what a
    PodDisruptionBudget and the victim order ask of it (Ready, startTime)."""
    out: dict = {"phase": st.get("phase")}
    if st.get("startTime"):
        out["startTime"] = st["startTime"]  # a victim's age (youngest first)
    # Ready: what a PodDisruptionBudget asks of a victim; the resize conditions: what it holds
    conds = [c for c in st.get("conditions") or [] if isinstance(c, dict)
             and c.get("type") in ("Ready", "PodResizePending", "PodResizeInProgress")]
    if conds:
        out["conditions"] = conds
    for kind in ("containerStatuses", "initContainerStatuses"):
        keep = []
        for c in st.get(kind) or []:
            if not isinstance(c, dict):
                continue
            k = {f: c[f] for f in ("name", "allocatedResources") if f in c}
            if isinstance(c.get("resources"), dict) and "requests" in c["resources"]:
                k["resources"] = {"requests": c["resources"]["requests"]}
            if len(k) > 1:
                keep.append(k)
        if keep:
            out[kind] = keep
    if "allocatedResources" in st:
        out["allocatedResources"] = st["allocatedResources"]
    if isinstance(st.get("resources"), dict):
        out["resources"] = {k: v for k, v in st["resources"].items() if k == "requests"}
    return out


def created_s(obj: dict) -> float | None:
    """metadata.creationTimestamp as seconds since the epoch, or None."""
    import datetime

    ts = (obj.get("metadata") or {}).get("creationTimestamp")
    if not isinstance(ts, str):
        return None
    try:
        return datetime.datetime.fromisoformat(ts).timestamp()  # "...Z": Python 3.11 reads it
    except ValueError:
        return None


def time_s(ts: object) -> float | None:
    import datetime

    if not isinstance(ts, str):
        return None
    try:
        return datetime.datetime.fromisoformat(ts).timestamp()
    except ValueError:
        return None


def pod_age_key(pod: dict, first_seen_rv: int) -> int:
    """Larger = younger.  A pod's age is when it started (``status.startTime``, else its
    ``creationTimestamp``), the time kube-scheduler orders victims by; within one second (the
    timestamps' resolution), the pod the scheduler saw first (its resourceVersion then) is older."""
    t = time_s((pod.get("status") or {}).get("startTime")) or created_s(pod) or 0.0
    return (int(t) << 64) + max(0, first_seen_rv)


def resource_version(obj: dict) -> int | None:
    try:
        return int((obj.get("metadata") or {}).get("resourceVersion") or "")
    except ValueError:  # resourceVersions are opaque; etcd's are integers
        return None
