"""gpufleet's default placement policy as a package of plugins: stranding-aware fragmentation descent, GPU-model
pressure, share patterns, and two reserves (CPU for free GPUs, whole GPUs for whole-GPU pods).

The plugins, each with typed, validated arguments (``engine.args``) and per-cycle state under typed keys
(``engine.framework.StateKey``):

* ``DescentScore`` (score and GPU selector, ``descent``): how much a placement lowers FGD's expected
  fragment plus the GPU that CPU or memory cannot feed and the slivers no share size fills; a share is
  scored per GPU, with the share-pattern term (``patterns.SharePatterns``) and best fit among equals;
* ``ModelPressure`` (score, ``pressure``): GPUs of the models pinned pods need cost more to pods with a choice;
* ``CpuReserve`` and ``WholeGpuReserve`` (filters, ``reserves``): room kept for pods not yet here, where CPU
  or whole GPUs run out first;
* what they share: the ``WorkloadModel`` they learn together from the pods seen (``workload``) and the
  ``SharePatterns`` of the share-packing LP, components of the profile (``engine.config.ProfileHandle``)
  configured under their own names in ``pluginConfig``.

Everything a live scheduler could know: the target workload is learned online from the pods the scheduler
has seen, never from the trace.  Why each part, and what it measured, is in docs/policy.md; the profile is
``policies/profiles/default.yaml``.
"""

from __future__ import annotations

from dataclasses import fields

from ...engine.config import Registry
from . import patterns, workload
from .descent import DescentArgs, DescentScore
from .patterns import PATTERN_STEP, SharePatternArgs, SharePatterns, pattern_loads, pattern_units
from .pressure import ModelPressure, ModelPressureArgs
from .reserves import WHOLE_KEPT, CpuReserve, CpuReserveArgs, WholeGpuReserve, WholeGpuReserveArgs
from .workload import WorkloadArgs, WorkloadModel

PLUGINS = (DescentScore, ModelPressure, CpuReserve, WholeGpuReserve)
# every plugin's and component's arguments, by the name its pluginConfig goes under
ARGS = {"DescentScore": DescentArgs, "ModelPressure": ModelPressureArgs, "CpuReserve": CpuReserveArgs,
        "WholeGpuReserve": WholeGpuReserveArgs, workload.NAME: WorkloadArgs, patterns.NAME: SharePatternArgs}


def owners(arg: str) -> list[str]:
    """The plugins and components that take an argument of this name (``quant_milli``: the descent and the
    pressure, which counts in its steps; ``reserve_max_wait_s``: both reserves)."""
    return [name for name, cls in ARGS.items() if arg in {f.name for f in fields(cls)}]


def register(r: Registry) -> None:
    for p in PLUGINS:
        r.register(p.name, p.from_config)
    r.register_shared(workload.NAME, WorkloadModel.from_config)
    r.register_shared(patterns.NAME, SharePatterns.from_config)


__all__ = [
    "ARGS", "CpuReserve", "CpuReserveArgs", "DescentArgs", "DescentScore", "ModelPressure", "ModelPressureArgs", "PATTERN_STEP",
    "PLUGINS", "SharePatternArgs", "SharePatterns", "WHOLE_KEPT", "WholeGpuReserve", "WholeGpuReserveArgs", "WorkloadArgs",
    "WorkloadModel", "owners", "pattern_loads", "pattern_units", "register",
]
