"""GPU cost by namespace, team queue, workload and pod: allocated, used and idle GPU-hours and what they cost.

The model is OpenCost's allocation model narrowed to GPUs.  Every sample (one step of ``step_s`` seconds) of
every GPU the agents report (``gpufleet_gpu_info``) is one GPU-step of capacity at that GPU's price (per the
price file, by node, instance type, model; spot or on-demand by its node's labels).  The pods holding the GPU
(``gpufleet_pod_gpu_allocated``: their shares ``a_i``, summing to ``S``) are charged ``a_i x price``; what no pod
holds (``1 - S``) is the cluster's *unallocated* cost.  A GPU held more than once over (``S > 1``: pods time-sliced
on it without gpufleet shares each count as holding all of it) is split among its holders in proportion,
``a_i / S``, so no GPU is charged more than once; such GPU-hours are reported as *oversubscribed*.  A holder's *use* is its own utilisation series
(``DCGM_FI_DEV_GPU_UTIL`` / 100, per the agent's per-process attribution on shared GPUs) plus its share
``a_i / S`` of the GPU's utilisation that no holder's process explains, capped at ``a_i``; its *idle* GPU-hours
are ``a_i`` minus that, and its idle cost is those at the GPU's price.  So on a shared GPU each holder's idle
part is its own unused share, and what the device is seen doing without an owner is split by share.

The numbers add up by construction, and ``check_identities`` proves it on every report: per pod, used + idle =
allocated and idle cost <= cost; a namespace's (queue's, workload's) figures are the sums over its pods; the
cluster's allocated GPU-hours are the sum over its GPUs of what their holders held, and capacity =
allocated + unallocated.  A GPU-step whose price is unknown is counted as
*unpriced* (its GPU-hours shown, its cost unknown, never zero); ``compute`` refuses such a report unless
``allow_unpriced``.
"""

from __future__ import annotations

import csv
import io
import json
import math
from dataclasses import asdict, dataclass, field
from typing import Any, Iterable, Mapping, Sequence

from ..engine.errors import ConfigError, GpufleetError
from ..engine.prices import PriceBook, parse_prices_text

Q_INFO = "max by (Hostname, gpu, modelName, node, instance_type, capacity_type) (gpufleet_gpu_info)"
Q_ALLOC = "sum by (Hostname, gpu, modelName, namespace, pod, queue, workload_kind, workload) (gpufleet_pod_gpu_allocated)"
Q_UTIL = "sum by (Hostname, gpu, namespace, pod) (DCGM_FI_DEV_GPU_UTIL)"
QUERIES = {"info": Q_INFO, "allocated": Q_ALLOC, "util": Q_UTIL}
LEVELS = ("namespace", "queue", "workload", "pod")
NO_QUEUE = "-"


def load_prices(path: str | None) -> PriceBook:
    """The user's price file (``engine.prices``), or the built-in list prices alone when ``path`` is None."""
    if path is None:
        return PriceBook()
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"price file {path}: {getattr(exc, 'strerror', None) or exc}") from None
    return parse_prices_text(text, str(path))


class NoData(GpufleetError):
    """The window holds no GPU samples (bad input: the flag that chose the window is named)."""

    exit_code = 2


Matrix = list[tuple[dict[str, str], list[tuple[float, float]]]]


def parse_matrix(doc: Any, what: str) -> Matrix:
    """A Prometheus query_range answer (or its ``data.result`` list) -> [(labels, [(t, v)])]."""
    if isinstance(doc, Mapping) and "status" in doc:
        if doc.get("status") != "success":
            raise ConfigError(f"{what}: Prometheus answered {doc.get('error') or doc.get('status')!r}")
        doc = (doc.get("data") or {}).get("result")
    if not isinstance(doc, list):
        raise ConfigError(f"{what}: expected a list of series (Prometheus matrix), got {type(doc).__name__}")
    out: Matrix = []
    for i, s in enumerate(doc):
        if not isinstance(s, Mapping) or not isinstance(s.get("metric"), Mapping) or not isinstance(s.get("values"), list):
            raise ConfigError(f"{what}[{i}]: a series needs 'metric' and 'values'")
        pts = []
        for j, pair in enumerate(s["values"]):
            try:
                t, v = float(pair[0]), float(pair[1])
            except (TypeError, ValueError, IndexError):
                raise ConfigError(f"{what}[{i}].values[{j}]: not a [time, value] pair: {pair!r}") from None
            if math.isfinite(v):
                pts.append((t, v))
        out.append(({str(k): str(v) for k, v in s["metric"].items()}, pts))
    return out


