"""``gpufleet simulate --experiment replay`` with the platform engineer's options: offered load
(``--load``), capacity what-ifs (``--what-if``, ``--search-shape``), team queues from a file
(``--queues``), and the 2025 DLRM trace (detected by its header).

Kept apart from ``cli/simulate.py`` so the packing experiment's command stays small; that module
calls ``add_arguments`` and hands replay runs here.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time
import zlib
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path
from typing import Any, cast

from ..engine.errors import ConfigError, GpufleetError

_CACHE: dict[tuple, Any] = {}


def parse_loads(text: str) -> list[float]:
    out = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        try:
            v = float(part)
        except ValueError:
            raise argparse.ArgumentTypeError(f"--load: {part!r} is not a number (use 0.6,0.8,1.0,1.2)") from None
        if not 0 < v <= 5:
            raise argparse.ArgumentTypeError(f"--load: {v} is out of range (0, 5]")
        out.append(v)
    if not out:
        raise argparse.ArgumentTypeError("--load: no value given")
    return out


def add_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("replay: load, capacity what-ifs, team queues")
    g.add_argument("--load", type=parse_loads, default=None,
                   help="replay: offered GPU load(s) as a fraction of the cluster's GPU capacity, e.g. 0.6,0.8,1.0,1.2 "
                        "(arrival gaps scaled, run times kept; see simulator/experiments/replay.py for how it is computed)")
    g.add_argument("--warmup", type=float, default=0.1,
                   help="replay: fraction of arrivals treated as warm-up and left out of the metrics (default 0.1)")
    g.add_argument("--what-if", action="append", default=[], metavar="CHANGE",
                   help="replay: change the cluster, e.g. +8xA100-80GB (8 nodes of that model), +2x8xH100 (two 8-GPU nodes), "
                        "-4xT4, -10%%, +5%%; repeatable; the unchanged cluster is run beside it")
    g.add_argument("--search-shape", metavar="MODEL",
                   help="replay: find the fewest nodes of this shape (e.g. A100-80GB or 8xA100-80GB) to add so that "
                        "p99 queueing delay <= --target-p99 at the (first) --load")
    g.add_argument("--target-p99", type=float, default=600.0, help="replay: target p99 queueing delay in seconds (default 600)")
    g.add_argument("--queues", metavar="FILE",
                   help="replay: team queues, a YAML/JSON file of gpufleet.io/v1alpha1 Queue objects (as for kubectl apply)")
    g.add_argument("--team-column", default=None,
                   help="replay with --queues: the trace column whose value is a pod's team (its namespace; a Queue takes it "
                        "by spec.namespaces or by having that name): qos (openb), app_name or role (2025 trace), "
                        "or hash:N for N synthetic teams team-a.. by crc32 of the pod name (default: qos, app_name for the 2025 trace)")
    g.add_argument("--priority-column", default=None,
                   help="replay: give pods priorities from a column, e.g. qos:LS=100,Guaranteed=100,Burstable=50,BE=0 "
                        "(a higher priority may preempt)")
    g.add_argument("--cluster-size", type=float, default=1.1,
                   help="2025 trace (no node list): nodes as a multiple of production's peak demand (default 1.1)")
    g.add_argument("--no-preemption", action="store_true", help="replay: no reclaim or preemption")


def wants_sweep(args: argparse.Namespace) -> bool:
    """Replay runs that go through this module (all of them since issue 16)."""
    return args.experiment == "replay"


# --- loading (cached per worker) ---------------------------------------------------------------------


def _load(nodes_path: str | None, pods_path: str, skip: bool, cluster_size: float):
    from ..simulator.traces import trace as tracemod
    from ..simulator.traces import trace2025

    key = (nodes_path, pods_path, skip, cluster_size)
    if key not in _CACHE:
        if trace2025.is_dlrm(pods_path):
            tr = trace2025.load_dlrm(pods_path, skip_bad_rows=skip)
            nodes = tracemod.load_nodes(nodes_path, skip_bad_rows=skip) if nodes_path else trace2025.synth_cluster(tr.pods, cluster_size)
            kind = "dlrm2025"
        else:
            tr = tracemod.load_pods(pods_path, skip_bad_rows=skip)
            nodes = tracemod.load_nodes(nodes_path or str(tracemod.bundled(tracemod.DEFAULT_NODES)), skip_bad_rows=skip)
            kind = "openb"
        _CACHE[key] = (nodes, tr, kind)
    return _CACHE[key]


def load_queue_file(path: str) -> list:
    """Queue objects from YAML (multi-document, or a List) or JSON; ConfigError names file and object."""
    import yaml

    from ..engine.queues import load_queues

    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise ConfigError(f"--queues {path}: {exc.strerror or exc}") from None
    try:
        docs = [d for d in yaml.safe_load_all(text) if d is not None]
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f":{mark.line + 1}" if mark is not None else ""
        raise ConfigError(f"{path}{where}: not valid YAML/JSON: {getattr(exc, 'problem', exc)}") from None
    objs: list = []
    for d in docs:
        if isinstance(d, dict) and d.get("kind") == "List":
            objs.extend(d.get("items") or [])
        elif isinstance(d, list):
            objs.extend(d)
        else:
            objs.append(d)
    qs, errors = load_queues(objs)
    if errors:
        raise ConfigError(f"{path}: {errors[0]}")
    if not qs:
        raise ConfigError(f"{path}: no Queue objects")
    from ..engine.queues import QueueTree
    from ..engine.state import ClusterState

    try:
        QueueTree(qs, ClusterState([]))
    except ConfigError as exc:
        raise ConfigError(f"{path}: {exc}") from None
    return qs


def team_function(column: str | None, kind: str):
    """pod -> team name (its namespace) from a column, or hash:N."""
    col = column or ("app_name" if kind == "dlrm2025" else "qos")
    if col.startswith("hash:"):
        try:
            n = int(col[5:])
        except ValueError:
            raise ConfigError(f"--team-column {col}: expected hash:N") from None
        if not 1 <= n <= 26:
            raise ConfigError(f"--team-column {col}: N must be 1..26")
        names = [f"team-{chr(97 + i)}" for i in range(n)]
        return lambda p: names[zlib.crc32(p.name.encode()) % n]
    known = {"qos", "name", "gpu_spec"} | ({"app_name", "role", "app"} if kind == "dlrm2025" else set())
    if col not in known:
        raise ConfigError(f"--team-column {col}: not a column of this trace (known: {', '.join(sorted(known))}, hash:N)")

    def team(p) -> str:
        if col == "app_name":
            v = p.app
        elif col == "gpu_spec":
            v = "|".join(p.gpu_spec) or "any"
        else:
            v = getattr(p, col)
        return str(v or "none").lower().replace("_", "-")
    return team


def priority_function(spec: str | None):
    if not spec:
        return None
    col, _, rest = spec.partition(":")
    table: dict[str, int] = {}
    for part in rest.split(","):
        k, eq, v = part.partition("=")
        try:
            table[k.strip()] = int(v)
        except ValueError:
            raise ConfigError(f"--priority-column {spec}: expected COLUMN:VALUE=PRIORITY,... (e.g. qos:LS=100,BE=0)") from None
        if not eq:
            raise ConfigError(f"--priority-column {spec}: expected COLUMN:VALUE=PRIORITY,...")
    if col not in ("qos", "role", "app_name"):
        raise ConfigError(f"--priority-column {spec}: column must be qos, role or app_name")
    return lambda p: table.get(str(getattr(p, "app" if col == "app_name" else col, "")), 0)


# --- one run (top level, so it pickles) -----------------------------------------------------------


def _workload(task: dict, tr, kind: str, queues: list | None):
    """The trace's workload with the task's teams and priorities: the same for every run of this trace, teams and
    priorities, so made once per process (read only by a run); the sweep's parent makes it before its workers fork."""
    from ..simulator.experiments.packing import memo
    from ..simulator.traces.workload import Workload, workload_from_trace

    ns = team_function(task.get("team_column"), kind) if queues else None
    pr = priority_function(task.get("priority_column"))
    return cast(Workload, memo((tr,), ("workload", task.get("queues"), task.get("team_column"), task.get("priority_column")),
                               lambda: workload_from_trace(tr.pods, tr.name, namespace_of=ns, priority_of=pr)))


