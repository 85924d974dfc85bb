"""GPU clustering: keep tasks of one kind (shared, 1-GPU, 2-GPU, ...) on the same nodes."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ...engine.framework import MAX_NODE_SCORE, Cycle
from ...engine.model import GPU_MILLI
from ...engine.state import ClusterState
from ._common import FEW_NODES, MAX_SPEC_GPU_MILLI, PaperPlugin, left_rows
from .workload import node_view


def _affinity_tag(gpu_count: int, gpu_milli: int) -> str | None:
    if gpu_count == 0:
        return None
    if gpu_milli < GPU_MILLI:
        return "share"
    return f"{gpu_count}-gpu"


@dataclass
class GpuClusteringScore(PaperPlugin):
    """GPU clustering (``gpu_clustering_score.go``): keep tasks of one kind together.

    Nodes running only tasks of the pod's kind (shared, 1-GPU, 2-GPU, ...) score
    highest, then mixed nodes that include it, then empty nodes, then nodes of
    other kinds; within a band, fuller nodes first.
    """

    name: str = "GpuClusteringScore"

    def cache_key(self, cycle: Cycle):
        """The score reads the pod's kind only (shared, 1-GPU, 2-GPU, ...; none for a CPU-only pod)."""
        r = cycle.request
        return _affinity_tag(r.gpu_count, r.gpu_milli) or "cpu-only"

    def score(self, cycle: Cycle, state: ClusterState, nodes: np.ndarray) -> np.ndarray:
        r = cycle.request
        tag = _affinity_tag(r.gpu_count, r.gpu_milli)
        if tag is None:
            return np.zeros(nodes.size)
        if nodes.size <= FEW_NODES:  # the same integers, node by node in Python
            base = [(MAX_NODE_SCORE // 4) * (MAX_SPEC_GPU_MILLI - sum(left)) // MAX_SPEC_GPU_MILLI
                    for left in left_rows(state, nodes)]
        else:
            _, left, _ = node_view(state, nodes)
            base = ((MAX_NODE_SCORE // 4) * (MAX_SPEC_GPU_MILLI - left.sum(axis=1)) // MAX_SPEC_GPU_MILLI).tolist()
        out = np.empty(nodes.size)
        for k, i in enumerate(nodes.tolist()):
            tags = set()
            for key in state.pods_on_node.get(state.nodes[i].name, ()):
                a = state.assignments[key]
                t = _affinity_tag(len(a.gpu_indices), a.gpu_milli)
                if t:
                    tags.add(t)
            if tag in tags:
                band = 3 if len(tags) == 1 else 2
            else:
                band = 1 if not tags else 0
            out[k] = base[k] + band * MAX_NODE_SCORE // 4
        return out
