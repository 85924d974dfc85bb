"""The workload the default policy's plugins learn together: one ``WorkloadModel`` per profile.

Why one object: the descent score, the GPU-model pressure and both reserves judge a placement against the
same pods seen -- their shapes (FGD's target workload, ``paper.learning.OnlineWorkload``), the CPU and
memory they bring per GPU milli, the demand pinned to each GPU model, the single-GPU share sizes, the
demand asking one whole GPU -- and must see it at the same moment.  It is a shared component of the
profile (``engine.config.ProfileHandle``, ``pluginConfig: {WorkloadModel: {...}}``); each plugin asks
the profile's handle for it, and whichever plugin sees a pod first teaches it (once per pod).

What is learned is in the module docstring of ``policies.default`` and in docs/policy.md.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

from ...engine.args import PluginArgs, arg
from ...engine.model import GPU_MILLI, PodRequest
from ...engine.state import ClusterState
from ..paper.learning import FORGET_BELOW, OnlineWorkload, fade
from .patterns import pattern_units

NAME = "WorkloadModel"


@dataclass(frozen=True)
class WorkloadArgs(PluginArgs):
    """How the workload is learned (see ``paper.learning.OnlineWorkload``)."""

    learn_online: bool = arg(True)  # False: only ``prime`` (the whole trace, the paper's setting) sets it
    refresh_every: int = arg(64, 1)
    refresh_growth: float = arg(1.0)  # re-learn at 64, 128, ... 512 pods, then each doubling (at most refresh_max_pods apart)
    refresh_max_pods: int = arg(8192)  # 0: no limit
    memory_pods: int = arg(16384)  # older pods fade so the pods seen weigh this many (0: never forget)
    min_change: float = arg(0.0, 0.0, 2.0)  # keep the target unless shape frequencies moved more than this (L1)
    threshold: float = arg(0.85, 0.0, 1.0)  # popular shapes covering this share of tasks (FGD: 0.9; 0.85 on the tuning split)
    include_cpu_pods: bool = arg(False)  # CPU-only pods do not define what a GPU fragment is


class WorkloadModel(OnlineWorkload):
    """FGD's learned target workload, plus what the default's terms and reserves need of the pods seen."""

    def __init__(self, args: WorkloadArgs | None = None) -> None:
        a = args or WorkloadArgs()
        super().__init__(a.learn_online, a.refresh_every, a.refresh_growth, a.refresh_max_pods, a.memory_pods,
                         a.min_change, a.threshold, a.include_cpu_pods)
        self.args = a
        self.ratios: Counter = Counter()  # rounded CPU milli per GPU milli -> GPU milli
        self.pinned: dict = {}  # frozenset(models) -> GPU milli of pods pinned to them
        self.sums = [0.0, 0.0, 0.0]  # GPU milli, CPU milli, memory MiB of GPU tasks
        self.cpu_all = 0.0  # CPU milli of every pod seen, CPU-only ones too
        self.share_sizes: Counter = Counter()  # single-GPU share size (PATTERN_STEP units) -> pods
        self.whole1 = 0.0  # GPU milli of the pods seen that ask one whole GPU (what the whole-GPU reserve keeps GPUs for)
        self._tight: tuple | None = None

    @classmethod
    def from_config(cls, **cfg) -> WorkloadModel:
        return cls(WorkloadArgs.from_config(NAME, cfg))

    # --- what is learned -----------------------------------------------------------
    def _note(self, r: PodRequest) -> None:
        self.cpu_all += r.cpu_milli
        if r.gpu_count:
            total = r.total_gpu_milli  # a property: read once
            self.sums[0] += total
            self.sums[1] += r.cpu_milli
            self.sums[2] += r.memory_mib
            if total > 0:  # a MIG request has no milli-GPU size
                k = round(r.cpu_milli / total, 2)
                self.ratios[k] = self.ratios.get(k, 0) + total  # Counter's += without its __missing__ call
            if r.gpu_models_allow:
                self.pinned[r.gpu_models_allow] = self.pinned.get(r.gpu_models_allow, 0) + total
            if r.gpu_count == 1 and 0 < r.gpu_milli < GPU_MILLI and not r.mig_profile:
                self.share_sizes[pattern_units(r.gpu_milli)] += 1
            if r.gpu_count == 1 and r.gpu_milli >= GPU_MILLI and not r.mig_profile:
                self.whole1 += total

    def observe(self, r: PodRequest) -> None:
        self._note(r)  # every pod, CPU-only ones too (their CPU counts towards how tight CPU is)
        super().observe(r)

    def _forget(self, keep: float) -> None:
        super()._forget(keep)
        # the same floor in every map's unit (pods, GPU milli): nothing a hundredth of a pod still weighs is dropped
        fade(self.ratios, keep, FORGET_BELOW)
        fade(self.pinned, keep, FORGET_BELOW)
        fade(self.share_sizes, keep, FORGET_BELOW)
        self.sums = [x * keep for x in self.sums]
        self.cpu_all *= keep
        self.whole1 *= keep

    def prime(self, requests: Iterable[PodRequest]) -> None:
        requests = list(requests)
        for r in requests:
            self._note(r)
        super().prime(requests)

    # --- what the plugins read ---------------------------------------------------------
    def learned(self) -> bool:
        """A target is known: given, or learned from at least ``refresh_every`` pods."""
        return self.workload is not None and (not self.learn_online or self._seen >= self.refresh_every)

    def cpu_tight(self, state: ClusterState) -> float:
        """CPU demand over CPU capacity when GPU demand fills the GPUs, at the mix seen.

        Computed once per workload refresh and cluster epoch, by whichever plugin asks first, and the same
        for every plugin after: the reserves and the descent decide on one figure."""
        key = (self.version, state.epoch)
        if self._tight is None or self._tight[0] != key:
            g = max(self.sums[0], 1.0)
            t = self.cpu_all / g * float(state.gpu_milli_cap.sum()) / max(float(state.cpu_cap.sum()), 1.0)
            self._tight = (key, t)
        return self._tight[1]

    def cpu_per_gpu_milli(self) -> float:
        """Mean CPU milli per GPU milli of the GPU pods seen (what both reserves feed a free GPU with); 0 before any."""
        return self.sums[1] / self.sums[0] if self.sums[0] > 0 else 0.0


def model_of(handle) -> WorkloadModel:
    """The profile's shared model (a fresh one for a plugin made on its own)."""
    return handle.shared(NAME) if handle is not None else WorkloadModel()


__all__ = ["NAME", "WorkloadArgs", "WorkloadModel", "model_of"]
