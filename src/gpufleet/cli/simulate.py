"""``gpufleet simulate``: replay a cluster trace through the scheduling engine.

With no arguments: the FGD paper's packing experiment on the bundled Alibaba
trace, for the paper's six policies and gpufleet's default, seed 42; prints a
table, writes ``report.html``.  Runs (policy x seed) go to worker processes
with ``--jobs``; each run is deterministic given its seed.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import sys
import time
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator

import numpy as np

from ..argtypes import float_range, int_range, output_file
from ..engine.errors import UsageError
from ..policies import policy_aliases, policy_names, policy_names_with_aliases
from ..simulator.traces import trace as tracemod

if TYPE_CHECKING:
    from ..simulator.experiments.packing import PackingRun
    from ..simulator.experiments.queues import QueueReplayRun

PAPER_POLICIES = ["random", "dotprod", "clustering", "packing", "bestfit", "fgd"]
MAX_SEEDS = 1000
MAX_RUNS = 10_000  # policies x seeds: about a day of CPU at the default trace's ~10 s per run
PUBLISHED_NAMES = {
    "01-Random": "random", "02-DotProd": "dotprod", "03-GpuClustering": "clustering",
    "04-GpuPacking": "packing", "05-BestFit": "bestfit", "06-FGD": "fgd",
}


def parse_seeds(text: str) -> list[int]:
    """Seeds ``42``, ``42-51`` or ``1,2,3``: each in [0, 2**32), none twice, at most ``MAX_SEEDS``."""
    out: list[int] = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        try:
            if "-" in part:
                a, b = part.split("-", 1)
                lo, hi = int(a), int(b)
                if hi < lo:
                    raise ValueError
            else:
                lo = hi = int(part)
        except ValueError:
            raise argparse.ArgumentTypeError(f"bad seed or range {part!r} (use 42, 42-51 or 1,2,3)") from None
        if lo < 0 or hi >= 2**32:
            raise argparse.ArgumentTypeError(f"seeds must be in [0, 2**32), got {part!r}")
        if len(out) + hi - lo + 1 > MAX_SEEDS:
            raise argparse.ArgumentTypeError(f"at most {MAX_SEEDS} seeds, got {part!r} in {text!r}")
        out.extend(range(lo, hi + 1))
    if not out:
        raise argparse.ArgumentTypeError("no seeds given")
    dup = next((x for i, x in enumerate(out) if x in out[:i]), None)
    if dup is not None:
        raise argparse.ArgumentTypeError(f"seed {dup} given twice")
    return out


def parse_policies(text: str | None) -> list[str]:
    """Policy names, comma-separated; aliases resolve to one policy, which runs once."""
    if text is None:
        return default_policies()
    names = [p.strip() for p in text.split(",")]
    if not any(names):
        raise UsageError("--policy: no policy named (known: " + ", ".join(_known_with_aliases()) + ")")
    known, aliases = policy_names(), policy_aliases()
    out: list[str] = []
    for n in names:
        if not n:
            continue
        if n not in known:
            raise UsageError(f"--policy: unknown policy {n!r}; known: {', '.join(_known_with_aliases())}")
        canon = aliases.get(n, n)
        if canon not in out:
            out.append(canon)
    return out


def _known_with_aliases() -> list[str]:
    return policy_names_with_aliases()


def default_policies() -> list[str]:
    known = policy_names()
    return [p for p in PAPER_POLICIES if p in known] + (["default"] if "default" in known else [])


def _policy_help() -> str:
    return ("policy name(s), comma-separated (default: the six paper policies + default); known: "
            + ", ".join(_known_with_aliases()))


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--nodes", help="node list CSV (sn,cpu_milli,memory_mib,gpu,model); default: the bundled Alibaba GPU node list")
    p.add_argument("--pods", help="pod list CSV (openb format, 11 or 5 columns); default: the bundled openb_pod_list_default")
    p.add_argument("--policy", default=None, help=_policy_help())
    p.add_argument("--seeds", type=parse_seeds, default=[42],
                   help=f"seeds: 42, 42-51 or 1,2,3 (default 42; at most {MAX_SEEDS}, each once; 42-51 gives the README's table)")
    p.add_argument("--tune", type=float_range(0, 10, lo_open=True), default=1.3,
                   help="packing: inflate the workload to TUNE x cluster GPU capacity, in (0, 10] (default 1.3)")
    p.add_argument("--experiment", choices=["packing", "replay", "queues", "spot"], default="packing",
                   help="packing (the FGD paper's), replay (trace clock), queues (replay with team queues, quotas, reclaim), "
                        "spot (GFS-shaped HP and Spot jobs with spot capacity that comes and goes, docs/spot.md)")
    p.add_argument("--teams", type=int_range(1, 64), default=3, help="queues: number of synthetic teams, 1-64 (default 3)")
    p.add_argument("--jobs", type=int_range(1, 256), default=None, help="worker processes, 1-256 (default: number of CPUs)")
    p.add_argument("--json", dest="json_path", help="write all runs and the summary as JSON to this path")
    p.add_argument("--report", default="report.html", help="HTML report path (default report.html); '' to skip")
    p.add_argument("--skip-bad-rows", action="store_true", help="skip malformed trace rows (counted and reported) instead of stopping")
    p.add_argument("--speedup", type=float_range(0.001, 1e6), default=1.0, help="replay: divide the gaps between arrivals by this factor (pod run times unchanged) to raise the load, 0.001-1e6 (default 1)")
    p.add_argument("--bound", action=argparse.BooleanOptionalAction, default=True,
                   help="packing: also compute the offline bound (a MIP over node groups: least unallocated GPU %% any placement could reach; default on)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    from . import replay_cli

    replay_cli.add_arguments(p)
    from . import spot_cli

    spot_cli.add_arguments(p)


# --- workers (top level, so they pickle) --------------------------------------------

_CACHE: dict[tuple, Any] = {}
# a run's CPU time relative to the simplest policy's on the default trace (measured, about): only the order in
# which runs go to the workers depends on it
_RUN_COST = {"default": 1.8, "fgd": 1.4, "dotprod": 1.35, "random": 1.3, "clustering": 1.1, "packing": 1.1}


def _load(nodes_path: str, pods_path: str, skip: bool):
    """(nodes, trace of the placeable pods); ``_load_all`` also gives what was skipped or left out."""
    loaded = _load_all(nodes_path, pods_path, skip)
    return loaded[0].nodes, loaded[2]


def _load_all(nodes_path: str, pods_path: str, skip: bool) -> tuple[tracemod.NodeList, tracemod.Trace, tracemod.Trace, dict[str, str]]:
    """(node list, pod trace as read, trace of the pods some node could hold, unplaceable pod -> reason)."""
    key = (nodes_path, pods_path, skip)
    if key not in _CACHE:
        nl = tracemod.read_nodes(nodes_path, skip_bad_rows=skip)
        tr = tracemod.load_pods(pods_path, skip_bad_rows=skip)
        bad = tracemod.unplaceable(tr.pods, nl.nodes)
        placeable = tracemod.Trace(tr.name, [p for p in tr.pods if p.name not in bad], tr.skipped_rows) if bad else tr
        _CACHE[key] = (nl, tr, placeable, bad)
    return _CACHE[key]


def _run_one(task: dict) -> dict:
    nodes, tr = _load(task["nodes"], task["pods"], task["skip"])
    r: PackingRun | QueueReplayRun
    if task["experiment"] == "packing":
        from ..simulator.experiments.packing import run_packing

        r = run_packing(nodes, tr.pods, task["policy"], seed=task["seed"], tune=task["tune"], trace_name=task["trace"])
    elif task["experiment"] == "queues":
        from ..simulator.experiments.queues import run_queue_replay

        r = run_queue_replay(nodes, tr.pods, task["policy"], teams=task.get("teams", 3), speedup=task.get("speedup", 1.0), seed=task["seed"])
    else:  # the replay experiment runs through cli/replay_cli.py, never here
        raise ValueError(f"unknown experiment {task['experiment']!r}")
    return r.to_json()


def _bound_one(task: dict) -> dict:
    from ..simulator.bounds.bound import offline_bound

    nodes, tr = _load(task["nodes"], task["pods"], task["skip"])
    return offline_bound(nodes, tr.pods, seed=task["seed"], tune=task["tune"]).to_json()


def _import_for_workers(experiment: str) -> None:
    """Import here, once, what every worker imports for its first run (the engine's policies, the experiment, the
    bounds' solver): workers made by fork start with it, instead of each importing it."""
    import multiprocessing

    if multiprocessing.get_start_method(allow_none=False) != "fork":
        return  # spawned or forkserver workers import for themselves; importing here would only add to the parent
    from ..policies import registry

    registry()  # the engine's plugins and the policies, which each worker's first build_profile() would import
    if experiment == "packing":
        import highspy  # noqa: F401  the keep-first LP of every run, the MIP of the bound (bounds/bound.py)
        import numpy.ma  # noqa: F401  numpy 2 imports it at the first np.unique (the target workload's sizes)

        from ..simulator.bounds import bound  # noqa: F401
        from ..simulator.experiments import packing  # noqa: F401
    elif experiment == "queues":
        from ..simulator.experiments import queues  # noqa: F401


def _start_first_bound(bound_tasks: list[dict]) -> tuple[ProcessPoolExecutor, Future] | None:
    """The first offline bound's MIP, started now in a process of its own (None: no bound, or workers are not forked).

    Why: the MIP needs the trace, numpy and HiGHS only, while the runs' workers need the engine and the policies,
    which the parent imports next (about 0.2 CPU s) before it forks them; started now, the MIP uses the core that
    would idle meanwhile, and its process never imports them at all (a worker of the runs' pool that took the MIP
    first would import them after it, which only moves that time).  The other seeds' MIPs go to the runs' pool
    first, as before, so a job of many seeds and few policies keeps every core busy to its end."""
    import multiprocessing

    if not bound_tasks or multiprocessing.get_start_method(allow_none=False) != "fork":
        return None
    import highspy  # noqa: F401  what the MIP's process would import first (bounds/bound.py solves through it)

    from ..simulator.bounds import bound  # noqa: F401

    ex = ProcessPoolExecutor(max_workers=1)
    return ex, ex.submit(_bound_one, bound_tasks[0])


def _in_workers(pending: list[tuple[str, Callable[[dict], dict], dict]], jobs: int,
                first: tuple[ProcessPoolExecutor, Future] | None) -> Iterator[tuple[str, dict]]:
    """Each task's (kind, result) as it finishes, the ``pending`` tasks given in their order to ``jobs`` worker
    processes, one task at a time each; ``first``: the first bound's MIP already running in a process of its own.

    While that MIP runs it holds one of the ``jobs`` cores, so ``jobs - 1`` workers take the other tasks, and one more
    is forked from this process when it ends (with what the parent imported and built meanwhile): never more busy
    processes than ``jobs``.  (Three processes on two cores took about 5% more CPU seconds for the same work, the
    cores' caches shared by turns.)"""
    workers: list[ProcessPoolExecutor] = []
    running: dict[Future, tuple[str, ProcessPoolExecutor | None]] = {}
    if first is not None:
        running[first[1]] = ("bound", None)

    def give(ex: ProcessPoolExecutor) -> None:
        if pending:
            kind, fn, task = pending.pop(0)
            running[ex.submit(fn, task)] = (kind, ex)
        else:  # nothing left for it: it ends now, beside the others' last tasks and this process's report
            ex.shutdown(wait=False)

    def fork_worker() -> None:
        ex = ProcessPoolExecutor(max_workers=1)
        workers.append(ex)
        give(ex)

    done_all = False
    try:
        for _ in range(jobs - (first is not None)):
            fork_worker()
        while running:
            done, _ = wait(running, return_when=FIRST_COMPLETED)
            for f in done:
                kind, ex = running.pop(f)
                result = f.result()
                if ex is None:  # the first bound's process ends: its core takes the other tasks now
                    if first is not None:
                        first[0].shutdown(wait=False)
                    if pending:
                        fork_worker()
                else:
                    give(ex)
                yield kind, result
        done_all = True
    finally:  # one task failed (or Ctrl-C): do not wait for the others
        for ex in workers:  # (a worker shut down above is waited for at the interpreter's exit, after the outputs)
            ex.shutdown(wait=done_all, cancel_futures=not done_all)


# --- published figures ------------------------------------------------------------------


def published_unallocated(trace_name: str, nodes_path: str, tune: float, seeds: list[int]) -> dict[str, float]:
    """Mean published unallocated GPU % per policy, where the published runs match this trace."""
    if Path(nodes_path).name != tracemod.DEFAULT_NODES or abs(tune - 1.3) > 1e-9:
        return {}
    p = tracemod.bundled("published/analysis_allo_discrete.csv")
    if not p.exists():
        return {}
    vals: dict[str, dict[int, float]] = {}
    with open(p, newline="") as f:
        for row in csv.DictReader(f):
            if row["workload"] != trace_name or row["sc_policy"] not in PUBLISHED_NAMES or row.get("100") in (None, ""):
                continue
            vals.setdefault(PUBLISHED_NAMES[row["sc_policy"]], {})[int(row["seed"])] = 100.0 - float(row["100"])
    out = {}
    for pol, by_seed in vals.items():
        chosen = [v for s, v in by_seed.items() if s in seeds] or list(by_seed.values())
        out[pol] = round(float(np.mean(chosen)), 2)
    return out


# --- main ------------------------------------------------------------------------------------


def summarize(runs: list[dict]) -> dict[str, dict]:
    out: dict[str, dict] = {}
    for pol in dict.fromkeys(r["policy"] for r in runs):
        rs = [r for r in runs if r["policy"] == pol]
        if rs[0].get("experiment") == "queues":
            out[pol] = {
                "runs": len(rs),
                "jain_mean": float(np.mean([np.mean(r["jain"]) if r["jain"] else 1.0 for r in rs])),
                "preemptions": float(np.mean([sum(r["preemptions"].values()) for r in rs])),
                "mean_gpu_alloc_pct": float(np.mean([np.mean(r["gpu_alloc_pct"]) if r["gpu_alloc_pct"] else 0.0 for r in rs])),
                "delay_s_mean": {q: float(np.mean([r["delay_s"][q]["mean"] for r in rs])) for q in rs[0]["teams"]},
            }
            continue
        u = [r["unallocated_gpu_pct"] for r in rs if r["unallocated_gpu_pct"] is not None]
        out[pol] = {
            "unallocated_gpu_pct_mean": round(float(np.mean(u)), 4) if u else None,
            "unallocated_gpu_pct_std": round(float(np.std(u)), 4) if u else None,
            "runs": len(rs),
            "pods_failed_mean": float(np.mean([r["pods_failed"] for r in rs])),
            "wall_s_mean": round(float(np.mean([r["wall_s"] for r in rs])), 3),
        }
        if all("idle" in r for r in rs):
            from ..simulator.bounds.idle import summarize_idle

            out[pol]["idle"] = summarize_idle([r["idle"] for r in rs])
    return out


def run(args: argparse.Namespace) -> int:
    nodes_path = args.nodes or str(tracemod.bundled(tracemod.DEFAULT_NODES))
    pods_path = args.pods or str(tracemod.bundled(tracemod.DEFAULT_PODS))
    policies = parse_policies(args.policy)
    if len(policies) * len(args.seeds) > MAX_RUNS:
        raise UsageError(f"--policy x --seeds: {len(policies)} x {len(args.seeds)} runs is more than {MAX_RUNS}; use fewer seeds")
    for flag, path in (("--json", args.json_path), ("--report", args.report)):
        if path:
            output_file(flag, path)  # before the work, not after it
    if args.experiment == "spot":
        from . import spot_cli

        return spot_cli.run(args, policies)
    if args.experiment == "replay":  # load, what-ifs, team queues, the 2025 trace
        from . import replay_cli

        return replay_cli.run(args, policies, pods_path, args.nodes)
    try:
        nl, read, tr, unplaceable = _load_all(nodes_path, pods_path, args.skip_bad_rows)
    except OSError as exc:
        raise UsageError(f"{exc.filename}: {exc.strerror or exc}") from None
    nodes = nl.nodes
    skipped = {"nodes": len(nl.skipped_rows), "pods": len(read.skipped_rows)}
    for what, path, rows in (("node", nodes_path, nl.skipped_rows), ("pod", pods_path, read.skipped_rows)):
        if rows:
            print(f"warning: skipped {len(rows)} bad {what} row(s) in {Path(path).name}; first: {rows[0]}", file=sys.stderr)
    if unplaceable:
        first = next(iter(unplaceable.items()))
        print(f"warning: {len(unplaceable)} pod(s) fit no node of this cluster even when it is empty; left out of the runs "
              f"(first: {first[0]}: {first[1]})", file=sys.stderr)
    if not tr.pods:
        raise UsageError(f"{pods_path}: no pods to place" + (" (every pod was skipped or fits no node)" if read.pods or read.skipped_rows else ""))
    trace_name = Path(pods_path).stem
    if args.experiment == "packing" and not any(p.num_gpu for p in tr.pods):
        raise UsageError(f"{Path(pods_path).name}: no pod requests a GPU; the packing experiment has nothing to pack")
    if args.experiment == "queues" and any(p.creation_time is None for p in tr.pods):
        raise UsageError(f"--experiment {args.experiment}: {Path(pods_path).name} has no creation_time column; "
                         "it needs the 11-column pod list")
    tasks = [
        {"nodes": nodes_path, "pods": pods_path, "skip": args.skip_bad_rows, "experiment": args.experiment,
         "policy": pol, "seed": s, "tune": args.tune, "trace": trace_name, "speedup": args.speedup, "teams": args.teams}
        for pol in policies for s in args.seeds
    ]
    jobs = args.jobs or (os.cpu_count() or 1)
    jobs = max(1, min(jobs, len(tasks)))
    bound_tasks = [dict(tasks[0], seed=s) for s in args.seeds] if args.bound and args.experiment == "packing" else []
    early = _start_first_bound(bound_tasks) if jobs > 1 else None
    bar = None
    try:
        from ..version import start_git_commit

        commit = start_git_commit()  # for the provenance at the end: git runs while the runs do, not after them
        t0 = time.perf_counter()
        print(f"{args.experiment} experiment: {len(nodes)} nodes, {sum(len(n.gpus) for n in nodes)} GPUs, {len(tr.pods)} pods "
              f"({trace_name}); policies {', '.join(policies)}; seeds {args.seeds[0]}..{args.seeds[-1]} ({len(args.seeds)}); "
              f"{jobs} worker(s)" + (", the first offline bound's started first" if early is not None else ""), file=sys.stderr)
        runs: list[dict] = []
        bounds: list[dict] = []
        from tqdm import tqdm

        bar = tqdm(total=len(tasks) + len(bound_tasks), unit="run", disable=args.no_progress, file=sys.stderr)
        if jobs == 1:
            for t in tasks:
                bar.set_postfix_str(f"{t['policy']} seed {t['seed']}")
                runs.append(_run_one(t))
                bar.update(1)
            for b in bound_tasks:
                bounds.append(_bound_one(b))
                bar.update(1)
        else:
            if early is not None:
                bound_tasks = bound_tasks[1:]
            _import_for_workers(args.experiment)
            if args.report and args.experiment != "queues":  # here, beside the other core's work, not after the last run
                from ..simulator.report import packing as _report  # noqa: F401
            if early is not None:  # the MIP has the other core meanwhile: the workers forked next start with these
                from ..simulator.experiments.packing import prepare

                prepare(nodes, tr.pods, seed=args.seeds[0], tune=args.tune)
            # longest first (the bound's MIP, then the policies by their usual cost), so that no worker is left alone
            # with a long run at the end while the other idles; the output is sorted below, unchanged
            pending: list[tuple[str, Callable[[dict], dict], dict]] = [("bound", _bound_one, b) for b in bound_tasks]
            pending += [("run", _run_one, t) for t in sorted(tasks, key=lambda t: -_RUN_COST.get(t["policy"], 1.0))]
            for kind, result in _in_workers(pending, jobs, early):
                (runs if kind == "run" else bounds).append(result)
                bar.update(1)
    finally:
        if bar is not None:
            bar.close()
        if early is not None:
            early[0].shutdown(wait=False, cancel_futures=True)
    order = {p: i for i, p in enumerate(policies)}
    runs.sort(key=lambda r: (order[r["policy"]], r["seed"]))
    bounds.sort(key=lambda b: b["seed"])  # workers finish in any order; the mean and the JSON follow the seeds
    summary = summarize(runs)
    published = published_unallocated(trace_name, nodes_path, args.tune, args.seeds) if args.experiment == "packing" else {}
    bound = None
    bound_info: dict[str, Any] = {}
    if bounds:
        bound = round(float(np.mean([b["unallocated_gpu_pct"] for b in bounds])), 4)
        gaps = [b["gap_pct"] for b in bounds if b.get("gap_pct") is not None]
        bound_info = {"method": bounds[0].get("method"), "gap_pct_max": round(max(gaps), 4) if gaps else None,
                      "solve_s_max": max(b.get("solve_s", 0.0) for b in bounds), "all_optimal": all(b.get("optimal") for b in bounds),
                      "left_out_mean": _left_out_mean(bounds)}
    _print_table(args.experiment, summary, published, bound)
    if skipped["nodes"] or skipped["pods"] or unplaceable:
        print(f"skipped bad rows: {skipped['nodes']} node(s), {skipped['pods']} pod(s); "
              f"pods that fit no node (left out): {len(unplaceable)}")
    if bound is not None:
        print(_headline(summary, bound, bound_info))
    wall = time.perf_counter() - t0
    print(f"done in {wall:.1f} s", file=sys.stderr)
    params = {
        "experiment": args.experiment, "nodes": Path(nodes_path).name, "pods": Path(pods_path).name, "policies": policies,
        "seeds": args.seeds,
        "tune": args.tune, "speedup": args.speedup, "jobs": jobs, "skipped_rows": skipped["nodes"] + skipped["pods"],
        "skipped_node_rows": skipped["nodes"], "skipped_pod_rows": skipped["pods"], "unplaceable_pods": len(unplaceable),
        "wall_s": round(wall, 2),
    }
    def local(msg: str) -> str:  # file names, not this machine's directories
        return msg.replace(nodes_path, Path(nodes_path).name).replace(pods_path, Path(pods_path).name)

    problems = {"skipped_node_rows": [local(x) for x in nl.skipped_rows], "skipped_pod_rows": [local(x) for x in read.skipped_rows],
                "unplaceable_pods": [f"{k}: {v}" for k, v in unplaceable.items()]}
    bound_status = (f"not applicable to the {args.experiment} experiment" if args.experiment != "packing" else
                    "not computed (--no-bound)" if not args.bound else
                    f"{bound:.2f}% unallocated GPU, mean over {len(bounds)} seed(s) (LP relaxation)" if bound is not None else "not computed")
    prov = provenance(nodes_path, pods_path, args.seeds, bound_status, commit)
    params["provenance"] = prov
    if args.json_path:
        doc: dict[str, Any] = {"runs": runs, "summary": summary, "params": params, "input_problems": problems}
        if published:
            doc["published"] = published
        if bounds and bound is not None:
            doc["bound"] = {"unallocated_gpu_pct_mean": bound, **bound_info, "headline": _headline(summary, bound, bound_info), "runs": bounds}
        with open(args.json_path, "w") as out:
            json.dump(doc, out, indent=1)
        print(f"wrote {args.json_path}", file=sys.stderr)
    if args.report:
        from ..simulator.report.packing import write_simulation_report

        if args.experiment == "queues":
            from ..simulator.experiments.queues import QueueReplayRun, report_section
            from ..simulator.report.plots import write_report

            sections = []
            for r in runs:
                if r["seed"] == args.seeds[0]:
                    qr = QueueReplayRun(**{k: v for k, v in r.items() if k != "experiment"})
                    sections += report_section(qr)
            write_report(args.report, "gpufleet simulate: team queues", sections, params, prov)
        else:
            write_simulation_report(args.report, args.experiment, runs, summary, published, bound, params,
                                    provenance=prov, problems=problems,
                                    bound_note=_headline(summary, bound, bound_info) if bound is not None else "")
        print(f"wrote {args.report}", file=sys.stderr)
    return 0


def provenance(nodes_path: str, pods_path: str, seeds: list[int], bound_status: str,
               commit: Callable[[], str | None] | None = None) -> dict[str, Any]:
    """What made these figures: gpufleet's version and commit, when, the input files (name + sha256), seeds, the bound.
    ``commit``: what ``version.start_git_commit`` returned when the command started (the lookup ran meanwhile)."""
    import datetime as dt
    import hashlib

    from .. import __version__
    from ..version import git_commit

    def sha(path: str) -> str:
        h = hashlib.sha256()
        with open(path, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
        return h.hexdigest()

    contiguous = seeds == list(range(seeds[0], seeds[0] + len(seeds)))
    return {
        "gpufleet": __version__,
        "commit": (commit or git_commit)() or "unknown (not a git checkout)",
        "date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC"),
        "seeds": (f"{seeds[0]}-{seeds[-1]}" if contiguous and len(seeds) > 1 else ",".join(map(str, seeds))) + f" ({len(seeds)})",
        "bound": bound_status,
        "inputs": [{"role": role, "file": Path(path).name, "sha256": sha(path)}
                   for role, path in (("nodes", nodes_path), ("pods", pods_path))],
    }


def _left_out_mean(bounds: list[dict]) -> dict[str, list[float]]:
    """GPU request -> [pods left out, pods arrived], means over the seeds, of the bound's best placements."""
    labels = {k for b in bounds for k in b.get("left_out") or {}}
    out = {}
    for k in labels:  # left out: 0 in a seed that kept them all; arrived: over the seeds that say
        seen = [(b.get("left_out") or {})[k] for b in bounds if k in (b.get("left_out") or {})]
        out[k] = [round(sum(v[0] for v in seen) / len(bounds), 1), round(float(np.mean([v[1] for v in seen])), 1)]
    from ..simulator.bounds.bound import label_milli

    return dict(sorted(out.items(), key=lambda kv: -kv[1][0] * label_milli(kv[0])))


def _headline(summary: dict, bound: float, info: dict) -> str:
    """'fgd leaves 4.72%, default 3.86%; no placement can leave fewer than 3.11% (...); to get there ...'."""
    left = ", ".join(f"{p} leaves {s['unallocated_gpu_pct_mean']:.2f}%" for p, s in summary.items()
                     if s.get("unallocated_gpu_pct_mean") is not None and p in ("fgd", "default"))
    gap = info.get("gap_pct_max")
    how = f"{info.get('method', 'bound')}, solver gap <= {gap:.3f} points, {info.get('solve_s_max', 0):.0f} s" if gap is not None else "bound"
    gone = [(label, p, n) for label, (p, n) in (info.get("left_out_mean") or {}).items() if p >= 0.5]
    get_there = ""
    if gone:
        label, p, n = gone[0]
        rest = sum(g[1] for g in gone[1:])
        get_there = (f"; the best placement found leaves out {p:,.0f} of the {n:,.0f} {label.replace(' ', '-')} pods"
                     + (f" (and {rest:,.0f} other{'s' if rest >= 1.5 else ''})" if rest >= 0.5 else ""))
    return f"{left + '; ' if left else ''}no placement can leave fewer than {bound:.2f}% ({how}){get_there}"


def _print_table(experiment: str, summary: dict, published: dict, bound: float | None) -> None:
    if experiment == "queues":
        print(f"{'policy':<12} {'runs':>4} {'Jain':>6} {'preemptions':>12} {'mean GPU alloc %':>17}  queueing delay mean s per queue")
        for pol, s in summary.items():
            d = ", ".join(f"{q} {v:.0f}" for q, v in s["delay_s_mean"].items())
            print(f"{pol:<12} {s['runs']:>4} {s['jain_mean']:>6.3f} {s['preemptions']:>12.1f} {s['mean_gpu_alloc_pct']:>17.2f}  {d}")
        return
    keep = {p: (s.get("idle") or {}).get("bound_placing_first_pct_mean") for p, s in summary.items()}
    cpu = {p: (s.get("idle") or {}).get("cpu_used_pct_mean") for p, s in summary.items()}
    print(f"{'policy':<12} {'runs':>4} {'unallocated GPU %':>18} {'± std':>7} {'keep-first bound':>17} {'CPU in use %':>13} {'published':>10} "
          f"{'failed pods':>12} {'wall s':>7}")
    means = {p: s["unallocated_gpu_pct_mean"] for p, s in summary.items() if s["unallocated_gpu_pct_mean"] is not None}
    best = min(means, key=means.__getitem__) if means else None
    for pol, s in summary.items():
        pub = published.get(pol)
        m = s["unallocated_gpu_pct_mean"]
        std = f"{s['unallocated_gpu_pct_std'] or 0:.2f}" if s["runs"] > 1 else "-"  # no spread from one seed
        k = keep.get(pol)
        print(f"{pol + (' *' if pol == best else ''):<12} {s['runs']:>4} {(f'{m:.2f}' if m is not None else '-'):>18} {std:>7} "
              f"{(f'{k:.2f}' if k is not None else '-'):>17} {(f'{c:.1f}' if (c := cpu.get(pol)) is not None else '-'):>13} "
              f"{(f'{pub:.2f}' if pub is not None else '-'):>10} {s['pods_failed_mean']:>12.1f} {s['wall_s_mean']:>7.1f}")
    if bound is not None:
        print(f"{'offline bound':<17} {bound:>18.2f}   (no placement of the arrived pods leaves fewer GPUs unallocated)")
    if any(v is not None for v in keep.values()):
        print("keep-first bound: no placement that keeps every pod the policy placed before it first turned one away "
              "leaves fewer (LP)")
    if best is not None:
        runs = max(s["runs"] for s in summary.values())
        print("* best (lowest unallocated GPU %); " + (f"mean over {runs} seeds" if runs > 1 else
              "one seed: a mean over seeds differs by a few tenths (--seeds 42-51 gives the README's 10-seed table)"))
