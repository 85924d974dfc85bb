"""Priority preemption: the fewest lower-priority victims that make a pod fit.

For each node, candidate victims are pods of lower priority, taken lowest
priority and youngest first (whole pod groups together), evicted tentatively
inside a transaction until the pod fits; then victims that turn out not to be
needed are put back (reprieved), as kube-scheduler does.  A victim protected
by a PodDisruptionBudget with no disruptions left is skipped.  Nodes are compared like kube-scheduler does: the lowest highest-victim
priority, then the lowest sum of victim priorities, then the fewest victims.
``find_victims`` only plans (a dry run, for ``gpufleet explain``);
``preempt`` carries the plan out.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Mapping

from .framework import Scheduler
from .model import Assignment, PodRequest


@dataclass
class Plan:
    node: str
    victims: list[Assignment]
    explanation: list[str] = field(default_factory=list)


def find_victims(sched: Scheduler, r: PodRequest, pdb_allows: Callable[[Assignment], bool] | None = None,
                 age_rank: Mapping[str, int] | None = None) -> Plan | None:
    st = sched.state
    pdb_allows = pdb_allows or (lambda a: True)
    order = age_rank or {k: i for i, k in enumerate(st.assignments)}  # later = younger
    best: Plan | None = None
    for node in [n.name for n in st.nodes]:
        cands = [st.assignments[k] for k in st.pods_on_node.get(node, ()) if st.assignments[k].priority < r.priority]
        if not cands:
            continue
        # whole pod groups go together
        groups: dict[str, list[Assignment]] = {}
        for a in cands:
            groups.setdefault(a.pod_group or a.pod_key, []).append(a)
        units = sorted(groups.values(), key=lambda g: (min(a.priority for a in g), -max(order.get(a.pod_key, 0) for a in g)))
        units = [u for u in units if all(pdb_allows(a) for a in u)]
        with st.transaction() as tx:
            evicted: list[list[Assignment]] = []
            fits = False
            for u in units:
                for a in u:
                    tx.evict(a.pod_key)
                evicted.append(u)
                if _fits_on(sched, r, node):
                    fits = True
                    break
            if not fits:
                continue  # rolled back
            # reprieve: put back victims (highest priority first) that are not needed
            for u in sorted(evicted, key=lambda g: -max(a.priority for a in g)):
                for a in u:
                    st.reserve(a)
                if _fits_on(sched, r, node):
                    evicted.remove(u)
                    tx.removed = [x for x in tx.removed if x not in u]
                else:
                    for a in u:
                        st.unreserve(a.pod_key)
            victims = [a for u in evicted for a in u]
            plan = Plan(node, victims, [f"evict {a.pod_key} (priority {a.priority})" for a in victims])
            if best is None or _rank(victims) < _rank(best.victims):
                best = plan
            # the transaction rolls back: planning changes nothing
    if best:
        best.explanation.insert(0, f"{r.key} fits on {best.node} after evicting {len(best.victims)} lower-priority pod(s)")
    return best


def _rank(victims: list[Assignment]) -> tuple[int, int, int]:
    return (max(a.priority for a in victims), sum(a.priority for a in victims), len(victims))


def _fits_on(sched: Scheduler, r: PodRequest, node: str) -> bool:
    import numpy as np

    mask = np.zeros(len(sched.state), dtype=bool)
    mask[sched.state.index[node]] = True
    c = sched.new_cycle(r)
    c.only_nodes = mask
    return sched.decide(c).ok


def preempt(sched: Scheduler, r: PodRequest, pdb_allows: Callable[[Assignment], bool] | None = None) -> Plan | None:
    plan = find_victims(sched, r, pdb_allows)
    if plan:
        for a in plan.victims:
            sched.forget(a.pod_key)
    return plan
