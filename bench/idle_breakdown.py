"""Where do idle GPUs sit at the 100%-arrived point, and why?  (issue 14's instrument)

Runs the packing experiment with each policy up to the moment the arrived GPU
demand equals the cluster's capacity, then breaks the idle GPU milli down per
GPU model:

* ``whole``: idle GPUs with nothing on them; ``sliver``: free milli on GPUs that
  are partly used;
* ``cpu-stranded``: idle milli on nodes where no GPU shape of the arrived workload that
  may use this model fits the node's CPU/memory although its GPUs would hold it;
* ``used-by-free``: GPU milli of this model taken by pods that could have gone elsewhere
  (no gpu_spec) vs by pods pinned to it;
* ``failed``: GPU demand of failed pods (which is what unallocated % is at this point), split
  into pinned and unpinned pods;
* ``saturation``: the arrived fraction at the first failure.  Nearly every pod that arrives after
  it fails too, so unallocated % is about 1 - that fraction: what counts is how full the cluster
  is when it first turns a pod away;
* ``holes``: the free milli on partly used GPUs by the pods on them (``810`` alone leaves 190 that
  nothing common fills);
* ``repack``: the GPUs the policy used for shares against an offline best-fit-decreasing packing of
  the very same shares (one dimension, GPU milli only), and the arc-flow LP's lower bound on the
  GPUs any packing of them needs.  The difference is all that any better share placement could
  win back at this point, for the same pods.

    python bench/idle_breakdown.py --variant pinskew33 --seeds 42-44 --policies default,fgd
"""

from __future__ import annotations

import argparse
import bisect
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))

from variants import _nodes, variant_pods

from gpufleet.engine.framework import Scheduler
from gpufleet.engine.state import ClusterState
from gpufleet.policies import build_profile
from gpufleet.simulator.packing import prime_policy, workload_order


def breakdown(variant: str, seed: int, policy: str, tune: float = 1.3) -> dict:
    nodes = _nodes()
    pods = variant_pods(variant, seed, nodes)
    state = ClusterState(nodes)
    sched = Scheduler(build_profile(policy), state, seed=seed)
    prime_policy(sched, [p.request() for p in pods])
    cap = state.total_gpu_milli()
    arrived = 0
    used_by = defaultdict(lambda: [0, 0])  # model -> [unpinned milli, pinned milli]
    failed = defaultdict(int)  # "pinned:<spec>" / "unpinned" -> milli
    shapes = []
    saturation = None
    for tp, name in workload_order(pods, cap, tune, seed):
        r = tp.request(name)
        if arrived + r.total_gpu_milli > cap:
            break
        arrived += r.total_gpu_milli
        if r.gpu_count:
            shapes.append(r)
        d = sched.schedule(r)
        if d.ok:
            i = state.index[d.assignment.node]
            if nodes[i].gpus:
                used_by[nodes[i].gpus[0].model][1 if r.gpu_models_allow else 0] += r.total_gpu_milli
        else:
            failed["pinned:" + "|".join(sorted(r.gpu_models_allow)) if r.gpu_models_allow else "unpinned"] += r.total_gpu_milli
            if saturation is None:
                saturation = arrived / cap
    out: dict = {"per_model": {}, "failed": dict(failed), "unallocated_pct": 100.0 * sum(failed.values()) / cap, "capacity": cap,
                 "saturation": saturation, **_holes_and_repack(state)}
    uniq = {(r.cpu_milli, r.memory_mib, r.gpu_count, r.gpu_milli, r.gpu_models_allow) for r in shapes}
    for i, n in enumerate(nodes):
        if not n.gpus:
            continue
        m = n.gpus[0].model
        row = out["per_model"].setdefault(m, defaultdict(float))
        free = state.gpu_free_milli[i, : len(n.gpus)].astype(int)
        row["gpus"] += len(n.gpus)
        idle = int(free.sum())
        row["idle"] += idle
        row["whole"] += int(free[free == 1000].sum())
        row["sliver"] += int(free[free < 1000].sum())
        if idle:
            gpu_ok = cpu_ok = False
            for c, mem, cnt, milli, allow in uniq:
                if allow and m not in allow:
                    continue
                if (free >= milli).sum() >= cnt:
                    gpu_ok = True
                    if state.cpu_free[i] >= c and state.mem_free[i] >= mem:
                        cpu_ok = True
                        break
            if gpu_ok and not cpu_ok:
                row["cpu_stranded"] += idle
            elif not gpu_ok:
                row["unfillable"] += idle
    for m, row in out["per_model"].items():
        row["used_unpinned"], row["used_pinned"] = used_by[m]
    return out


def _holes_and_repack(state: ClusterState) -> dict:
    """Free milli on GPUs holding shares, by what is on them; share GPUs used vs an offline best-fit-decreasing repack."""
    on_gpu: dict[tuple[str, int], list[int]] = defaultdict(list)
    for a in state.assignments.values():
        if 0 < a.gpu_milli < 1000 and len(a.gpu_indices) == 1 and not a.mig:
            on_gpu[(a.node, a.gpu_indices[0])].append(a.gpu_milli)
    holes: dict[tuple[int, ...], list[int]] = defaultdict(lambda: [0, 0])  # combination -> [GPUs, free milli]
    for v in on_gpu.values():
        h = holes[tuple(sorted(v, reverse=True))]
        h[0] += 1
        h[1] += 1000 - sum(v)
    items = [m for v in on_gpu.values() for m in v]
    return {"holes": dict(holes), "share_gpus": len(on_gpu), "repack_gpus": _best_fit_decreasing(items), "repack_lower": _bins_lower_bound(items)}


