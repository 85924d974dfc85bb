"""A trace ready to replay, and its pace: arrival and run times, the busy window, offered load.

``--load X`` means "arrivals paced so that the time-averaged offered GPU demand is X of the cluster's
capacity" (see ``simulator/experiments/replay.py``'s docstring for the formula); this module computes the offered
load of a workload and finds the arrival scaling (and, past what one pass of the trace can offer, the
number of back-to-back passes) that gives it.  Separate from the event loop, which only consumes the
arrival and run times.
"""

from __future__ import annotations

import copy

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from ...engine.model import GPU_MILLI, PodRequest, request_copy
from .trace import TraceError, TracePod

DEFAULT_WARMUP = 0.1


@dataclass
class Workload:
    """A trace ready to replay: requests, arrival and run times (seconds), what production saw."""

    requests: list[PodRequest]
    arrival_s: np.ndarray  # NaN: already running when the trace starts
    run_s: np.ndarray
    production_delay_s: np.ndarray  # scheduled - creation (NaN when unknown)
    extras: list[Mapping[str, object]] = field(default_factory=list)  # per pod, for constraint plugins

    copies: int = 1
    gpu: np.ndarray = field(init=False, repr=False)  # GPUs per pod

    def __post_init__(self) -> None:
        self.gpu = np.array([r.total_gpu_milli / GPU_MILLI for r in self.requests], dtype=float)

    def window(self, warmup: float = DEFAULT_WARMUP) -> tuple[float, float]:
        """The busy window: from the arrival of the first ``warmup`` fraction of pods to the last arrival."""
        a = self.arrival_s[~np.isnan(self.arrival_s)]
        if a.size == 0:
            return 0.0, 0.0
        s = np.sort(a)
        return float(s[min(int(warmup * s.size), s.size - 1)]), float(s[-1])

    def offered_load(self, capacity_gpus: float, warmup: float = DEFAULT_WARMUP) -> float:
        """Time-averaged GPU demand over the busy window if every pod ran on arrival, as a fraction
        of ``capacity_gpus``: sum_i gpu_i * |[a_i, a_i + run_i] within the window| / (capacity * window)."""
        w0, w1 = self.window(warmup)
        m = ~np.isnan(self.arrival_s)
        if w1 <= w0 or capacity_gpus <= 0:
            return 0.0
        a = self.arrival_s[m]
        ov = np.clip(np.minimum(a + self.run_s[m], w1) - np.maximum(a, w0), 0.0, None)
        pre = (~m) & (self.run_s > 0)  # running at the start: from the first arrival on
        t0 = float(a.min())
        ov_pre = np.clip(np.minimum(t0 + self.run_s[pre], w1) - w0, 0.0, None)
        return float(((self.gpu[m] * ov).sum() + (self.gpu[pre] * ov_pre).sum()) / (capacity_gpus * (w1 - w0)))

    def scaled(self, k: float) -> Workload:
        """Gaps between arrivals multiplied by ``k``; run times unchanged."""
        m = ~np.isnan(self.arrival_s)
        a = self.arrival_s.copy()
        if m.any():
            t0 = a[m].min()
            a[m] = t0 + (a[m] - t0) * k
        out = copy.copy(self)  # same pods: not ``replace``, which works out every pod's GPUs again (80 times in ``at_load``)
        out.arrival_s = a
        return out

    def tiled(self, n: int) -> Workload:
        """The trace's arrivals repeated ``n`` times back to back (copy j's pods named ``<name>~j``),
        for loads one pass of the trace cannot offer; pods running at the start come once."""
        if n <= 1:
            return self
        idx, arr = self._passes(n)
        reqs = list(self.requests)
        run, prod = [self.run_s], [self.production_delay_s]
        extras = list(self.extras)
        for j in range(1, n):
            reqs += [_renamed(self.requests[i], f"{self.requests[i].name}~{j}") for i in idx]
            run.append(self.run_s[idx])
            prod.append(self.production_delay_s[idx])
            extras += [self.extras[i] for i in idx] if self.extras else []
        return Workload(reqs, arr, np.concatenate(run), np.concatenate(prod), extras, copies=n)

    def _passes(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        """``tiled(n)``'s arrival times, and the pods every pass after the first repeats (those that arrive)."""
        m = ~np.isnan(self.arrival_s)
        a = self.arrival_s[m]
        span = float(a.max() - a.min()) + float(np.diff(np.sort(a)).mean() if a.size > 1 else 1.0)
        return np.flatnonzero(m), np.concatenate([self.arrival_s, *(a + j * span for j in range(1, n))])

    def max_load(self, capacity_gpus: float, warmup: float = DEFAULT_WARMUP) -> float:
        """About the most one pass can offer: every pod arriving at once (arrival gaps x 1e-9)."""
        return self.scaled(1e-9).offered_load(capacity_gpus, warmup)

    def copies_for(self, load: float, capacity_gpus: float, warmup: float = DEFAULT_WARMUP, most: int = 32) -> int:
        """How many back-to-back passes of the trace it takes to offer ``load`` (with 20% to spare)."""
        for n in range(1, most + 1):
            if self._tiled_times(n).max_load(capacity_gpus, warmup) >= 1.2 * load:
                return n
        raise ValueError(f"load {load} is more than {most} passes of the trace can offer")

    def _tiled_times(self, n: int) -> Workload:
        """``tiled(n)`` for what the offered load reads (arrival and run times, GPUs), without making every pass's
        pods: its requests are the first pass's only."""
        if n <= 1:
            return self
        idx, arr = self._passes(n)
        out = copy.copy(self)
        out.arrival_s, out.copies = arr, n
        out.run_s = np.concatenate([self.run_s, *(self.run_s[idx] for _ in range(1, n))])
        out.gpu = np.concatenate([self.gpu, *(self.gpu[idx] for _ in range(1, n))])
        return out

    def at_load(self, load: float, capacity_gpus: float, warmup: float = DEFAULT_WARMUP,
                copies: int | None = None) -> tuple[Workload, float]:
        """Arrival gaps scaled (bisection: the offered load falls as gaps grow) so the offered load is
        ``load``, over ``copies`` passes of the trace (default: as few as it takes); (workload, factor)."""
        if load <= 0:
            raise ValueError("load must be > 0")
        base = self.tiled(copies if copies is not None else self.copies_for(load, capacity_gpus, warmup))
        if base.offered_load(capacity_gpus, warmup) <= 0 and base.max_load(capacity_gpus, warmup) <= 0:
            raise ValueError("the trace offers no GPU demand over time: --load cannot scale it")
        lo, hi = -30.0, 30.0  # log(k)
        offered = _Pacing(base, capacity_gpus, warmup)
        for _ in range(80):
            mid = (lo + hi) / 2
            if offered(float(np.exp(mid))) > load:
                lo = mid
            else:
                hi = mid
        k = float(np.exp((lo + hi) / 2))
        return base.scaled(k), k


class _Pacing:
    """``w.scaled(k).offered_load(capacity_gpus, warmup)`` for many ``k``, the same numbers without sorting the
    arrivals again for each: scaling maps every arrival through one increasing function (``t0 + (a - t0) * k``,
    rounded the same way for each), so the sorted scaled arrivals are the sorted arrivals scaled, and the busy
    window's ends are two of them."""

    def __init__(self, w: Workload, capacity_gpus: float, warmup: float) -> None:
        self.capacity_gpus = capacity_gpus
        m = ~np.isnan(w.arrival_s)
        self.a = w.arrival_s[m]
        self.t0 = self.a.min() if self.a.size else 0.0
        s = np.sort(self.a)
        self.first = s[min(int(warmup * s.size), s.size - 1)] if s.size else 0.0
        self.last = s[-1] if s.size else 0.0
        self.run, self.gpu = w.run_s[m], w.gpu[m]
        pre = (~m) & (w.run_s > 0)  # running at the start: from the first arrival on
        self.run_pre, self.gpu_pre = w.run_s[pre], w.gpu[pre]

    def __call__(self, k: float) -> float:
        if not self.a.size:
            return 0.0
        t0 = self.t0
        a = t0 + (self.a - t0) * k  # what ``scaled`` gives the arriving pods, in the same order
        w0, w1 = float(t0 + (self.first - t0) * k), float(t0 + (self.last - t0) * k)
        if w1 <= w0 or self.capacity_gpus <= 0:
            return 0.0
        ov = np.clip(np.minimum(a + self.run, w1) - np.maximum(a, w0), 0.0, None)
        t0s = float(a.min())
        ov_pre = np.clip(np.minimum(t0s + self.run_pre, w1) - w0, 0.0, None)
        return float(((self.gpu * ov).sum() + (self.gpu_pre * ov_pre).sum()) / (self.capacity_gpus * (w1 - w0)))


def _renamed(r: PodRequest, name: str) -> PodRequest:
    """``replace(r, name=name)`` without running the frozen dataclass's ``__init__`` again (every pod of every pass
    after the first; the fields are the same values)."""
    return request_copy(r, name=name)


def workload_from_trace(pods: Sequence[TracePod], trace_name: str = "trace",
                        namespace_of: Callable[[TracePod], str] | None = None,
                        priority_of: Callable[[TracePod], int] | None = None) -> Workload:
    """Arrival = creation_time; run = deletion - (scheduled or creation); a pod with no deletion
    time runs to the trace's last timestamp; no creation_time: already running at the start."""
    times = [t for p in pods for t in (p.creation_time, p.deletion_time, p.scheduled_time) if t is not None]
    t_end = max(times) if times else 0
    reqs, arr, run, prod, extras = [], [], [], [], []
    for i, p in enumerate(pods):
        if p.creation_time is None and p.scheduled_time is None and p.deletion_time is None and not hasattr(p, "extras"):
            raise TraceError(trace_name, i + 2, "creation_time",
                             f"pod {p.name} has no creation_time; the replay needs the 11-column trace")
        r = p.request()
        if namespace_of is not None or priority_of is not None:
            r = replace(r, namespace=namespace_of(p) if namespace_of else r.namespace,
                        priority=priority_of(p) if priority_of else r.priority)
        start = p.scheduled_time if p.scheduled_time is not None else p.creation_time
        end = p.deletion_time if p.deletion_time is not None else t_end
        if start is None:
            start = 0
        reqs.append(r)
        arr.append(np.nan if p.creation_time is None else float(p.creation_time))
        run.append(max(float(end) - float(start), 1.0))
        prod.append(np.nan if p.creation_time is None or p.scheduled_time is None else float(p.scheduled_time - p.creation_time))
        extras.append(getattr(p, "extras", {}))
    return Workload(reqs, np.array(arr, dtype=float), np.array(run, dtype=float), np.array(prod, dtype=float), extras)
