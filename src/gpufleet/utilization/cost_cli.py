"""``gpufleet cost``: GPU-hours and cost per namespace, team queue, workload and pod, from Prometheus or a samples file."""

from __future__ import annotations

import argparse
import json
import sys
import time
import urllib.parse


def add_arguments(p: argparse.ArgumentParser) -> None:
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--prometheus", metavar="URL", help="Prometheus base URL scraping the gpufleet agents")
    src.add_argument("--samples", metavar="FILE", help="compute offline from a samples file (written by --save-samples)")
    p.add_argument("--window", default="24h", help="how far back from --end, e.g. 1h, 24h, 30d (default 24h; Prometheus only)")
    p.add_argument("--end", default="now", help="end of the window: RFC 3339, unix seconds or 'now' (default now)")
    p.add_argument("--step", default="60s", help="sample step (default 60s; raised so a window has at most 10,000 steps)")
    p.add_argument("--prices", metavar="FILE", help="price file (docs/cost.md); default: the built-in list prices only")
    p.add_argument("--format", choices=("table", "csv", "json"), default="table", help="output format (default table)")
    p.add_argument("--level", default="namespace,queue,workload",
                   help="table/CSV rows: comma-separated namespace, queue, workload, pod (default namespace,queue,workload)")
    p.add_argument("--top", type=int, default=0, metavar="N", help="table: the N most costly rows per level (0: all)")
    p.add_argument("--report", metavar="FILE.html", help="also write a self-contained HTML page")
    p.add_argument("--save-samples", metavar="FILE", help="also write the samples fetched from Prometheus (for --samples)")
    p.add_argument("--allow-unpriced", action="store_true",
                   help="report GPUs without a price (their cost shown as unknown) instead of stopping")
    p.add_argument("--timeout", type=float, default=60.0, help="seconds per Prometheus query (default 60)")


def fetch_samples(base: str, start_s: float, end_s: float, step_s: float, timeout_s: float, fetch=None):
    """The three queries over one window (same start, end and step: one time grid)."""
    from .cost import QUERIES, Samples, parse_matrix
    from .sources import MAX_POINTS, SourceError, http_get

    fetch = fetch or http_get
    step = max(step_s, (end_s - start_s) / MAX_POINTS)
    out = Samples(start_s, end_s, step)
    for name, q in QUERIES.items():
        url = base.rstrip("/") + "/api/v1/query_range?" + urllib.parse.urlencode(
            {"query": q, "start": f"{start_s + step:.3f}", "end": f"{end_s:.3f}", "step": f"{step:g}"})
        body = fetch(url, timeout_s)
        try:
            doc = json.loads(body)
        except ValueError as exc:
            raise SourceError(f"query_range {q!r}: not JSON: {exc}") from None
        if not isinstance(doc, dict) or doc.get("status") != "success":
            raise SourceError(f"query_range {q!r}: Prometheus answered {doc.get('error') if isinstance(doc, dict) else doc!r}")
        setattr(out, name, parse_matrix(doc, f"query_range {q!r}"))
    return out


def _end(text: str) -> float:
    from ..engine.errors import ConfigError
    from .podjson import parse_time

    if text.strip().lower() == "now":
        return time.time()
    try:
        return parse_time("--end", "--end", text)
    except Exception:
        raise ConfigError(f"--end: not RFC 3339, unix seconds or 'now': {text!r}") from None


def run(args: argparse.Namespace) -> int:
    from ..engine.errors import ConfigError
    from .cost import LEVELS, Samples, check_identities, compute, load_prices, render_csv, render_json, render_table
    from .reclaim import parse_duration
    from .sources import SourceError

    levels = [x.strip() for x in args.level.split(",") if x.strip()]
    bad = [x for x in levels if x not in LEVELS]
    if bad or not levels:
        raise ConfigError(f"--level: unknown level(s) {', '.join(bad) or '(none)'}; known: {', '.join(LEVELS)}")
    if args.top < 0:
        raise ConfigError(f"--top: must be >= 0, got {args.top}")
    if not args.timeout > 0:
        raise ConfigError(f"--timeout: must be > 0, got {args.timeout}")
    prices = load_prices(args.prices)
    if args.samples:
        try:
            with open(args.samples, encoding="utf-8") as f:
                doc = json.load(f)
        except OSError as exc:
            raise ConfigError(f"--samples {args.samples}: {exc.strerror or exc}") from None
        except ValueError as exc:
            raise ConfigError(f"--samples {args.samples}: not JSON: {exc}") from None
        samples = Samples.from_json(doc, args.samples)
        flag = f"--samples {args.samples}"
    else:
        if not args.prometheus.startswith(("http://", "https://")):
            raise ConfigError(f"--prometheus: must start with http:// or https://, got {args.prometheus!r}")
        window_s, step_s = parse_duration("--window", args.window), parse_duration("--step", args.step)
        if not 0 < step_s <= window_s:
            raise ConfigError(f"--step {args.step}: must be > 0 and at most --window {args.window}")
        end = _end(args.end)
        try:
            samples = fetch_samples(args.prometheus, end - window_s, end, step_s, args.timeout)
        except SourceError as exc:
            print(f"gpufleet cost: {exc}", file=sys.stderr)
            return 1
        flag = f"--window {args.window}"
        if args.save_samples:
            with open(args.save_samples, "w", encoding="utf-8") as f:
                json.dump(samples.to_json(), f)
    report = compute(samples, prices, allow_unpriced=args.allow_unpriced, window_flag=flag)
    broken = check_identities(report)
    if broken:  # a bug, not bad input: say so rather than print numbers that do not add up
        raise RuntimeError("the cost figures do not add up: " + "; ".join(broken[:3]))
    if args.format == "json":
        print(render_json(report))
    elif args.format == "csv":
        sys.stdout.write(render_csv(report, levels))
    else:
        print(render_table(report, levels, args.top))
    if args.report:
        from .cost_report import write_cost_report

        write_cost_report(args.report, report, {"source": args.samples or args.prometheus, "window": args.window,
                                                "end": args.end, "step_s": samples.step_s, "prices": args.prices or "built-in"})
    return 0
