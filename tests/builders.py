"""Small builders shared by the engine's unit, scenario and property tests.

Nodes are built as engine ``Node`` objects (what the adapters hand the engine);
pods are built as real Kubernetes Pod JSON so that every test goes through
``parse_pod`` the way the live scheduler does.
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from gpufleet.engine.framework import Cycle, Scheduler
from gpufleet.engine.gpu_models import lookup
from gpufleet.engine.model import Gpu, MigInstance, Node, PodRequest, Taint
from gpufleet.engine.podspec import parse_pod
from gpufleet.engine.state import ClusterState

T4 = "Tesla-T4"  # 15360 MiB
A100 = "NVIDIA-A100-SXM4-80GB"  # 81920 MiB, MIG-capable
V100 = "Tesla-V100-SXM2-32GB"  # 32768 MiB


def model_memory_mib(model: str) -> int:
    m = lookup(model)
    return m.memory_mib if m else 16_384


def mig_instances(model: str, profiles: Sequence[str], first_id: int = 0) -> tuple[MigInstance, ...]:
    known = dict(lookup(model).mig_profiles) if lookup(model) else {}
    return tuple(MigInstance(p, known.get(p, 10_000), first_id + k) for k, p in enumerate(profiles))


def make_node(
    name: str,
    gpus: int = 0,
    model: str = T4,
    gpu_memory_mib: int | None = None,
    cpu_milli: int = 16_000,
    memory_mib: int = 65_536,
    labels: Mapping[str, str] | None = None,
    taints: Iterable[Taint | tuple] = (),
    unschedulable: bool = False,
    max_pods: int = 110,
    nvlink: Sequence[Sequence[int]] = (),
    mig: Mapping[int, Sequence[str]] | None = None,
    unhealthy: Iterable[int] = (),
) -> Node:
    """A node with ``gpus`` GPUs of one model.

    ``nvlink`` lists islands of GPU indices fully connected by NVLink;
    ``mig`` maps a GPU index to the MIG profiles carved out of it (that GPU is
    in MIG mode); ``taints`` takes ``Taint`` objects or (key, value, effect).
    """
    mem = gpu_memory_mib if gpu_memory_mib is not None else model_memory_mib(model)
    peers: dict[int, tuple[int, ...]] = {}
    for island in nvlink:
        for g in island:
            peers[g] = tuple(x for x in island if x != g)
    bad = set(unhealthy)
    gs = []
    for i in range(gpus):
        profs = (mig or {}).get(i)
        gs.append(
            Gpu(
                index=i,
                uuid=f"GPU-{name}-{i}",
                model=model,
                memory_mib=mem,
                mig_enabled=profs is not None,
                mig_instances=mig_instances(model, profs) if profs is not None else (),
                nvlink_peers=peers.get(i, ()),
                healthy=i not in bad,
            )
        )
    return Node(
        name=name,
        cpu_milli=cpu_milli,
        memory_mib=memory_mib,
        gpus=tuple(gs),
        labels={"kubernetes.io/hostname": name, **dict(labels or {})},
        taints=tuple(t if isinstance(t, Taint) else Taint(*t) for t in taints),
        unschedulable=unschedulable,
        max_pods=max_pods,
    )


def container(
    name: str = "main",
    cpu: Any = None,
    memory: Any = None,
    gpu: Any = None,
    requests: Mapping[str, Any] | None = None,
    limits: Mapping[str, Any] | None = None,
    restart_policy: str | None = None,
) -> dict[str, Any]:
    """A container; ``cpu``/``memory`` go to requests, ``gpu`` to limits (as users write it)."""
    req = dict(requests or {})
    lim = dict(limits or {})
    if cpu is not None:
        req["cpu"] = cpu
    if memory is not None:
        req["memory"] = memory
    if gpu is not None:
        lim["nvidia.com/gpu"] = gpu
    res: dict[str, Any] = {}
    if req:
        res["requests"] = req
    if lim:
        res["limits"] = lim
    c: dict[str, Any] = {"name": name, "image": "registry.example/app:1", "resources": res}
    if restart_policy:
        c["restartPolicy"] = restart_policy
    return c


def make_pod_json(
    name: str = "p",
    namespace: str = "default",
    containers: Sequence[Mapping[str, Any]] | None = None,
    init_containers: Sequence[Mapping[str, Any]] | None = None,
    annotations: Mapping[str, str] | None = None,
    labels: Mapping[str, str] | None = None,
    cpu: Any = "500m",
    memory: Any = "1Gi",
    gpu: Any = None,
    **spec: Any,
) -> dict[str, Any]:
    """Pod JSON as the API returns it; one container from cpu/memory/gpu unless ``containers`` is given."""
    cs = containers if containers is not None else [container(cpu=cpu, memory=memory, gpu=gpu)]
    cs = list(cs) if isinstance(cs, tuple) else cs  # anything else passes through, malformed on purpose
    s: dict[str, Any] = {"schedulerName": "gpufleet", "containers": cs, **spec}
    if init_containers:
        s["initContainers"] = list(init_containers)
    meta: dict[str, Any] = {"name": name, "namespace": namespace, "uid": f"uid-{name}"}
    if annotations:
        meta["annotations"] = dict(annotations)
    if labels:
        meta["labels"] = dict(labels)
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": s}


def make_pod(name: str = "p", **kw: Any) -> PodRequest:
    """``parse_pod(make_pod_json(...))``."""
    return parse_pod(make_pod_json(name, **kw))


def affinity(required: Sequence[Sequence[Mapping[str, Any]]] = (), preferred: Sequence[tuple[int, Sequence[Mapping[str, Any]]]] = ()) -> dict:
    """``spec.affinity`` from required terms (each a list of expressions) and (weight, expressions) preferences."""
    na: dict[str, Any] = {}
    if required:
        na["requiredDuringSchedulingIgnoredDuringExecution"] = {
            "nodeSelectorTerms": [{"matchExpressions": list(t)} for t in required]
        }
    if preferred:
        na["preferredDuringSchedulingIgnoredDuringExecution"] = [
            {"weight": w, "preference": {"matchExpressions": list(t)}} for w, t in preferred
        ]
    return {"nodeAffinity": na}


def expr(key: str, operator: str, *values: Any) -> dict[str, Any]:
    e: dict[str, Any] = {"key": key, "operator": operator}
    if values:
        e["values"] = list(values)
    return e


def state_of(*nodes: Node) -> ClusterState:
    return ClusterState(list(nodes))


def cycle_for(request: PodRequest, seed: int = 0) -> Cycle:
    return Cycle(request=request, rng=np.random.default_rng(seed))


def verdicts(plugin: Any, request: PodRequest, state: ClusterState) -> dict[str, str | None]:
    """Run one filter plugin: node name -> None when it passes, else its reason string."""
    res = plugin.filter(cycle_for(request), state)
    out: dict[str, str | None] = {}
    for i, node in enumerate(state.nodes):
        if res.ok[i]:
            out[node.name] = None
        else:
            codes = res.reason_codes()
            out[node.name] = res.reasons[int(codes[i])] if codes is not None else res.reasons[0]
    return out


def scores(plugin: Any, request: PodRequest, state: ClusterState) -> np.ndarray:
    """Run one score plugin over every node: its normalised scores, in node order."""
    nodes = np.arange(len(state))
    return plugin.normalize(np.asarray(plugin.score(cycle_for(request), state, nodes), dtype=float))


def score_order(plugin: Any, request: PodRequest, state: ClusterState) -> list[str]:
    """Node names by one score plugin, best first (stable for equal scores)."""
    s = scores(plugin, request, state)
    return [state.nodes[i].name for i in np.argsort(-s, kind="stable")]


def profile_config(
    score: Sequence[Any] = ("LeastAllocated",),
    filters: Sequence[str] | None = None,
    gpu_select: str = "BestFitGpu",
    name: str = "test",
    tie_break: str = "ordered",
) -> dict[str, Any]:
    plugins: dict[str, Any] = {"score": list(score), "gpuSelect": gpu_select}
    if filters is not None:
        plugins["filter"] = list(filters)
    return {"name": name, "tieBreak": tie_break, "plugins": plugins}


def scheduler(nodes: Iterable[Node], policy: str | Mapping[str, Any] = "bestfit", seed: int = 0) -> Scheduler:
    from gpufleet.policies import build_profile

    return Scheduler(build_profile(policy if isinstance(policy, str) else {"profiles": [policy]}), ClusterState(list(nodes)), seed=seed)


def snapshot(state: ClusterState) -> dict[str, Any]:
    """Every free-resource column and the MIG free lists, copied, for exact comparison."""
    return {
        "cpu_free": state.cpu_free.copy(),
        "mem_free": state.mem_free.copy(),
        "pods_free": state.pods_free.copy(),
        "gpu_free_milli": state.gpu_free_milli.copy(),
        "gpu_mem_free": state.gpu_mem_free.copy(),
        "mig_count": {p: c.copy() for p, c in state.mig_count.items()},
        "mig_free": [{p: list(v) for p, v in m.items()} for m in state.mig_free],
        "assignments": dict(state.assignments),
        "pods_on_node": {k: set(v) for k, v in state.pods_on_node.items()},
    }


def assert_same_snapshot(a: Mapping[str, Any], b: Mapping[str, Any]) -> None:
    assert a.keys() == b.keys()
    for k in a:
        if k == "mig_count":
            assert a[k].keys() == b[k].keys(), k
            for p in a[k]:
                np.testing.assert_array_equal(a[k][p], b[k][p], err_msg=f"mig_count[{p}]")
        elif isinstance(a[k], np.ndarray):
            np.testing.assert_array_equal(a[k], b[k], err_msg=k)
        else:
            assert a[k] == b[k], k


class RoundShell:
    """The ports a ``SchedulingRound`` asks of its shell (RoundPort, RoomPort), at their smallest: the pending pods
    (``self.pending``, a ``PendingGroups``) placed or left waiting, the scheduler's state for the could-fit screen, no
    queues, nothing lower to preempt unless ``self.lower`` (then every plan is allowed).  Tests of the pending pods
    subclass it with their scheduler and pods."""

    lower = False
    tree = None

    def could_fit(self, request: PodRequest) -> Any:
        from gpufleet.engine.pending import could_fit

        return could_fit(self.sched.state, request)  # type: ignore[attr-defined]

    def bind(self, attempt: Any) -> None:
        self.pending.placed(self.pending.by_key[attempt.request.key])  # type: ignore[attr-defined]

    def wait(self, attempt: Any) -> None:
        self.pending.failed(self.pending.by_key[attempt.request.key], 0.0, attempt.decision.rejected_by)  # type: ignore[attr-defined]

    def lower_priority_running(self, priority: int) -> bool:
        return self.lower

    def may_plan(self, room: Any, now: float) -> bool:
        return self.lower

    def planned(self, room: Any, now: float, spent_s: float, outcome: Any) -> None:
        pass

    def victim_options(self) -> dict:
        return {}

    def room_coming(self, request: PodRequest) -> str:
        return ""

    def leaving(self) -> frozenset:
        return frozenset()

