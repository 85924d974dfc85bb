"""Decision-throughput guard: the engine's speed as a ratio to a reference computation timed beside it.

Why a ratio: the machines this runs on (2 shared cores, CI) change speed by +-40% from one minute to the next,
so an absolute decisions/s says nothing about the code.  Each round times the engine on a fixed piece of work
and, right beside it, a reference computation of the same mix (interpreted Python plus numpy on node-sized
arrays); the round's figure is engine time / reference time, and the result is the median over the rounds.
Both are timed in this process's CPU seconds, not wall seconds: other processes taking turns on the cores
do not count, and what load still does to a CPU second (caches, shared cores, clock) hits both sides alike.
A slower commit moves only the engine's side.

The work: the default profile (every constraint plugin enabled) places the first ``PODS`` pods of the bundled
Alibaba trace on its 1,213-node cluster, from an empty snapshot, every round the same decisions; then it tries
the same pods once more on the now fuller cluster with pod anti-affinity and topology spread terms added, so
the pod-to-pod plugins are timed too.  The first round warms the caches and imports and is not counted.

``bench/throughput_baseline.json`` holds the recorded figure; ``tests/bench/test_throughput_guard.py``
fails when the figure is more than ``TOLERANCE`` (25%) worse, i.e. decision throughput fell below 75% of the
baseline's.  Record a new baseline after a change that makes the engine faster (or, with a reason in the
commit, slower) on a quiet machine: the recording takes the median of several measurements.

    python bench/throughput_guard.py                 # measure, compare with the baseline
    python bench/throughput_guard.py record [--runs 5]   # measure several times, write the median as baseline
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

BASELINE = Path(__file__).resolve().with_name("throughput_baseline.json")
PODS = 240  # trace pods placed per round; a third of them again with pod-to-pod terms
ROUNDS = 5  # counted rounds (after one warm-up round)
CHUNK = 16  # decisions between two slices of the reference
REF_SLICE = 60  # reference iterations per slice (about as long as CHUNK decisions)
TOLERANCE = 0.25  # fail when throughput falls more than this below the baseline


def _workload() -> tuple[list, list, list]:
    from gpufleet.engine.constraints import LabelSelector, PodAffinityTerm, PodTerms, SpreadConstraint
    from gpufleet.simulator.traces import trace

    nodes = trace.load_nodes(trace.bundled(trace.DEFAULT_NODES))
    pods = [p.request() for p in trace.load_pods(trace.bundled(trace.DEFAULT_PODS)).pods[:PODS]]
    sel = LabelSelector(match_labels=(("app", "guard"),))
    host = "kubernetes.io/hostname"
    terms = PodTerms(
        labels={"app": "guard"},
        preferred_anti_affinity=(PodAffinityTerm(sel, host, namespaces=frozenset({"default"}), weight=100),),
        spread=(SpreadConstraint(max_skew=1, topology_key=host, when_unsatisfiable="ScheduleAnyway", selector=sel),),
    )
    constrained = [replace(r, name=r.name + "-c", labels=(("app", "guard"),), terms=terms) for r in pods[: PODS // 3]]
    return nodes, pods, constrained


_REF_A = np.arange(1213 * 8, dtype=np.int64).reshape(1213, 8) % 1001
_REF_B = np.arange(1213, dtype=np.int64) * 37 % 96_000


def _reference(iterations: int) -> None:
    """A fixed computation of the engine's mix: numpy on [nodes, GPUs] and [nodes] arrays, and plain Python."""
    a, b = _REF_A, _REF_B
    acc = 0
    for k in range(iterations):
        m = (a >= (k % 900)) & (b[:, None] >= 2000)
        cnt = m.sum(axis=1)
        idx = np.flatnonzero(cnt >= 2)
        s = np.where(cnt > 0, b * 1.5, 0.0)
        acc += int(idx.size) + int(s[idx[:50]].argmax() if idx.size else 0)
        d: dict[str, int] = {}
        for i in range(120):
            d[f"k{i % 17}"] = d.get(f"k{i % 17}", 0) + i
        acc += sum(d.values())
    if acc < 0:  # keeps the work from being optimised away
        print(acc)


def _round(nodes: list, pods: list, constrained: list, flip: bool) -> tuple[float, float]:
    """(engine s, reference s) of one round: after every CHUNK decisions a slice of the reference, so both
    sides see the same load (``flip``: each slice before its decisions instead)."""
    from gpufleet.engine.framework import Scheduler
    from gpufleet.engine.state import ClusterState
    from gpufleet.policies import build_profile

    sched = Scheduler(build_profile("default"), ClusterState(nodes), seed=42)
    reqs = pods + constrained
    eng = ref = 0.0
    clock = time.process_time  # CPU time: other processes' load takes turns on the cores, not this process's seconds
    for k in range(0, len(reqs), CHUNK):
        if flip:
            t0 = clock()
            _reference(REF_SLICE)
            ref += clock() - t0
        t0 = clock()
        for r in reqs[k:k + CHUNK]:
            sched.schedule(r)
        eng += clock() - t0
        if not flip:
            t0 = clock()
            _reference(REF_SLICE)
            ref += clock() - t0
    return eng, ref


def measure(rounds: int = ROUNDS) -> dict[str, Any]:
    """Engine seconds / reference seconds per round (median over rounds), and the rounds' raw figures."""
    nodes, pods, constrained = _workload()
    _round(nodes, pods, constrained, False)  # warm-up: imports, compiled selectors, the policy's first LP
    ratios, eng = [], []
    for i in range(rounds):
        e, r = _round(nodes, pods, constrained, bool(i % 2))
        eng.append(e)
        ratios.append(e / r)
    decisions = len(pods) + len(constrained)
    return {"ratio": statistics.median(ratios), "ratios": [round(x, 4) for x in ratios], "decisions": decisions,
            "engine_decisions_per_s": round(decisions / statistics.median(eng))}


def load_baseline(path: Path = BASELINE) -> dict[str, Any]:
    return json.loads(path.read_text())


def verdict(figure: float, baseline: float) -> tuple[bool, float]:
    """(passes, throughput as a share of the baseline's): the ratio is time, so throughput share = baseline / figure."""
    share = baseline / figure
    return share >= 1.0 - TOLERANCE, share


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["record"]:
        runs = int(argv[argv.index("--runs") + 1]) if "--runs" in argv else 5
        figs = []
        for _ in range(runs):
            m = measure()
            figs.append(m["ratio"])
            print(f"ratio {m['ratio']:.4f} (rounds {m['ratios']}), engine {m['engine_decisions_per_s']} decisions/s", flush=True)
        doc = {"ratio": round(statistics.median(figs), 4), "runs": [round(x, 4) for x in figs], "pods": PODS, "rounds": ROUNDS,
               "recorded": time.strftime("%Y-%m-%d"),
               "how": "python bench/throughput_guard.py record: median over runs of the median over rounds of engine CPU s / reference CPU s"}
        BASELINE.write_text(json.dumps(doc, indent=1) + "\n")
        print(f"wrote {BASELINE}: ratio {doc['ratio']}")
        return 0
    m = measure()
    base = load_baseline()["ratio"]
    ok, share = verdict(m["ratio"], base)
    print(f"ratio {m['ratio']:.4f} vs baseline {base:.4f}: throughput {share:.0%} of the baseline's "
          f"({'ok' if ok else 'REGRESSION'}); rounds {m['ratios']}; engine {m['engine_decisions_per_s']} decisions/s")
    return 0 if ok else 1


if __name__ == "__main__":
    from gpufleet.cli.main import run_script

    sys.exit(run_script("throughput_guard.py", main))
