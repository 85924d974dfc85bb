"""Behaviour identity across a refactor: every figure and every placement of the main experiments.

Why: a restructuring (issue 38: one scheduling round for the live loop and the replay, the default
policy as plugins, ...) must not move a single decision.  ``record`` runs a fixed set of scenarios
through the real command (``gpufleet simulate``, in this process, one worker) and stores, per
scenario, the ``--json`` output without its timings and a digest of every change the runs made to
the cluster snapshot (each reservation and release, in order; tentative ones that a transaction rolled
back are left out, so a dry run planned once more or once less does not count, a placement does).
``compare`` says which scenario differs and where.

    python bench/identity.py record /work/arch-baseline/identity.json            # on the old commit
    python bench/identity.py record /tmp/after.json && \\
        python bench/identity.py compare /work/arch-baseline/identity.json /tmp/after.json
    python bench/identity.py record /tmp/q.json --only packing-default,replay-gangs   # a subset

Scenarios: the packing experiment (every policy, seeds 42-44), the replay at two loads (default and
fgd), the replay with priorities (preemption) and with team queues (DRF order, reclaim), the replay of
pod groups (the gang round, gang preemption; the bundled trace's multi-GPU pods paired into gangs), and
the queues experiment, and the spot replay (a subclass of the replay); the main job (``gpufleet simulate``
with its offline bound: the MIP's result also depends on its time limit, which a heavily loaded machine can
hit); the engine benchmark's decisions (``bench_kube_loop.py --engine-only``'s clusters at 5,000 nodes, default,
fgd and bestfit: every decision's node, GPUs, score, feasible count and status).  About 15 minutes on one
quiet core.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import io
import json
import re
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

_REPO = Path(__file__).resolve().parents[1]
_PRIORITIES = "qos:LS=100,Guaranteed=100,Burstable=50,BE=0"
_ALL = "random,dotprod,clustering,packing,bestfit,fgd,default"

# name -> gpufleet simulate arguments (or a callable returning JSON-able results)
SCENARIOS: dict[str, list[str] | str] = {
    "packing-all": ["--policy", _ALL, "--seeds", "42-44", "--no-bound"],
    "replay-load": ["--experiment", "replay", "--policy", "default,fgd", "--load", "0.8,1.2", "--seeds", "42"],
    "replay-priorities": ["--experiment", "replay", "--policy", "default", "--load", "1.2", "--seeds", "42",
                          "--priority-column", _PRIORITIES],
    "replay-queues": ["--experiment", "replay", "--policy", "default", "--load", "1.0", "--seeds", "42",
                      "--queues", str(_REPO / "examples" / "queues-openb.yaml"), "--priority-column", _PRIORITIES],
    "replay-gangs": "gangs",
    "queues": ["--experiment", "queues", "--policy", "default,fgd", "--seeds", "42"],
    "spot": ["--experiment", "spot", "--policy", "default", "--seeds", "42"],
    "main": ["--seeds", "42"],  # the main job as the README runs it, offline bound included
    "engine": "engine",
}
# keys whose values are timings (differ from run to run)
_TIMING = {"wall_s", "wall_s_mean", "decision_ms_p50", "decision_ms_p99", "solve_s", "solve_s_max", "jobs", "generated",
           "provenance"}
_PATHS = {"pods", "nodes"}  # trace files: compared by name (two checkouts have two paths)
_SOLVE_TIME = re.compile(r", \d+ s\)")  # the bound's headline says how long the MIP took


class Recorder:
    """Digest of every committed change to any ``ClusterState`` while active (see the module docstring).

    A change made through a ``Transaction`` is logged with the transaction's tag and dropped again if the
    transaction rolls back (a dry run, a released gang hold); what a rollback itself does is not logged."""

    def __init__(self) -> None:
        self.log: list[tuple] = []
        self.counts: dict[int, int] = {}  # transaction tag -> entries logged under it
        self._quiet = 0
        self._tags = 0

    def add(self, tag: int, *entry: Any) -> None:
        self.log.append((tag, *entry))
        self.counts[tag] = self.counts.get(tag, 0) + 1

    @contextlib.contextmanager
    def active(self) -> Iterator[Recorder]:
        from gpufleet.engine import state as st

        cls, tx = st.ClusterState, st.Transaction
        orig = (cls.reserve, cls.unreserve, tx.reserve, tx.evict, tx.rollback)
        rec = self

        def reserve(self: Any, a: Any, *args: Any, **kw: Any) -> None:
            orig[0](self, a, *args, **kw)
            if not rec._quiet:
                rec.log.append((None, "+", a.pod_key, a.node, tuple(a.gpu_indices), a.gpu_milli, tuple(a.mig or ())))

        def unreserve(self: Any, pod_key: str, *args: Any, **kw: Any) -> Any:
            a = orig[1](self, pod_key, *args, **kw)
            if a is not None and not rec._quiet:
                rec.log.append((None, "-", pod_key))
            return a

        def _tag(t: Any) -> int:
            if not hasattr(t, "_identity_tag"):
                rec._tags += 1
                t._identity_tag = rec._tags
            return t._identity_tag

        def tx_reserve(self: Any, a: Any, *args: Any, **kw: Any) -> None:
            rec._quiet += 1
            try:
                orig[2](self, a, *args, **kw)
            finally:
                rec._quiet -= 1
            rec.add(_tag(self), "+", a.pod_key, a.node, tuple(a.gpu_indices), a.gpu_milli, tuple(a.mig or ()))

        def tx_evict(self: Any, pod_key: str, *args: Any, **kw: Any) -> Any:
            rec._quiet += 1
            try:
                a = orig[3](self, pod_key, *args, **kw)
            finally:
                rec._quiet -= 1
            if a is not None:
                rec.add(_tag(self), "-", pod_key)
            return a

        def rollback(self: Any) -> None:
            committed = self.committed
            rec._quiet += 1
            try:
                orig[4](self)
            finally:
                rec._quiet -= 1
            if not committed and hasattr(self, "_identity_tag"):
                t, log = self._identity_tag, rec.log
                while log and log[-1][0] == t:  # a dry run: its entries are the last ones
                    log.pop()
                    rec.counts[t] -= 1
                if rec.counts.pop(t, 0):  # a gang hold, rolled back after other changes
                    log[:] = [e for e in log if e[0] != t]

        cls.reserve, cls.unreserve = reserve, unreserve  # type: ignore[method-assign]
        tx.reserve, tx.evict, tx.rollback = tx_reserve, tx_evict, rollback  # type: ignore[method-assign]
        try:
            yield self
        finally:
            cls.reserve, cls.unreserve = orig[0], orig[1]  # type: ignore[method-assign]
            tx.reserve, tx.evict, tx.rollback = orig[2], orig[3], orig[4]  # type: ignore[method-assign]

    def digest(self) -> str:
        h = hashlib.sha256()
        for e in self.log:
            h.update(repr(e[1:]).encode())
        return h.hexdigest()


def _clean(x: Any) -> Any:
    """The output less what differs from run to run: timings, the commit and date, where the checkout is."""
    if isinstance(x, dict):
        return {k: Path(v).name if k in _PATHS and isinstance(v, str) else _clean(v) for k, v in x.items() if k not in _TIMING}
    if isinstance(x, list):
        return [_clean(v) for v in x]
    if isinstance(x, str):
        return _SOLVE_TIME.sub(", N s)", x)
    return x


def _clean_table(text: str) -> str:
    """The printed table less its timings: the "wall s" column and the MIP's solve time."""
    lines = text.splitlines()
    cut = next((ln.index("wall s") for ln in lines if "wall s" in ln and ln.startswith("policy")), None)
    if cut is not None:  # the header and every row whose last field, under "wall s", is a number
        lines = [ln[:cut].rstrip() if ln.startswith("policy") or ln[cut:].strip().replace(".", "").isdigit() else ln
                 for ln in lines]
    return _SOLVE_TIME.sub(", N s)", "\n".join(lines))


