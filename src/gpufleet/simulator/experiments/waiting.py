"""The replay's scheduling queue: waiting pods grouped by what a decision depends on.

Pods of one (queue, shape, labels, priority) get the same answer from the scheduler against the same
cluster, so the replay keeps them in one list, in the shared queue order (``engine.schedqueue``), and a
round tries a group's head and moves on when it fails.  Per-group resource columns answer "could this
group fit on these nodes" without asking the scheduler (``schedqueue.room_need``/``room_on``, the live
queue's wake-up test, for all groups at once), which is what keeps a retry round cheap: only groups that
could fit on a node that gained room are tried (or, kept out by a cluster-wide count, every group:
``schedqueue.may_fit_after``).
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Sequence

import numpy as np

from ...engine.model import PodRequest
from ...engine.schedqueue import QueuedPod, room_need, room_on, sort_key
from ...engine.state import ClusterState


class WaitingPods:
    """Pending pods (by index into ``reqs``) per decision group, each group's list in queue order."""

    def __init__(self, reqs: Sequence[PodRequest]) -> None:
        self.reqs = reqs
        self.queued: dict[int, QueuedPod] = {}  # pending pods, in the order they came
        self.groups: dict[tuple, list[tuple]] = {}  # group -> [(sort key, index)], in order; only non-empty groups
        self.group_of = [(r.queue, r.shape(), r.labels, r.priority) for r in reqs]
        self.group_ids: dict[tuple, int] = {}
        for g in self.group_of:
            self.group_ids.setdefault(g, len(self.group_ids))
        self.group_list = list(self.group_ids)
        self.count = np.zeros(len(self.group_list), dtype=np.int64)  # [group id]: pods waiting in it
        first: dict[tuple, PodRequest] = {}
        for i, g in enumerate(self.group_of):
            first.setdefault(g, reqs[i])
        self.need = [room_need(first[g]) for g in self.group_list]  # [group id]
        need = np.array(self.need, dtype=np.int64).reshape(-1, 4)
        self.cpu_milli, self.memory_mib, self.gpu_count, self.gpu_milli = (need[:, k].copy() for k in range(4))

    def __len__(self) -> int:
        return len(self.queued)

    def __contains__(self, i: int) -> bool:
        return i in self.queued

    def add(self, i: int, first_seen_s: float) -> None:
        if i not in self.queued:
            r = self.reqs[i]
            q = self.queued[i] = QueuedPod(r.key, r.priority, first_seen_s, r)
            bisect.insort(self.groups.setdefault(self.group_of[i], []), (sort_key(q)[1:], i))
            self.count[self.group_ids[self.group_of[i]]] += 1

    def remove(self, i: int) -> None:
        q = self.queued.pop(i, None)
        if q is not None:
            g = self.groups[self.group_of[i]]
            g.remove((sort_key(q)[1:], i))
            self.count[self.group_ids[self.group_of[i]]] -= 1
            if not g:
                del self.groups[self.group_of[i]]

    def head(self, group: tuple) -> int | None:
        g = self.groups.get(group)
        return g[0][1] if g else None

    def first(self, group: tuple, n: int) -> list[QueuedPod]:
        return [self.queued[i] for _, i in self.groups[group][:n]]

    def with_room(self, state: ClusterState, nodes: Iterable[int]) -> np.ndarray:
        """[group id]: could the group fit on one of ``nodes`` (CPU, memory, enough GPUs with its milli free)."""
        ok = np.zeros(len(self.group_list), dtype=bool)
        for d in nodes:
            ok |= (self.cpu_milli <= state.cpu_free[d]) & (self.memory_mib <= state.mem_free[d]) & \
                ((state.gpu_free_milli[d][None, :] >= self.gpu_milli[:, None]).sum(axis=1) >= self.gpu_count)
        return ok

    def fits_on(self, gid: int, state: ClusterState, nodes: Sequence[int]) -> bool:
        """``with_room`` for one group on a few nodes, without numpy's per-call cost."""
        return room_on(state, self.need[gid], nodes)


def could_fit(state: ClusterState, r: PodRequest) -> bool:
    """A necessary condition, cheap: some node has the CPU, memory and free GPUs the pod asks for (``room_need``)."""
    c, m, gc, gm = room_need(r)
    ok = (state.cpu_free >= c) & (state.mem_free >= m)
    if gc:
        ok &= (state.gpu_free_milli >= gm).sum(axis=1) >= gc
    return bool(ok.any())
