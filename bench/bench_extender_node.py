"""Extender vs secondary scheduler on one real node: binds/s and create-to-bound latency.

The real node of the real-node tier (``tests/e2e/node_up.sh`` on the recipe:
kube-apiserver, kube-controller-manager, containerd, kubelet) with
``gpufleet agent --nvml fake:h100-nvlink`` in its default configuration (8 GPUs x
``sharesPerGpu`` 10 kubelet devices), then, side by side on it
(``tests/e2e/extender_node.py``):

* extender mode: the stock kube-scheduler v1.28 configured from
  ``deploy/extender/kube-scheduler-config.yaml`` + ``gpufleet extender``;
* secondary mode: ``gpufleet scheduler`` (pods with its ``schedulerName``).

Each round creates a burst of pods from 8 threads at once and times each pod
from just before its create call to the first watch event that shows it bound;
modes alternate, round after round.  The node takes 20 pods (kubelet
``maxPods``), so bursts are 16 pods of 250 milli-GPU (``--shape share``) or
8 one-GPU pods (``--shape whole``).  Root only; hold the node's lock:

    flock /work/realnode.lock python bench/bench_extender_node.py --rounds 3

Needs ``GPUFLEET_E2E_BIN`` (+ ``KUBEBUILDER_ASSETS``) or ``GPUFLEET_E2E_RECIPE``, as the real-node tier does.
"""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[1]))
from tests.e2e import extender_node as h

NS = "ext-bench"


def main() -> int:
    from gpufleet.argtypes import int_range
    from gpufleet.cli.main import Parser

    ap = Parser(prog="bench_extender_node.py", description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int_range(1), default=3)
    ap.add_argument("--shape", choices=("share", "whole", "both"), default="both")
    ap.add_argument("--json", help="write the per-round figures here")
    args = ap.parse_args()
    why = h.missing()
    if why:
        print(f"bench_extender_node: {why}", file=sys.stderr)
        return 2
    workdir = Path(tempfile.mkdtemp(prefix="gpufleet-ext-bench-"))
    shapes = [("share", 16, 250), ("whole", h.GPUS, None)]
    shapes = [s for s in shapes if args.shape in (s[0], "both")]
    rows: list[dict] = []
    stack = None
    real = h.real_node()
    try:
        print(f"node up (tests/e2e/node_up.sh + gpufleet agent), logs in {workdir} and {real.logs}", flush=True)
        core, stack = h.bring_up(real, workdir, NS)
        for rnd in range(args.rounds):
            for shape, n, milli in shapes:
                for mode, sched in (("extender", "default-scheduler"), ("secondary", stack.secondary_name)):
                    b = h.burst(core, NS, sched, n, gpus=1, milli=milli, prefix=f"r{rnd}{shape[0]}{mode[0]}-")
                    over = max(h.gpu_use(core, NS).values() or [0]) > 1000
                    rows.append({"round": rnd + 1, "shape": shape, "mode": mode, "pods": n, "bound": len(b.bound),
                                 "binds_per_s": b.binds_per_s, "p50_ms": b.p(0.5) * 1000, "p99_ms": b.p(0.99) * 1000,
                                 "overcommitted": over})
                    print(f"round {rnd + 1} {shape:5} {mode:9}: {b.summary()}{'  OVERCOMMITTED' if over else ''}", flush=True)
                    h.clear_pods(core, NS)
    finally:
        if stack is not None:
            stack.stop_all()
        h.node_down(real, workdir / "run-e2e.log")
    print("\n| shape | mode | binds/s (median of rounds) | p50 create-to-bound ms | p99 create-to-bound ms |\n|---|---|---|---|---|")
    for shape, n, _ in shapes:
        for mode in ("extender", "secondary"):
            rs = [r for r in rows if r["shape"] == shape and r["mode"] == mode]
            if rs:
                print(f"| {n} x {shape} | {mode} | {statistics.median(r['binds_per_s'] for r in rs):.1f} | "
                      f"{statistics.median(r['p50_ms'] for r in rs):.0f} | {statistics.median(r['p99_ms'] for r in rs):.0f} |")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    bad = [r for r in rows if r["bound"] != r["pods"] or r["overcommitted"]]
    return 1 if bad else 0


if __name__ == "__main__":
    from gpufleet.cli.main import run_script

    sys.exit(run_script("bench_extender_node.py", main))
