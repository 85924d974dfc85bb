"""Pending demand per team queue, as gauges: what an autoscaler (or a person) scales workers and capacity on.

``gpufleet_pending_pods`` says how many pods wait for the scheduler; a HorizontalPodAutoscaler that follows one
team's work needs that per queue, and in GPUs, not pods (one 8-GPU pod is more work than four shares).  The queue
of a pod is the one the scheduler itself uses (its annotation, else its namespace's queue, else a Queue selecting the
namespace: ``SchedulerCache.request``), and GPUs are counted as the queue's quota counts them: a whole GPU 1, a
500-milli share 0.5, a MIG instance its slices out of 7; a share that sets only ``gpufleet.io/gpu-memory`` asks no
GPU compute and counts 0, as against ``nvidia.com/gpu`` quota.

Every queue the cluster defines is exported, at 0 when nothing waits, so "nothing pending" is a value an
autoscaler scales down on, not a missing series it refuses to act on.  Pods without a queue are left out (their
count is in ``gpufleet_pending_pods``).  Pure: the runner feeds it the loop's pending pods.
"""

from __future__ import annotations

import logging
from typing import Callable, Iterable, Mapping

from ..engine.errors import GpufleetError
from ..engine.gpu_models import mig_fraction
from ..engine.model import PodRequest

log = logging.getLogger(__name__)


def request_gpus(r: PodRequest) -> float:
    """GPUs a request asks for, as queue quota counts them (shares fractional, MIG instances by slices)."""
    if r.gpu_count <= 0:
        return 0.0
    if r.mig_profile:
        return r.gpu_count * mig_fraction(r.mig_profile)
    return r.total_gpu_milli / 1000.0


def pending_by_queue(pending: Mapping[str, dict], request: Callable[[str, dict], PodRequest],
                     queues: Iterable[str] = ()) -> dict[str, tuple[int, float]]:
    """queue -> (pods waiting, GPUs they ask for); every name in ``queues`` is there, at (0, 0.0) when idle.

    A pod whose spec cannot be read is left out (the scheduler reports it on the pod).
    """
    out: dict[str, tuple[int, float]] = {q: (0, 0.0) for q in queues}
    for key, pod in pending.items():
        try:
            r = request(key, pod)
        except GpufleetError:
            continue
        if not r.queue:
            continue
        n, g = out.get(r.queue, (0, 0.0))
        out[r.queue] = (n + 1, round(g + request_gpus(r), 6))
    return out


class QueueGauges:
    """Sets the two labelled gauges from ``pending_by_queue``; a queue gone from both the cluster and the pending
    pods has its series removed, not left at its last value."""

    def __init__(self, pods_gauge, gpus_gauge) -> None:
        self.pods, self.gpus = pods_gauge, gpus_gauge
        self._shown: set[str] = set()

    def update(self, by_queue: Mapping[str, tuple[int, float]]) -> None:
        for q, (n, g) in by_queue.items():
            self.pods.labels(q).set(n)
            self.gpus.labels(q).set(g)
        for q in self._shown - set(by_queue):
            for gauge in (self.pods, self.gpus):
                try:
                    gauge.remove(q)
                except KeyError:
                    pass
        self._shown = set(by_queue)


__all__ = ["QueueGauges", "pending_by_queue", "request_gpus"]
