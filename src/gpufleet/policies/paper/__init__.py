"""The six placement policies of the FGD paper, as engine plugins.

Weng et al., "Beware of Fragmentation: Scheduling GPU-Sharing Workloads with
Fragmentation Gradient Descent", USENIX ATC 2023.  The definitions follow the
paper's published simulator (github.com/hkust-adsl/kubernetes-scheduler-
simulator, ``pkg/simulator/plugin/*_score.go``, ``pkg/utils/frag.go``,
``pkg/type/resource.go``); one module per policy, and each class names the file it mirrors
(``workload`` holds FGD's target workload and fragment measure, which the simulator also reports).  Details that
change results are kept on purpose:

* scores are truncated to integers 0..100 as the Go plugins return them, so
  ties are frequent and are broken uniformly at random by the framework, as
  kube-scheduler's ``selectHost`` does;
* the paper's resource model is CPU + per-GPU milli-GPU; memory only filters.
  ``MAX_SPEC_CPU_MILLI``/``MAX_SPEC_GPU_MILLI`` are the simulator's
  normalisers (a 128-core, 8-GPU machine).

Everything is vectorised over candidate nodes (and, for FGD, over the GPUs of
each node) and declares a cache key, so the framework recomputes a node's
score only after that node changed.
"""

from __future__ import annotations

from ...engine.config import Registry
from .bestfit import BestFitScore
from .clustering import GpuClusteringScore
from .dotproduct import DotProductScore
from .fgd import FGDScore
from .packing import GpuPackingScore
from .randomfit import RandomGpu, RandomScore


def register(r: Registry) -> None:
    r.register("RandomScore", RandomScore)
    r.register("RandomGpu", RandomGpu)
    r.register("DotProductScore", DotProductScore)
    r.register("GpuClusteringScore", GpuClusteringScore)
    r.register("GpuPackingScore", GpuPackingScore)
    r.register("BestFitScore", BestFitScore)
    r.register("FGDScore", FGDScore)