def run_one(task: dict) -> dict:
    from ..simulator.experiments import whatif
    from ..simulator.experiments.replay import run_replay

    nodes, tr, kind = _load(task["nodes"], task["pods"], task["skip"], task["cluster_size"])
    ref = sum(len(n.gpus) for n in nodes)
    if task["what_if"]:
        nodes = whatif.apply(nodes, [whatif.parse(s) for s in task["what_if"]])
    if task.get("add"):
        nodes = whatif.apply(nodes, [whatif.parse(f"+{task['add']}x{task['search_shape']}")])
    queues = load_queue_file(task["queues"]) if task.get("queues") else None
    wl = _workload(task, tr, kind, queues)
    label = " ".join(task["what_if"]) + (f" +{task['add']}x{task['search_shape']}" if task.get("add") else "")
    r = run_replay(nodes, wl, task["policy"], seed=task["seed"], trace_name=tr.name, load=task["load"],
                   reference_gpus=ref, warmup=task["warmup"], queues=queues, preemption=not task["no_preemption"],
                   what_if=label.strip(), copies=task.get("copies"), speedup=task.get("speedup", 1.0))
    d = r.to_json()
    d["search_added"] = task.get("add")
    del r
    # a replay's state is held in reference cycles (its round's ports are the replay itself, and the scheduler's):
    # freed here, at once, not at some later full collection while this worker's next run builds its own (a sweep's
    # worker peaked about 20 MiB higher that way)
    gc.collect()
    return d


