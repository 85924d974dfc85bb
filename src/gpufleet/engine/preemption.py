"""Priority preemption: the smallest set of lower-priority victims that makes a pod fit.

Why: a high-priority pod (Kubernetes ``PriorityClass`` value in
``PodRequest.priority``) that does not fit should displace as little work as
possible, never pods of its own or higher priority, never a pod whose
PodDisruptionBudget has no disruption left, and never half a gang (a gang
member's eviction takes its whole pod group, on every node).

Per node: victims are *units* (a pod, or a whole pod group) of lower priority.
The planner evicts units tentatively inside a ``ClusterState`` transaction --
lowest priority, youngest first -- until the pod fits, puts back units that
turn out not to be needed (kube-scheduler's reprieve), then searches smaller
combinations (bounded) for a set with fewer victims.  Nodes are compared by
the number of victim pods, then the highest victim priority, then the sum of
victim priorities, then the GPU the victims hold (evict no more than needed).  Every evaluation rolls back: ``find_victims`` is a dry run
(its ``explanation`` feeds ``gpufleet explain``); ``preempt`` carries it out.

A pod that evicts may also take room a plugin holds for pods not yet here (``take_held``; the
default's CPU reserve): nobody is evicted to keep room for demand that has not come.  Callers
place it with ``take_held`` once its victims are gone.
"""

from __future__ import annotations

import itertools
import zlib
from dataclasses import dataclass, field
from typing import Any, Callable, Collection, Mapping, Sequence

import numpy as np

from .disruption import NO_BUDGETS, Budgets
from .framework import Scheduler
from .model import Assignment, PodRequest

MAX_CHECKS_PER_NODE = 256  # fit checks spent looking for a smaller set than the greedy one


@dataclass
class Plan:
    node: str
    victims: list[Assignment]
    explanation: list[str] = field(default_factory=list)


def _rank(victims: Sequence[Assignment]) -> tuple[int, int, int, int]:
    """Fewer victims, then lower top priority, then lower priority sum, then less GPU taken away."""
    return (len(victims), max((a.priority for a in victims), default=-(1 << 62)), sum(a.priority for a in victims),
            sum(a.held_gpu_milli for a in victims))


def _fits_on(sched: Scheduler, r: PodRequest, node: int) -> bool:
    c = sched.new_cycle(r, take_held=True)  # a pod that evicts may also take room held for pods not yet here
    mask = np.zeros(len(sched.state), dtype=bool)
    mask[node] = True
    c.only_nodes = mask
    return sched.decide(c).ok


def _could_fit(sched: Scheduler, r: PodRequest, node: int, freed: Sequence[Assignment]) -> bool:
    """Cheap necessary condition: enough CPU, memory, GPU share on the node once ``freed`` go."""
    st = sched.state
    here = [a for a in freed if a.node == st.nodes[node].name]
    cpu = st.cpu_free[node] + sum(a.cpu_milli for a in here)
    mem = st.mem_free[node] + sum(a.memory_mib for a in here)
    gpu = st.gpu_free_milli[node].sum() + sum(a.held_gpu_milli for a in here)
    return cpu >= r.cpu_milli and mem >= r.memory_mib and gpu >= (0 if r.mig_profile else r.total_gpu_milli)


START_BY_POD = -1  # find_victims' start: a node chosen by the pod's key