@dataclass
class Samples:
    """What the cost is computed from: the three queries over one window, one step."""

    start_s: float
    end_s: float
    step_s: float
    info: Matrix = field(default_factory=list)
    allocated: Matrix = field(default_factory=list)
    util: Matrix = field(default_factory=list)

    def to_json(self) -> dict:
        def m(x: Matrix) -> list:
            return [{"metric": lab, "values": [[t, repr(v)] for t, v in pts]} for lab, pts in x]

        return {"version": 1, "start_s": self.start_s, "end_s": self.end_s, "step_s": self.step_s,
                "queries": QUERIES, "info": m(self.info), "allocated": m(self.allocated), "util": m(self.util)}

    @classmethod
    def from_json(cls, doc: Any, origin: str) -> "Samples":
        if not isinstance(doc, Mapping):
            raise ConfigError(f"{origin}: must be a JSON object (written by gpufleet cost --save-samples)")
        for k in ("start_s", "end_s", "step_s", "info", "allocated", "util"):
            if k not in doc:
                raise ConfigError(f"{origin}: missing key {k!r}")
        try:
            start, end, step = float(doc["start_s"]), float(doc["end_s"]), float(doc["step_s"])
        except (TypeError, ValueError):
            raise ConfigError(f"{origin}: start_s, end_s and step_s must be numbers") from None
        if not (math.isfinite(start) and math.isfinite(end) and step > 0 and end > start):
            raise ConfigError(f"{origin}: needs start_s < end_s and step_s > 0")
        return cls(start, end, step, parse_matrix(doc["info"], f"{origin}: info"),
                   parse_matrix(doc["allocated"], f"{origin}: allocated"), parse_matrix(doc["util"], f"{origin}: util"))


@dataclass
class Figures:
    allocated_gpu_h: float = 0.0
    used_gpu_h: float = 0.0
    idle_gpu_h: float = 0.0
    spot_gpu_h: float = 0.0
    cost: float = 0.0
    idle_cost: float = 0.0
    unpriced_gpu_h: float = 0.0  # allocated GPU-hours whose price is unknown (their cost is not in ``cost``)

    def add(self, o: "Figures") -> None:
        for k in asdict(self):
            setattr(self, k, getattr(self, k) + getattr(o, k))


@dataclass
class Row:
    level: str
    key: str
    namespace: str
    queue: str
    figures: Figures
    workload: str = ""

    def to_json(self, currency: str) -> dict:
        f = self.figures
        priced = f.unpriced_gpu_h == 0
        return {"level": self.level, "key": self.key, "namespace": self.namespace, "queue": self.queue,
                "allocated_gpu_hours": round(f.allocated_gpu_h, 6), "used_gpu_hours": round(f.used_gpu_h, 6),
                "idle_gpu_hours": round(f.idle_gpu_h, 6), "spot_gpu_hours": round(f.spot_gpu_h, 6),
                "cost": round(f.cost, 6) if priced else None, "idle_cost": round(f.idle_cost, 6) if priced else None,
                "priced_cost": round(f.cost, 6), "unpriced_gpu_hours": round(f.unpriced_gpu_h, 6), "currency": currency}


@dataclass
class Cluster:
    capacity_gpu_h: float = 0.0
    allocated_gpu_h: float = 0.0
    unallocated_gpu_h: float = 0.0
    oversubscribed_gpu_h: float = 0.0  # GPU-hours of GPUs whose holders' shares summed to more than 1 (split in proportion)
    capacity_cost: float = 0.0
    allocated_cost: float = 0.0
    unallocated_cost: float = 0.0
    unpriced_gpu_h: float = 0.0
    spot_gpu_h: float = 0.0
    gpus: int = 0
    samples: int = 0  # GPU-steps seen
    steps_with_data: int = 0
    steps_in_window: int = 0


@dataclass
class Report:
    start_s: float
    end_s: float
    step_s: float
    currency: str
    cluster: Cluster
    pods: dict[str, Row]
    rows: dict[str, list[Row]]  # level -> rows, largest cost first
    unpriced: list[str]  # what is missing from the price file (one line each)
    price_sources: dict[str, str]  # GPU kind -> where its price came from

    def to_json(self) -> dict:
        return {"window": {"start_s": self.start_s, "end_s": self.end_s, "step_s": self.step_s},
                "currency": self.currency, "cluster": asdict(self.cluster),
                "rows": {lv: [r.to_json(self.currency) for r in rs] for lv, rs in self.rows.items()},
                "unpriced": self.unpriced, "price_sources": self.price_sources}