def _simulate(argv: list[str]) -> dict:
    from gpufleet.cli.main import main

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "out.json"
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(io.StringIO()):
            rc = main(["simulate", *argv, "--jobs", "1", "--no-progress", "--report", "", "--json", str(out)])
        if rc not in (0, None):
            raise RuntimeError(f"gpufleet simulate {' '.join(argv)}: exit {rc}")
        data = json.loads(out.read_text())
    data.pop("provenance", None)
    return {"json": _clean(data), "table": _clean_table(buf.getvalue())}


def _gangs() -> dict:
    """The replay with pod groups: at load 0.7 (two passes of the bundled trace), the multi-GPU pods
    paired into gangs (minMember 2), every third gang of priority 100 and the other pods of their qos's
    priority (as ``--priority-column``), so gangs wait, hold and preempt (22 preemptions)."""
    from dataclasses import replace

    from gpufleet.simulator.traces import trace as tracemod
    from gpufleet.simulator.experiments.replay import run_replay
    from gpufleet.simulator.traces.workload import workload_from_trace

    nodes = tracemod.load_nodes(str(tracemod.bundled(tracemod.DEFAULT_NODES)))
    pods = tracemod.load_pods(str(tracemod.bundled(tracemod.DEFAULT_PODS))).pods
    # scaled here, not by run_replay(load=): its passes of the trace would share the gangs' names
    wl, _ = workload_from_trace(pods, "openb_pod_list_default").at_load(0.7, sum(len(n.gpus) for n in nodes))
    qos = {p.name: p.qos for p in pods}
    prio = {"LS": 100, "Guaranteed": 100, "Burstable": 50, "BE": 0}
    reqs, n = [], 0
    for r in wl.requests:
        if r.gpu_count >= 2:
            g = n // 2
            r = replace(r, pod_group=f"gang-{g}", pod_group_min=2, priority=100 if g % 3 == 0 else 0)
            n += 1
        else:
            r = replace(r, priority=prio.get(qos.get(r.name.partition("~")[0], ""), 0))
        reqs.append(r)
    wl.requests = reqs
    run = run_replay(nodes, wl, "default", seed=42, trace_name="gangs")
    return {"json": _clean(run.to_json())}


