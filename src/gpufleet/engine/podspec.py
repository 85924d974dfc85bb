"""Turn a real Kubernetes Pod (the JSON dict from the API) into a PodRequest.

Resource arithmetic follows kube-scheduler's (``component-helpers`` ``PodRequests``):
requests default to limits; app containers (and restartable "sidecar" init
containers) are summed; ordinary init containers run one at a time, so the pod
needs the max of that and the sum; pod-level ``spec.resources`` (cpu, memory,
hugepages-*; on by default since 1.34) replaces that sum for the resources it
names, defaulted as kube-apiserver defaults it; ``spec.overhead`` is added.

A pod that runs (``counted_requests``) holds the larger of what it asks and what
kubelet allocated or actuated during an in-place resize
(``status.containerStatuses[].allocatedResources`` / ``.resources``, pod-level
``status.allocatedResources`` / ``status.resources``), the desired size left out
while the resize is ``Infeasible``, as kube-scheduler counts it: a node is never
over-committed by a resize kubelet has not finished.  Every bad value raises
``InvalidPodSpec`` naming the pod and the JSON path of the field.
"""

from __future__ import annotations

from typing import Any, Literal, Mapping

from . import annotations as ann
from .errors import InvalidPodSpec, InvalidQuantity
from .gpu_models import LARGEST_GPU_MEMORY_MIB, mig_profile_memory_mib
from .model import (
    GPU_MILLI,
    PodRequest,
    PreferredTerm,
    Requirement,
    SelectorTerm,
    Toleration,
)
from .podterms import parse_terms
from .quantity import parse_quantity, to_int, to_mib, to_milli

GPU_RESOURCE = "nvidia.com/gpu"
MIG_PREFIX = "nvidia.com/mig-"
# resources other plugins account for (GpuFit, NodeResourcesFit's cpu/memory/pods columns); the
# gpufleet.io/ names are the agent's own bookkeeping, never admitted by count on a node
_NOT_SCALAR_PREFIXES = (MIG_PREFIX, "gpufleet.io/")


def scalar_requests(req: Mapping[str, int]) -> tuple[tuple[str, int], ...]:
    """The requests NodeResourcesFit checks beyond cpu, memory and pods (sorted, positive)."""
    return tuple(sorted((k, v) for k, v in req.items()
                        if v > 0 and k not in ("cpu", "memory", "pods", GPU_RESOURCE) and not k.startswith(_NOT_SCALAR_PREFIXES)))
_OPERATORS = {"In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt"}
_TOLERATION_OPS: dict[str, Literal["Equal", "Exists", "Gt", "Lt"]] = {"Equal": "Equal", "Exists": "Exists", "Gt": "Gt", "Lt": "Lt"}


def pod_key(pod: Mapping[str, Any]) -> str:
    meta = pod.get("metadata") or {}
    return f"{meta.get('namespace') or 'default'}/{meta.get('name') or '<unnamed>'}"


def _mapping(pod: str, path: str, v: Any) -> Mapping[str, Any]:
    if v is None:
        return {}
    if not isinstance(v, Mapping):
        raise InvalidPodSpec(pod, path, "must be an object")
    return v


def _list(pod: str, path: str, v: Any) -> list[Any]:
    if v is None:
        return []
    if not isinstance(v, list):
        raise InvalidPodSpec(pod, path, "must be a list")
    return v