def _grid(s: Samples) -> list[float]:
    ts = sorted({t for m in (s.info, s.allocated, s.util) for _, pts in m for t, _ in pts if s.start_s < t <= s.end_s + 1e-6})
    return ts


def compute(s: Samples, prices: PriceBook, allow_unpriced: bool = False, window_flag: str = "--window") -> Report:
    """Samples + prices -> Report (see the module docstring).  NoData when the window has no GPU samples;
    ConfigError naming the price file and the missing entry when a GPU's price is unknown (unless allowed)."""
    dt_h = s.step_s / 3600.0
    info: dict[tuple[str, str], dict[float, dict[str, str]]] = {}
    for lab, pts in s.info:
        d = info.setdefault((lab.get("Hostname", ""), lab.get("gpu", "")), {})
        for t, _ in pts:
            d[t] = lab
    if not info:
        raise NoData(f"{window_flag}: no GPU samples (gpufleet_gpu_info) between {_when(s.start_s)} and {_when(s.end_s)}; "
                     "is the gpufleet agent scraped, and is the window right?")
    alloc: dict[tuple[str, str], dict[float, list[tuple[dict[str, str], float]]]] = {}
    for lab, pts in s.allocated:
        if not lab.get("pod"):
            continue
        d2 = alloc.setdefault((lab.get("Hostname", ""), lab.get("gpu", "")), {})
        for t, v in pts:
            if v > 0:
                d2.setdefault(t, []).append((lab, v))
    util: dict[tuple[str, str], dict[float, dict[tuple[str, str], float]]] = {}
    for lab, pts in s.util:
        d3 = util.setdefault((lab.get("Hostname", ""), lab.get("gpu", "")), {})
        who = (lab.get("namespace", ""), lab.get("pod", ""))
        for t, v in pts:
            d3.setdefault(t, {})[who] = d3.setdefault(t, {}).get(who, 0.0) + max(0.0, v) / 100.0

    cl = Cluster(gpus=len(info))
    grid = _grid(s)
    cl.steps_in_window = max(1, int(round((s.end_s - s.start_s) / s.step_s)))
    cl.steps_with_data = len({t for d in info.values() for t in d})
    pods: dict[str, Row] = {}
    missing: dict[str, str] = {}
    sources: dict[str, str] = {}
    price_cache: dict[tuple, float | None] = {}
    for gkey in sorted(set(info) | set(alloc)):
        seen = info.get(gkey, {})
        last: dict[str, str] | None = None
        for t in grid:
            holders = alloc.get(gkey, {}).get(t, [])
            gl = seen.get(t) or last or (next(iter(seen.values())) if seen else None)
            if seen.get(t) is None and not holders:
                continue
            last = gl if gl is not None else last
            if gl is None:  # held, but the agent never said what the GPU is: its capacity type and price are unknown
                gl = {**holders[0][0], "capacity_type": "unknown"}
            spot = gl.get("capacity_type") == "spot"
            pk = (gl.get("node") or gl.get("Hostname", ""), gl.get("instance_type", ""), gl.get("modelName", ""), spot)
            if pk not in price_cache:
                kind = f"{pk[2]} on {pk[1] or 'node ' + pk[0]} ({'spot' if spot else 'on-demand'})"
                if gl.get("capacity_type") == "unknown":
                    price_cache[pk] = None
                    missing[f"GPU {gkey[1]} of {gkey[0]}"] = "no gpufleet_gpu_info sample (capacity type unknown)"
                else:
                    pr = prices.price(*pk)
                    price_cache[pk] = pr.per_gpu_hour
                    if pr.per_gpu_hour is None:
                        missing[kind] = pr.source
                    else:
                        sources[kind] = f"{pr.per_gpu_hour:g} {prices.currency}/GPU-hour from {pr.source}"
            price = price_cache[pk]
            # a GPU-step with holders counts as capacity even if its info sample is missing (a scrape lost)
            cl.samples += 1
            cl.capacity_gpu_h += dt_h
            cl.spot_gpu_h += dt_h if spot else 0.0
            raw = sum(v for _, v in holders)
            scale = 1.0 / raw if raw > 1.0 else 1.0  # held more than once over: split in proportion
            total = raw * scale
            free = max(0.0, 1.0 - total)
            cl.unallocated_gpu_h += free * dt_h
            cl.oversubscribed_gpu_h += dt_h if raw > 1.0 + 1e-9 else 0.0
            if price is None:
                cl.unpriced_gpu_h += dt_h
            else:
                cl.capacity_cost += price * dt_h
                cl.unallocated_cost += free * price * dt_h
            used = util.get(gkey, {}).get(t, {})
            rest = used.get(("", ""), 0.0) if total > 0 else 0.0
            for hl, a_raw in holders:
                a = a_raw * scale
                ns, pod = hl.get("namespace", ""), hl.get("pod", "")
                u = used.get((ns, pod), 0.0) + rest * a / total
                u = min(u, a)
                key = f"{ns}/{pod}"
                row = pods.get(key)
                if row is None:
                    row = pods[key] = Row("pod", key, ns, hl.get("queue") or NO_QUEUE, Figures(),
                                          f"{ns}/{hl.get('workload_kind') or 'Pod'}/{hl.get('workload') or pod}")
                f = row.figures
                f.allocated_gpu_h += a * dt_h
                f.used_gpu_h += u * dt_h
                f.idle_gpu_h += (a - u) * dt_h
                f.spot_gpu_h += a * dt_h if spot else 0.0
                cl.allocated_gpu_h += a * dt_h
                if price is None:
                    f.unpriced_gpu_h += a * dt_h
                else:
                    f.cost += a * price * dt_h
                    f.idle_cost += (a - u) * price * dt_h
                    cl.allocated_cost += a * price * dt_h
    if missing and not allow_unpriced:
        kind, why = next(iter(sorted(missing.items())))
        more = f" (and {len(missing) - 1} more GPU kind(s))" if len(missing) > 1 else ""
        raise ConfigError(f"{why}: GPUs {kind} have no price{more}; add it to the price file (docs/cost.md), "
                          "or --allow-unpriced to report their cost as unknown")
    rows = {"pod": sorted(pods.values(), key=_order)}
    for level in ("namespace", "queue", "workload"):
        groups: dict[str, Row] = {}
        for r in pods.values():
            k = _group_key(r, level)
            g = groups.get(k)
            if g is None:
                g = groups[k] = Row(level, k, r.namespace if level != "queue" else "", r.queue if level != "namespace" else "",
                                    Figures())
            g.figures.add(r.figures)
        rows[level] = sorted(groups.values(), key=_order)
    return Report(s.start_s, s.end_s, s.step_s, prices.currency, cl, pods, rows,
                  [f"{k}: {v}" for k, v in sorted(missing.items())], dict(sorted(sources.items())))


