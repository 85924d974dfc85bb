"""Idle-GPU reclaim: which pods hold GPUs they do not use, and what to do about it.

The decision core is pure: given each pod's GPU utilisation samples over the
window, its metadata and the namespace's policy, it returns actions with
reasons.  Policies per namespace: ``report`` (log only), ``warn`` (event +
``gpufleet.io/idle-warning`` annotation), ``evict`` (after ``grace_s`` since
the warning, through the Eviction API so PodDisruptionBudgets hold).

Protected, whatever the policy: pods younger than the window (not enough
data), pods opting out with ``gpufleet.io/reclaim-opt-out: "true"``, pods at
or above ``protect_priority``, and pods whose PDB allows no disruption now.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping, Sequence

from ..engine import annotations as ann


@dataclass(frozen=True)
class NamespacePolicy:
    action: str = "report"  # report | warn | evict
    idle_util_pct: float = 5.0  # "idle": every sample at or under this
    window_s: float = 3600.0
    grace_s: float = 1800.0  # warn -> evict
    protect_priority: int = 1_000_000


@dataclass(frozen=True)
class PodInfo:
    namespace: str
    name: str
    gpus: float  # GPUs held (fractional for shares)
    created_s: float
    priority: int = 0
    annotations: Mapping[str, str] = field(default_factory=dict)
    pdb_allows: bool = True


@dataclass(frozen=True)
class Action:
    pod: str
    action: str  # report | warn | evict | protect
    reason: str
    gpu_hours: float = 0.0  # GPU-hours returned by evicting (window-length estimate)


def decide(now_s: float, pods: Sequence[PodInfo], util: Mapping[str, Sequence[tuple[float, float]]],
           policies: Mapping[str, NamespacePolicy], default: NamespacePolicy = NamespacePolicy()) -> list[Action]:
    """``util``: pod key -> [(timestamp_s, gpu_util_pct)] over the recent past."""
    out = []
    for p in pods:
        key = f"{p.namespace}/{p.name}"
        pol = policies.get(p.namespace, default)
        if p.annotations.get(ann.RECLAIM_OPT_OUT, "").lower() == "true":
            out.append(Action(key, "protect", "opted out (gpufleet.io/reclaim-opt-out)"))
            continue
        if now_s - p.created_s < pol.window_s:
            out.append(Action(key, "protect", f"younger than the {pol.window_s / 60:.0f} min window"))
            continue
        if p.priority >= pol.protect_priority:
            out.append(Action(key, "protect", f"priority {p.priority} >= {pol.protect_priority}"))
            continue
        samples = [u for t, u in util.get(key, []) if now_s - t <= pol.window_s]
        if not samples:
            out.append(Action(key, "protect", "no utilisation data in the window"))
            continue
        covered = max(t for t, _ in util[key]) - min(t for t, _ in util[key] if now_s - t <= pol.window_s)
        if covered < 0.8 * pol.window_s:
            out.append(Action(key, "protect", f"utilisation data covers only {covered / 60:.0f} min of the window"))
            continue
        peak = max(samples)
        if peak > pol.idle_util_pct:
            continue  # busy: nothing to do
        why = f"GPU utilisation <= {pol.idle_util_pct:g}% for {pol.window_s / 60:.0f} min (peak {peak:.1f}%), holding {p.gpus:g} GPU"
        hours = p.gpus * pol.window_s / 3600.0
        if pol.action == "report":
            out.append(Action(key, "report", why, hours))
        elif pol.action == "warn" or ann.IDLE_WARNING not in p.annotations:
            out.append(Action(key, "warn", why, hours))
        else:
            try:
                warned = float(p.annotations[ann.IDLE_WARNING])
            except ValueError:
                warned = now_s
            if now_s - warned < pol.grace_s:
                out.append(Action(key, "warn", why + f"; eviction in {(pol.grace_s - (now_s - warned)) / 60:.0f} min", hours))
            elif not p.pdb_allows:
                out.append(Action(key, "protect", "PodDisruptionBudget allows no disruption now"))
            else:
                out.append(Action(key, "evict", why + f"; warned {(now_s - warned) / 60:.0f} min ago", hours))
    return out