def _engine() -> dict:
    """The engine benchmark's clusters (``bench_kube_loop.engine_bench``: uniform A100 nodes and the trace's node
    mix, 5,000 nodes, 4,000 pods), each policy from an empty snapshot: a digest of every decision."""
    from dataclasses import replace

    from gpufleet.engine.framework import Scheduler
    from gpufleet.engine.model import Gpu, Node, PodRequest
    from gpufleet.engine.state import ClusterState
    from gpufleet.policies import build_profile
    from gpufleet.simulator.experiments.packing import prime_policy
    from gpufleet.simulator.traces import trace as tracemod

    n_nodes = 5000
    tnodes = tracemod.load_nodes(tracemod.bundled(tracemod.DEFAULT_NODES))
    tpods = [p.request() for p in tracemod.load_pods(tracemod.bundled(tracemod.DEFAULT_PODS)).pods[:4000]]
    clusters = {
        "uniform": ([Node(f"n{i}", 128_000, 1_048_576, tuple(Gpu(j, f"g{i}-{j}", "A100", 81920) for j in range(8)),
                          max_pods=110) for i in range(n_nodes)],
                    [PodRequest(name=f"e{i}", cpu_milli=2000, memory_mib=8192, gpu_count=1, gpu_milli=[1000, 250, 500][i % 3])
                     for i in range(4000)]),
        "trace": ([replace(tnodes[i % len(tnodes)], name=f"t{i}") for i in range(n_nodes)], tpods),
    }
    out = {}
    for cname, (nodes, reqs) in clusters.items():
        for policy in ("default", "fgd", "bestfit"):
            s = Scheduler(build_profile(policy), ClusterState(nodes), seed=0)
            prime_policy(s, reqs)
            h = hashlib.sha256()
            for r in reqs:
                d = s.schedule(r)
                a = d.assignment
                h.update(repr((d.ok, d.score, d.feasible_nodes, a and (a.node, a.gpu_indices, a.gpu_milli, a.mig),
                               str(d.status))).encode())
            out[f"{cname}-{policy}"] = h.hexdigest()
    return {"json": out}


def record(path: str, only: set[str] | None) -> int:
    sys.path.insert(0, str(_REPO))
    results: dict[str, Any] = {}
    for name, spec in SCENARIOS.items():
        if only and name not in only:
            continue
        t0 = time.perf_counter()
        with Recorder().active() as rec:
            res = _gangs() if spec == "gangs" else _engine() if spec == "engine" else _simulate(list(spec))
        res["placements"] = {"changes": len(rec.log), "sha256": rec.digest()}
        results[name] = res
        print(f"{name}: {len(rec.log)} snapshot changes, digest {rec.digest()[:16]}, {time.perf_counter() - t0:.0f} s",
              file=sys.stderr)
    Path(path).write_text(json.dumps(results, indent=1, sort_keys=True))
    print(f"wrote {path}", file=sys.stderr)
    return 0


def _diff(a: Any, b: Any, where: str, out: list[str]) -> None:
    if len(out) >= 20:
        return
    if isinstance(a, dict) and isinstance(b, dict):
        for k in sorted(set(a) | set(b)):
            if k not in a or k not in b:
                out.append(f"{where}.{k}: only in {'after' if k not in a else 'before'}")
            else:
                _diff(a[k], b[k], f"{where}.{k}", out)
    elif isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        for i, (x, y) in enumerate(zip(a, b)):
            _diff(x, y, f"{where}[{i}]", out)
    elif a != b:
        out.append(f"{where}: {str(a)[:80]} != {str(b)[:80]}")


def compare(before: str, after: str) -> int:
    def load(path: str) -> dict:  # cleaned again: a recording made before a timing was known to differ
        return {name: {**res, "json": _clean(res.get("json")), "table": _clean_table(res.get("table", ""))}
                for name, res in json.loads(Path(path).read_text()).items()}

    a, b = load(before), load(after)
    bad = 0
    for name in sorted(set(a) & set(b)):
        out: list[str] = []
        _diff(a[name], b[name], name, out)
        print(f"{name}: {'identical' if not out else 'DIFFERS'} ({a[name]['placements']['changes']} snapshot changes)")
        for line in out:
            print("  " + line)
        bad += bool(out)
    missing = sorted(set(a) ^ set(b))
    if missing:
        print(f"only in one file: {', '.join(missing)}")
    return 1 if bad else 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("record")
    r.add_argument("out")
    r.add_argument("--only", default="", help="comma-separated scenario names (default: all)")
    c = sub.add_parser("compare")
    c.add_argument("before")
    c.add_argument("after")
    a = ap.parse_args(argv)
    if a.cmd == "record":
        only = {s for s in a.only.split(",") if s}
        unknown = only - set(SCENARIOS)
        if unknown:
            from gpufleet.engine.errors import UsageError

            raise UsageError(f"--only: unknown scenario(s) {', '.join(sorted(unknown))}; known: {', '.join(SCENARIOS)}")
        return record(a.out, only or None)
    return compare(a.before, a.after)


if __name__ == "__main__":
    from gpufleet.cli.main import run_script

    sys.exit(run_script("identity.py", main))