# a replay's CPU time relative to bestfit's, measured on the sweep of docs/replay.md (bundled trace, three passes,
# loads 0.6 to 1.2: default 6.3-7.4 CPU s a run, fgd 5.3-6.1, bestfit 3.1-3.3); a replay's cycles are about one per
# arrival at any load, so the load moves a run's time little.  Only the order runs go to the workers depends on it
_REPLAY_COST = {"default": 2.1, "fgd": 1.75}


def longest_first(tasks: list[dict]) -> list[int]:
    """The tasks' indices, the costliest run first: the costlier policy, then the higher load (then the table's
    order).  Handed out in this order to workers that each take the next when done, the last runs are the shortest,
    so that neither worker idles long at the end while the other finishes a long run."""
    from .simulate import _RUN_COST

    def cost(i: int) -> float:
        t = tasks[i]
        return _REPLAY_COST.get(t["policy"], _RUN_COST.get(t["policy"], 1.0)) * (1.0 + 0.1 * (t["load"] or 1.0))

    return sorted(range(len(tasks)), key=lambda i: -cost(i))


def _pool_map(tasks: list[dict], jobs: int, bar) -> list[dict]:
    out: list[dict] = []
    if jobs <= 1 or len(tasks) <= 1:
        for t in tasks:
            out.append(run_one(t))
            bar.update(1)
        return out
    first = longest_first(tasks)
    done: dict[int, dict] = {}
    with ProcessPoolExecutor(max_workers=jobs) as ex:
        futs = {ex.submit(run_one, tasks[i]): i for i in first}
        try:
            for f in as_completed(futs):
                done[futs[f]] = f.result()
                bar.update(1)
        except BaseException:  # one run failed (or Ctrl-C): do not wait for the others
            ex.shutdown(wait=False, cancel_futures=True)
            raise
    return [done[i] for i in range(len(tasks))]


def summarize(runs: list[dict]) -> list[dict]:
    rows = []
    for r in runs:
        rows.append({
            "policy": r["policy"], "load": r["load"], "what_if": r["what_if"] or "-", "seed": r["seed"],
            "offered_load": r["offered_load"], "gpu_alloc_pct": r["mean_gpu_alloc_pct"], "frag_pct": r["mean_frag_pct"],
            "delay_mean_s": r["queue_delay_s"]["mean"], "delay_p50_s": r["queue_delay_s"]["p50"],
            "delay_p95_s": r["queue_delay_s"]["p95"], "delay_p99_s": r["queue_delay_s"]["p99"],
            "never_placed": r["pods_never_placed"], "bounded_slowdown_p99": r["bounded_slowdown"]["p99"],
            "production_p99_s": r["production_delay_s"].get("p99") if r["production_delay_s"].get("n") else None,
            "wall_s": r["wall_s"],
        })
    return rows


