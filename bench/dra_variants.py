"""The default against FGD and best fit on DRA-shaped requests: every GPU pod asks by ResourceClaim.

    python bench/dra_variants.py --variants default,pinned20,multigpu50 --seeds 42 --json dra.json

Each (variant, seed, policy) runs the packing experiment twice on the same pods: as device-plugin
requests and DRA-shaped (``simulator/traces/dra.py``: whole GPUs by count, shares by consumable capacity,
pinned models by a CEL selector on ``productName``; ``multigpu*`` with a ``matchAttribute`` on the
PCIe root).  The table gives unallocated GPU % at 100% arrived for both, and the default's margin.
Variants come from ``bench/variants.py`` (seeded generators over the bundled trace).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.variants import _nodes, variant_nodes, variant_pods  # noqa: E402
from gpufleet.simulator.experiments.packing import run_packing  # noqa: E402

POLICIES = ("default", "fgd", "bestfit")


def rel(x: float | None, y: float | None) -> str:
    return f"{(x - y) / y * 100:+.1f}%" if x is not None and y else "-"


def fmt(x: float | None) -> str:
    return f"{x:.2f}" if x is not None else "-"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--variants", default="default,pinned20,multigpu50")
    ap.add_argument("--seeds", default="42")
    ap.add_argument("--policies", default=",".join(POLICIES))
    ap.add_argument("--no-plain", action="store_true", help="DRA-shaped runs only")
    ap.add_argument("--plain-only", action="store_true", help="device-plugin runs only (the baseline)")
    ap.add_argument("--json", default=None)
    a = ap.parse_args(argv)
    try:
        seeds = [int(s) for s in a.seeds.split(",")]
    except ValueError:
        ap.error(f"--seeds: a comma-separated list of integers, not {a.seeds!r}")
    rows = []
    for variant in a.variants.split(","):
        mode = "constrained" if variant.startswith("multigpu") else "claims"
        nodes = variant_nodes(variant, _nodes())
        for seed in seeds:
            pods = variant_pods(variant, seed, nodes)
            for policy in a.policies.split(","):
                for dra in ((mode,) if a.no_plain else (None,) if a.plain_only else (None, mode)):
                    t0 = time.perf_counter()
                    r = run_packing(nodes, pods, policy, seed=seed, placing_bound=False, dra=dra)
                    rows.append({"variant": variant, "seed": seed, "policy": policy, "requests": dra or "device-plugin",
                                 "unallocated_gpu_pct": r.unallocated_gpu_pct, "pods_failed": r.pods_failed,
                                 "mig_pods": r.mig_pods, "mig_pods_failed": r.mig_pods_failed,
                                 "wall_s": round(time.perf_counter() - t0, 1)})
                    print(json.dumps(rows[-1]), flush=True)
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=1))
    print()
    print("| variant | requests | default | FGD | bestfit | default vs FGD | default vs bestfit |")
    print("|---|---|---|---|---|---|---|")
    keys = sorted({(r["variant"], r["requests"]) for r in rows}, key=lambda k: (a.variants.split(",").index(k[0]), k[1] != "device-plugin"))
    for v, req in keys:
        mean = {}
        for p in POLICIES:
            xs = [r["unallocated_gpu_pct"] for r in rows if r["variant"] == v and r["requests"] == req and r["policy"] == p]
            mean[p] = sum(xs) / len(xs) if xs else None
        d, f, b = mean["default"], mean["fgd"], mean["bestfit"]
        print(f"| {v} | {req} | {fmt(d)} | {fmt(f)} | {fmt(b)} | {rel(d, f)} | {rel(d, b)} |")
    return 0


if __name__ == "__main__":
    from gpufleet.cli.main import run_script

    sys.exit(run_script("dra_variants.py", main))
