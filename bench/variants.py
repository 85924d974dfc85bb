"""Seeded trace variants for judging placement policies on clusters we do not have.

The FGD paper judges policies on variants of the Alibaba pod list; the ones it
holds out (``gpuspec*``, ``multigpu*``) we never download.  This module builds
our own from the bundled default pod list, with the paper's methods:

* ``pinnedNN``: NN% of the GPU pods get a ``gpu_spec`` naming one to three GPU
  models, drawn (without replacement) from the cluster's model mix weighted by
  GPU count, among the models with a node that can hold the pod at all;
* ``pinskewNN``: the same, but each trace draws its own model mix from a Dirichlet around the
  capacity shares, so some models get more pinned demand than they have GPUs (the family where the
  capacity-weighted ``pinned`` one was too easy to show the loss issue 14 reports);
* ``multigpuNN``: single-GPU pods are replaced by copies of the trace's own
  multi-GPU pods until multi-GPU pods make NN% of the GPU demand (the default
  trace: 7%);
* ``migNN``: MIG-shaped (not in the FGD paper; no family of the split, so never tuned on): 64 8-GPU hosts
  are added (half A100-80GB, half H100-80GB, CPU and memory of the trace's 8-GPU nodes), GPUs 0-5 in MIG mode
  with fixed layouts (``MIG_LAYOUTS``: instances created ahead, as the agent's fake backend and static MIG
  give them), GPUs 6-7 whole; NN% of the GPU-share pods ask one MIG instance instead, the profile with the
  fewest compute slices (of 7) covering their share (``mig_profile_for``); ``variant_nodes`` gives the hosts;
* ``cpuNNN`` / ``gpushareNN``: the Alibaba release's own variants (read from
  ``../shared/traces`` when present; skipped otherwise).

Each (variant, seed) pair is its own draw: the generator is seeded with the
simulation seed and the variant's name, so ten seeds are ten pinned traces.

The split is fixed here, before any tuning (see the commit that added it):
``TUNE`` is what the default policy may be tuned on; ``HELDOUT`` is what it is
reported on.  The policy itself has no per-trace constant: it learns online.

    python bench/variants.py write OUT_DIR [--seed 42]        # CSVs of every generated variant
    python bench/variants.py sweep --split tune --seeds 42-44 --policies default,fgd --jobs 2
    python bench/variants.py sweep --split heldout --seeds 42-51 --policies default,fgd,bestfit --bound --json out.json
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import json
import os
import re
import sys
import time
from collections import defaultdict
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import replace
from pathlib import Path

import numpy as np
import yaml

from gpufleet.engine.model import Node
from gpufleet.simulator.traces import trace as tracemod
from gpufleet.simulator.traces.trace import TracePod

_REPO = Path(__file__).resolve().parents[1]
_CANDIDATES = [Path(os.environ["GPUFLEET_SHARED_TRACES"])] if "GPUFLEET_SHARED_TRACES" in os.environ else []
_CANDIDATES += [_REPO.parent / "shared" / "traces", _REPO.parent.parent / "shared" / "traces"]
SHARED_CSV = next((c / "alibaba-gpu-v2023" / "csv" for c in _CANDIDATES if (c / "alibaba-gpu-v2023" / "csv").exists()),
                  _CANDIDATES[0] / "alibaba-gpu-v2023" / "csv")

# --- the split (committed before tuning) ------------------------------------------------
FAMILIES: dict[str, list[str]] = {
    "default": ["default"],
    "pinned": ["pinned05", "pinned10", "pinned15", "pinned20", "pinned25", "pinned30", "pinned33", "pinned40"],
    "pinskew": ["pinskew05", "pinskew10", "pinskew15", "pinskew20", "pinskew25", "pinskew30", "pinskew33", "pinskew40"],
    "multigpu": ["multigpu20", "multigpu30", "multigpu40", "multigpu50"],
    "cpu": ["cpu0", "cpu037", "cpu050", "cpu072", "cpu100", "cpu200", "cpu235", "cpu250", "cpu300"],
    "gpushare": ["gpushare20", "gpushare40", "gpushare60", "gpushare80", "gpushare100"],
    # generated, tuning only (added in the third session, after the split): more CPU-only pods
    "cpumore": ["cpumore200", "cpumore275", "cpumore350"],
}
TUNE = ["default", "pinned10", "pinned30", "pinskew20", "pinskew33", "multigpu30", "cpu050", "cpu250", "gpushare40",
        "cpumore200", "cpumore275", "cpumore350"]
HELDOUT = [v for fam in FAMILIES.values() for v in fam if v not in TUNE]
SKEW = 0.125  # pinskew*: Dirichlet concentration 8 x capacity share
# the tuning split also uses its own seeds; the held-out split is reported on seeds 42-51
TUNE_SEEDS = "42-44"


def family_of(variant: str) -> str:
    for fam, vs in FAMILIES.items():
        if variant in vs:
            return fam
    raise KeyError(variant)


def _rng(variant: str, seed: int) -> np.random.Generator:
    h = int.from_bytes(hashlib.sha256(f"{variant}/{seed}".encode()).digest()[:8], "little")
    return np.random.default_rng(h)


def _fits(p: TracePod, n: Node) -> bool:
    return p.num_gpu <= len(n.gpus) and p.cpu_milli <= n.cpu_milli and p.memory_mib <= n.memory_mib


def pin_models(pods: Sequence[TracePod], nodes: Sequence[Node], share: float, rng: np.random.Generator,
               max_models: int = 3, skew: float = 0.0) -> list[TracePod]:
    """A ``share`` of the GPU pods gets a gpu_spec of 1..max_models models drawn from the cluster's model mix.

    ``skew`` > 0 draws this trace's mix from Dirichlet(capacity share / skew) instead: the pinned demand
    then falls on the models unevenly, as a real team's preferences do, and some models get more pinned
    demand than they have GPUs for.
    """
    gpus_per_model: dict[str, int] = defaultdict(int)
    for n in nodes:
        if n.gpus:
            gpus_per_model[n.gpus[0].model] += len(n.gpus)
    models = sorted(gpus_per_model)
    weight = np.array([gpus_per_model[m] for m in models], dtype=float)
    if skew > 0:
        weight = rng.dirichlet(weight / weight.sum() / skew) + 1e-12
    gpu_idx = [i for i, p in enumerate(pods) if p.num_gpu]
    chosen = rng.choice(len(gpu_idx), size=round(share * len(gpu_idx)), replace=False)
    out = list(pods)
    for c in chosen:
        i = gpu_idx[int(c)]
        p = pods[i]
        ok = np.array([any(_fits(p, n) for n in nodes if n.gpus and n.gpus[0].model == m) for m in models])
        if not ok.any():
            continue
        w = np.where(ok, weight, 0.0)
        pk = np.array([0.6, 0.3, 0.1][:max_models])
        k = int(min(ok.sum(), rng.choice(np.arange(1, max_models + 1), p=pk / pk.sum())))
        spec = rng.choice(len(models), size=k, replace=False, p=w / w.sum())
        out[i] = replace(p, gpu_spec=tuple(sorted(models[j] for j in spec)))
    return out


def _demand(p: TracePod) -> int:
    return 0 if not p.num_gpu else (p.gpu_milli if p.num_gpu == 1 else 1000 * p.num_gpu)


def more_multigpu(pods: Sequence[TracePod], share: float, rng: np.random.Generator) -> list[TracePod]:
    """Replace random single-GPU pods by copies of random multi-GPU pods until those make ``share`` of GPU demand."""
    out = list(pods)
    multi = [p for p in pods if p.num_gpu > 1]
    singles = [i for i, p in enumerate(pods) if p.num_gpu == 1]
    rng.shuffle(singles)
    total = sum(_demand(p) for p in out)
    mdem = sum(_demand(p) for p in multi)
    k = 0
    while singles and mdem < share * total:
        i = singles.pop()
        src = multi[int(rng.integers(len(multi)))]
        total += _demand(src) - _demand(out[i])
        mdem += _demand(src)
        out[i] = replace(src, name=f"{out[i].name}-m{k}")
        k += 1
    return out


def more_cpu_pods(pods: Sequence[TracePod], factor: float, rng: np.random.Generator) -> list[TracePod]:
    """Add seeded copies of the trace's CPU-only pods until their CPU demand is ``factor`` x the trace's own.

    The Alibaba release's cpu* variants do the same with their own draws; these are ours, for tuning, so
    that the cpu* family can stay held out.
    """
    out = list(pods)
    cpu_only = [p for p in pods if not p.num_gpu]
    have = sum(p.cpu_milli for p in cpu_only)
    target = factor * have
    k = 0
    while cpu_only and have < target:
        src = cpu_only[int(rng.integers(len(cpu_only)))]
        out.append(replace(src, name=f"{src.name}-c{k}"))
        have += src.cpu_milli
        k += 1
    return out


_RELEASE = re.compile(r"(cpu|gpushare)\d+")
_GENERATED = re.compile(r"(pinskew|pinned|multigpu|cpumore|mig)(\d+)")


def check_variant(variant: str) -> None:
    """ValueError naming ``variant`` unless ``variant_pods`` can build it (the release's files aside)."""
    if variant == "default" or _RELEASE.fullmatch(variant):
        return
    m = _GENERATED.fullmatch(variant)
    if not m:
        raise ValueError(f"unknown variant {variant!r} (default, pinnedNN, pinskewNN, multigpuNN, cpumoreNNN, migNN, "
                         "or one of the release's cpuNNN/gpushareNN)")
    kind, amount = m.group(1), int(m.group(2))
    if kind == "cpumore" and amount < 100:
        raise ValueError(f"variant {variant!r}: cpumoreNNN takes the CPU-only pods' CPU in percent of the trace's own, "
                         "at least 100")
    if kind != "cpumore" and not 0 < amount <= 100:
        raise ValueError(f"variant {variant!r}: {kind}NN takes a share of the GPU pods in percent, 1 to 100")


def variant_pods(variant: str, seed: int, nodes: Sequence[Node], base: Sequence[TracePod] | None = None) -> list[TracePod]:
    """The pod list of ``variant`` for simulation seed ``seed`` (ValueError for a name ``check_variant`` refuses)."""
    check_variant(variant)
    path = release_path(variant)
    if path is not None:
        if not path.exists():
            raise FileNotFoundError(f"{path}: the Alibaba release's variants are read from ../shared/traces")
        return tracemod.load_pods(path).pods
    if base is None:
        base = tracemod.load_pods(tracemod.bundled(tracemod.DEFAULT_PODS)).pods
    m = _GENERATED.fullmatch(variant)
    if m is None:  # "default"
        return list(base)
    kind, share = m.group(1), int(m.group(2)) / 100.0
    rng = _rng(variant, seed)
    if kind == "pinskew":
        return pin_models(base, nodes, share, rng, skew=SKEW)
    if kind == "pinned":
        return pin_models(base, nodes, share, rng)
    if kind == "multigpu":
        return more_multigpu(base, share, rng)
    if kind == "mig":
        return mig_pods(base, share, rng)
    return more_cpu_pods(base, share, rng)


def variant_nodes(variant: str, nodes: Sequence[Node]) -> list[Node]:
    """The cluster ``variant`` runs on: the trace's nodes, plus the MIG hosts for ``migNN``."""
    m = _GENERATED.fullmatch(variant)
    return list(nodes) + mig_hosts(nodes) if m is not None and m.group(1) == "mig" else list(nodes)


# migNN: per MIG host, GPU i's layout for i < len(MIG_LAYOUTS) (each a valid A100/H100-80GB geometry of 7 compute
# slices, the first two as the agent's fake a100-mig backend has them), the other GPUs whole
MIG_LAYOUTS: tuple[tuple[str, ...], ...] = (
    ("1g.10gb",) * 7, ("3g.40gb", "2g.20gb", "2g.20gb"), ("4g.40gb", "3g.40gb"), ("7g.80gb",),
    ("4g.40gb", "2g.20gb", "1g.10gb"), ("7g.80gb",))
MIG_HOSTS = 64
MIG_MODELS = ("NVIDIA-A100-SXM4-80GB", "NVIDIA-H100-80GB-HBM3")


def mig_hosts(nodes: Sequence[Node]) -> list[Node]:
    from gpufleet.engine.gpu_models import lookup
    from gpufleet.engine.model import Gpu, MigInstance

    like = next(n for n in nodes if len(n.gpus) == 8)
    out = []
    for h in range(MIG_HOSTS):
        model = lookup(MIG_MODELS[h % 2])
        assert model is not None
        mem_of = dict(model.mig_profiles)
        gpus = []
        for j in range(8):
            uuid = f"mig-host-{h:03d}-gpu{j}"
            if j < len(MIG_LAYOUTS):
                insts = tuple(MigInstance(prof, mem_of[prof], k) for k, prof in enumerate(MIG_LAYOUTS[j]))
                gpus.append(Gpu(j, uuid, model.name, model.memory_mib, mig_enabled=True, mig_instances=insts))
            else:
                gpus.append(Gpu(j, uuid, model.name, model.memory_mib))
        out.append(Node(f"mig-host-{h:03d}", like.cpu_milli, like.memory_mib, tuple(gpus), dict(like.labels), max_pods=like.max_pods))
    return out


def mig_profile_for(gpu_milli: int) -> str:
    """The MIG profile with the fewest compute slices (of 7) that covers a share of ``gpu_milli``."""
    slices = max(1, -(-gpu_milli * 7 // 1000))
    return {1: "1g.10gb", 2: "2g.20gb", 3: "3g.40gb", 4: "4g.40gb"}.get(slices, "7g.80gb")


def mig_pods(pods: Sequence[TracePod], share: float, rng: np.random.Generator) -> list[TracePod]:
    """A ``share`` of the GPU-share pods ask one MIG instance instead (their model pins dropped: MIG hosts only)."""
    idx = [i for i, p in enumerate(pods) if p.num_gpu == 1 and p.gpu_milli < 1000]
    chosen = rng.choice(len(idx), size=round(share * len(idx)), replace=False)
    out = list(pods)
    for c in chosen:
        p = pods[idx[int(c)]]
        out[idx[int(c)]] = replace(p, mig_profile=mig_profile_for(p.gpu_milli), gpu_spec=())
    return out


def release_path(variant: str) -> Path | None:
    """Where a release variant's pod list is read from (None for a generated one)."""
    return SHARED_CSV / f"openb_pod_list_{variant}.csv" if _RELEASE.fullmatch(variant) else None


def available(variants: Sequence[str]) -> list[str]:
    return [v for v in variants if (path := release_path(v)) is None or path.exists()]


def write_csv(path: Path, pods: Sequence[TracePod]) -> None:
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(tracemod.POD_COLUMNS_FULL)
        for p in pods:
            w.writerow([p.name, p.cpu_milli, p.memory_mib, p.num_gpu, p.gpu_milli, "|".join(p.gpu_spec), p.qos or "LS",
                        "Running", p.creation_time or 0, p.deletion_time or "", p.scheduled_time or 0])


# --- the sweep ------------------------------------------------------------------------------

_NODES: list[Node] | None = None


def _nodes() -> list[Node]:
    global _NODES
    if _NODES is None:
        _NODES = tracemod.load_nodes(tracemod.bundled(tracemod.DEFAULT_NODES))
    return _NODES


def _task(kind: str, variant: str, seed: int, policy: str, tune: float, time_limit_s: float) -> dict:
    nodes = variant_nodes(variant, _nodes())
    pods = variant_pods(variant, seed, nodes)
    t0 = time.perf_counter()
    if kind == "bound":
        from gpufleet.simulator.bounds.bound import offline_bound

        b = offline_bound(nodes, pods, seed=seed, tune=tune, time_limit_s=time_limit_s).to_json()
        return {"kind": kind, "variant": variant, "seed": seed, "policy": "bound", **b, "solve_s": round(time.perf_counter() - t0, 2)}
    from gpufleet.simulator.experiments.packing import run_packing

    r = run_packing(nodes, pods, policy_config(policy), seed=seed, tune=tune, trace_name=variant)
    idle = r.idle
    return {"kind": kind, "variant": variant, "seed": seed, "policy": policy, "unallocated_gpu_pct": r.unallocated_gpu_pct,
            "pods_failed": r.pods_failed, "wall_s": r.wall_s, "saturation": None if idle is None else idle.saturation,
            "bound_placing_first_pct": None if idle is None else idle.bound_placing_first_pct,
            "cpu_used_pct": None if idle is None else round(idle.cpu_used_pct, 3),
            "cpu_only_pods_failed": None if idle is None else idle.cpu_only_failed}


def policy_config(policy: str):
    """``default`` or, for tuning runs, ``default:model_weight=4/sliver_weight=8`` (the default profile, args set; ``/`` or
    ``,`` between them).  The default's arguments go to the plugins or components that take them (``policies.default.owners``);
    another policy's to its first score plugin."""
    if ":" not in policy:
        return policy
    import copy

    from gpufleet.policies import profile_config
    from gpufleet.policies.default import owners

    name, _, args = policy.partition(":")
    cfg = copy.deepcopy(profile_config(name))
    prof = cfg["profiles"][0]
    first = prof["plugins"]["score"][0]["name"]
    prof["name"] = policy
    pconf = prof.setdefault("pluginConfig", {})
    for arg, value in (_plugin_arg(kv) for kv in args.replace("/", ",").split(",")):
        to = owners(arg) if name in ("default", "strandfrag") else [first]
        if not to:
            raise ValueError(f"{policy}: no plugin of the default policy takes an argument {arg!r}")
        for plugin in to:
            pconf.setdefault(plugin, {})[arg] = value
    return cfg


def _plugin_arg(text: str) -> tuple[str, int | float | bool]:
    """``name=4``, ``name=0.5`` or ``name=true`` (YAML's scalars, as in a pluginConfig)."""
    name, eq, raw = (x.strip() for x in text.partition("="))
    value = yaml.safe_load(raw) if eq and raw else None
    if not name or isinstance(value, str) or not isinstance(value, (int, float, bool)):
        raise ValueError(f"want NAME:ARG=VALUE/ARG=VALUE with a number or true/false, got {text!r}")
    return name, value


def sweep(variants: Sequence[str], seeds: Sequence[int], policies: Sequence[str], jobs: int, tune: float = 1.3,
          bound: bool = False, time_limit_s: float = 50.0, progress: bool = True) -> list[dict]:
    from tqdm import tqdm

    tasks = [("run", v, s, p, tune, time_limit_s) for v in variants for s in seeds for p in policies]
    if bound:
        tasks += [("bound", v, s, "bound", tune, time_limit_s) for v in variants for s in seeds]
    out: list[dict] = []
    with ProcessPoolExecutor(max_workers=max(1, jobs)) as ex, \
            tqdm(total=len(tasks), unit="run", disable=not progress, file=sys.stderr) as bar:
        futs = [ex.submit(_task, *t) for t in tasks]
        for f in as_completed(futs):
            out.append(f.result())
            bar.update(1)
    return out


KEEP = "default keeps its first pods"  # column: the bound for placements keeping what the default placed before its first refusal


def _by(results: Sequence[dict]) -> dict[tuple[str, str], dict[int, float]]:
    by: dict[tuple[str, str], dict[int, float]] = defaultdict(dict)
    for r in results:
        if r["unallocated_gpu_pct"] is not None:
            by[(r["variant"], r["policy"])][r["seed"]] = r["unallocated_gpu_pct"]
        if r["policy"] == "default" and r.get("bound_placing_first_pct") is not None:
            by[(r["variant"], KEEP)][r["seed"]] = r["bound_placing_first_pct"]
    return by


def _columns(results: Sequence[dict], policies: Sequence[str]) -> list[str]:
    cols = [p for p in policies if p != "bound"] + (["bound"] if any(r["kind"] == "bound" for r in results) else [])
    return cols + ([KEEP] if any(r["policy"] == "default" and r.get("bound_placing_first_pct") is not None for r in results) else [])


def _cell(xs: Sequence[float]) -> str:
    if not xs:
        return "-"
    return f"{np.mean(xs):.2f} ± {np.std(xs):.2f}" if len(xs) > 1 else f"{xs[0]:.2f}"


def _rel(d: Sequence[float], f: Sequence[float]) -> str:
    return f"{100 * (np.mean(d) - np.mean(f)) / np.mean(f):+.1f}%" if len(d) and len(f) else "-"


def table(results: Sequence[dict], policies: Sequence[str], split: dict[str, str]) -> str:
    """Per variant: mean +- std over seeds per policy (and the bound), default vs FGD, the seeds where default lost."""
    by = _by(results)
    cols = _columns(results, policies)
    present = {v for v, _ in by}
    variants = [v for fam in FAMILIES.values() for v in fam if v in present] + sorted(present - set().union(*FAMILIES.values()))
    lines = ["| variant | split | " + " | ".join(cols) + " | default vs fgd | seeds where default > fgd |",
             "|---" * (len(cols) + 4) + "|"]
    for v in variants:
        d, f = by.get((v, "default"), {}), by.get((v, "fgd"), {})
        common = sorted(set(d) & set(f))
        worse = (", ".join(f"{s}: {d[s] - f[s]:+.2f}" for s in common if d[s] > f[s]) or "none") if common else "-"
        lines.append(f"| {v} | {split.get(v, '?')} | " + " | ".join(_cell(list(by.get((v, c), {}).values())) for c in cols)
                     + f" | {_rel([d[s] for s in common], [f[s] for s in common])} | {worse} |")
    return "\n".join(lines)


def family_table(results: Sequence[dict], policies: Sequence[str], split: dict[str, str]) -> str:
    """Per family and split: mean +- std over all (variant, seed) runs, and default vs FGD."""
    cols = _columns(results, policies)
    cells: dict[tuple[str, str, str], list[float]] = defaultdict(list)
    for (v, pol), xs in _by(results).items():
        cells[(family_of(v), split.get(v, "?"), pol)] += list(xs.values())
    keys = sorted({(f, sp) for f, sp, _ in cells}, key=lambda k: (list(FAMILIES).index(k[0]), k[1] != "tune"))
    lines = ["| family | split | " + " | ".join(cols) + " | default vs fgd |", "|---" * (len(cols) + 3) + "|"]
    for f, sp in keys:
        lines.append(f"| {f} | {sp} | " + " | ".join(_cell(cells.get((f, sp, c), [])) for c in cols)
                     + f" | {_rel(cells.get((f, sp, 'default'), []), cells.get((f, sp, 'fgd'), []))} |")
    bs = [r for r in results if r["kind"] == "bound"]
    if bs:
        t = [r["solve_s"] for r in bs]
        gaps = [r["gap_pct"] for r in bs if r.get("gap_pct") is not None]
        lines.append("")
        lines.append(f"bound: {len(bs)} solves, solve time median {np.median(t):.1f} s, max {max(t):.1f} s; "
                     f"solved to optimality {sum(bool(r.get('optimal')) for r in bs)}/{len(bs)}; "
                     f"solver gap median {np.median(gaps):.4f}, max {max(gaps):.4f} points of GPU capacity")
    return "\n".join(lines)


def _read_sweep(path: str) -> dict:
    """A ``sweep --json`` file; ValueError naming the file and what is wrong with it."""
    try:
        doc = json.loads(Path(path).read_text())
    except OSError as exc:
        raise ValueError(f"{path}: {exc.strerror or exc}") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}:{exc.lineno}: not JSON: {exc.msg}") from None
    if not (isinstance(doc, dict) and isinstance(doc.get("results"), list) and isinstance(doc.get("params"), dict)
            and isinstance(doc["params"].get("policies"), str)):
        raise ValueError(f"{path}: not a sweep file (want 'params' with 'policies' and a list of 'results', "
                         "as `sweep --json` writes)")
    for k, r in enumerate(doc["results"]):
        missing = [f for f in ("kind", "variant", "seed", "policy") if not isinstance(r, dict) or f not in r]
        if missing:
            raise ValueError(f"{path}: results[{k}]: missing {', '.join(missing)}")
    return doc


def check_policy(policy: str) -> None:
    """ValueError naming ``policy`` unless a sweep can run it (a name, or ``name:arg=value/...``)."""
    from gpufleet.engine.errors import GpufleetError
    from gpufleet.policies import build_profile

    try:
        build_profile(policy_config(policy))
    except (GpufleetError, ValueError) as exc:
        raise ValueError(f"--policies: {policy!r}: {exc}") from None


def main(argv: Sequence[str] | None = None) -> int:
    from gpufleet.argtypes import float_range, int_range
    from gpufleet.cli.main import Parser
    from gpufleet.cli.simulate import parse_seeds

    ap = Parser(prog="variants.py", description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    w = sub.add_parser("write", help="write the generated variants as openb CSVs")
    w.add_argument("out")
    w.add_argument("--seed", type=int, default=42)
    s = sub.add_parser("sweep", help="run policies on a split (or named variants) and print the table")
    s.add_argument("--split", choices=["tune", "heldout", "all"], default="tune")
    s.add_argument("--variants", help="comma-separated variant names (instead of --split)")
    s.add_argument("--seeds", type=parse_seeds, default=parse_seeds(TUNE_SEEDS))
    s.add_argument("--policies", default="default,fgd")
    s.add_argument("--jobs", type=int_range(1), default=2)
    s.add_argument("--tune", type=float_range(0, lo_open=True), default=1.3)
    s.add_argument("--bound", action="store_true", help="also the offline MIP bound per (variant, seed)")
    s.add_argument("--time-limit", type=float_range(0, lo_open=True), default=50.0, help="bound: MIP time limit per solve (s)")
    s.add_argument("--json", help="write every run as JSON here")
    s.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    t = sub.add_parser("table", help="one table from the JSON files of several sweeps (the last file with a bound gives it)")
    t.add_argument("files", nargs="+")
    a = ap.parse_args(argv)
    try:
        return _run(a)
    except ValueError as exc:  # bad input, found before any run starts; a runtime failure is run_script's to report
        print(f"variants.py {a.cmd}: {exc}", file=sys.stderr)
        return 2


def _run(a: argparse.Namespace) -> int:
    split = {v: "tune" for v in TUNE} | {v: "held-out" for v in HELDOUT}
    if a.cmd == "table":
        res: list[dict] = []
        pols: list[str] = []
        for doc in [_read_sweep(f) for f in a.files]:
            if any(r["kind"] == "bound" for r in doc["results"]):  # a later file's bound replaces an earlier one's
                res = [r for r in res if r["kind"] != "bound"]
            res += doc["results"]
            pols += [p for p in doc["params"]["policies"].split(",") if p and p not in pols]
            if doc["params"].get("bound") and "bound" not in pols:
                pols.append("bound")
        print(table(res, pols, split))
        print()
        print(family_table(res, pols, split))
        return 0
    if a.cmd == "write":
        out = Path(a.out)
        if out.exists() and not out.is_dir():
            raise ValueError(f"{out}: not a folder")
        out.mkdir(parents=True, exist_ok=True)
        for fam in ("pinned", "pinskew", "multigpu", "cpumore"):
            for v in FAMILIES[fam]:
                write_csv(out / f"openb_pod_list_{v}.csv", variant_pods(v, a.seed, _nodes()))
        print(f"wrote {out}")
        return 0
    if a.variants:
        variants = [v.strip() for v in a.variants.split(",") if v.strip()]
        if not variants:
            raise ValueError("--variants: no variant named")
        for v in variants:
            check_variant(v)
            path = release_path(v)
            if path is not None and not path.exists():
                raise ValueError(f"--variants: {v}: {path} does not exist (the release's variants are read from ../shared/traces)")
    else:
        named = {"tune": TUNE, "heldout": HELDOUT, "all": TUNE + HELDOUT}[a.split]
        variants = available(named)
        if len(variants) < len(named):
            print(f"variants.py sweep: skipping {', '.join(v for v in named if v not in variants)}: the release's files "
                  f"are not in {SHARED_CSV}", file=sys.stderr)
    policies = [p.strip() for p in a.policies.split(",") if p.strip()]
    if not policies and not a.bound:
        raise ValueError("--policies: no policy named (and no --bound)")
    for p in policies:
        check_policy(p)
    res = sweep(variants, a.seeds, policies, a.jobs, a.tune, a.bound, a.time_limit, progress=not a.no_progress)
    if a.json:
        Path(a.json).write_text(json.dumps({"params": vars(a) | {"variants": variants}, "results": res}, indent=1))
    print(table(res, policies, split))
    return 0


if __name__ == "__main__":
    from gpufleet.cli.main import run_script

    sys.exit(run_script("variants.py", main))
