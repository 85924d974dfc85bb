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


# --- pod-to-pod constraints ----------------------------------------------------------

HOST = "kubernetes.io/hostname"
ZONE = "topology.kubernetes.io/zone"


def zoned(zones: dict[str, str], **kw: Any) -> list[Node]:
    """Nodes by name -> zone (``topology.kubernetes.io/zone``)."""
    return [gpu_node(n, labels={ZONE: z} if z else {}, **kw) for n, z in zones.items()]


def term(topology_key: str = HOST, namespaces: list | None = None, ns_selector: dict | None = None,
         match_label_keys: list | None = None, **match_labels: str) -> dict:
    t: dict[str, Any] = {"labelSelector": {"matchLabels": dict(match_labels)}, "topologyKey": topology_key}
    if namespaces is not None:
        t["namespaces"] = namespaces
    if ns_selector is not None:
        t["namespaceSelector"] = ns_selector
    if match_label_keys is not None:
        t["matchLabelKeys"] = match_label_keys
    return t


def spread_c(max_skew: int = 1, key: str = ZONE, hard: bool = True, **kw: Any) -> dict:
    c: dict[str, Any] = {"maxSkew": max_skew, "topologyKey": key,
                         "whenUnsatisfiable": "DoNotSchedule" if hard else "ScheduleAnyway"}
    labels = {k: v for k, v in kw.items() if k not in ("minDomains", "nodeAffinityPolicy", "nodeTaintsPolicy", "matchLabelKeys")}
    c["labelSelector"] = {"matchLabels": labels}
    c.update({k: v for k, v in kw.items() if k not in labels})
    return c


def kpod(name: str, labels: dict | None = None, namespace: str = "default", anti: tuple = (), aff: tuple = (),
         pref_anti: tuple = (), pref_aff: tuple = (), spread: tuple = (), host_ports: tuple = (), claims: tuple = (),
         owner: str | None = None, cpu: str = "100m", **spec: Any) -> dict:
    """Pod JSON with labels and inter-pod terms: ``anti``/``aff`` are required terms, ``pref_*`` (weight, term)."""
    p = pod(name, cpu=cpu, memory="64Mi", **spec)
    p["metadata"]["namespace"] = namespace
    p["metadata"]["labels"] = dict(labels or {})
    if owner:
        p["metadata"]["ownerReferences"] = [{"kind": "ReplicaSet", "name": owner, "uid": owner, "controller": True}]
    a: dict[str, Any] = {}
    if aff or pref_aff:
        a["podAffinity"] = {"requiredDuringSchedulingIgnoredDuringExecution": list(aff),
                            "preferredDuringSchedulingIgnoredDuringExecution": [{"weight": w, "podAffinityTerm": t} for w, t in pref_aff]}
    if anti or pref_anti:
        a["podAntiAffinity"] = {"requiredDuringSchedulingIgnoredDuringExecution": list(anti),
                                "preferredDuringSchedulingIgnoredDuringExecution": [{"weight": w, "podAffinityTerm": t} for w, t in pref_anti]}
    if a:
        p["spec"]["affinity"] = {**p["spec"].get("affinity", {}), **a}
    if spread:
        p["spec"]["topologySpreadConstraints"] = list(spread)
    if host_ports:
        p["spec"]["containers"][0]["ports"] = [
            {"containerPort": hp[0], "hostPort": hp[0], **({"protocol": hp[1]} if len(hp) > 1 else {}),
             **({"hostIP": hp[2]} if len(hp) > 2 else {})} for hp in host_ports]
    if claims:
        p["spec"]["volumes"] = [{"name": f"v{i}", "persistentVolumeClaim": {"claimName": c}} for i, c in enumerate(claims)]
    return p


def place(state: Any, pod_json: dict, node: str) -> None:
    """Reserve a pod on a node as if it were running there (with its labels and terms)."""
    from gpufleet.engine.model import Assignment
    from gpufleet.engine.podspec import parse_pod

    r = parse_pod(pod_json)
    state.reserve(Assignment(r.key, node, r.cpu_milli, r.memory_mib, scalars=r.scalars, terms=r.terms))