def _amount(name: str, raw: Any) -> int:
    """Engine units of one resource; the sign is checked on the exact value (``-1`` bytes is negative, not 0 MiB).

    CPU in milli, memory in MiB, GPUs and MIG instances whole; every other
    scalar resource in its base unit (bytes, devices), rounded up.
    """
    if name == "cpu":
        v = to_milli(raw)
    elif name == "memory":
        v = to_mib(raw)
    elif name == GPU_RESOURCE or name.startswith(MIG_PREFIX):
        v = to_int(raw)
    else:
        v = to_milli(raw)
        v = -(-v // 1000)
    return -1 if parse_quantity(raw) < 0 else v


def _resource_list(pod: str, path: str, raw: Any, limits: Any = None, limits_path: str = "") -> dict[str, int]:
    """A ResourceList in engine units; ``limits`` fill requests not given (kube-apiserver's defaulting)."""
    requests = _mapping(pod, path, raw)
    lim = _mapping(pod, limits_path, limits) if limits_path else {}
    out: dict[str, int] = {}
    for name, v in {**lim, **requests}.items():
        field = f"{path}.{name}" if name in requests else f"{limits_path}.{name}"
        try:
            amount = _amount(name, v)
        except InvalidQuantity as exc:
            raise InvalidPodSpec(pod, field, str(exc)) from None
        if amount < 0:
            raise InvalidPodSpec(pod, field, f"must not be negative, got {v!r}")
        out[str(name)] = amount
    return out


def _container_requests(pod: str, path: str, c: Mapping[str, Any]) -> dict[str, int]:
    c = _mapping(pod, path, c)
    res = _mapping(pod, f"{path}.resources", c.get("resources"))
    limits = _mapping(pod, f"{path}.resources.limits", res.get("limits"))
    requests = _mapping(pod, f"{path}.resources.requests", res.get("requests"))
    out = _resource_list(pod, f"{path}.resources.requests", requests, limits, f"{path}.resources.limits")
    for name in (GPU_RESOURCE,):
        if name in requests and name in limits:
            try:
                if to_int(requests[name]) != to_int(limits[name]):
                    raise InvalidPodSpec(pod, f"{path}.resources.requests.{name}", "extended resources need requests equal to limits")
            except InvalidQuantity as exc:
                raise InvalidPodSpec(pod, f"{path}.resources.limits.{name}", str(exc)) from None
    return out


def _add(a: dict[str, int], b: Mapping[str, int]) -> None:
    for k, v in b.items():
        a[k] = a.get(k, 0) + v


def _max_into(a: dict[str, int], b: Mapping[str, int]) -> None:
    for k, v in b.items():
        if v > a.get(k, -1):
            a[k] = v


Role = Literal["app", "sidecar", "init"]


def _aggregate(per_container: list[tuple[Role, dict[str, int] | None]]) -> dict[str, int]:
    """Containers' requests as one pod: app containers and sidecars summed, each ordinary init container
    beside the sidecars started before it, the larger of the two (``None``: that container counts nothing)."""
    total: dict[str, int] = {}
    sidecars: dict[str, int] = {}
    init_max: dict[str, int] = {}
    for role, r in per_container:
        r = r or {}
        if role == "app":
            _add(total, r)
        elif role == "sidecar":
            _add(total, r)
            _add(sidecars, r)
            _max_into(init_max, sidecars)
        else:
            both = dict(sidecars)
            _add(both, r)
            _max_into(init_max, both)
    _max_into(total, init_max)
    return total


def is_pod_level_resource(name: str) -> bool:
    """What pod-level ``spec.resources`` may name (component-helpers ``IsSupportedPodLevelResource``)."""
    return name in ("cpu", "memory") or name.startswith("hugepages-")


def _containers(key: str, spec: Mapping[str, Any]) -> list[tuple[str, int, Any, Role]]:
    """(kind, index, container, role): app containers, then init containers (restartable ones are sidecars)."""
    out: list[tuple[str, int, Any, Role]] = []
    for i, c in enumerate(_list(key, "spec.containers", spec.get("containers"))):
        out.append(("containers", i, c, "app"))
    for i, c in enumerate(_list(key, "spec.initContainers", spec.get("initContainers"))):
        sidecar = isinstance(c, Mapping) and c.get("restartPolicy") == "Always"
        out.append(("initContainers", i, c, "sidecar" if sidecar else "init"))
    return out


def _pod_level(key: str, spec: Mapping[str, Any], containers: Mapping[str, int]) -> dict[str, int]:
    """Pod-level requests after kube-apiserver's defaulting: a resource named in ``spec.resources.limits`` only
    is requested at its containers' sum when they request it (cpu, memory), else at the limit; bad names and
    requests below the containers' sum or above the limit are refused as kube-apiserver refuses them."""
    res = _mapping(key, "spec.resources", spec.get("resources"))
    if not res:
        return {}
    for part in ("requests", "limits"):
        for name in _mapping(key, f"spec.resources.{part}", res.get(part)):
            if not is_pod_level_resource(str(name)):
                raise InvalidPodSpec(key, f"spec.resources.{part}.{name}",
                                     "pod-level resources support only cpu, memory and hugepages-<size>")
    if res.get("claims"):
        raise InvalidPodSpec(key, "spec.resources.claims", "claims may not be set for resources at pod level")
    requests = _resource_list(key, "spec.resources.requests", res.get("requests"))
    limits = _resource_list(key, "spec.resources.limits", res.get("limits"))
    out = dict(requests)
    if limits:
        for name, v in limits.items():
            if name not in out:
                overcommit = not name.startswith("hugepages-")
                out[name] = containers[name] if overcommit and name in containers else v
    for name, v in requests.items():
        if name in containers and containers[name] > v:
            raise InvalidPodSpec(key, f"spec.resources.requests.{name}",
                                 f"must be greater than or equal to aggregate container requests ({v} < {containers[name]})")
        if name in limits and limits[name] < v:
            raise InvalidPodSpec(key, f"spec.resources.requests.{name}", f"must be less than or equal to the limit {limits[name]}")
    return out


def _overhead(key: str, spec: Mapping[str, Any]) -> dict[str, int]:
    return _resource_list(key, "spec.overhead", spec.get("overhead"))


def effective_requests(pod: Mapping[str, Any]) -> dict[str, int]:
    """Per-resource requests of a pod to place (kube-scheduler's ``PodRequests`` from the spec alone):
    containers aggregated, pod-level resources over them, overhead added."""
    key = pod_key(pod)
    spec = _mapping(key, "spec", pod.get("spec"))
    per: list[tuple[Role, dict[str, int] | None]] = [
        (role, _container_requests(key, f"spec.{kind}[{i}]", c)) for kind, i, c, role in _containers(key, spec)]
    total = _aggregate(per)
    total.update(_pod_level(key, spec, total))
    _add(total, _overhead(key, spec))
    return total


def resize_infeasible(pod: Mapping[str, Any]) -> bool:
    """A ``PodResizePending`` condition with reason ``Infeasible``: the desired size will not be applied."""
    for c in (_mapping(pod_key(pod), "status", pod.get("status")).get("conditions") or []):
        if isinstance(c, Mapping) and c.get("type") == "PodResizePending":
            return c.get("reason") == "Infeasible"
    return False


def counted_requests(pod: Mapping[str, Any]) -> dict[str, int]:
    """What a running pod holds on its node, as kube-scheduler's NodeInfo counts it (in-place resize GA):
    per resource the larger of the desired, allocated and actuated sizes (desired left out while the resize
    is ``Infeasible``), pod-level resources likewise, overhead added."""
    key = pod_key(pod)
    spec = _mapping(key, "spec", pod.get("spec"))
    status = _mapping(key, "status", pod.get("status"))
    infeasible = resize_infeasible(pod)
    statuses: dict[str, tuple[str, Mapping[str, Any]]] = {}
    for kind in ("containerStatuses", "initContainerStatuses"):
        for j, cs in enumerate(_list(key, f"status.{kind}", status.get(kind))):
            if isinstance(cs, Mapping) and cs.get("name") not in statuses:
                statuses[str(cs.get("name"))] = (f"status.{kind}[{j}]", cs)
    desired: list[tuple[Role, dict[str, int] | None]] = []
    allocated: list[tuple[Role, dict[str, int] | None]] = []
    actuated: list[tuple[Role, dict[str, int] | None]] = []
    for kind, i, c, role in _containers(key, spec):
        want = _container_requests(key, f"spec.{kind}[{i}]", c)
        desired.append((role, want))
        path, cs = statuses.get(str(c.get("name")) if isinstance(c, Mapping) else "", ("", {}))
        alloc = act = None
        if cs.get("allocatedResources") is not None:
            alloc = _resource_list(key, f"{path}.allocatedResources", cs.get("allocatedResources"))
        cres = _mapping(key, f"{path}.resources", cs.get("resources"))
        if cres.get("requests") is not None:
            act = _resource_list(key, f"{path}.resources.requests", cres.get("requests"))
        fallback = None if infeasible else want
        allocated.append((role, alloc if alloc is not None else fallback))
        actuated.append((role, act if act is not None else alloc if alloc is not None else fallback))
    pod_alloc_raw = status.get("allocatedResources")
    pod_res = _mapping(key, "status.resources", status.get("resources"))
    if pod_alloc_raw is not None and pod_res.get("requests") is not None:
        # pod-level resize: kubelet reports the pod's allocated and actuated sizes as a whole
        alloc_total = _resource_list(key, "status.allocatedResources", pod_alloc_raw)
        act_total = _resource_list(key, "status.resources.requests", pod_res.get("requests"))
    else:
        alloc_total, act_total = _aggregate(allocated), _aggregate(actuated)
    want_total = _aggregate(desired)
    total: dict[str, int] = {}
    for part in ((act_total, alloc_total) if infeasible else (want_total, act_total, alloc_total)):
        _max_into(total, part)
    pod_want = _pod_level(key, spec, want_total)
    if pod_want:
        eff = {} if infeasible else dict(pod_want)
        if status.get("resources") is not None:
            _max_into(eff, _resource_list(key, "status.resources.requests", pod_res.get("requests")))
            if pod_alloc_raw is not None:
                _max_into(eff, _resource_list(key, "status.allocatedResources", pod_alloc_raw))
        else:
            eff = dict(pod_want)
        total.update({k: v for k, v in eff.items() if is_pod_level_resource(k)})
    _add(total, _overhead(key, spec))
    return total


# node features a pod needs, as kube-scheduler 1.37's NodeDeclaredFeatures infers them (component-helpers
# nodedeclaredfeatures: only these three features have a scheduling requirement)
FEATURE_RESTART_ALL = "RestartAllContainersOnContainerExits"
FEATURE_USERNS_HOST_NETWORK = "UserNamespacesHostNetworkSupport"
FEATURE_BIND_MOUNT_OPTIONS = "VolumeBindMountOptions"


def required_node_features(pod: str, spec: Mapping[str, Any]) -> frozenset[str]:
    """Features the pod's node must declare in ``status.declaredFeatures``: a container restart rule
    ``RestartAllContainers``, host network with ``hostUsers: false``, a volume mount with ``bindMountOptions``."""
    out: set[str] = set()
    for kind in ("containers", "initContainers", "ephemeralContainers"):
        for i, c in enumerate(_list(pod, f"spec.{kind}", spec.get(kind))):
            if not isinstance(c, Mapping):
                continue
            if kind != "ephemeralContainers":
                for rule in _list(pod, f"spec.{kind}[{i}].restartPolicyRules", c.get("restartPolicyRules")):
                    if isinstance(rule, Mapping) and rule.get("action") == "RestartAllContainers":
                        out.add(FEATURE_RESTART_ALL)
            for j, m in enumerate(_list(pod, f"spec.{kind}[{i}].volumeMounts", c.get("volumeMounts"))):
                if isinstance(m, Mapping) and _list(pod, f"spec.{kind}[{i}].volumeMounts[{j}].bindMountOptions", m.get("bindMountOptions")):
                    out.add(FEATURE_BIND_MOUNT_OPTIONS)
    host_users = spec.get("hostUsers")
    if host_users is not None and not isinstance(host_users, bool):
        raise InvalidPodSpec(pod, "spec.hostUsers", f"must be true or false, got {host_users!r}")
    if spec.get("hostNetwork") and host_users is False:
        out.add(FEATURE_USERNS_HOST_NETWORK)
    return frozenset(out)


def _requirement(pod: str, path: str, e: Any) -> Requirement:
    if not isinstance(e, Mapping):
        raise InvalidPodSpec(pod, path, "must be an object")
    op = e.get("operator")
    if op not in _OPERATORS:
        raise InvalidPodSpec(pod, f"{path}.operator", f"unknown operator {op!r}")
    k = e.get("key")
    if not k or not isinstance(k, str):
        raise InvalidPodSpec(pod, f"{path}.key", "must be a non-empty string")
    values = tuple(str(v) for v in (e.get("values") or []))
    if op in ("In", "NotIn") and not values:
        raise InvalidPodSpec(pod, f"{path}.values", f"operator {op} needs at least one value")
    if op in ("Exists", "DoesNotExist") and values:
        raise InvalidPodSpec(pod, f"{path}.values", f"operator {op} takes no values")
    if op in ("Gt", "Lt"):
        if len(values) != 1:
            raise InvalidPodSpec(pod, f"{path}.values", f"operator {op} needs exactly one value")
        try:
            int(values[0])
        except ValueError:
            raise InvalidPodSpec(pod, f"{path}.values", f"operator {op} needs an integer, got {values[0]!r}") from None
    return Requirement(k, op, values)


def _term(pod: str, path: str, t: Any) -> SelectorTerm:
    if not isinstance(t, Mapping):
        raise InvalidPodSpec(pod, path, "must be an object")
    reqs = [_requirement(pod, f"{path}.matchExpressions[{i}]", e) for i, e in enumerate(t.get("matchExpressions") or [])]
    for i, e in enumerate(t.get("matchFields") or []):
        r = _requirement(pod, f"{path}.matchFields[{i}]", e)
        if r.key != "metadata.name":
            raise InvalidPodSpec(pod, f"{path}.matchFields[{i}].key", "only metadata.name is supported")
        reqs.append(r)
    return SelectorTerm(tuple(reqs))


def _models(pod: str, key: str, raw: str) -> frozenset[str]:
    names = frozenset(s.strip() for s in raw.split(",") if s.strip())
    if not names:
        raise InvalidPodSpec(pod, f"metadata.annotations[{key}]", "must list at least one GPU model")
    return names


def parse_pod(pod: Mapping[str, Any]) -> PodRequest:
    """Build the engine's request from Pod JSON; raises InvalidPodSpec."""
    if not isinstance(pod, Mapping):
        raise InvalidPodSpec("<unknown>", "", "a pod must be a JSON object")
    meta = pod.get("metadata") or {}
    if not isinstance(meta, Mapping):
        raise InvalidPodSpec("<unknown>", "metadata", "must be an object")
    key = pod_key(pod)
    spec = _mapping(key, "spec", pod.get("spec"))
    annotations = meta.get("annotations") or {}
    if not isinstance(annotations, Mapping):
        raise InvalidPodSpec(key, "metadata.annotations", "must be an object")
    for a, v in annotations.items():
        if not isinstance(v, str):
            raise InvalidPodSpec(key, f"metadata.annotations[{a}]", f"must be a string, got {v!r}")
        if a.startswith(ann.PREFIX) and a not in ann.POD_INPUT_ANNOTATIONS and a not in ann.POD_OUTPUT_ANNOTATIONS:
            raise InvalidPodSpec(key, f"metadata.annotations[{a}]", f"unknown gpufleet annotation; known: {', '.join(sorted(ann.POD_INPUT_ANNOTATIONS))}")

    req = effective_requests(pod)
    terms = parse_terms(key, meta, spec)
    gpus = req.get(GPU_RESOURCE, 0)
    migs = {k[len(MIG_PREFIX):]: v for k, v in req.items() if k.startswith(MIG_PREFIX) and v > 0}
    gpu_count, gpu_milli, gpu_mem, mig = gpus, GPU_MILLI if gpus else 0, 0, None

    if len(migs) > 1:
        raise InvalidPodSpec(key, "spec.containers[*].resources", f"more than one MIG profile requested: {sorted(migs)}")
    if migs:
        if gpus:
            raise InvalidPodSpec(key, "spec.containers[*].resources", "requests both nvidia.com/gpu and a MIG profile")
        (mig, n), = migs.items()
        mem = mig_profile_memory_mib(mig)
        if mem is None:
            raise InvalidPodSpec(key, f"spec.containers[*].resources.requests.{MIG_PREFIX}{mig}", f"unknown MIG profile {mig!r}")
        gpu_count, gpu_milli, gpu_mem = n, 0, mem

    share_raw = annotations.get(ann.GPU_MILLI)
    mem_raw = annotations.get(ann.GPU_MEMORY)
    if share_raw is not None or mem_raw is not None:
        present = f"metadata.annotations[{ann.GPU_MILLI if share_raw is not None else ann.GPU_MEMORY}]"
        if mig:
            raise InvalidPodSpec(key, present, "a GPU share cannot be combined with a MIG profile")
        if gpus > 1:
            raise InvalidPodSpec(key, present, f"a GPU share applies to one GPU, but the pod requests {gpus} nvidia.com/gpu")
        gpu_count = 1
        gpu_milli = 0
        if share_raw is not None:
            f = f"metadata.annotations[{ann.GPU_MILLI}]"
            try:
                gpu_milli = int(str(share_raw).strip())
            except ValueError:
                raise InvalidPodSpec(key, f, f"must be an integer milli-GPU share 1..1000, got {share_raw!r}") from None
            if not 1 <= gpu_milli <= GPU_MILLI:
                raise InvalidPodSpec(key, f, f"must be within 1..1000 milli-GPU, got {gpu_milli}")
        if mem_raw is not None:
            f = f"metadata.annotations[{ann.GPU_MEMORY}]"
            try:
                gpu_mem = to_mib(mem_raw)
            except InvalidQuantity as exc:
                raise InvalidPodSpec(key, f, str(exc)) from None
            if gpu_mem <= 0:
                raise InvalidPodSpec(key, f, f"must be positive, got {mem_raw!r}")
            if gpu_mem > LARGEST_GPU_MEMORY_MIB:
                raise InvalidPodSpec(key, f, f"{gpu_mem} MiB is more than any GPU model has ({LARGEST_GPU_MEMORY_MIB} MiB)")

    allow = _models(key, ann.GPU_MODELS, annotations[ann.GPU_MODELS]) if ann.GPU_MODELS in annotations else None
    deny = _models(key, ann.GPU_MODELS_DENY, annotations[ann.GPU_MODELS_DENY]) if ann.GPU_MODELS_DENY in annotations else frozenset()

    ns = spec.get("nodeSelector") or {}
    if not isinstance(ns, Mapping):
        raise InvalidPodSpec(key, "spec.nodeSelector", "must be an object")
    aff = _mapping(key, "spec.affinity", spec.get("affinity"))
    node_aff = _mapping(key, "spec.affinity.nodeAffinity", aff.get("nodeAffinity"))
    rpath = "spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution"
    required = _list(key, f"{rpath}.nodeSelectorTerms", _mapping(key, rpath, node_aff.get("requiredDuringSchedulingIgnoredDuringExecution")).get("nodeSelectorTerms"))
    req_terms = tuple(
        _term(key, f"spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[{i}]", t)
        for i, t in enumerate(required)
    )
    preferred = []
    for i, p in enumerate(_list(key, "spec.affinity.nodeAffinity.preferredDuringSchedulingIgnoredDuringExecution", node_aff.get("preferredDuringSchedulingIgnoredDuringExecution"))):
        path = f"spec.affinity.nodeAffinity.preferredDuringSchedulingIgnoredDuringExecution[{i}]"
        w = p.get("weight") if isinstance(p, Mapping) else None
        if not isinstance(w, int) or not 1 <= w <= 100:
            raise InvalidPodSpec(key, f"{path}.weight", f"must be an integer 1..100, got {w!r}")
        preferred.append(PreferredTerm(w, _term(key, f"{path}.preference", p.get("preference") or {})))

    tols = []
    for i, t in enumerate(_list(key, "spec.tolerations", spec.get("tolerations"))):
        if not isinstance(t, Mapping):
            raise InvalidPodSpec(key, f"spec.tolerations[{i}]", "must be an object")
        op = t.get("operator") or "Equal"
        if op not in _TOLERATION_OPS:
            raise InvalidPodSpec(key, f"spec.tolerations[{i}].operator", f"unknown operator {op!r}")
        if op in ("Gt", "Lt"):  # TaintTolerationComparisonOperators (alpha in 1.35): an integer to compare with
            try:
                int(str(t.get("value")))
            except ValueError:
                raise InvalidPodSpec(key, f"spec.tolerations[{i}].value", f"operator {op} needs an integer, got {t.get('value')!r}") from None
        tols.append(Toleration(t.get("key") or "", _TOLERATION_OPS[op], str(t.get("value") or ""), t.get("effect") or ""))

    for f in ("name", "namespace", "uid"):
        if not isinstance(meta.get(f) or "", str):
            raise InvalidPodSpec(key, f"metadata.{f}", f"must be a string, got {meta.get(f)!r}")
    labels = meta.get("labels") or {}
    if not isinstance(labels, Mapping) or not all(isinstance(v, str) for v in labels.values()):
        raise InvalidPodSpec(key, "metadata.labels", "must be an object of string values")
    if not isinstance(spec.get("schedulerName") or "", str):
        raise InvalidPodSpec(key, "spec.schedulerName", f"must be a string, got {spec.get('schedulerName')!r}")
    prio = spec.get("priority", 0) or 0
    if not isinstance(prio, int) or isinstance(prio, bool):
        raise InvalidPodSpec(key, "spec.priority", f"must be an integer, got {prio!r}")
    pp = spec.get("preemptionPolicy") or "PreemptLowerPriority"
    if pp not in ("PreemptLowerPriority", "Never"):
        raise InvalidPodSpec(key, "spec.preemptionPolicy", f"must be PreemptLowerPriority or Never, got {pp!r}")
    scheduling_group = None
    if spec.get("schedulingGroup") is not None:
        sg = _mapping(key, "spec.schedulingGroup", spec.get("schedulingGroup"))
        scheduling_group = sg.get("podGroupName")
        if not isinstance(scheduling_group, str) or not scheduling_group:
            raise InvalidPodSpec(key, "spec.schedulingGroup.podGroupName", f"must be a PodGroup name, got {scheduling_group!r}")
        other = annotations.get(ann.POD_GROUP)
        if other is not None and other != scheduling_group:
            raise InvalidPodSpec(key, f"metadata.annotations[{ann.POD_GROUP}]", f"names pod group {other!r} but "
                                 f"spec.schedulingGroup names {scheduling_group!r}: a pod belongs to one group")
    group_min = 0
    if ann.POD_GROUP_MIN in annotations:
        try:
            group_min = int(annotations[ann.POD_GROUP_MIN])
            if group_min < 1:
                raise ValueError
        except ValueError:
            raise InvalidPodSpec(key, f"metadata.annotations[{ann.POD_GROUP_MIN}]", f"must be a positive integer, got {annotations[ann.POD_GROUP_MIN]!r}") from None

    spot = annotations.get(ann.SPOT)
    if spot is not None and spot.strip() not in ("prefer", "allow", "never"):
        raise InvalidPodSpec(key, f"metadata.annotations[{ann.SPOT}]", f"must be prefer, allow or never, got {spot!r}")
    pclass = spec.get("priorityClassName") or ""
    if not isinstance(pclass, str):
        raise InvalidPodSpec(key, "spec.priorityClassName", f"must be a string, got {pclass!r}")

    return PodRequest(
        name=meta.get("name") or "<unnamed>",
        namespace=meta.get("namespace") or "default",
        uid=meta.get("uid") or "",
        cpu_milli=req.get("cpu", 0),
        memory_mib=req.get("memory", 0),
        gpu_count=gpu_count,
        gpu_milli=gpu_milli,
        gpu_memory_mib=gpu_mem,
        mig_profile=mig,
        gpu_models_allow=allow,
        gpu_models_deny=deny,
        node_selector=tuple(sorted((str(k), str(v)) for k, v in ns.items())),
        required_terms=req_terms,
        preferred_terms=tuple(preferred),
        tolerations=tuple(tols),
        priority=prio,
        scheduler_name=spec.get("schedulerName") or "default-scheduler",
        queue=annotations.get(ann.QUEUE),
        pod_group=annotations.get(ann.POD_GROUP),
        pod_group_min=group_min,
        labels=tuple(sorted(labels.items())),
        scalars=scalar_requests(req),
        terms=terms,
        preempt_never=pp == "Never",
        priority_class=pclass,
        spot=spot.strip() if spot is not None else None,
        node_features=required_node_features(key, spec),
        scheduling_group=scheduling_group,
    )
