"""Which shared GPUs still have room at the 100%-arrived point, since when, and could anything fill them?

``idle_breakdown.py`` says how much idle milli sits on partly used GPUs; this says which GPUs
they are.  For every GPU holding shares (not beside an 810-milli pod, whose 190 only the rare
<=190-milli pods fill) with at least ``--min-free`` milli free, it records when its first and last
share arrived and sorts the free milli into:

* ``fits``: some share pod of the trace fits it now, by GPU milli, CPU and memory of its node;
* ``cpu/mem``: a pod fits by GPU milli, but the node's CPU or memory is too short for every one;
* ``late``: its last share came after 90% of the arrivals (a pattern cut short by the end).

It answers whether the policy's remaining loss is an end effect or holes opened early that the
workload never completed (issue 14, seventh session's note).

    python bench/hole_ages.py --variant default --seeds 42-51 --policy default [--top 8]
"""

from __future__ import annotations

import sys
from collections import defaultdict
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parents[1]))

from bench.variants import _nodes, check_policy, check_variant, variant_pods

from gpufleet.engine.framework import Scheduler
from gpufleet.engine.model import GPU_MILLI
from gpufleet.engine.state import ClusterState
from gpufleet.policies import build_profile
from gpufleet.simulator.experiments.packing import prime_policy, workload_order


def holes(variant: str, seed: int, policy: str, min_free: int, tune: float = 1.3) -> list[dict]:
    """The GPUs holding shares with at least ``min_free`` milli free at the 100%-arrived point (810s aside)."""
    nodes = _nodes()
    pods = variant_pods(variant, seed, nodes)
    state = ClusterState(nodes)
    sched = Scheduler(build_profile(policy), state, seed=seed)
    reqs = [p.request() for p in pods]
    prime_policy(sched, reqs)
    shares = np.array([(r.gpu_milli, r.cpu_milli, r.memory_mib) for r in reqs if r.gpu_count == 1 and r.gpu_milli < GPU_MILLI])
    capacity = state.total_gpu_milli()
    order = workload_order(pods, capacity, tune, seed)
    arrived, k = 0, 0
    held: dict[tuple[str, int], list[tuple[int, int]]] = defaultdict(list)  # (node, gpu) -> [(arrival, milli)]
    for k, (tp, name) in enumerate(order):
        req = tp.request(name)
        if arrived + req.total_gpu_milli > capacity:  # the 100%-arrived point, as run_packing takes it
            break
        arrived += req.total_gpu_milli
        dec = sched.schedule(req)
        if dec.ok and dec.assignment is not None and req.gpu_count == 1 and req.gpu_milli < GPU_MILLI:
            held[(dec.assignment.node, dec.assignment.gpu_indices[0])].append((k, req.gpu_milli))
    n = max(k, 1)
    out = []
    for (node, gpu), got in held.items():
        free = GPU_MILLI - sum(m for _, m in got)
        if free < min_free or any(m == 810 for _, m in got):
            continue
        i = state.index[node]
        by_size = shares[:, 0] <= free
        fits = by_size & (shares[:, 1] <= state.cpu_free[i]) & (shares[:, 2] <= state.mem_free[i])
        out.append({"node": node, "gpu": gpu, "free": free, "pods": sorted(m for _, m in got),
                    "opened": got[0][0] / n, "last": got[-1][0] / n, "fits": bool(fits.any()),
                    "cpu_mem_short": bool(by_size.any() and not fits.any()),
                    "cpu_free": int(state.cpu_free[i]), "mem_free_mib": int(state.mem_free[i])})
    return out


def main() -> int:
    from gpufleet.argtypes import int_range
    from gpufleet.cli.main import Parser
    from gpufleet.cli.simulate import parse_seeds

    ap = Parser(prog="hole_ages.py", description=__doc__.splitlines()[0])
    ap.add_argument("--variant", default="default")
    ap.add_argument("--seeds", type=parse_seeds, default=parse_seeds("42-44"))
    ap.add_argument("--policy", default="default")
    ap.add_argument("--min-free", type=int_range(1, GPU_MILLI - 1), default=100, help="milli free for a GPU to count (default 100)")
    ap.add_argument("--top", type=int_range(0), default=0, help="also list the largest holes of each seed")
    a = ap.parse_args()
    try:
        check_variant(a.variant)
        check_policy(a.policy)
    except ValueError as exc:
        ap.error(str(exc))
    print(f"{a.variant}, policy {a.policy}: shared GPUs with >= {a.min_free} milli free at 100% arrived (810s aside), milli")
    print(f"{'seed':>5} {'GPUs':>5} {'free':>6} {'fits':>6} {'cpu/mem':>8} {'late':>6}  opened (median)")
    for seed in a.seeds:
        hs = holes(a.variant, seed, a.policy, a.min_free)
        tot = sum(h["free"] for h in hs)
        fits = sum(h["free"] for h in hs if h["fits"])
        short = sum(h["free"] for h in hs if h["cpu_mem_short"])
        late = sum(h["free"] for h in hs if h["last"] > 0.9)
        med = float(np.median([h["opened"] for h in hs])) if hs else float("nan")
        print(f"{seed:>5} {len(hs):>5} {tot:>6} {fits:>6} {short:>8} {late:>6}  {med:.2f}")
        for h in sorted(hs, key=lambda h: -h["free"])[: a.top]:
            print(f"        {h['free']:>4} free on {h['node']} GPU {h['gpu']} {'+'.join(map(str, h['pods']))}: opened at "
                  f"{h['opened']:.3f}, last share at {h['last']:.3f}; node has {h['cpu_free'] / 1000:.1f} cores, "
                  f"{h['mem_free_mib'] / 1024:.0f} GiB free")
    return 0


if __name__ == "__main__":
    from gpufleet.cli.main import run_script

    sys.exit(run_script("hole_ages.py", main))
