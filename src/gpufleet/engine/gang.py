"""Gang scheduling: all-or-nothing placement of a pod group as one transaction.

Members are placed one by one on the live snapshot inside a
``ClusterState.transaction``; if at least ``min_member`` fit, the transaction
commits, else every tentative reservation rolls back and the gang waits.
Gangs are tried one at a time, so two gangs can never each hold half the
cluster and wait for each other (no deadlock); a gang that waited past its
``timeout_s`` is reported so the caller can give up on it.  Members prefer the
nodes the gang already uses (one NVLink/node group when possible).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .framework import Decision, Scheduler
from .model import PodRequest
from .status import Status


@dataclass
class GangResult:
    group: str
    placed: list[Decision] = field(default_factory=list)
    status: Status = field(default_factory=Status.success)

    @property
    def ok(self) -> bool:
        return self.status.ok


def place_gang(sched: Scheduler, group: str, members: list[PodRequest], min_member: int | None = None) -> GangResult:
    need = min_member or len(members)
    res = GangResult(group)
    st = sched.state
    used_nodes: list[int] = []
    with st.transaction() as tx:
        failures: list[str] = []
        for r in members:
            cycle = sched.new_cycle(r)
            if used_nodes:  # topology: first try the nodes the gang already occupies
                mask = np.zeros(len(st), dtype=bool)
                mask[used_nodes] = True
                cycle.only_nodes = mask
                dec = sched.decide(cycle)
                if not dec.ok:
                    cycle = sched.new_cycle(r)
                    dec = sched.decide(cycle)
            else:
                dec = sched.decide(cycle)
            if not dec.ok:
                failures.append(f"{r.key}: {dec.status.message}")
                continue
            tx.reserve(dec.assignment)  # type: ignore[arg-type]
            i = st.index[dec.assignment.node]  # type: ignore[union-attr]
            if i not in used_nodes:
                used_nodes.append(i)
            res.placed.append(dec)
        if len(res.placed) >= need:
            tx.commit()
            return res
    res.status = Status.unschedulable(
        f"pod group {group}: only {len(res.placed)} of the {need} required members fit"
        + (f"; first failure: {failures[0]}" if failures else ""), plugin="Gang")
    res.placed = []
    return res


def schedule_gangs(sched: Scheduler, gangs: dict[str, tuple[list[PodRequest], int]], waited_s: dict[str, float] | None = None,
                   timeout_s: float = 600.0) -> dict[str, GangResult]:
    """Try each gang in turn (never two holding tentative reservations at once)."""
    out = {}
    for g, (members, mn) in sorted(gangs.items(), key=lambda kv: (-max(m.priority for m in kv[1][0]), kv[0])):
        r = place_gang(sched, g, members, mn)
        if not r.ok and waited_s and waited_s.get(g, 0.0) > timeout_s:
            r.status = Status.unresolvable(f"pod group {g}: gave up after {timeout_s:.0f} s: {r.status.message}", plugin="Gang")
        out[g] = r
    return out
