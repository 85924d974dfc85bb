"""The loop's counters: attempts by result, end-to-end latencies, binds, evictions by kind, events dropped
(exported by ``queue_metrics`` and the runner's /metrics)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Stats:
    attempts: dict[str, int] = field(default_factory=lambda: {"scheduled": 0, "unschedulable": 0, "error": 0, "invalid": 0})
    e2e_s: list[float] = field(default_factory=list)
    binds: int = 0
    double_book_refused: int = 0  # bound pods whose devices the snapshot already had taken
    events_dropped: int = 0
    preempted: int = 0  # pods deleted to make room for higher priority
    reclaimed: int = 0  # borrowed pods deleted to give a queue its quota back
    already_gone: int = 0  # victims whose eviction found them gone (404): not evictions of ours
    eviction_refused: int = 0  # evictions the API server refused (429): a PodDisruptionBudget said no
    held_room: int = 0  # pods placed in room the policy held for pods not yet here, rather than evict anyone
    plugin_holds: int = 0  # nodes held because kubelet refused a pod while their GPU device plugin was down (kube/plugin_down.py)
    recreated: int = 0  # bare pods re-created after such a refusal
    interrupted: int = 0  # pods moved off nodes with an interruption notice (or gone), kube/interruption.py