def run(args: argparse.Namespace, policies: list[str], pods_path: str, nodes_path: str | None) -> int:
    from tqdm import tqdm

    from ..simulator.experiments import whatif

    if not 0 <= args.warmup < 1:
        print("gpufleet simulate: --warmup must be in [0, 1)", file=sys.stderr)
        return 2
    if args.target_p99 <= 0:
        print("gpufleet simulate: --target-p99 must be > 0", file=sys.stderr)
        return 2
    try:
        for s in args.what_if:
            whatif.parse(s)
        if args.search_shape:
            whatif.parse(f"+1x{args.search_shape}")
        nodes, tr, kind = _load(nodes_path, pods_path, args.skip_bad_rows, args.cluster_size)
        if args.queues:
            load_queue_file(args.queues)
            team_function(args.team_column, kind)
        priority_function(args.priority_column)
        for s in args.what_if:
            whatif.apply(nodes, [whatif.parse(s)])
        if args.search_shape:
            whatif.apply(nodes, [whatif.parse(f"+1x{args.search_shape}")])
    except (GpufleetError, OSError, ValueError) as exc:
        print(f"gpufleet simulate: {exc}", file=sys.stderr)
        return 2
    if tr.skipped_rows:
        print(f"warning: skipped {len(tr.skipped_rows)} bad row(s) in {pods_path}; first: {tr.skipped_rows[0]}", file=sys.stderr)
    if not tr.pods:
        print(f"gpufleet simulate: no pods in {pods_path}", file=sys.stderr)
        return 2
    from ..simulator.experiments.replay import prepare

    base = {"nodes": nodes_path, "pods": pods_path, "skip": args.skip_bad_rows, "cluster_size": args.cluster_size,
            "warmup": args.warmup, "queues": args.queues, "team_column": args.team_column,
            "priority_column": args.priority_column, "no_preemption": args.no_preemption, "speedup": args.speedup}
    try:
        # what every run recomputes the same (the workload, each load's pacing, the pods' decision groups) is made
        # here, once: the workers fork from this process and find it made (``_workload``, ``replay.prepare``)
        wl = _workload(base, tr, kind, load_queue_file(args.queues) if args.queues else None)
        ref = sum(len(n.gpus) for n in nodes)
        loads = args.load or [None]
        copies = wl.copies_for(max(x for x in loads if x is not None), ref, args.warmup) if args.load else None
        prepare(wl, args.load or [], ref, args.warmup, copies)
    except (GpufleetError, ValueError) as exc:
        print(f"gpufleet simulate: {exc}", file=sys.stderr)
        return 2
    base["copies"] = copies
    variants = [[]] + ([list(args.what_if)] if args.what_if else [])
    tasks = [dict(base, policy=pol, seed=s, load=ld, what_if=v) for v in variants for pol in policies for ld in loads for s in args.seeds]
    jobs = max(1, min(args.jobs or (os.cpu_count() or 1), len(tasks)))
    from ..simulator.experiments.whatif import describe

    print(f"replay: {describe(nodes)}; {len(tr.pods)} pods ({tr.name}, {kind}); policies {', '.join(policies)}; "
          f"loads {', '.join('trace clock' if x is None else f'{x:g}' for x in loads)}"
          f"{'; ' + str(copies) + ' pass(es) of the trace' if copies and copies > 1 else ''}"
          f"{'; what-if ' + ' '.join(args.what_if) if args.what_if else ''}; {jobs} worker(s)", file=sys.stderr)
    t0 = time.perf_counter()
    bar = tqdm(total=len(tasks), unit="run", disable=args.no_progress, file=sys.stderr)
    # what is made so far (the modules, the trace, the prepared workloads) lives until the end: out of the cyclic
    # collector's sight, so that each run's collection (``run_one``) and the workers' own walk only what runs make,
    # and a forked worker's collections leave the pages it shares with this process as they are
    gc.freeze()
    try:
        runs = _pool_map(tasks, jobs, bar)
        search = None
        if args.search_shape:
            search = _search(args, base, policies[0], loads[0], nodes, jobs, bar)
    except (GpufleetError, ValueError) as exc:
        print(f"gpufleet simulate: {exc}", file=sys.stderr)
        return 1
    finally:
        gc.unfreeze()
        bar.close()
    rows = summarize(runs)
    print_table(rows)
    if search is not None:
        print(search["recommendation"])
    wall = time.perf_counter() - t0
    print(f"done in {wall:.1f} s", file=sys.stderr)
    params = {"experiment": "replay", "nodes": nodes_path or ("synthesized (trace2025.synth_cluster)" if kind == "dlrm2025" else "bundled"),
              "pods": pods_path, "trace_kind": kind, "policies": policies, "seeds": args.seeds, "loads": loads,
              "copies": copies, "warmup": args.warmup, "what_if": args.what_if, "queues": args.queues,
              "team_column": args.team_column, "cluster_size": args.cluster_size if kind == "dlrm2025" else None,
              "jobs": jobs, "wall_s": round(wall, 2)}
    if args.json_path:
        doc = {"runs": runs, "summary": rows, "params": params}
        if search is not None:
            doc["search"] = search
        with open(args.json_path, "w") as f:
            json.dump(doc, f, indent=1)
        print(f"wrote {args.json_path}", file=sys.stderr)
    if args.report:
        from ..simulator.report.replay import write_replay_report

        write_replay_report(args.report, runs, rows, params, search)
        print(f"wrote {args.report}", file=sys.stderr)
    return 0


