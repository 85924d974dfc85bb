"""Dot-product: avoid nodes whose free (CPU, GPU) lines up with the request."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ...engine.framework import MAX_NODE_SCORE, Cycle
from ...engine.state import ClusterState
from ._common import FEW_NODES, MAX_SPEC_CPU_MILLI, MAX_SPEC_GPU_MILLI, PaperPlugin, left_rows
from .workload import node_view


@dataclass
class DotProductScore(PaperPlugin):
    """Dot-product (``dot_product_score.go``, dimension 'merge', norm 'max').

    Node free vector (CPU, total GPU milli) dotted with the request, both
    normalised by the largest machine; the smaller the product, the higher the
    score (it avoids nodes whose free resources align with the request).
    """

    name: str = "DotProductScore"

    def cache_key(self, cycle: Cycle):
        """The score reads the pod's CPU and total GPU milli only: pods alike in those share cached scores."""
        r = cycle.request
        return (r.cpu_milli, r.total_gpu_milli)

    def score(self, cycle: Cycle, state: ClusterState, nodes: np.ndarray) -> np.ndarray:
        r = cycle.request
        if nodes.size <= FEW_NODES:  # the same arithmetic on Python floats (IEEE doubles, in the same order)
            rc, rg = r.cpu_milli / MAX_SPEC_CPU_MILLI, r.total_gpu_milli / MAX_SPEC_GPU_MILLI
            return np.array([float(math.floor(MAX_NODE_SCORE * (1.0 - ((c / MAX_SPEC_CPU_MILLI) * rc
                                                                      + (sum(left) / MAX_SPEC_GPU_MILLI) * rg) / 2.0)))
                             if c >= r.cpu_milli else 0.0
                             for c, left in zip(state.cpu_free.take(nodes).tolist(), left_rows(state, nodes))])
        cpu, left, _ = node_view(state, nodes)
        dot = (cpu / MAX_SPEC_CPU_MILLI) * (r.cpu_milli / MAX_SPEC_CPU_MILLI) + (left.sum(axis=1) / MAX_SPEC_GPU_MILLI) * (
            r.total_gpu_milli / MAX_SPEC_GPU_MILLI
        )
        s = np.floor(MAX_NODE_SCORE * (1.0 - dot / 2.0))
        return np.where(cpu >= r.cpu_milli, s, 0.0)