def _best_fit_decreasing(items: list[int], cap: int = 1000) -> int:
    """Bins best-fit decreasing opens for ``items`` (a real packing: never fewer than the optimum)."""
    free: list[int] = []  # free space of the open bins, kept sorted
    for m in sorted(items, reverse=True):
        i = bisect.bisect_left(free, m)
        f = (free.pop(i) if i < len(free) else cap) - m
        bisect.insort(free, f)
    return len(free)


def _bins_lower_bound(items: list[int], cap: int = 1000) -> int:
    """No packing of ``items`` into bins of ``cap`` uses fewer bins: the arc-flow LP (Valerio de Carvalho), rounded up.

    Positions 0..cap in steps of the sizes' common divisor; a bin is a path from 0 to cap made of
    item arcs (i -> i + size) and loss arcs (i -> i + 1 step).  Minimise the flow out of 0 such that
    every size has as many arcs as items.  Its LP bound is known to be within one bin of the optimum
    on practically every instance, so it is the honest yardstick for "how much better could these
    shares be packed".
    """
    import math
    from collections import Counter

    from scipy.optimize import linprog
    from scipy.sparse import csr_matrix

    if not items:
        return 0
    step = math.gcd(cap, *items)
    n = cap // step
    count = Counter(x // step for x in items)
    sizes = sorted(count)
    arcs = [(i, i + w, w) for w in sizes for i in range(0, n - w + 1)] + [(i, i + 1, 0) for i in range(n)]
    rows, cols, vals = [], [], []
    for j, (u, v, _) in enumerate(arcs):  # flow conservation at 1..n-1: in - out = 0
        if 0 < u < n:
            rows.append(u - 1), cols.append(j), vals.append(-1.0)
        if 0 < v < n:
            rows.append(v - 1), cols.append(j), vals.append(1.0)
    a_eq = csr_matrix((vals, (rows, cols)), shape=(n - 1, len(arcs)))
    d_rows, d_cols = [], []
    for j, (_, _, w) in enumerate(arcs):
        if w:
            d_rows.append(sizes.index(w)), d_cols.append(j)
    a_ub = csr_matrix((np.full(len(d_cols), -1.0), (d_rows, d_cols)), shape=(len(sizes), len(arcs)))
    b_ub = -np.array([count[w] for w in sizes], dtype=float)
    c = np.array([1.0 if u == 0 else 0.0 for u, _, _ in arcs])
    res = linprog(c, A_ub=a_ub, b_ub=b_ub, A_eq=a_eq, b_eq=np.zeros(n - 1), bounds=(0, None), method="highs")
    if res.status != 0:  # pragma: no cover - the LP always has a solution (one bin per item)
        return -(-sum(items) // cap)
    return int(math.ceil(res.fun - 1e-6))


def main() -> int:
    from gpufleet.cli.simulate import parse_seeds

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--variant", default="pinskew33")
    ap.add_argument("--seeds", type=parse_seeds, default=parse_seeds("42-44"))
    ap.add_argument("--policies", default="default,fgd")
    a = ap.parse_args()
    for s in a.seeds:
        for pol in a.policies.split(","):
            b = breakdown(a.variant, s, pol)
            print(f"\n== {a.variant} seed {s} {pol}: unallocated {b['unallocated_pct']:.2f}% (GPUs)")
            print(f"{'model':<9} {'gpus':>5} {'idle':>7} {'whole':>7} {'sliver':>7} {'cpu-str':>7} {'unfill':>7} {'used-free':>9} {'used-pin':>9}")
            for m, r in sorted(b["per_model"].items(), key=lambda kv: -kv[1]["gpus"]):
                print(f"{m:<9} {r['gpus']:>5.0f} {r['idle'] / 1000:>7.1f} {r['whole'] / 1000:>7.1f} {r['sliver'] / 1000:>7.1f} "
                      f"{r['cpu_stranded'] / 1000:>7.1f} {r['unfillable'] / 1000:>7.1f} {r['used_unpinned'] / 1000:>9.1f} {r['used_pinned'] / 1000:>9.1f}")
            top = sorted(b["failed"].items(), key=lambda kv: -kv[1])[:6]
            print("failed GPU demand: " + ", ".join(f"{k} {v / 1000:.1f}" for k, v in top))
            sat = b["saturation"]
            print(f"saturation: first pod turned away at {sat:.3f} of capacity arrived" if sat is not None else "saturation: none")
            big = sorted(b["holes"].items(), key=lambda kv: -kv[1][1])[:6]
            print("holes (GPUs with shares; free GPU-equivalents): "
                  + ", ".join(f"{'+'.join(map(str, k))}: {n} GPUs, {f / 1000:.1f}" for k, (n, f) in big))
            print(f"repack: the policy used {b['share_gpus']} GPUs for shares; best-fit decreasing of the same shares needs "
                  f"{b['repack_gpus']} ({b['share_gpus'] - b['repack_gpus']} fewer, "
                  f"{100.0 * (b['share_gpus'] - b['repack_gpus']) * 1000 / b['capacity']:.2f} points of capacity); "
                  f"no packing of them needs fewer than {b['repack_lower']} (arc-flow LP bound: at most "
                  f"{100.0 * (b['share_gpus'] - b['repack_lower']) * 1000 / b['capacity']:.2f} points to win back)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