def candidate_bound(sched: Scheduler) -> dict[str, int]:
    """``find_victims``' search bound, as kube-scheduler's: candidates on max(100, 10% of the nodes), from a
    node chosen at random -- by a hash of the pod's key, not a draw from the scheduler's generator, so that how
    often a shell plans (the live loop rations by time, the replay by what changed) moves no later decision.
    Both shells of the round pass it, so the live loop and the replay break ties between equal plans alike."""
    return {"max_candidates": max(100, len(sched.state) // 10), "start": START_BY_POD}


def find_victims(sched: Scheduler, r: PodRequest, pdb_allows: Callable[[Assignment], bool] | None = None,
                 age_rank: Mapping[str, int] | None = None, budgets: Budgets = NO_BUDGETS,
                 notes: list[str] | None = None, max_candidates: int | None = None, start: int = 0,
                 exclude: Collection[str] = ()) -> Plan | None:
    """The best node and the fewest lower-priority victims there; a dry run (changes nothing).

    ``pdb_allows`` may veto single pods; ``budgets`` are the PodDisruptionBudgets (with the
    facts about the pods) the whole victim set must keep (``Budgets.check``).  ``age_rank``: pod key -> order of
    creation (larger = younger); default: the order the pods were placed.  ``notes``
    collects why other nodes were not chosen.  ``max_candidates``: stop once this
    many nodes have a workable plan and take the best of those, looking at nodes
    from ``start`` on (kube-scheduler's bounded candidate search, so a live
    scheduler does not stall on a large cluster; ``START_BY_POD``: a node chosen by the pod's key); None looks at
    every node.
    ``exclude``: pods already on their way out (evictions in flight, terminating):
    never victims again, and neither is a pod group with one of them.
    """
    st = sched.state
    if start == START_BY_POD:
        start = zlib.crc32(r.key.encode()) % len(st.nodes) if len(st.nodes) else 0
    allows = pdb_allows or (lambda a: True)
    order = age_rank if age_rank is not None else {k: i for i, k in enumerate(st.assignments)}
    by_group: dict[str, list[Assignment]] = {}
    for a in st.assignments.values():
        if a.pod_group:
            by_group.setdefault(f"{a.pod_key.split('/', 1)[0]}/{a.pod_group}", []).append(a)
    best: Plan | None = None
    no_lower = too_small = 0
    protected: dict[str, int] = {}  # why a lower-priority pod is not a victim
    leaving: set[str] = set()
    n_nodes = len(st.nodes)
    candidates = 0
    for i in ((start + j) % n_nodes for j in range(n_nodes)):
        if max_candidates is not None and candidates >= max_candidates:
            break
        node = st.nodes[i]
        keys = sorted(st.pods_on_node.get(node.name, ()))
        units: list[list[Assignment]] = []
        seen: set[str] = set()
        for k in keys:
            a = st.assignments[k]
            if k in seen or a.priority >= r.priority:
                continue
            unit = by_group.get(f"{k.split('/', 1)[0]}/{a.pod_group}", [a]) if a.pod_group else [a]
            seen.update(b.pod_key for b in unit)
            if any(b.priority >= r.priority for b in unit):
                continue  # a gang with a member we may not evict
            if exclude and any(b.pod_key in exclude for b in unit):
                leaving.update(b.pod_key for b in unit if b.pod_key in exclude)
                continue  # already going: evicting it again would change nothing
            vetoed = next((b.pod_key for b in unit if not allows(b)), None)
            why = f"{vetoed} is protected, not a victim" if vetoed else None
            if why is None and budgets:
                broken = budgets.check(b.pod_key for b in unit)
                if broken:
                    why = f"{unit[0].pod_key} is protected ({broken}), not a victim"
            if why:
                protected[why] = protected.get(why, 0) + 1
                continue
            units.append(unit)
        if not units:
            no_lower += 1
            continue
        units.sort(key=lambda u: (max(a.priority for a in u), -max(order.get(a.pod_key, 0) for a in u)))
        allv = [a for u in units for a in u]
        if not _could_fit(sched, r, i, allv):
            too_small += 1
            continue
        plan = _plan_node(sched, r, i, units, budgets)
        if plan is None:
            too_small += 1
            continue
        candidates += 1
        if best is None or _rank(plan.victims) < _rank(best.victims):
            best = plan
    if notes is not None:
        if no_lower:
            notes.append(f"{no_lower} node(s) run no pod of lower priority than {r.priority} that may be evicted")
        if too_small:
            notes.append(f"{too_small} node(s) would not fit {r.key} even after evicting every lower-priority pod")
        if leaving:
            notes.append(f"{len(leaving)} lower-priority pod(s) already on their way out, not victims again: "
                         + ", ".join(sorted(leaving)[:5]) + (" ..." if len(leaving) > 5 else ""))
        notes.extend(sorted(protected))
    if best is not None:
        best.explanation.insert(0, f"{r.key} (priority {r.priority}) fits on {best.node} after evicting "
                                   f"{len(best.victims)} lower-priority pod(s)")
    return best


def _plan_node(sched: Scheduler, r: PodRequest, i: int, units: list[list[Assignment]],
               budgets: Budgets) -> Plan | None:
    st = sched.state
    node = st.nodes[i].name
    checks = 0

    def fits_without(chosen: Sequence[list[Assignment]]) -> bool:
        nonlocal checks
        victims = [a for u in chosen for a in u]
        if budgets.check(a.pod_key for a in victims) or not _could_fit(sched, r, i, victims):
            return False
        checks += 1
        with st.transaction() as tx:
            for a in victims:
                tx.evict(a.pod_key)
            return _fits_on(sched, r, i)  # the transaction rolls back

    # greedy: lowest priority, youngest first, until it fits (within the PDB budgets)
    greedy: list[list[Assignment]] = []
    for u in units:
        if budgets.check(a.pod_key for g in greedy + [u] for a in g):
            continue
        greedy.append(u)
        if fits_without(greedy):
            break
    else:
        return None
    # reprieve: put back (highest priority, oldest first) what is not needed
    for u in sorted(greedy, key=lambda u: -max(a.priority for a in u)):
        rest = [g for g in greedy if g is not u]
        if fits_without(rest):
            greedy = rest
    best = greedy
    best_rank = _rank([a for u in best for a in u])
    # a smaller set? combinations of fewer units, while the check budget lasts
    for size in range(1, len(best)):
        for combo in itertools.combinations(units, size):
            if checks >= MAX_CHECKS_PER_NODE:
                break
            vs = [a for u in combo for a in u]
            if _rank(vs) < best_rank and fits_without(list(combo)):
                best, best_rank = list(combo), _rank(vs)
        if checks >= MAX_CHECKS_PER_NODE:
            break
    victims = [a for u in best for a in u]
    lines = []
    for a in victims:
        extra = (f", pod group {a.pod_group}" if a.pod_group else "") + (f", queue {a.queue}" if a.queue else "")
        lines.append(f"evict {a.pod_key} on {a.node} (priority {a.priority}{extra})")
    return Plan(node, victims, lines)


def find_gang_victims(sched: Scheduler, group: str, members: Sequence[PodRequest], need: int,
                      budgets: Budgets = NO_BUDGETS, **kw: Any) -> Plan | None:
    """Victims that make room for ``need`` members of a gang at once; a dry run (changes nothing).

    Members (largest first) are placed one by one on the state as the plan
    leaves it: a member that fits takes its place; one that does not first has
    the fewest lower-priority victims for it (``find_victims``) evicted
    tentatively.  The victims together must respect the disruption budgets.
    None when some member cannot be made to fit.
    """
    st = sched.state
    victims: list[Assignment] = []
    with st.transaction() as tx:  # never committed: rolls back on the way out
        placed = 0
        for r in sorted(members, key=lambda r: (-r.total_gpu_milli, -r.cpu_milli, r.key)):
            if placed >= need:
                break
            dec = sched.decide(sched.new_cycle(r, take_held=True))
            if not dec.ok:
                plan = find_victims(sched, r, budgets=budgets, **kw)
                if plan is None or budgets.check(a.pod_key for a in victims + plan.victims):
                    return None
                for a in plan.victims:
                    tx.evict(a.pod_key)
                victims.extend(plan.victims)
                dec = sched.decide(sched.new_cycle(r, take_held=True))
                if not dec.ok:
                    return None
            tx.reserve(dec.assignment)  # type: ignore[arg-type]
            placed += 1
        if placed < need:
            return None
    lines = [f"pod group {group} ({need} member(s)) fits after evicting {len(victims)} lower-priority pod(s)"]
    lines += [f"evict {a.pod_key} on {a.node} (priority {a.priority})" for a in victims]
    return Plan(",".join(sorted({a.node for a in victims})), victims, lines) if victims else None


def explain_preemption(sched: Scheduler, r: PodRequest, **kw: Any) -> list[str]:
    """Dry-run lines for ``gpufleet explain``: the plan, or why there is none."""
    notes: list[str] = []
    plan = find_victims(sched, r, notes=notes, **kw)
    if plan is None:
        return [f"preemption (dry run): no set of lower-priority pods would make room for {r.key} "
                f"(priority {r.priority})"] + notes
    return ["preemption (dry run): " + plan.explanation[0]] + plan.explanation[1:]


def preempt(sched: Scheduler, r: PodRequest, pdb_allows: Callable[[Assignment], bool] | None = None,
            **kw: Any) -> Plan | None:
    """Plan, then release the victims in the snapshot (the adapter deletes the pods)."""
    plan = find_victims(sched, r, pdb_allows, **kw)
    if plan:
        for a in plan.victims:
            sched.forget(a.pod_key)
    return plan


__all__ = ["Plan", "explain_preemption", "find_gang_victims", "find_victims", "preempt"]