def _group_key(r: Row, level: str) -> str:
    return r.namespace if level == "namespace" else r.queue if level == "queue" else r.workload if level == "workload" else r.key


def _order(r: Row) -> tuple:
    return (-r.figures.cost, -r.figures.allocated_gpu_h, r.key)


def _when(t: float) -> str:
    import datetime as _dt

    return _dt.datetime.fromtimestamp(t, _dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def check_identities(r: Report, rel: float = 1e-9) -> list[str]:
    """Every way the numbers must add up; returns what does not (empty: all hold)."""
    bad = []

    def close(a: float, b: float) -> bool:
        return abs(a - b) <= rel * max(1.0, abs(a), abs(b))

    for p in r.pods.values():
        f = p.figures
        if not close(f.used_gpu_h + f.idle_gpu_h, f.allocated_gpu_h):
            bad.append(f"pod {p.key}: used + idle != allocated")
        if f.idle_cost > f.cost + rel * max(1.0, f.cost) or f.used_gpu_h < -rel or f.idle_gpu_h < -rel:
            bad.append(f"pod {p.key}: idle cost above cost, or a negative figure")
    for level in ("namespace", "queue", "workload"):
        for g in r.rows[level]:
            members = [p for p in r.pods.values() if _group_key(p, level) == g.key]
            for k in ("allocated_gpu_h", "used_gpu_h", "idle_gpu_h", "cost", "idle_cost", "unpriced_gpu_h"):
                if not close(getattr(g.figures, k), math.fsum(getattr(p.figures, k) for p in members)):
                    bad.append(f"{level} {g.key}: {k} is not the sum over its pods")
        for k in ("allocated_gpu_h", "cost"):
            if not close(math.fsum(getattr(g.figures, k) for g in r.rows[level]), math.fsum(getattr(p.figures, k) for p in r.pods.values())):
                bad.append(f"{level}s together: {k} is not the pods' total")
    c = r.cluster
    if not close(c.allocated_gpu_h, math.fsum(p.figures.allocated_gpu_h for p in r.pods.values())):
        bad.append("cluster: allocated GPU-hours are not the sum over its pods")
    if not close(c.capacity_gpu_h, c.allocated_gpu_h + c.unallocated_gpu_h):
        bad.append("cluster: capacity != allocated + unallocated")
    if c.unpriced_gpu_h == 0 and not close(c.capacity_cost, c.allocated_cost + c.unallocated_cost):
        bad.append("cluster: capacity cost != allocated + unallocated cost")
    return bad


# --- output ---------------------------------------------------------------------------------------

COLUMNS = ("allocated GPU-h", "used GPU-h", "idle GPU-h", "cost", "idle cost", "spot GPU-h")


def _money(v: float | None) -> str:
    return "unknown" if v is None else f"{v:,.2f}"


def _cells(f: Figures) -> list[str]:
    unknown = f.unpriced_gpu_h > 0
    return [f"{f.allocated_gpu_h:.3f}", f"{f.used_gpu_h:.3f}", f"{f.idle_gpu_h:.3f}",
            _money(None if unknown else f.cost), _money(None if unknown else f.idle_cost), f"{f.spot_gpu_h:.3f}"]


def render_table(r: Report, levels: Sequence[str] = ("namespace", "queue", "workload"), top: int = 0) -> str:
    c = r.cluster
    out = [f"GPU cost {_when(r.start_s)} .. {_when(r.end_s)} (step {r.step_s:g} s), {r.currency}; "
           f"{c.gpus} GPU(s), data in {c.steps_with_data} of {c.steps_in_window} steps"]
    cap_cost = None if c.unpriced_gpu_h else c.capacity_cost
    out.append(f"cluster: capacity {c.capacity_gpu_h:.3f} GPU-h ({_money(cap_cost)}) = allocated {c.allocated_gpu_h:.3f} "
               f"({_money(None if c.unpriced_gpu_h else c.allocated_cost)}) + unallocated {c.unallocated_gpu_h:.3f} "
               f"({_money(None if c.unpriced_gpu_h else c.unallocated_cost)})"
               + (f"; {c.oversubscribed_gpu_h:.3f} GPU-h oversubscribed (split in proportion)" if c.oversubscribed_gpu_h else "")
               + (f"; spot {c.spot_gpu_h:.3f} GPU-h" if c.spot_gpu_h else ""))
    if c.unpriced_gpu_h:
        out.append(f"unpriced: {c.unpriced_gpu_h:.3f} GPU-h have no price, their cost is unknown: " + "; ".join(r.unpriced))
    for level in levels:
        rows = r.rows[level][: top or None]
        head = (level,) + COLUMNS
        body = [[row.key] + _cells(row.figures) for row in rows]
        total = Figures()
        for row in r.rows[level]:
            total.add(row.figures)
        body.append(["total"] + _cells(total))
        w = [max(len(str(x)) for x in col) for col in zip(head, *body)]
        out.append("")
        out.append("  ".join(h.ljust(w[0]) if i == 0 else h.rjust(w[i]) for i, h in enumerate(head)))
        for b in body:
            out.append("  ".join(x.ljust(w[0]) if i == 0 else x.rjust(w[i]) for i, x in enumerate(b)))
    return "\n".join(out)


def render_csv(r: Report, levels: Iterable[str] = LEVELS) -> str:
    buf = io.StringIO()
    w = csv.writer(buf)
    keys = ["level", "key", "namespace", "queue", "allocated_gpu_hours", "used_gpu_hours", "idle_gpu_hours",
            "spot_gpu_hours", "cost", "idle_cost", "unpriced_gpu_hours", "currency"]
    w.writerow(keys)
    for level in levels:
        for row in r.rows[level]:
            d = row.to_json(r.currency)
            w.writerow(["" if d[k] is None else d[k] for k in keys])
    return buf.getvalue()


def render_json(r: Report) -> str:
    return json.dumps(r.to_json(), indent=1)
