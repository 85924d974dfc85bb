"""A seeded workload in the shape of the GFS trace, and spot capacity that comes and goes.

Why generated: Alibaba's ``cluster-trace-v2026-spot-gpu`` (the GFS paper, ASPLOS'26: 4,278 GPU nodes, 10,412 GPUs
of 6 models; 466,867 jobs over 184 days, high-priority (HP) and Spot, from 84 organizations) is public, but this
project does not ship trace data it cannot re-derive; what it ships is this generator and the figures it is shaped
to (``TARGETS``), so a replay with spot capacity runs anywhere, at any scale, from a seed.

What it reproduces, and from where (``TARGETS`` holds the numbers; ``describe`` measures a generated trace the
same way, and tests hold the two together):

* the fleet by GPU model (nodes and GPUs per model: the trace's ``node_info_df.csv``, as summarised in
  ``sultanul-ovi/GPU-Cluster-Spot-Resource-Dataset-Analysis`` ``outputs/tables/fleet_by_model.csv``); GPU-series-1's
  989 nodes hold 1,558 GPUs in a mix of 1-, 4- and 8-GPU nodes whose split is not published (879/50/60 here);
* jobs: 89.0% HP, 11.0% Spot; median / p90 duration HP 1,101 s / 58,770 s, Spot 2,096 s / 21,740 s; 91.6% of jobs
  have one worker, the rest a long tail up to hundreds (multi-worker jobs are gangs); the job share of each GPU
  model (A10 49.0%, A100 36.2%, GPU-series-2 6.5%, GPU-series-1 4.1%, H800 2.4%, A800 1.9%); arrivals: 105.65 jobs per
  hour with an hourly coefficient of variation of 0.92; organizations very unequal (Gini 0.91 by GPU-seconds) --
  all from the same analysis of ``job_info_df.csv`` (``job_type_summary.csv``, ``worker_count_distribution.csv``,
  ``demand_by_model.csv``, ``summary_extra.txt``);
* the GFS paper's own figures for its production cluster (abstract and section 2, arXiv 2509.11134): spot
  tasks evicted at up to 93.53% in peak periods, P90 / P99 runtimes of 6.4 hours and 19.8 days, a median wait of
  4.8 hours for 8-GPU gang tasks, and GFS's improvement over its baseline (33.0% fewer evictions, 44.1% less LP
  queueing).  These depend on GFS's scheduler and the cluster's load, not on the workload's shape alone: the
  replay reports its own figures beside them and says why they differ (docs/spot.md).

Per-worker GPU requests are not published per model beyond the medians (A10 1, A100 1, GPU-series-2 4,
GPU-series-1 1, H800 8, A800 2) and the share of jobs asking less than one GPU (10.4%, all put on A10 here);
``GPUS_PER_WORKER`` is an assumption with those medians.  Durations are log-normal per class, fitted to the
median and p90 (the trace's tail beyond p90 is heavier: its p99 is 65 days, cut here at ``max_duration_s``), the
same for every model: in the trace A10 and GPU-series-1 jobs run for days and the big-model jobs for hours (mean
run time per model 0.3 to 5 days), which per-model scaling would match only by moving the class medians, so each
model's share of the GPU-seconds is off (``describe`` reports it: H800 and A100 carry more of the load here, A10
and GPU-series-1 less).

Spot capacity: spot nodes beside the on-demand fleet (``spot_share`` x each kind's nodes); each is available for an exponentially distributed
time (mean ``up_h``), then gets an interruption notice, disappears ``notice_s`` later and comes back after an
exponentially distributed time (mean ``down_h``), as spot capacity that is reclaimed and later offered again.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Iterable, Sequence

import numpy as np

HP, SPOT = "HP", "Spot"

# model -> [(GPUs per node, nodes)]
FLEET: dict[str, list[tuple[int, int]]] = {
    "A100-SXM4-80GB": [(8, 432)],
    "A10": [(1, 2494)],
    "H800": [(8, 219)],
    "GPU-series-1": [(1, 879), (4, 50), (8, 60)],
    "GPU-series-2": [(8, 122)],
    "A800-SXM4-80GB": [(8, 22)],
}
CPU_PER_NODE = {"A100-SXM4-80GB": 128, "A10": 128, "H800": 192, "GPU-series-1": 192, "GPU-series-2": 192, "A800-SXM4-80GB": 128}
MODEL_JOB_SHARE = {"A10": 0.4897, "A100-SXM4-80GB": 0.3620, "GPU-series-2": 0.0651, "GPU-series-1": 0.0405, "H800": 0.0238,
                   "A800-SXM4-80GB": 0.0188}
# per-worker GPUs (milli-GPU) -> probability, per model (medians as published; the rest assumed)
GPUS_PER_WORKER: dict[str, dict[int, float]] = {
    "A10": {250: 0.105, 500: 0.107, 1000: 0.788},
    "A100-SXM4-80GB": {1000: 0.70, 2000: 0.10, 4000: 0.08, 8000: 0.12},
    "GPU-series-2": {1000: 0.2, 4000: 0.4, 8000: 0.4},
    "GPU-series-1": {1000: 0.85, 4000: 0.1, 8000: 0.05},
    "H800": {1000: 0.1, 4000: 0.1, 8000: 0.8},
    "A800-SXM4-80GB": {1000: 0.3, 2000: 0.4, 4000: 0.2, 8000: 0.1},
}
# workers per job: bucket (lo, hi) -> share of jobs (the trace's distribution, bucketed)
WORKERS: list[tuple[int, int, float]] = [
    (1, 1, 0.91588), (2, 2, 0.02815), (3, 3, 0.00985), (4, 4, 0.01128), (5, 7, 0.01079), (8, 8, 0.00532),
    (9, 16, 0.00895), (17, 32, 0.00640), (33, 64, 0.00209), (65, 128, 0.00107), (129, 332, 0.00022),
]
# mean GPUs per job per model (the trace's GPU demand / jobs, demand_by_model.csv): multi-worker jobs concentrate on
# the big models (H800: 65 GPUs per job); ``_worker_tables`` tilts WORKERS per model to these means
MEAN_GPUS_PER_JOB = {"A10": 0.920, "A100-SXM4-80GB": 4.903, "GPU-series-2": 14.56, "GPU-series-1": 2.160, "H800": 65.02,
                     "A800-SXM4-80GB": 6.133}
# each model's share of the trace's GPU-seconds (demand_by_model.csv): reported by ``describe``, not matched (see above)
MODEL_GPU_SECONDS_SHARE = {"A10": 0.3712, "A100-SXM4-80GB": 0.2866, "GPU-series-2": 0.0728, "GPU-series-1": 0.1320,
                           "H800": 0.1242, "A800-SXM4-80GB": 0.0133}
TARGETS = {
    "hp_job_share": 0.8904, "hp_gpu_seconds_share": 0.9757,
    "hp_median_duration_s": 1101.0, "hp_p90_duration_s": 58770.0,
    "spot_median_duration_s": 2095.5, "spot_p90_duration_s": 21740.0,
    "multi_worker_share": 0.0841, "jobs_per_hour": 105.65, "hourly_arrival_cv": 0.923, "org_gini_gpu_seconds": 0.9117,
    "gpus": 10412, "nodes": 4278, "organizations": 84,
}
PAPER = {"peak_spot_eviction_rate": 0.9353, "p90_runtime_h": 6.4, "p99_runtime_days": 19.8,
         "median_wait_8gpu_gang_h": 4.8, "gfs_eviction_reduction": 0.330, "gfs_lp_queueing_reduction": 0.441}


def _worker_tables() -> dict[str, list[float]]:
    """Per model, WORKERS' bucket shares tilted by w^alpha (w: a bucket's mean workers) so that workers x GPUs per
    worker has the model's mean GPUs per job; alpha by bisection (0 keeps the trace's overall distribution)."""
    base = np.array([w[2] for w in WORKERS])
    mean_w = np.array([(w[0] + w[1]) / 2.0 for w in WORKERS])
    out = {}
    for model, table in GPUS_PER_WORKER.items():
        per_worker = sum(k / 1000.0 * p for k, p in table.items()) / sum(table.values())
        target = MEAN_GPUS_PER_JOB[model] / per_worker

        def mean_workers(alpha: float) -> float:
            p = base * mean_w ** alpha
            return float((p * mean_w).sum() / p.sum())

        lo, hi = -5.0, 5.0
        for _ in range(60):
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if mean_workers(mid) < target else (lo, mid)
        p = base * mean_w ** lo
        out[model] = (p / p.sum()).tolist()
    return out


def _lognormal(median: float, p90: float) -> tuple[float, float]:
    mu = math.log(median)
    return mu, (math.log(p90) - mu) / 1.2815515655446004


DURATION = {HP: _lognormal(TARGETS["hp_median_duration_s"], TARGETS["hp_p90_duration_s"]),
            SPOT: _lognormal(TARGETS["spot_median_duration_s"], TARGETS["spot_p90_duration_s"])}


@dataclass(frozen=True)
class GfsNode:
    name: str
    model: str
    gpus: int
    cpus: int
    spot: bool = False


@dataclass(frozen=True)
class GfsJob:
    name: str
    org: str
    kind: str  # HP | Spot
    model: str
    workers: int
    gpu_milli_per_worker: int  # 1000 = one GPU; 250 = a quarter share; 4000 = four GPUs
    cpus_per_worker: int
    submit_s: float
    duration_s: float

    @property
    def gpus(self) -> float:
        return self.workers * self.gpu_milli_per_worker / 1000.0


@dataclass(frozen=True)
class SpotEvent:
    t_s: float
    node: str
    kind: str  # notice | gone | back


def fleet(scale: float = 1.0, spot_share: float = 0.0, spot_models: Iterable[str] | None = None) -> list[GfsNode]:
    """The trace's fleet times ``scale`` (at least one node per kind), all on-demand, plus spot nodes: ``spot_share``
    x as many of each kind again (of ``spot_models`` only, when given), as spot capacity bought beside it."""
    out = []
    only = set(spot_models) if spot_models is not None else None
    for model, kinds in FLEET.items():
        for gpus, n in kinds:
            k = max(1, int(round(n * scale)))
            for i in range(k):
                out.append(GfsNode(f"{model.lower()}-{gpus}g-{i}", model, gpus, CPU_PER_NODE[model]))
            if only is None or model in only:
                for i in range(int(round(k * spot_share))):
                    out.append(GfsNode(f"{model.lower()}-{gpus}g-spot-{i}", model, gpus, CPU_PER_NODE[model], True))
    return out


def _pick(rng: np.random.Generator, table: dict, n: int) -> np.ndarray:
    keys = list(table)
    p = np.array([table[k] for k in keys], dtype=float)
    return np.array(keys, dtype=object)[rng.choice(len(keys), size=n, p=p / p.sum())]


def jobs(seed: int = 0, hours: float = 24.0, scale: float = 1.0, max_duration_s: float = 30 * 86400.0,
         organizations: int = 84, org_zipf: float = 1.7, prefill_h: float = 0.0,
         fit_gpus: dict[str, int] | None = None) -> list[GfsJob]:
    """Jobs submitted over ``hours`` at ``scale`` x the trace's arrival rate (see the module docstring).

    ``prefill_h``: also jobs submitted that long before the start that still run at it (negative ``submit_s``):
    a cluster that has been running, not an empty one.  ``fit_gpus`` (model -> GPUs of a scaled fleet): a job
    asking more GPUs of its model than that is cut to as many workers as fit (the trace's largest gangs do not
    fit a small fleet, and a job that can never run only measures the fleet's size)."""
    out = _jobs(seed, hours + prefill_h, scale, max_duration_s, organizations, org_zipf, fit_gpus)
    if prefill_h <= 0:
        return out
    shift = prefill_h * 3600.0
    return [j for j in (replace(j, submit_s=j.submit_s - shift) for j in out)
            if j.submit_s >= 0 or j.submit_s + j.duration_s > 0]


def _jobs(seed: int, hours: float, scale: float, max_duration_s: float, organizations: int, org_zipf: float,
          fit_gpus: dict[str, int] | None) -> list[GfsJob]:
    rng = np.random.default_rng(seed)
    cv = TARGETS["hourly_arrival_cv"]
    k = 1.0 / (cv * cv)
    rate = TARGETS["jobs_per_hour"] * scale
    times: list[float] = []
    for h in range(int(math.ceil(hours))):
        n = rng.poisson(rng.gamma(k, rate / k))  # bursty hours: the trace's hourly CV
        span = min(1.0, hours - h)
        times.extend(sorted((h + rng.uniform(0, span, n)) * 3600.0))
    n = len(times)
    kind = np.where(rng.random(n) < TARGETS["hp_job_share"], HP, SPOT)
    model = _pick(rng, MODEL_JOB_SHARE, n)
    tables = _worker_tables()
    b = [int(rng.choice(len(WORKERS), p=tables[str(m)])) for m in model]
    workers = np.array([int(rng.integers(WORKERS[i][0], WORKERS[i][1] + 1)) for i in b])
    ranks = np.arange(1, organizations + 1, dtype=float)
    org_p = ranks ** -org_zipf
    org = rng.choice(organizations, size=n, p=org_p / org_p.sum())
    out = []
    for i in range(n):
        mu, sigma = DURATION[str(kind[i])]
        d = float(min(max_duration_s, max(1.0, rng.lognormal(mu, sigma))))
        milli = int(_pick(rng, GPUS_PER_WORKER[str(model[i])], 1)[0])
        w = int(workers[i])
        if fit_gpus is not None and w * milli > fit_gpus.get(str(model[i]), 0) * 1000:
            w = max(1, fit_gpus.get(str(model[i]), 0) * 1000 // milli)
        cpus = max(1, int(round(milli / 1000.0 * CPU_PER_NODE[str(model[i])] / 8.0 * rng.uniform(0.5, 1.0))))
        out.append(GfsJob(f"j{i}", f"org-{int(org[i])}", str(kind[i]), str(model[i]), w, milli, cpus,
                          float(times[i]), d))
    return out


def spot_events(nodes: Iterable[GfsNode], hours: float, up_h: float = 8.0, down_h: float = 2.0, notice_s: float = 120.0,
                seed: int = 0) -> list[SpotEvent]:
    """Each spot node: up for Exp(``up_h``), a notice, gone ``notice_s`` later, back after Exp(``down_h``); repeated."""
    rng = np.random.default_rng(seed + 7919)
    out: list[SpotEvent] = []
    end = hours * 3600.0
    for nd in nodes:
        if not nd.spot:
            continue
        t = rng.exponential(up_h * 3600.0)
        while t < end:
            out.append(SpotEvent(t, nd.name, "notice"))
            gone = t + notice_s
            if gone >= end:
                break
            out.append(SpotEvent(gone, nd.name, "gone"))
            back = gone + rng.exponential(down_h * 3600.0)
            if back >= end:
                break
            out.append(SpotEvent(back, nd.name, "back"))
            t = back + rng.exponential(up_h * 3600.0)
    return sorted(out, key=lambda e: (e.t_s, e.node, e.kind))


def gini(values: Sequence[float]) -> float:
    v = np.sort(np.asarray(values, dtype=float))
    if v.size == 0 or v.sum() == 0:
        return 0.0
    n = v.size
    return float((2 * np.arange(1, n + 1) - n - 1).dot(v) / (n * v.sum()))


@dataclass
class Shape:
    """A workload measured the way TARGETS are."""

    values: dict[str, float] = field(default_factory=dict)

    def table(self) -> list[tuple[str, float, float]]:
        want = {**TARGETS, **{f"gpu_seconds_share:{m}": v for m, v in MODEL_GPU_SECONDS_SHARE.items()}}
        return [(k, v, want[k]) for k, v in self.values.items() if k in want]


def fleet_gpus(nodes: Iterable[GfsNode], spot: bool = False) -> dict[str, int]:
    """GPUs per model of the on-demand nodes (and the spot ones with ``spot``): what ``jobs(fit_gpus=...)`` takes."""
    out: dict[str, int] = {}
    for n in nodes:
        if spot or not n.spot:
            out[n.model] = out.get(n.model, 0) + n.gpus
    return out


def describe(js: Sequence[GfsJob], nodes: Sequence[GfsNode] = (), hours: float | None = None) -> Shape:
    js = [j for j in js if j.submit_s >= 0]  # jobs submitted in the window (not the prefill's)
    kinds = np.array([j.kind for j in js])
    dur = np.array([j.duration_s for j in js])
    gs = np.array([j.gpus * j.duration_s for j in js])
    hp = kinds == HP
    s = Shape()
    v = s.values
    v["hp_job_share"] = float(hp.mean())
    v["hp_gpu_seconds_share"] = float(gs[hp].sum() / gs.sum())
    for name, m in (("hp", hp), ("spot", ~hp)):
        v[f"{name}_median_duration_s"] = float(np.median(dur[m]))
        v[f"{name}_p90_duration_s"] = float(np.quantile(dur[m], 0.9))
    v["multi_worker_share"] = float(np.mean([j.workers > 1 for j in js]))
    for m in MODEL_GPU_SECONDS_SHARE:
        v[f"gpu_seconds_share:{m}"] = float(sum(g for j, g in zip(js, gs) if j.model == m) / gs.sum())
    span_h = hours or max(1.0, max(j.submit_s for j in js) / 3600.0)
    per_hour = np.bincount(np.array([int(j.submit_s // 3600) for j in js]), minlength=int(math.ceil(span_h)))
    v["jobs_per_hour"] = float(per_hour.mean())
    v["hourly_arrival_cv"] = float(per_hour.std() / per_hour.mean())
    by_org: dict[str, float] = {}
    for j, g in zip(js, gs):
        by_org[j.org] = by_org.get(j.org, 0.0) + g
    v["org_gini_gpu_seconds"] = gini(list(by_org.values()))
    v["organizations"] = float(len(by_org))
    if nodes:
        v["gpus"] = float(sum(n.gpus for n in nodes))
        v["nodes"] = float(len(nodes))
    return s