def _search(args, base: dict, policy: str, load: float | None, nodes, jobs: int, bar) -> dict:
    from ..simulator.experiments import whatif

    g, c, m, model = whatif.node_shape(whatif.parse(f"+1x{args.search_shape}").model or "", nodes,
                                       whatif.parse(f"+1x{args.search_shape}").gpus_per_node)
    shape = f"{g}x{model}"
    cache: dict[int, dict] = {}

    def evaluate(n: int) -> whatif.SearchPoint:
        if n not in cache:
            t = dict(base, policy=policy, seed=args.seeds[0], load=load, what_if=list(args.what_if), add=n, search_shape=shape)
            cache[n] = run_one(t)
            bar.total += 1
            bar.update(1)
        r = cache[n]
        return whatif.SearchPoint(n, r["queue_delay_s"]["p99"], r["queue_delay_s"]["p50"], r["mean_gpu_alloc_pct"], r["pods_never_placed"])

    best, pts = whatif.smallest_addition(evaluate, args.target_p99, most=max(64, len(nodes)))
    at = "the trace's clock" if load is None else f"load {load:g}"
    if best is None:
        rec = (f"recommendation: even {pts[-1].added} more {shape} node(s) do not bring p99 queueing delay under "
               f"{args.target_p99:g} s at {at} with {policy} (p99 {pts[-1].p99_s:.0f} s)")
    elif best == 0:
        rec = f"recommendation: no nodes needed: p99 queueing delay is {pts[0].p99_s:.0f} s <= {args.target_p99:g} s at {at} with {policy}"
    else:
        p = next(x for x in pts if x.added == best)
        rec = (f"recommendation: add {best} node(s) of {shape} ({c // 1000} cores, {m // 1024} GiB each) to keep p99 queueing "
               f"delay <= {args.target_p99:g} s at {at} with {policy}: p99 {p.p99_s:.0f} s, p50 {p.p50_s:.0f} s "
               f"(now p99 {pts[0].p99_s:.0f} s)")
    return {"policy": policy, "load": load, "shape": shape, "target_p99_s": args.target_p99, "added": best,
            "curve": [p.__dict__ for p in pts], "recommendation": rec}


def print_table(rows: list[dict]) -> None:
    print(f"{'policy':<10} {'load':>5} {'what-if':<16} {'GPU alloc %':>11} {'frag %':>7} {'delay mean s':>12} {'p50 s':>8} "
          f"{'p95 s':>8} {'p99 s':>8} {'never':>6} {'bsld p99':>9} {'prod p99 s':>10}")
    for r in rows:
        ld = "trace" if r["load"] is None else f"{r['load']:g}"
        prod = "-" if r["production_p99_s"] is None else f"{r['production_p99_s']:.0f}"
        print(f"{r['policy']:<10} {ld:>5} {r['what_if'][:16]:<16} {r['gpu_alloc_pct']:>11.1f} {r['frag_pct']:>7.1f} "
              f"{r['delay_mean_s']:>12.1f} {r['delay_p50_s']:>8.1f} {r['delay_p95_s']:>8.1f} {r['delay_p99_s']:>8.1f} "
              f"{r['never_placed']:>6d} {r['bounded_slowdown_p99']:>9.2f} {prod:>10}")


__all__ = ["add_arguments", "load_queue_file", "longest_first", "parse_loads", "run", "run_one", "wants_sweep"]
