"""Where do idle GPUs sit at the 100%-arrived point, and why?  (issue 14's instrument)

Runs the packing experiment with each policy on a trace variant and prints, per GPU model, what
``gpufleet.simulator.bounds.idle`` records at the moment the arrived GPU demand equals the cluster's
capacity (``gpufleet simulate`` reports the same for the bundled trace, in its JSON and report.html):

* ``whole``: idle GPUs with nothing on them; ``sliver``: free milli on GPUs that are partly used;
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

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[1]))

from bench.variants import _nodes, check_policy, check_variant, variant_pods

from gpufleet.simulator.bounds.idle import IdleBreakdown, hole_name
from gpufleet.simulator.experiments.packing import run_packing


def breakdown(variant: str, seed: int, policy: str, tune: float = 1.3) -> IdleBreakdown:
    nodes = _nodes()
    run = run_packing(nodes, variant_pods(variant, seed, nodes), policy, seed=seed, tune=tune)
    assert run.idle is not None
    return run.idle


def main() -> int:
    from gpufleet.cli.main import Parser
    from gpufleet.cli.simulate import parse_seeds

    ap = Parser(prog="idle_breakdown.py", description=__doc__.splitlines()[0])
    ap.add_argument("--variant", default="pinskew33")
    ap.add_argument("--seeds", type=parse_seeds, default=parse_seeds("42-44"))
    ap.add_argument("--policies", default="default,fgd")
    a = ap.parse_args()
    try:
        check_variant(a.variant)
        for pol in a.policies.split(","):
            check_policy(pol)
    except ValueError as exc:
        ap.error(str(exc))
    for s in a.seeds:
        for pol in a.policies.split(","):
            b = breakdown(a.variant, s, pol)
            print(f"\n== {a.variant} seed {s} {pol}: unallocated {100.0 * sum(b.failed.values()) / b.capacity:.2f}% (GPUs)")
            print(f"{'model':<9} {'gpus':>5} {'idle':>7} {'whole':>7} {'sliver':>7} {'cpu-str':>7} {'unfill':>7} {'used-free':>9} {'used-pin':>9}")
            for m, r in sorted(b.per_model.items(), key=lambda kv: -kv[1]["gpus"]):
                print(f"{m:<9} {r['gpus']:>5.0f} {r['idle'] / 1000:>7.1f} {r['whole'] / 1000:>7.1f} {r['sliver'] / 1000:>7.1f} "
                      f"{r['cpu_stranded'] / 1000:>7.1f} {r['unfillable'] / 1000:>7.1f} {r['used_unpinned'] / 1000:>9.1f} {r['used_pinned'] / 1000:>9.1f}")
            top = sorted(b.failed.items(), key=lambda kv: -kv[1])[:6]
            print("failed GPU demand: " + ", ".join(f"{k} {v / 1000:.1f}" for k, v in top))
            sat = b.saturation
            print(f"saturation: first pod turned away at {sat:.3f} of capacity arrived" if sat is not None else "saturation: none")
            big = sorted(b.holes.items(), key=lambda kv: -kv[1][1])[:6]
            print("holes (GPUs with shares; free GPU-equivalents): "
                  + ", ".join(f"{hole_name(k)}: {n} GPUs, {f / 1000:.1f}" for k, (n, f) in big))
            print(f"repack: the policy used {b.share_gpus} GPUs for shares; best-fit decreasing of the same shares needs "
                  f"{b.repack_gpus} ({abs(b.share_gpus - b.repack_gpus)} {'fewer' if b.share_gpus >= b.repack_gpus else 'more'}, "
                  f"{100.0 * abs(b.share_gpus - b.repack_gpus) * 1000 / b.capacity:.2f} points of capacity); "
                  f"no packing of them needs fewer than {b.repack_lower} (arc-flow LP bound: at most "
                  f"{100.0 * (b.share_gpus - b.repack_lower) * 1000 / b.capacity:.2f} points to win back)")
    return 0


if __name__ == "__main__":
    from gpufleet.cli.main import run_script

    sys.exit(run_script("idle_breakdown.py", main))
