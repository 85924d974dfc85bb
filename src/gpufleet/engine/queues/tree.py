"""The queue tree: usage kept in step with the cluster state, admission within quota + borrowing, weighted
dominant-resource fair order, and reclaim plans.  Pure: it decides from the state and the queue specs."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Collection, Iterable, Mapping, Sequence

import numpy as np

from ..disruption import NO_BUDGETS, Budgets
from ..errors import ConfigError
from ..model import Assignment, PodRequest
from ..state import ClusterState
from ..status import Status
from .spec import PLUGIN, RESOURCES, Queue, Vector, add_vector, fmt_amount, request_vector, resource_label

if TYPE_CHECKING:  # pragma: no cover
    from ..framework import Scheduler


# --- the tree -------------------------------------------------------------------------------


@dataclass
class ReclaimPlan:
    """Borrowed pods to preempt so that ``pod`` (within its queue's quota) fits."""

    pod: str
    queue: str
    victims: list[Assignment]
    explanation: list[str] = field(default_factory=list)


class QueueTree:
    """All queues, their usage (kept in step with the cluster state) and the decisions on them."""

    def __init__(self, queues: Iterable[Queue], state: ClusterState) -> None:
        self.queues: dict[str, Queue] = {}
        for q in queues:
            if q.name in self.queues:
                raise ConfigError(f"Queue {q.name}: defined twice")
            self.queues[q.name] = q
        self.state = state
        self.children: dict[str, list[str]] = {n: [] for n in self.queues}
        for q in self.queues.values():
            if q.parent:
                if q.parent not in self.queues:
                    raise ConfigError(f"Queue {q.name}: field spec.parent: queue {q.parent!r} does not exist")
                self.children[q.parent].append(q.name)
        for q in self.queues.values():  # no cycles
            seen = {q.name}
            p = q.parent
            while p:
                if p in seen:
                    raise ConfigError(f"Queue {q.name}: field spec.parent: the parent chain loops back through {p!r}")
                seen.add(p)
                p = self.queues[p].parent
        self.roots = [n for n, q in self.queues.items() if not q.parent]
        self._paths = {n: self._path(n) for n in self.queues}
        self._nominal: dict[tuple[str, str], int | None] = {}
        self._use: dict[str, Vector] = {n: {} for n in self.queues}
        self._counted: dict[str, Assignment] = {}
        self._key: tuple | None = None
        self._ver: np.ndarray | None = None
        self._by_node: dict[str, set[str]] = {}
        self.order_seq: dict[str, int] = {}  # pod key -> when first counted (age: larger = younger)
        self._seq = 0

    def _path(self, name: str) -> list[str]:
        out = []
        n: str | None = name
        while n:
            out.append(n)
            n = self.queues[n].parent
        return out

    def path(self, name: str) -> list[str]:
        """The queue and its ancestors, leaf first."""
        return self._paths[name]

    def nominal(self, name: str, resource: str) -> int | None:
        """A queue's nominal quota for a resource; a parent without its own is the sum of its children's."""
        k = (name, resource)
        if k not in self._nominal:
            q = self.queues[name]
            if resource in q.quota:
                v: int | None = q.quota[resource]
            else:
                kids = [self.nominal(c, resource) for c in self.children[name]]
                kids_set = [x for x in kids if x is not None]
                v = sum(kids_set) if kids_set else None
            self._nominal[k] = v
        return self._nominal[k]

    def pool(self, resource: str) -> int | None:
        """What all root queues together guarantee: the quota there is to lend."""
        vals = [v for v in (self.nominal(r, resource) for r in self.roots) if v is not None]
        return sum(vals) if vals else None

    # --- usage ----------------------------------------------------------------------------
    def _sync(self) -> None:
        """Bring usage up to date: only nodes whose ``version`` moved since the last call are
        looked at (a pod that left or came changed its node's version), so a decision costs
        O(pods on the nodes that changed), not O(all pods)."""
        st = self.state
        key = (id(st.assignments), st.epoch, int(st.version.sum()), len(st.assignments))
        if key == self._key:
            return
        cur = st.assignments
        counted = self._counted
        if self._key is None or self._key[:2] != key[:2] or self._ver is None or self._ver.shape != st.version.shape:
            for u in self._use.values():  # node set changed (or first call): recount everything
                u.clear()
            counted.clear()
            self._by_node = {}
            changed = [n.name for n in st.nodes]
        else:
            changed = [st.nodes[i].name for i in np.flatnonzero(st.version != self._ver)]
        fresh: list[str] = []
        for node in changed:
            old = self._by_node.get(node, set())
            new = set(st.pods_on_node.get(node, ()))
            for k in old - new:
                a = counted.get(k)
                if a is not None and a.node == node:  # left (or moved: then counted again below)
                    del counted[k]
                    self._count(a, -1)
            for k in new:
                a = cur[k]
                prev = counted.get(k)
                if prev is a:
                    continue
                if prev is not None:
                    self._count(prev, -1)
                counted[k] = a
                self._count(a, +1)
                if k not in self.order_seq:
                    fresh.append(k)
            self._by_node[node] = new
        if len(fresh) > 1:  # age = order of placement, as the state's dict keeps it
            pos = {k: i for i, k in enumerate(cur)}
            fresh.sort(key=pos.__getitem__)
        for k in fresh:
            self._seq += 1
            self.order_seq[k] = self._seq
        if len(self.order_seq) > 2 * len(cur) + 1024:  # forget pods long gone
            self.order_seq = {k: v for k, v in self.order_seq.items() if k in cur}
        self._ver = st.version.copy()
        self._key = key

    def _count(self, a: Assignment, sign: int) -> None:
        if a.queue not in self.queues:
            return
        v = request_vector(a)
        for n in self._paths[a.queue]:
            add_vector(self._use[n], v, sign)

    def usage(self) -> dict[str, Vector]:
        """Usage per queue (a parent's includes its children's); a copy."""
        self._sync()
        return {n: dict(u) for n, u in self._use.items()}

    def used(self, name: str, resource: str) -> int:
        self._sync()
        return self._use[name].get(resource, 0)

    def age_rank(self, pod_key: str) -> int:
        """Larger = younger (seen later); pods never counted rank youngest."""
        self._sync()
        return self.order_seq.get(pod_key, 1 << 62)

    # --- admission ------------------------------------------------------------------------
    def check(self, queue: str | None, want: Mapping[str, int], use: Mapping[str, Mapping[str, int]] | None = None) -> Status:
        """Would adding ``want`` to ``queue`` keep every queue within quota + what it may borrow?"""
        if not queue:
            return Status.success()
        if queue not in self.queues:
            return Status.unresolvable(f"queue {queue!r} does not exist", plugin=PLUGIN)
        if use is None:
            self._sync()
            use = self._use
        path = self._paths[queue]
        for k, v in want.items():
            if v <= 0:
                continue
            for n in path:  # hard limits: quota + borrowing limit, at every level
                nom = self.nominal(n, k)
                if nom is None or k not in self.queues[n].borrowing_limit:
                    continue
                bl = self.queues[n].borrowing_limit[k]
                u = use[n].get(k, 0)
                if u + v > nom + bl:
                    lab = resource_label(k)
                    what = (f"{lab} quota {fmt_amount(k, nom)} exhausted ({fmt_amount(k, u)} used, pod needs "
                            f"{fmt_amount(k, v)}, borrowing limit 0)") if bl == 0 else \
                        (f"{lab} quota {fmt_amount(k, nom)} + borrowing limit {fmt_amount(k, bl)} exhausted "
                         f"({fmt_amount(k, u)} used, pod needs {fmt_amount(k, v)})")
                    return Status.wait(f"queue {n}: {what}", plugin=PLUGIN)
            # the pool: all root queues' quota together can never be over-used
            limited = [n for n in path if self.nominal(n, k) is not None]
            if not limited:
                continue
            pool = self.pool(k)
            pool_use = sum(use[r].get(k, 0) for r in self.roots if self.nominal(r, k) is not None)
            if pool is not None and pool_use + v > pool:
                n = limited[0]
                nom = self.nominal(n, k) or 0
                u = use[n].get(k, 0)
                lab = resource_label(k)
                tail = f"({fmt_amount(k, pool_use)} of {fmt_amount(k, pool)} used by all queues)"
                if u + v <= nom:
                    return Status.wait(
                        f"queue {n}: within its {lab} quota {fmt_amount(k, nom)} ({fmt_amount(k, u)} used, pod needs "
                        f"{fmt_amount(k, v)}) but that quota is lent to other queues {tail}; reclaim needed", plugin=PLUGIN)
                return Status.wait(
                    f"queue {n}: over its {lab} quota {fmt_amount(k, nom)} ({fmt_amount(k, u)} used, pod needs "
                    f"{fmt_amount(k, v)}) and no idle {lab} quota to borrow {tail}", plugin=PLUGIN)
        return Status.success()

    def admit(self, r: PodRequest) -> Status:
        """Admission of a pending pod by its queue's quota (and what it may borrow)."""
        return self.check(r.queue, request_vector(r))

    def within_nominal(self, queue: str, want: Mapping[str, int]) -> bool:
        """Would the queue stay within its own nominal quota (no borrowing) with ``want`` added?"""
        self._sync()
        u = self._use[queue]
        for k, v in want.items():
            nom = self.nominal(queue, k)
            if v > 0 and nom is not None and u.get(k, 0) + v > nom:
                return False
        return True

    # --- fair share ---------------------------------------------------------------------
    def _totals(self) -> Vector:
        out = {}
        for k in set(RESOURCES) | {k for q in self.queues.values() for k in q.quota}:
            p = self.pool(k)
            if p:
                out[k] = p
        return out

    def dominant_share(self, queue: str, use: Mapping[str, Mapping[str, int]] | None = None) -> float:
        """Weighted dominant resource share (DRF): the largest fraction of any pooled resource
        the queue uses, divided by its weight."""
        if use is None:
            use = self.usage()
        tot = self._totals()
        u = use[queue]
        s = max((u.get(k, 0) / t for k, t in tot.items()), default=0.0)
        return s / self.queues[queue].weight

    def order(self, pending: Sequence[PodRequest]) -> list[PodRequest]:
        """Pending pods in hierarchical weighted-DRF order.

        Repeatedly, from the roots down: among the sibling queues with pending pods
        in their subtree, take the one with the smallest weighted dominant share
        (its subtree's usage, counting the pods ordered so far, over the pool,
        divided by its weight), until a queue whose own pod comes next; within a
        queue, higher priority first, then first come.  A queue's own pods compete
        with its children as one more sibling, with the queue's weight.  Siblings
        are compared on the same pool, so this is DRF applied level by level
        (a team's share is split among its sub-teams, never taken from a sibling
        team).  Pods without a (known) queue keep their order and come first.
        """
        use = self.usage()
        tot = self._totals()
        out = [r for r in pending if r.queue not in self.queues]
        own: dict[str, list[tuple[int, int, PodRequest]]] = {}
        for i, r in enumerate(pending):
            if r.queue in self.queues:
                own.setdefault(r.queue, []).append((-r.priority, i, r))
        for lst in own.values():
            lst.sort(key=lambda t: (t[0], t[1]))
        pos = {q: 0 for q in own}
        waiting: dict[str, int] = {n: 0 for n in self.queues}  # pods pending in each subtree
        for q, lst in own.items():
            for n in self._paths[q]:
                waiting[n] += len(lst)

        memo: dict[tuple[str, bool], float] = {}  # share per (queue, own only); dropped along a placed pod's path
        memo_head: dict[str, tuple[int, int]] = {}

        def share(q: str, own_only: bool = False) -> float:
            m = memo.get((q, own_only))
            if m is None:
                u = use[q]
                amount = (lambda k: u.get(k, 0) - sum(use[c].get(k, 0) for c in self.children[q])) if own_only else \
                    (lambda k: u.get(k, 0))
                m = memo[(q, own_only)] = max((amount(k) / t for k, t in tot.items()), default=0.0) / self.queues[q].weight
            return m

        def head(q: str) -> tuple[int, int]:
            lst = own.get(q)
            return lst[pos[q]][:2] if lst and pos[q] < len(lst) else (0, 1 << 62)

        def subtree_head(q: str) -> tuple[int, int]:
            h = memo_head.get(q)
            if h is None:
                h = memo_head[q] = min([head(q)] + [subtree_head(c) for c in self.children[q] if waiting[c]])
            return h

        def key(c: tuple[str, str]) -> tuple:
            kind, q = c  # ("sub", q): q's whole subtree; ("own", q): q's own pods beside its children
            return (share(q, kind == "own"), head(q) if kind == "own" else subtree_head(q), q, kind)

        roots = [("sub", q) for q in sorted(self.roots)]
        total = sum(len(v) for v in own.values())
        for _ in range(total):
            cands = [c for c in roots if waiting[c[1]]]
            while True:
                kind, q = min(cands, key=key)
                kids = [("sub", c) for c in self.children[q] if waiting[c]]
                if kind == "own" or not kids:
                    node = q
                    break
                cands = kids + ([("own", q)] if pos.get(q, 0) < len(own.get(q, ())) else [])
            r = own[node][pos[node]][2]
            pos[node] += 1
            out.append(r)
            v = request_vector(r)
            for n in self._paths[node]:
                add_vector(use[n], v)
                waiting[n] -= 1
                memo.pop((n, False), None)
                memo.pop((n, True), None)
                memo_head.pop(n, None)
        return out

    # --- reclaim ------------------------------------------------------------------------
    def borrowed(self, exclude: Collection[str] = (), age_rank: Mapping[str, int] | None = None,
                 budgets: Budgets = NO_BUDGETS) -> list[Assignment]:
        """Running pods beyond their queue's nominal quota (reclaim candidates), lowest priority
        then youngest first; per queue only as many as it is over its quota.

        ``exclude``: pods already on their way out (an eviction in flight): never candidates,
        and what they hold no longer counts as borrowed.  ``age_rank``: pod key -> age (larger =
        younger), the same the preemption planner takes; default: the order pods were placed in.
        ``budgets``: a pod no PodDisruptionBudget lets go now is passed over for the next youngest."""
        self._sync()
        victim_key = self._victim_key(age_rank)
        overs: dict[str, Vector] = {}
        for name, u in self._use.items():
            over = {k: x - nom for k, x in u.items() if (nom := self.nominal(name, k)) is not None and x > nom}
            if over:
                overs[name] = over
        for k in exclude:
            a = self.state.assignments.get(k)
            if a is not None and a.queue in self.queues:
                for n in self._paths[a.queue]:
                    if n in overs:
                        add_vector(overs[n], request_vector(a), -1)
        overs = {n: o for n, o in overs.items() if any(x > 0 for x in o.values())}
        if not overs:
            return []
        by_queue: dict[str, list[Assignment]] = {}
        for a in self.state.assignments.values():
            if a.queue in self.queues and a.pod_key not in exclude:
                for n in self._paths[a.queue]:  # a parent over its quota: its children's pods
                    if n in overs:
                        by_queue.setdefault(n, []).append(a)
        out: dict[str, Assignment] = {}
        for name, pods in by_queue.items():
            over = overs[name]
            for a in sorted(pods, key=victim_key):
                if budgets and budgets.check((a.pod_key,)):
                    continue
                v = request_vector(a)
                if any(x > 0 and v.get(k, 0) > 0 for k, x in over.items()):
                    out[a.pod_key] = a
                    add_vector(over, v, -1)
                    if all(x <= 0 for x in over.values()):
                        break
        return sorted(out.values(), key=victim_key)

    def _age_of(self, age_rank: Mapping[str, int] | None) -> Callable[[str], int]:
        if age_rank is not None:
            return lambda k: age_rank.get(k, 1 << 126)
        return lambda k: self.order_seq.get(k, 1 << 62)

    def _victim_key(self, age_rank: Mapping[str, int] | None) -> Callable[[Assignment], tuple[int, int]]:
        """Lowest priority first, then youngest first."""
        age = self._age_of(age_rank)
        return lambda a: (a.priority, -age(a.pod_key))

    def plan_reclaim(self, sched: "Scheduler", r: PodRequest, exclude: Collection[str] = (),
                     victim_args: Callable[[], Mapping[str, Any]] | None = None) -> ReclaimPlan | None:
        """Borrowed pods of *other* queues to preempt so that ``r`` fits, when ``r`` is within its
        own queue's nominal quota; None when reclaim does not apply or would not help.

        A dry run: victims are evicted tentatively in one transaction (whole pod groups
        together) until the pod fits, victims that turn out not to be needed are put back,
        and everything is rolled back.  ``apply_reclaim`` carries a plan out.  Pods in
        ``exclude`` (evictions in flight) are never chosen again, nor pod groups with one.
        ``victim_args`` gives what the preemption planner is given too, read only when there are
        candidates: ``budgets`` (PodDisruptionBudgets: a unit that would break one is skipped)
        and ``age_rank`` (which pods are youngest).
        """
        if not r.queue or r.queue not in self.queues or not self.within_nominal(r.queue, request_vector(r)):
            return None
        if not self.borrowed(exclude):
            return None
        args = victim_args() if victim_args is not None else {}
        budgets: Budgets = args.get("budgets") or NO_BUDGETS
        age_rank: Mapping[str, int] | None = args.get("age_rank")
        age = self._age_of(age_rank)
        cands = [a for a in self.borrowed(exclude, age_rank, budgets) if a.queue != r.queue]
        if not cands:
            return None
        st = self.state
        units: list[list[Assignment]] = []
        seen: set[str] = set()
        for a in cands:
            if a.pod_key in seen:
                continue
            unit = [a]
            if a.pod_group:  # whole pod groups go together
                unit = [b for b in st.assignments.values() if b.pod_group == a.pod_group and b.queue == a.queue]
            seen.update(b.pod_key for b in unit)
            if exclude and any(b.pod_key in exclude for b in unit):
                continue
            units.append(unit)
        protected: list[str] = []
        with st.transaction() as tx:
            taken: list[list[Assignment]] = []
            for u in units:
                broken = budgets.check(a.pod_key for g in taken + [u] for a in g) if budgets else None
                if broken:
                    protected.append(f"{u[0].pod_key} is protected ({broken}), not reclaimed")
                    continue
                for a in u:
                    tx.evict(a.pod_key)
                taken.append(u)
                if sched.decide(sched.new_cycle(r, take_held=True)).ok:  # held room as well (see preemption)
                    break
            else:
                return None
            # reprieve: put back (highest priority, oldest first) what is not needed after all
            for u in sorted(taken, key=lambda u: (-max(a.priority for a in u), min(age(a.pod_key) for a in u))):
                if not all(st.check(a) is None for a in u):
                    continue
                for a in u:
                    st.reserve(a)
                if sched.decide(sched.new_cycle(r, take_held=True)).ok:  # held room as well (see preemption)
                    taken.remove(u)
                    tx.removed = [x for x in tx.removed if x not in u]
                else:
                    for a in u:
                        st.unreserve(a.pod_key)
            victims = [a for u in taken for a in u]
        lines = [f"{r.key} is within queue {r.queue}'s quota; reclaiming {len(victims)} borrowed pod(s)"]
        lines += [f"reclaim {a.pod_key} from queue {a.queue} on {a.node} (priority {a.priority})" for a in victims]
        return ReclaimPlan(r.key, r.queue, victims, lines + protected)


def apply_reclaim(sched: "Scheduler", plan: ReclaimPlan, on_evict: Callable[[Assignment], None] | None = None) -> None:
    """Release the victims in the engine's snapshot (the adapter deletes the pods)."""
    for a in plan.victims:
        sched.forget(a.pod_key)
        if on_evict:
            on_evict(a)
