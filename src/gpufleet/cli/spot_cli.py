"""``gpufleet simulate --experiment spot``: the GFS-shaped workload replayed with spot capacity that comes and goes.

Two runs on the same fleet and jobs: with the spot nodes as spot (interrupted, priced as spot), and with the same
nodes on-demand (never interrupted, priced on-demand, usable by every job).  Per class (HP, Spot): queueing delay,
evictions, completed and lost GPU-hours, cost and what the same GPU-hours cost on-demand; then how the generated
workload compares with the trace's published figures.  Kept apart from ``cli/simulate.py`` like the replay's options.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any


def add_arguments(p: argparse.ArgumentParser) -> None:
    from ..argtypes import float_range

    g = p.add_argument_group("spot experiment (--experiment spot)")
    g.add_argument("--scale", type=float_range(0.001, 1.0), default=0.05,
                   help="spot: the GFS trace's fleet and arrival rate times this, (0, 1] (default 0.05: 214 nodes, 521 GPUs)")
    g.add_argument("--hours", type=float_range(1, 24 * 60), default=72.0, help="spot: hours of arrivals replayed (default 72)")
    g.add_argument("--prefill-hours", type=float_range(0, 24 * 60), default=720.0,
                   help="spot: jobs submitted this long before the start that still run at it are running (default 720)")
    g.add_argument("--spot-share", type=float_range(0, 5), default=0.2,
                   help="spot: spot nodes beside the fleet, as a share of each kind's nodes (default 0.2)")
    g.add_argument("--spot-up-hours", type=float_range(0.01, 1e4), default=6.0,
                   help="spot: mean hours a spot node stays before its interruption notice (default 6)")
    g.add_argument("--spot-down-hours", type=float_range(0.01, 1e4), default=2.0,
                   help="spot: mean hours a reclaimed spot node stays away (default 2)")
    g.add_argument("--notice-seconds", type=float_range(0, 3600), default=120.0,
                   help="spot: seconds from the interruption notice to the node's removal (default 120, AWS's)")
    g.add_argument("--rate", type=float_range(0.01, 100), default=1.0, help="spot: arrival rate x this (default 1)")
    g.add_argument("--prices", default=None, help="spot: price file (docs/cost.md; default: the bundled gfs-replay.yaml, "
                                                  "whose spot prices are an assumption)")


def _prices(path: str | None):
    from ..engine.errors import ConfigError
    from ..engine.prices import parse_prices_text
    from importlib import resources

    p = Path(path) if path else Path(str(resources.files("gpufleet") / "data" / "prices" / "gfs-replay.yaml"))
    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"--prices {p}: {getattr(exc, 'strerror', None) or exc}") from None
    return parse_prices_text(text, str(p))


def run_experiment(args: argparse.Namespace, policy: str, seed: int) -> dict[str, Any]:
    from dataclasses import replace

    from ..simulator.experiments.spot_replay import run_spot_replay
    from ..simulator.traces.spot_trace import PAPER, describe, fleet, fleet_gpus, jobs, spot_events

    prices = _prices(args.prices)
    nodes = fleet(args.scale, args.spot_share)
    js = jobs(seed=seed, hours=args.hours, scale=args.scale * args.rate, prefill_h=args.prefill_hours, fit_gpus=fleet_gpus(nodes))
    events = spot_events(nodes, args.hours, args.spot_up_hours, args.spot_down_hours, args.notice_seconds, seed=seed)
    spot = run_spot_replay(nodes, js, events, prices, policy=policy, seed=seed, warmup=0.0)
    base = run_spot_replay([replace(n, spot=False) for n in nodes], js, [], prices, policy=policy, seed=seed, warmup=0.0)
    shape = describe(jobs(seed=seed, hours=24 * 14), fleet(1.0), 24 * 14)  # the generator at the trace's own scale
    return {"experiment": "spot", "policy": policy, "seed": seed, "params": {
                "scale": args.scale, "hours": args.hours, "prefill_hours": args.prefill_hours, "spot_share": args.spot_share,
                "spot_up_hours": args.spot_up_hours, "spot_down_hours": args.spot_down_hours,
                "notice_seconds": args.notice_seconds, "rate": args.rate, "prices": prices.origin},
            "jobs": sum(1 for j in js if j.submit_s >= 0), "with_spot": spot.to_json(), "all_on_demand": base.to_json(),
            "shape": [{"figure": k, "generated": round(v, 4), "trace": t} for k, v, t in shape.table()],
            "paper": {"peak_spot_eviction_rate": PAPER["peak_spot_eviction_rate"],
                      "spot_evicted_pod_share_here": spot.to_json()["classes"]["Spot"]["evicted_pod_share"]}}


ROW = ("class", "pods", "delay p50 h", "p95 h", "p99 h", "evicted: notice", "preempted", "pods evicted %", "completed GPU-h", "lost GPU-h",
       "spot GPU-h", "cost", "same GPU-h on-demand", "saving %", "never placed")


def rows(doc: dict) -> list[list[str]]:
    out = []
    for run_name in ("with_spot", "all_on_demand"):
        for cls, c in doc[run_name]["classes"].items():
            d = c["queue_delay_s"]
            out.append([f"{cls} ({'spot nodes' if run_name == 'with_spot' else 'all on-demand'})", str(c["pods"]),
                        f"{d['p50'] / 3600:.2f}", f"{d['p95'] / 3600:.2f}", f"{d['p99'] / 3600:.2f}",
                        str(c["evicted_by_interruption"]), str(c["evicted_by_preemption"]), f"{100 * c['evicted_pod_share']:.1f}",
                        f"{c['completed_gpu_hours']:.1f}",
                        f"{c['lost_gpu_hours']:.1f}", f"{c['spot_gpu_hours']:.1f}", f"{c['cost']:,.2f}",
                        f"{c['cost_all_on_demand']:,.2f}", f"{c['saving_pct']:.1f}", str(c["never_placed"])])
    return out


def render(doc: dict) -> str:
    w = doc["with_spot"]
    head = [f"spot experiment: {w['replay']['nodes']} nodes ({w['spot_nodes']} spot), {w['replay']['gpus']} GPUs, "
            f"{doc['jobs']} jobs over {doc['params']['hours']:g} h (GFS-shaped, seed {doc['seed']}), policy {doc['policy']}; "
            f"spot node events {w['node_events']}, pods left on gone nodes {w['leftover_on_gone_nodes']}; "
            f"prices {doc['params']['prices']} ({w['currency']})"]
    body = rows(doc)
    widths = [max(len(str(x)) for x in col) for col in zip(ROW, *body)]
    head.append("  ".join(h.rjust(widths[i]) if i else h.ljust(widths[0]) for i, h in enumerate(ROW)))
    head += ["  ".join(x.rjust(widths[i]) if i else x.ljust(widths[0]) for i, x in enumerate(r)) for r in body]
    head.append("")
    head.append("generated workload (14 days at the trace's own scale, same seed) vs the GFS trace's published figures:")
    for s in doc["shape"]:
        head.append(f"  {s['figure']:36s} {s['generated']:>12.4g}  trace {s['trace']:>12.4g}")
    return "\n".join(head)


def write_html(path: str, doc: dict) -> None:
    import html

    from ..simulator.report.plots import table_html, write_report

    sections = [("Per class", "<p class='note'>" + html.escape(render(doc).splitlines()[0]) + "</p>" + table_html(ROW, rows(doc))),
                ("The workload against the trace", table_html(("figure", "generated", "GFS trace"),
                                                              [[s["figure"], s["generated"], s["trace"]] for s in doc["shape"]]))]
    write_report(path, "gpufleet spot replay", sections, doc["params"])


def run(args: argparse.Namespace, policies: list[str]) -> int:
    from ..engine.errors import ConfigError

    if args.policy is None:
        policies = ["default"]
    if len(policies) != 1 or len(args.seeds) != 1:
        raise ConfigError("--experiment spot: one --policy and one seed at a time")
    doc = run_experiment(args, policies[0], args.seeds[0])
    print(render(doc))
    if args.json_path:
        with open(args.json_path, "w", encoding="utf-8") as f:
            json.dump(doc, f, indent=1)
    if args.report:
        write_html(args.report, doc)
        print(f"wrote {args.report}", file=sys.stderr)
    return 0
