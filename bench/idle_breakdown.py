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
  into pinned and unpinned pods.

    python bench/idle_breakdown.py --variant pinskew33 --seeds 42-44 --policies default,fgd
"""

from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from pathlib import Path

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
    out: dict = {"per_model": {}, "failed": dict(failed), "unallocated_pct": 100.0 * sum(failed.values()) / cap}
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
    return 0


if __name__ == "__main__":
    sys.exit(main())
