"""Draining nodes that are going away: which pods move, in which order, and why.

Why: a spot node with an interruption notice (``engine.capacity``) is gone within minutes (two on AWS, thirty
seconds on GCP).  Waiting for it to vanish loses the pods' work and leaves them bound to a node that no longer
exists; draining at the notice lets them be placed again at once, while the capacity that is left goes to the
most important of them first.  The live scheduler and the replay carry out the same plan:

* every pod on a going node moves, highest priority first (then larger GPU holders first, then by name), so
  that, placed again in this order, the pods that matter most get the room that is left;
* a gang with a member on a going node moves whole (every member, on every node): a distributed job that lost a
  worker holds its other GPUs for nothing, and it is placed again all-or-nothing (``engine.gang``);
* each move carries the reason, in words ``gpufleet explain`` repeats: the node, and the taint or deletion that
  marked it.

Pure: the plan is computed from the ``ClusterState`` and the notices; the callers evict and re-queue.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

from .capacity import DEFAULT, SpotConfig
from .model import GPU_MILLI, Assignment
from .state import ClusterState


@dataclass(frozen=True)
class Move:
    pod_key: str
    node: str
    reason: str  # why it moves, for events and ``explain``
    priority: int
    group: str | None = None  # the pod group (namespace/name) it moves with


def notices(state: ClusterState, config: SpotConfig = DEFAULT, deleting: Mapping[str, bool] | None = None) -> dict[str, str]:
    """Node -> why it is going away (a taint in ``config.interruption_taints`` or its deletion)."""
    out = {}
    for n in state.nodes:
        why = config.interruption(n.taints, bool((deleting or {}).get(n.name)))
        if why is not None:
            out[n.name] = why
    return out


def _gpu_milli(a: Assignment) -> int:
    return len(a.gpu_indices) * (a.gpu_milli or GPU_MILLI) + len(a.mig) * GPU_MILLI // 7


def _group(a: Assignment) -> str | None:
    return f"{a.pod_key.split('/', 1)[0]}/{a.pod_group}" if a.pod_group else None


def drain_plan(state: ClusterState, going: Mapping[str, str]) -> list[Move]:
    """The pods to move off the nodes in ``going`` (node -> why), in the order to place them again."""
    if not going:
        return []
    moves: dict[str, Move] = {}
    hit_groups: dict[str, str] = {}
    for node, why in going.items():
        for key in sorted(state.pods_on_node.get(node, ())):
            a = state.assignments.get(key)
            if a is None:
                continue
            g = _group(a)
            moves[key] = Move(key, node, f"node {node} is going away ({why})", a.priority, g)
            if g is not None and g not in hit_groups:
                hit_groups[g] = f"pod group {g} lost {key} on node {node}, which is going away ({why})"
    if hit_groups:
        for key, a in state.assignments.items():
            g = _group(a)
            if g in hit_groups and key not in moves:
                moves[key] = Move(key, a.node, hit_groups[g], a.priority, g)

    def order(m: Move) -> tuple:
        a = state.assignments[m.pod_key]
        # a gang's members stay together, at the priority of its most important member
        prio = max((x.priority for x in moves.values() if x.group == m.group), default=m.priority) if m.group else m.priority
        return (-prio, m.group or "", -_gpu_milli(a), m.pod_key)

    return sorted(moves.values(), key=order)
