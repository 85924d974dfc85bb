"""Gang scheduling: all-or-nothing placement of a pod group, without deadlock.

Why: a distributed training job whose workers start one by one holds GPUs it
cannot use until the last worker runs; two such jobs that each got half the
cluster wait for each other forever.  Here a gang is placed as one
``ClusterState`` transaction: members are decided one by one on the state as
the transaction leaves it, and the transaction commits only when at least
``min_member`` members fit; otherwise every tentative reservation rolls back.

Members that arrive over time (a live cluster: controllers create a gang's pods
one at a time) may be *held*: reserved tentatively while the rest arrive, so
the gang is not starved by small pods.  Only ONE gang holds tentative
reservations at a time (the first in order of priority, then creation, then
name), and a hold older than the group's timeout is released (rolled back) and
the gang goes to the back of the line.  So two gangs can never each hold part
of the cluster and wait for each other: the holder either completes or times
out and lets the next one try.

A hold lasts only as long as what justifies it: the moment the gang is
complete the hold is dropped and the whole gang is placed as one transaction
(or waits holding nothing); it also goes when its members do, or when the
members held so far no longer fit their queue's quota together.  Held
reservations take capacity but count against no queue's quota: usage counts
what is bound, and what a transaction reserves for pods placed with it.  A pod
that only the hold keeps out is told so (``blocked_by_hold``: which gang, what
it holds where, until when).

Topology: a gang is first tried on one node, then on one NVLink domain (nodes
sharing the ``nvidia.com/gpu.clique`` label, configurable), then anywhere,
preferring nodes it already uses.  Within a node the GPU selector already keeps
each pod on one NVLink island.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Callable, Iterable, Iterator, Mapping, Sequence

import numpy as np

from .errors import ConfigError, GpufleetError, InvalidPodSpec
from .framework import Cycle, Decision, Scheduler
from .model import GPU_MILLI, PodRequest
from .podterms import UnsupportedPodField
from .queues import request_vector
from .state import ClusterState, Transaction
from .status import Status

PLUGIN = "Gang"
DEFAULT_TOPOLOGY_KEY = "nvidia.com/gpu.clique"
DEFAULT_TIMEOUT_S = 600.0
MAX_NODE_TRIES = 4  # single nodes tried for a whole gang before spreading it


# Kubernetes' own PodGroup (GenericWorkload, beta in 1.37): pods name it in spec.schedulingGroup.podGroupName
SCHEDULING_API = "scheduling.k8s.io/v1beta1"
# fields of a scheduling.k8s.io PodGroup gpufleet does not honour: its pods are refused naming the field
_UNSUPPORTED_GROUP_FIELDS = {
    "schedulingConstraints": "topology constraints (TopologyAwareWorkloadScheduling, alpha) are not supported by gpufleet",
    "parentCompositePodGroupName": "composite pod groups (CompositePodGroup, alpha) are not supported by gpufleet",
    "resourceClaims": "pod group resource claims (DRA) are not supported by gpufleet",
}


@dataclass
class PodGroup:
    """A gang: pods sharing a ``gpufleet.io/pod-group`` annotation, a gpufleet.io PodGroup object, or a
    ``scheduling.k8s.io`` PodGroup their ``spec.schedulingGroup`` names (``api``); ``gang=False`` is a
    scheduling.k8s.io group with the ``basic`` policy: its pods are placed one by one."""

    name: str
    namespace: str = "default"
    min_member: int = 1
    queue: str | None = None
    timeout_s: float = DEFAULT_TIMEOUT_S
    priority: int = 0
    created_s: float = 0.0
    api: str = "gpufleet.io/v1alpha1"
    gang: bool = True
    unsupported: tuple[str, str] | None = None  # (field, why): its pods are refused naming it

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @classmethod
    def from_json(cls, obj: Mapping[str, Any], created_s: float = 0.0) -> "PodGroup":
        """A ``gpufleet.io/v1alpha1`` PodGroup custom resource; ConfigError names object and field."""
        name, ns, where, spec = _group_object(obj, "")
        mm = spec.get("minMember")
        if not isinstance(mm, int) or isinstance(mm, bool) or mm < 1:
            raise ConfigError(f"{where}: field spec.minMember: must be an integer >= 1, got {mm!r}")
        t = spec.get("scheduleTimeoutSeconds", DEFAULT_TIMEOUT_S)
        if not isinstance(t, (int, float)) or isinstance(t, bool) or t <= 0:
            raise ConfigError(f"{where}: field spec.scheduleTimeoutSeconds: must be a positive number, got {t!r}")
        q = spec.get("queue")
        if q is not None and not isinstance(q, str):
            raise ConfigError(f"{where}: field spec.queue: must be a string, got {q!r}")
        prio = spec.get("priority", 0)
        if not isinstance(prio, int) or isinstance(prio, bool):
            raise ConfigError(f"{where}: field spec.priority: must be an integer, got {prio!r}")
        return cls(name, ns, mm, q, float(t), prio, created_s)


    @classmethod
    def from_scheduling_json(cls, obj: Mapping[str, Any], created_s: float = 0.0) -> "PodGroup":
        """A ``scheduling.k8s.io/v1beta1`` PodGroup (what a Workload's podGroupTemplates become): the ``gang``
        policy's ``minCount`` is the gang's minimum, ``basic`` places its pods one by one; ``spec.priority`` is
        the group's priority (kube-scheduler's ``PodGroupPriority``).  ConfigError names object and field."""
        name, ns, where, spec = _group_object(obj, f" ({SCHEDULING_API})")
        pol = spec.get("schedulingPolicy")
        if not isinstance(pol, Mapping) or ("gang" in pol) == ("basic" in pol):
            raise ConfigError(f"{where}: field spec.schedulingPolicy: exactly one of basic or gang is required")
        mc = 1
        if "gang" in pol:
            gang = pol["gang"]
            raw = gang.get("minCount") if isinstance(gang, Mapping) else None
            if not isinstance(raw, int) or isinstance(raw, bool) or raw < 1:
                raise ConfigError(f"{where}: field spec.schedulingPolicy.gang.minCount: must be an integer >= 1, got {raw!r}")
            mc = raw
        prio = spec.get("priority")
        if prio is not None and (not isinstance(prio, int) or isinstance(prio, bool)):
            raise ConfigError(f"{where}: field spec.priority: must be an integer, got {prio!r}")
        bad = next(((f"spec.{f}", why) for f, why in _UNSUPPORTED_GROUP_FIELDS.items() if spec.get(f)), None)
        return cls(name, ns, mc, None, DEFAULT_TIMEOUT_S, prio or 0, created_s, SCHEDULING_API, "gang" in pol, bad)


def _group_object(obj: Mapping[str, Any], api: str) -> tuple[str, str, str, Mapping[str, Any]]:
    """A PodGroup object's name, namespace, where (``PodGroup ns/name`` and ``api``, for messages) and spec;
    ConfigError when metadata.name or spec is missing."""
    meta = obj.get("metadata") if isinstance(obj, Mapping) else None
    name = meta.get("name") if isinstance(meta, Mapping) else None
    if not name or not isinstance(name, str):
        raise ConfigError("PodGroup: field metadata.name is required")
    ns = meta.get("namespace") or "default"  # type: ignore[union-attr]
    where = f"PodGroup {ns}/{name}{api}"
    spec = obj.get("spec")
    if not isinstance(spec, Mapping):
        raise ConfigError(f"{where}: field spec: required object")
    return name, ns, where, spec


class PodGroupNotReady(GpufleetError):
    """A pod's ``spec.schedulingGroup`` names a PodGroup that is not there (yet) or that gpufleet cannot honour:
    the pod waits (kube-scheduler's GangScheduling PreEnqueue waits for the group to appear)."""


def resolve_scheduling_group(r: PodRequest, groups: Mapping[str, PodGroup], served: bool = True) -> PodRequest:
    """The pod as its ``scheduling.k8s.io`` PodGroup makes it: a gang member (``pod_group``, the group's
    ``minCount``) under the gang policy, a single pod under basic.  Raises ``PodGroupNotReady`` while the
    group is missing (``served=False``: the API server does not serve the kind) and ``UnsupportedPodField``
    for a group field gpufleet does not honour.  Used by the live loop, ``explain`` and the simulator alike."""
    if not r.scheduling_group:
        return r
    key = f"{r.namespace}/{r.scheduling_group}"
    g = groups.get(key)
    if g is None or g.api != SCHEDULING_API:
        if not served:
            raise PodGroupNotReady(f"pod {r.key}: field spec.schedulingGroup.podGroupName: the API server does not "
                                   f"serve {SCHEDULING_API} PodGroups (enable the GenericWorkload feature gate and "
                                   f"--runtime-config={SCHEDULING_API}=true)")
        raise PodGroupNotReady(f"waiting for the pod's pod group {r.scheduling_group!r} ({SCHEDULING_API}) to appear")
    if g.unsupported is not None:
        field_, why = g.unsupported
        raise UnsupportedPodField(r.key, "spec.schedulingGroup.podGroupName", f"its PodGroup {key}: field {field_}: {why}")
    if r.priority != g.priority:  # kube-scheduler's validatePodGroup refuses the whole group likewise
        raise InvalidPodSpec(r.key, "spec.priority", f"must equal the priority of its PodGroup {key} ({g.priority}): "
                             f"all pods of a pod group share its priority, got {r.priority}")
    if not g.gang:
        return r
    return replace(r, pod_group=r.scheduling_group, pod_group_min=max(r.pod_group_min, g.min_member))


def group_key(r: PodRequest) -> str | None:
    return f"{r.namespace}/{r.pod_group}" if r.pod_group else None


def groups_from_pods(reqs: Iterable[PodRequest], timeout_s: float = DEFAULT_TIMEOUT_S) -> dict[str, PodGroup]:
    """Pod groups implied by pod annotations (min member: the largest ``pod-group-min-member`` given,
    else every member seen)."""
    out: dict[str, PodGroup] = {}
    count: dict[str, int] = {}
    for r in reqs:
        k = group_key(r)
        if k is None:
            continue
        g = out.setdefault(k, PodGroup(r.pod_group, r.namespace, 0, r.queue, timeout_s))  # type: ignore[arg-type]
        g.min_member = max(g.min_member, r.pod_group_min)
        g.priority = max(g.priority, r.priority)
        count[k] = count.get(k, 0) + 1
    for k, g in out.items():
        if g.min_member <= 0:
            g.min_member = count[k]
    return out


@dataclass
class GangResult:
    group: str
    placed: list[Decision] = field(default_factory=list)
    status: Status = field(default_factory=Status.success)

    @property
    def ok(self) -> bool:
        return self.status.ok


# --- one-shot all-or-nothing placement -----------------------------------------------------


def _mask(n: int, idx: Iterable[int]) -> np.ndarray:
    m = np.zeros(n, dtype=bool)
    m[list(idx)] = True
    return m


def _demand(members: Sequence[PodRequest]) -> tuple[int, int, int, int]:
    whole = sum(r.gpu_count for r in members if r.whole_gpus)
    share = sum(r.total_gpu_milli for r in members if r.shared_gpu)
    return whole, share, sum(r.cpu_milli for r in members), sum(r.memory_mib for r in members)


def _roomy(st: ClusterState, members: Sequence[PodRequest]) -> np.ndarray:
    """Per node: could it hold the whole gang (a quick arithmetic screen, not a fit check)?"""
    whole, share, cpu, mem = _demand(members)
    full = ((st.gpu_free_milli == GPU_MILLI) & st.gpu_usable).sum(axis=1)
    ok = (full >= whole) & (st.gpu_free_milli.sum(axis=1) >= whole * GPU_MILLI + share)
    return ok & (st.cpu_free >= cpu) & (st.mem_free >= mem) & (st.pods_free >= len(members))


def _domains(st: ClusterState, members: Sequence[PodRequest], topology_key: str | None) -> list[np.ndarray]:
    """Node sets to try in turn: single nodes (tightest first), NVLink domains, then anywhere."""
    n = len(st)
    out: list[np.ndarray] = []
    if len(members) > 1:
        roomy = np.flatnonzero(_roomy(st, members))
        if roomy.size:
            left = st.gpu_free_milli[roomy].sum(axis=1)
            for i in roomy[np.argsort(left, kind="stable")][:MAX_NODE_TRIES]:
                out.append(_mask(n, [int(i)]))
        if topology_key:
            dom: dict[str, list[int]] = {}
            for i, node in enumerate(st.nodes):
                v = node.labels.get(topology_key)
                if v:
                    dom.setdefault(v, []).append(i)
            whole, share, _, _ = _demand(members)
            free = st.gpu_free_milli.sum(axis=1)
            cands = [(int(free[ix].sum()), k, ix) for k, ix in dom.items()
                     if len(ix) > 1 and free[ix].sum() >= whole * GPU_MILLI + share]
            for _, _, ix in sorted(cands)[:MAX_NODE_TRIES]:
                out.append(_mask(n, ix))
    out.append(np.ones(n, dtype=bool))
    return out


def _partitioned(sched: Scheduler, members: Sequence[PodRequest], domains: list[np.ndarray]) -> Iterator[tuple[np.ndarray, bool]]:
    """The domains, each cut by the node sets a filter keeps a whole gang within (``gang_partitions``: spot or
    on-demand, in the plugin's order); with the flag that says it is the widest set of its partition."""
    parts = None
    for p in sched.profile.filters:
        f = getattr(p, "gang_partitions", None)
        if f is not None and (parts := f(members, sched.state)):
            break
    if not parts:
        yield from ((d, bool(d.all())) for d in domains)
        return
    for part in parts:
        for k, d in enumerate(domains):
            m = d & part
            if m.any():
                yield m, k == len(domains) - 1


def _try_place(sched: Scheduler, tx: Transaction, r: PodRequest, allowed: np.ndarray,
               used: list[int], waited_s: float = 0.0, take_held: bool = False) -> tuple[Decision, Cycle]:
    """Decide one member on the transaction's view: first on the nodes the gang uses."""
    st = sched.state
    dec: Decision | None = None
    cycle = sched.new_cycle(r, waited_s, take_held)
    if used:
        cycle.only_nodes = allowed & _mask(len(st), used)
        dec = sched.decide(cycle)
    if dec is None or not dec.ok:
        cycle = sched.new_cycle(r, waited_s, take_held)
        cycle.only_nodes = None if allowed.all() else allowed
        dec = sched.decide(cycle)
    if dec.ok:
        s = sched.reserve(cycle)  # with the profile's Reserve plugins (exact quota check)
        if not s.ok:
            return Decision(r.key, s), cycle
        tx.reserved.append(r.key)
        i = st.index[dec.assignment.node]  # type: ignore[union-attr]
        if i not in used:
            used.append(i)
    return dec, cycle


def _release(sched: Scheduler, tx: Transaction, cycles: Sequence[Cycle]) -> None:
    for c in reversed(cycles):
        for p in reversed(sched.profile.reserves):
            p.unreserve(c, sched.state)
    tx.rollback()


def place_gang(sched: Scheduler, group: str, members: Sequence[PodRequest], min_member: int | None = None,
               topology_key: str | None = DEFAULT_TOPOLOGY_KEY, waited_s: float = 0.0,
               take_held: bool = False) -> GangResult:
    """All-or-nothing: reserve at least ``min_member`` of ``members`` (all of them when
    None) as one transaction, or nothing.  Higher-priority members are placed first.
    ``waited_s`` and ``take_held`` go to every member's cycle (see ``Scheduler.schedule``)."""
    need = min_member or len(members)
    members = sorted(members, key=lambda r: -r.priority)
    st = sched.state
    if len(members) < need:
        return GangResult(group, [], Status.wait(
            f"pod group {group}: {len(members)} of the {need} required members exist", plugin=PLUGIN))
    first_failure = ""
    best = 0
    for allowed, widest in _partitioned(sched, members, _domains(st, members, topology_key)):
        tx = Transaction(st)
        placed: list[Decision] = []
        cycles: list[Cycle] = []
        used: list[int] = []
        for j, r in enumerate(members):
            if len(placed) + (len(members) - j) < need:
                break  # cannot reach min_member any more in this domain
            dec, cycle = _try_place(sched, tx, r, allowed, used, waited_s, take_held)
            if dec.ok:
                placed.append(dec)
                cycles.append(cycle)
            elif not first_failure and widest:
                first_failure = f"{r.key}: {dec.status.message}"
        if len(placed) >= need:
            tx.commit()
            return GangResult(group, placed)
        best = max(best, len(placed))
        _release(sched, tx, cycles)
    return GangResult(group, [], Status.unschedulable(
        f"pod group {group}: only {best} of the {need} required members fit"
        + (f"; first failure: {first_failure}" if first_failure else ""), plugin=PLUGIN))


def gang_dry_run(sched: Scheduler, members: Sequence[PodRequest]) -> list[tuple[str, str | None, Status]]:
    """Each member as a gang placement tries it anywhere (higher priority first, near the members placed
    before it): (pod, node it would get or None, why not).  Changes nothing (``gpufleet explain``)."""
    st = sched.state
    tx = Transaction(st)
    cycles: list[Cycle] = []
    used: list[int] = []
    out: list[tuple[str, str | None, Status]] = []
    try:
        for r in sorted(members, key=lambda r: -r.priority):
            dec, cycle = _try_place(sched, tx, r, np.ones(len(st), dtype=bool), used)
            if dec.ok and dec.assignment is not None:
                cycles.append(cycle)
                out.append((r.key, dec.assignment.node, dec.status))
            else:
                out.append((r.key, None, dec.status))
    finally:
        _release(sched, tx, cycles)
    return out


def schedule_gangs(sched: Scheduler, gangs: Mapping[str, tuple[Sequence[PodRequest], int]],
                   waited_s: Mapping[str, float] | None = None, timeout_s: float = DEFAULT_TIMEOUT_S) -> dict[str, GangResult]:
    """Try complete gangs one at a time (priority, then name); never two with tentative reservations."""
    out = {}
    for g, (members, mn) in sorted(gangs.items(), key=lambda kv: (-max((m.priority for m in kv[1][0]), default=0), kv[0])):
        r = place_gang(sched, g, members, mn)
        if not r.ok and waited_s and waited_s.get(g, 0.0) > timeout_s:
            r.status = Status.unresolvable(f"pod group {g}: gave up after {timeout_s:.0f} s: {r.status.message}", plugin=PLUGIN)
        out[g] = r
    return out


# --- live gangs: members arriving over time, one hold at a time, timeouts ----------------------


@dataclass
class _Gang:
    group: PodGroup
    members: dict[str, PodRequest] = field(default_factory=dict)  # arrived, not yet placed
    running: set[str] = field(default_factory=set)  # placed (committed)
    since_s: float = 0.0  # in line since (reset when a hold times out)
    first_s: float = 0.0  # first seen (never reset): how long the gang has waited
    placed: bool = False  # reached min_member once; later members go one by one
    hold_after: int = -1  # after a hold timed out: holds again only once more members than this arrived

    @property
    def need(self) -> int:
        return max(self.group.min_member - len(self.running), 1)


def _quota_tree(sched: Scheduler) -> Any:
    """The queue tree of the profile's ``QueueQuota`` plugin, if any (duck-typed: no import cycle)."""
    for p in sched.profile.pre_filters:
        t = getattr(p, "tree", None)
        if t is not None and hasattr(t, "check"):
            return t
    return None


class GangScheduler:
    """Pod groups whose members arrive over time.

    ``add`` a member when it appears, ``remove`` it when it leaves, call ``step(now)``
    each scheduling round: it returns what was placed (commit: bind these) and why the
    others wait.  At most one gang holds tentative reservations (``holder``).

    A hold lives only while it is justified: the gang is not complete yet (members
    still arriving), it has members, the members held so far fit its queue's quota
    as a whole, and its ``timeout_s`` has not run out.  Held reservations take
    capacity but count against no queue: the moment the gang is complete the hold
    is dropped and the whole gang is placed as one transaction, with the quota
    checked for all of it -- or nothing is held at all.
    """

    def __init__(self, sched: Scheduler, timeout_s: float = DEFAULT_TIMEOUT_S,
                 topology_key: str | None = DEFAULT_TOPOLOGY_KEY) -> None:
        self.sched = sched
        self.timeout_s = timeout_s
        self.topology_key = topology_key
        self.gangs: dict[str, _Gang] = {}
        self.holder: str | None = None
        self._tx: Transaction | None = None
        self._held: dict[str, Cycle] = {}
        self._hold_since = 0.0
        self.timeouts = 0  # holds released by timeout
        self.take_held: set[str] = set()  # groups that take room held for pods not yet here rather than evict (preemption)
        self.releases: dict[str, int] = {}  # holds ended, by why: complete, timeout, quota, members gone, preempted
        # how a hold's deadline reads (deadline, now); a live scheduler gives wall-clock time
        self.when: Callable[[float, float], str] = lambda deadline, now: f"in {max(0.0, deadline - now):.0f} s"

    # --- membership ---------------------------------------------------------------------
    def add_group(self, g: PodGroup, now: float = 0.0) -> None:
        cur = self.gangs.get(g.key)
        if cur is None:
            self.gangs[g.key] = _Gang(g, since_s=g.created_s or now, first_s=g.created_s or now)
        else:
            cur.group = g

    def add(self, r: PodRequest, now: float = 0.0) -> None:
        k = group_key(r)
        if k is None:
            raise ValueError(f"pod {r.key} has no pod group")
        if k not in self.gangs:
            self.gangs[k] = _Gang(PodGroup(r.pod_group, r.namespace, r.pod_group_min or 1, r.queue,  # type: ignore[arg-type]
                                           self.timeout_s, r.priority, now), since_s=now, first_s=now)
        g = self.gangs[k]
        g.group.min_member = max(g.group.min_member, r.pod_group_min)
        g.group.priority = max(g.group.priority, r.priority)
        if r.key not in g.running:
            g.members[r.key] = r

    def note_running(self, group: str, pod_keys: Iterable[str]) -> None:
        """Members found already bound (placed before this scheduler knew the gang: a restart, another
        scheduler): they count toward ``min_member`` as kube-scheduler counts a group's scheduled pods, so a
        replacement member of a running gang goes alone once the minimum runs."""
        g = self.gangs.get(group)
        if g is None:
            return
        g.running.update(k for k in pod_keys if k not in g.members)
        if len(g.running) >= g.group.min_member:
            g.placed = True

    def remove(self, pod_key: str) -> bool:
        """A member left (deleted, finished): forget it, releasing a held or running reservation.
        True when that gave capacity back."""
        freed = False
        for k, g in list(self.gangs.items()):
            if pod_key in g.members:
                del g.members[pod_key]
                if pod_key in self._held:
                    c = self._held.pop(pod_key)
                    for p in reversed(self.sched.profile.reserves):
                        p.unreserve(c, self.sched.state)
                    freed = self.sched.forget(pod_key) is not None or freed
                    if self._tx is not None and pod_key in self._tx.reserved:
                        self._tx.reserved.remove(pod_key)
                if self.holder == k and not g.members:  # nobody left to hold for
                    self.release_hold("members gone")
                    freed = True
            if pod_key in g.running:
                g.running.discard(pod_key)
                freed = self.sched.forget(pod_key) is not None or freed
                if not g.running:  # no member runs any more (the whole gang was evicted): all or nothing again
                    g.placed = False
            if not g.members and not g.running and self.holder != k:
                del self.gangs[k]
                self.take_held.discard(k)
        return freed

    # --- the round ----------------------------------------------------------------------
    def _order(self) -> list[str]:
        return sorted(self.gangs, key=lambda k: (-self.gangs[k].group.priority, self.gangs[k].since_s, k))

    def step(self, now: float) -> list[GangResult]:
        out: list[GangResult] = []
        done: set[str] = set()
        if self.holder is not None:
            done.add(self.holder)
            out.append(self._advance_hold(now))
        for k in self._order():
            g = self.gangs.get(k)
            if g is None or k in done or not g.members:
                continue
            if g.placed:  # already running: late members go one by one, near the others
                out.append(self._late_members(k, g, now))
                continue
            if len(g.members) >= g.need:
                out.append(self._place_complete(k, g, now))
            elif self.holder is None and len(g.members) > g.hold_after:
                out.append(self._start_hold(k, g, now))
            elif self.holder is None:
                out.append(GangResult(k, [], Status.wait(
                    f"pod group {k}: {len(g.members)} of {g.need} members arrived; its hold timed out, so it holds "
                    f"nothing until another member arrives", plugin=PLUGIN)))
            else:
                out.append(GangResult(k, [], Status.wait(
                    f"pod group {k}: {len(g.members)} of {g.need} members arrived; gang {self.holder} holds the "
                    f"tentative reservations, waiting for it", plugin=PLUGIN)))
        return out

    def _place_complete(self, k: str, g: _Gang, now: float) -> GangResult:
        """Every required member is there: all of them as one transaction, or nothing (no hold)."""
        res = place_gang(self.sched, k, list(g.members.values()), g.need, self.topology_key,
                         self._waited_s(g, now), k in self.take_held)
        if res.ok:
            self._mark_running(g, res.placed)
            return res
        waited = now - g.since_s
        if waited > g.group.timeout_s:
            res.status = Status.unschedulable(f"{res.status.reasons[0]}; waiting {waited:.0f} s "
                                              f"(past its {g.group.timeout_s:.0f} s timeout)", plugin=PLUGIN)
        return res

    def _mark_running(self, g: _Gang, placed: Sequence[Decision]) -> None:
        for d in placed:
            g.members.pop(d.pod_key, None)
            g.running.add(d.pod_key)
        g.placed = True

    def room_wanted(self, group: str) -> tuple[list[PodRequest], int, int] | None:
        """(members to make room for, how many of them must fit, their lowest priority) for a complete
        gang that may preempt, or None: unknown, not complete, nothing left to place, or a member
        with ``preemptionPolicy: Never``.  Members held by the gang's own hold already have room."""
        g = self.gangs.get(group)
        if g is None:
            return None
        need = max(g.group.min_member - len(g.running), 1)
        if len(g.members) < need:
            return None  # not all there yet: nothing to make room for
        held = set(self._held) if self.holder == group else set()
        members = [r for r in g.members.values() if r.key not in held]
        need -= len(held)
        if need <= 0 or not members or any(r.preempt_never for r in members):
            return None
        return members, need, min(r.priority for r in members)

    def place_in_held_room(self, group: str, now: float) -> GangResult | None:
        """Preemption would evict for ``group``: place it now if room that plugins hold for pods not
        yet here is enough (the placed result), else None.  Either way the gang may take held room
        from now on, also once victims have made room for it (the dry runs count on that)."""
        g = self.gangs.get(group)
        if g is None:
            return None
        self.take_held.add(group)
        if g.placed or self.holder == group or len(g.members) < g.need:
            return None  # late members and holds try held room at the next step
        res = self._place_complete(group, g, now)
        return res if res.ok else None

    def _waited_s(self, g: _Gang, now: float) -> float:
        """How long the gang has waited since it was first seen (its hold timeouts do not reset this)."""
        return now - g.first_s

    def _late_members(self, k: str, g: _Gang, now: float) -> GangResult:
        res = GangResult(k)
        used = [self.sched.state.index[a.node] for p in g.running if (a := self.sched.state.assignments.get(p))]
        for r in list(g.members.values()):
            with self.sched.state.transaction() as tx:
                dec, _ = _try_place(self.sched, tx, r, np.ones(len(self.sched.state), dtype=bool), used,
                                    self._waited_s(g, now), k in self.take_held)
                if dec.ok:
                    tx.commit()
                    res.placed.append(dec)
        self._mark_running(g, res.placed)
        g.placed = True
        if g.members:
            res.status = Status.unschedulable(f"pod group {k}: {len(g.members)} extra member(s) do not fit yet", plugin=PLUGIN)
        return res

    def _start_hold(self, k: str, g: _Gang, now: float) -> GangResult:
        self.holder = k
        self._tx = Transaction(self.sched.state)
        self._held = {}
        self._hold_since = now
        return self._advance_hold(now)

    def _advance_hold(self, now: float) -> GangResult:
        k = self.holder
        assert k is not None and self._tx is not None
        g = self.gangs.get(k)
        if g is None or not g.members:
            self.release_hold("members gone")
            return GangResult(k, [], Status.wait(f"pod group {k}: no member left; its hold is released", plugin=PLUGIN))
        if len(g.members) >= g.need:  # complete: the hold has done its job; one transaction or nothing
            self.release_hold("complete")
            return self._place_complete(k, g, now)
        if now - self._hold_since > g.group.timeout_s:
            n = len(self._held)
            self.release_hold("timeout")
            self.timeouts += 1
            g.since_s = now  # to the back of the line: the next gang may hold
            g.hold_after = len(g.members)
            return GangResult(k, [], Status.unschedulable(
                f"pod group {k}: timed out after {g.group.timeout_s:.0f} s with {n} of {g.need} members reserved; "
                f"released its reservations", plugin=PLUGIN))
        st = self.sched.state
        used = sorted({st.index[st.assignments[p].node] for p in self._held if p in st.assignments})
        everywhere = np.ones(len(st), dtype=bool)
        tree = _quota_tree(self.sched)
        for r in g.members.values():
            if r.key in self._held:
                continue
            if tree is not None and r.queue:  # the members held so far must fit the queue as a whole
                want: dict[str, int] = {}
                for m in [*(g.members[p] for p in self._held if p in g.members), r]:
                    for res_name, x in request_vector(m).items():
                        want[res_name] = want.get(res_name, 0) + x
                q = tree.check(r.queue, want)
                if not q.ok:
                    self.release_hold("quota")
                    return GangResult(k, [], Status.wait(
                        f"pod group {k}: the members arrived so far do not fit its queue's quota together "
                        f"({q.reasons[0] if q.reasons else q.message}); it holds nothing", plugin=PLUGIN))
            # held reservations take capacity only: no queue, so no quota is counted for them
            dec, cycle = _try_place(self.sched, self._tx, replace(r, queue=None), everywhere, used,
                                    self._waited_s(g, now), k in self.take_held)
            if dec.ok:
                self._held[r.key] = cycle
        return GangResult(k, [], Status.wait(
            f"pod group {k}: holding {len(self._held)} of {g.need} members, {len(g.members)} arrived, "
            f"until the gang is complete or {self._when(now)} at the latest", plugin=PLUGIN))

    def release_hold(self, why: str) -> None:
        """Give back every tentative reservation of the holder (rolled back, Reserve plugins undone)."""
        if self.holder is None:
            return
        if self._tx is not None:
            _release(self.sched, self._tx, list(self._held.values()))
        self.releases[why] = self.releases.get(why, 0) + 1
        self._end_hold()

    def _end_hold(self) -> None:
        self.holder = None
        self._tx = None
        self._held = {}

    @property
    def held(self) -> list[str]:
        """Pods with tentative (uncommitted) reservations right now."""
        return list(self._held)

    # --- what a hold blocks -----------------------------------------------------------------
    def hold_deadline(self) -> float | None:
        """When the current hold times out at the latest (the clock ``step`` is given)."""
        if self.holder is None or self.holder not in self.gangs:
            return None
        return self._hold_since + self.gangs[self.holder].group.timeout_s

    def _when(self, now: float) -> str:
        d = self.hold_deadline()
        return self.when(d, now) if d is not None else "now"

    def hold_text(self, now: float) -> str:
        """The current hold in words: which gang, what it holds where, until when."""
        k = self.holder
        if k is None or not self._held:
            return ""
        g = self.gangs[k]
        st = self.sched.state
        held = [st.assignments[p] for p in self._held if p in st.assignments]
        milli = sum(a.held_gpu_milli for a in held)
        gpus = f"{milli // GPU_MILLI}" if milli % GPU_MILLI == 0 else f"{milli / GPU_MILLI:.3g}"
        nodes = ", ".join(sorted({a.node for a in held}))
        return (f"pod group {k} holds {gpus} GPU(s) on {nodes} for its members still arriving "
                f"({len(g.members)} of {g.need} arrived), until the gang is complete or {self._when(now)} at the latest")

    def blocked_by_hold(self, r: PodRequest, now: float) -> str:
        """Why ``r`` waits if only the current hold keeps it out (it would fit without it); else ''."""
        if not self._held or r.key in self._held or group_key(r) == self.holder:
            return ""
        st = self.sched.state
        with st.transaction() as tx:  # rolled back on the way out
            for p in self._held:
                tx.evict(p)
            fits = self.sched.decide(self.sched.new_cycle(r)).ok
        return self.hold_text(now) if fits else ""


__all__ = ["SCHEDULING_API", "GangResult", "GangScheduler", "PodGroup", "PodGroupNotReady", "group_key",
           "resolve_scheduling_group", "gang_dry_run", "groups_from_pods", "place_gang", "schedule_gangs",
           "DEFAULT_TOPOLOGY_KEY"]
