"""Idle-GPU reclaim: which pods hold GPUs they do not use, and what to do about it.

The most common waste in a shared GPU cluster is a GPU that is allocated and
idle (a notebook left open, a crashed loop that keeps its process).  This is
the decision core, pure and deterministic: given each pod's GPU utilisation
samples, its metadata, the PodDisruptionBudgets and a per-namespace policy, it
returns one ``Action`` per pod that needs one, each with a human reason.

Policies per namespace: ``report`` (log only), ``warn`` (an event and the
``gpufleet.io/idle-warning`` annotation, holding the time of the warning),
``evict`` (warn first; evict once the pod is still idle ``grace_s`` after the
warning, through the Eviction API so PodDisruptionBudgets hold).  A warned pod
that works again gets its warning cleared.

A pod is idle when its utilisation stayed at or under ``idle_util_pct`` for a
whole window: the trailing run of samples at or under the threshold, without
a gap longer than the window allows, is at least ``window_s`` long.  Missing or
stale data is never read as idle.

Protected whatever the policy: pods younger than the window, pods opting out
(``gpufleet.io/reclaim-opt-out: "true"``), pods at or above the protected
priority or in a protected priority class, DaemonSet pods (eviction would
bring them back on the same node), and pods whose PDB allows no disruption
now (counting the evictions this round already plans).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Sequence

from ..engine import annotations as ann
from ..engine.disruption import Budgets, PodDisruptionBudget, PodFacts
from ..engine.errors import ConfigError, InvalidPodSpec
from ..engine.podspec import pod_key
from .podjson import controller_of, created_s, gpus_held, parse_time

ACTIONS = ("report", "warn", "evict")
_TRUE = {"true", "yes", "1"}


@dataclass(frozen=True)
class NamespacePolicy:
    action: str = "report"  # report | warn | evict
    idle_util_pct: float = 5.0  # idle: every sample at or under this
    window_s: float = 3600.0
    grace_s: float = 1800.0  # warning -> eviction
    protect_priority: int = 1_000_000  # pods at or above are never touched
    protect_priority_classes: frozenset[str] = frozenset({"system-cluster-critical", "system-node-critical"})
    min_coverage: float = 0.8  # share of the window the samples must cover (longest gap allowed: the rest)

    @property
    def max_gap_s(self) -> float:
        return max(120.0, (1.0 - self.min_coverage) * self.window_s)


@dataclass(frozen=True)
class ReclaimConfig:
    namespaces: Mapping[str, NamespacePolicy] = field(default_factory=dict)
    default: NamespacePolicy = NamespacePolicy()

    def for_namespace(self, ns: str) -> NamespacePolicy:
        return self.namespaces.get(ns, self.default)

    def lookback_s(self) -> float:
        """How far back the utilisation source must reach for every policy."""
        pols = [self.default, *self.namespaces.values()]
        return max(p.window_s + p.grace_s for p in pols)


_DUR = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*$")


def parse_duration(where: str, raw: Any) -> float:
    """``90``, ``"90s"``, ``"30m"``, ``"1h"``, ``"1.5h"``, ``"2d"`` -> seconds."""
    if isinstance(raw, (int, float)) and not isinstance(raw, bool):
        if not 0 <= raw < float("inf"):  # negative, nan or inf
            raise ConfigError(f"{where}: must be a finite number >= 0, got {raw!r}")
        return float(raw)
    m = _DUR.match(str(raw)) if isinstance(raw, str) else None
    if not m:
        raise ConfigError(f"{where}: not a duration (e.g. 90, '90s', '30m', '1h'), got {raw!r}")
    return float(m.group(1)) * {"ms": 0.001, "s": 1, None: 1, "m": 60, "h": 3600, "d": 86400}[m.group(2)]


_POLICY_FIELDS = {
    "action", "idleUtilPercent", "window", "grace", "protectPriority", "protectPriorityClasses", "minCoverage",
}


def _policy(where: str, d: Any, base: NamespacePolicy) -> NamespacePolicy:
    if not isinstance(d, Mapping):
        raise ConfigError(f"{where}: must be a mapping, got {type(d).__name__}")
    unknown = set(d) - _POLICY_FIELDS
    if unknown:
        raise ConfigError(f"{where}: unknown field(s) {', '.join(sorted(map(str, unknown)))}; known: {', '.join(sorted(_POLICY_FIELDS))}")
    kw: dict[str, Any] = {}
    if "action" in d:
        if d["action"] not in ACTIONS:
            raise ConfigError(f"{where}.action: must be one of {', '.join(ACTIONS)}, got {d['action']!r}")
        kw["action"] = d["action"]
    if "idleUtilPercent" in d:
        v = d["idleUtilPercent"]
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v < 100:
            raise ConfigError(f"{where}.idleUtilPercent: must be a number 0..100, got {v!r}")
        kw["idle_util_pct"] = float(v)
    if "window" in d:
        kw["window_s"] = parse_duration(f"{where}.window", d["window"])
        if kw["window_s"] < 300:
            raise ConfigError(f"{where}.window: at least 5m, got {d['window']!r}")
    if "grace" in d:
        kw["grace_s"] = parse_duration(f"{where}.grace", d["grace"])
    if "protectPriority" in d:
        v = d["protectPriority"]
        if isinstance(v, bool) or not isinstance(v, int):
            raise ConfigError(f"{where}.protectPriority: must be an integer, got {v!r}")
        kw["protect_priority"] = v
    if "protectPriorityClasses" in d:
        v = d["protectPriorityClasses"]
        if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
            raise ConfigError(f"{where}.protectPriorityClasses: must be a list of names, got {v!r}")
        kw["protect_priority_classes"] = frozenset(v)
    if "minCoverage" in d:
        v = d["minCoverage"]
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v <= 1:
            raise ConfigError(f"{where}.minCoverage: must be in (0, 1], got {v!r}")
        kw["min_coverage"] = float(v)
    from dataclasses import replace

    return replace(base, **kw)


def load_config(doc: Any) -> ReclaimConfig:
    """Policy file (YAML/JSON already parsed)::

        default: {action: report, idleUtilPercent: 5, window: 1h}
        namespaces:
          research: {action: warn}
          batch: {action: evict, window: 2h, grace: 30m}

    Namespace entries start from ``default``.  Raises ``ConfigError`` naming the field.
    """
    if doc is None:
        return ReclaimConfig()
    if not isinstance(doc, Mapping):
        raise ConfigError(f"reclaim policy: must be a mapping with 'default' and/or 'namespaces', got {type(doc).__name__}")
    unknown = set(doc) - {"default", "namespaces"}
    if unknown:
        raise ConfigError(f"reclaim policy: unknown top-level field(s) {', '.join(sorted(map(str, unknown)))}; known: default, namespaces")
    default = _policy("default", doc.get("default") or {}, NamespacePolicy())
    nss = doc.get("namespaces") or {}
    if not isinstance(nss, Mapping):
        raise ConfigError("namespaces: must be a mapping namespace -> policy")
    return ReclaimConfig({str(ns): _policy(f"namespaces.{ns}", p, default) for ns, p in nss.items()}, default)


# --- inputs -----------------------------------------------------------------------------


@dataclass(frozen=True)
class PodInfo:
    namespace: str
    name: str
    gpus: float  # GPUs held (fractional for shares and MIG slices)
    created_s: float
    priority: int = 0
    priority_class: str = ""
    owner_kind: str = ""  # controller kind ("" for a bare pod)
    owner_name: str = ""
    labels: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)
    ready: bool = True  # the Ready condition: a pod that is not may be evicted without spending a disruption

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    def facts(self) -> PodFacts:
        return PodFacts(self.namespace, self.name, self.labels, "Running", self.ready)


def pod_info_from_json(pod: Mapping[str, Any]) -> PodInfo | None:
    """A running GPU pod as the decision needs it; None for pods without GPUs.  Raises InvalidPodSpec."""
    key = pod_key(pod)
    meta = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    gpus = gpus_held(pod)
    if gpus <= 0:
        return None
    prio = spec.get("priority") or 0
    if isinstance(prio, bool) or not isinstance(prio, int):
        raise InvalidPodSpec(key, "spec.priority", f"must be an integer, got {prio!r}")
    owner = controller_of(pod) or ("", "")
    return PodInfo(meta.get("namespace") or "default", meta.get("name") or "<unnamed>", gpus, created_s(pod), prio,
                   spec.get("priorityClassName") or "", owner[0], owner[1], dict(meta.get("labels") or {}),
                   dict(meta.get("annotations") or {}), PodFacts.from_pod(pod).ready)


# --- decision ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Action:
    pod: str  # namespace/name
    action: str  # report | warn | evict | clear | protect
    reason: str
    gpus: float = 0.0
    idle_s: float = 0.0  # how long the pod has been idle (0 when not idle)

    @property
    def namespace(self) -> str:
        return self.pod.split("/", 1)[0]

    @property
    def gpu_hours(self) -> float:
        """GPU-hours the pod has sat idle: what evicting it returns to the cluster, at least."""
        return round(self.gpus * self.idle_s / 3600.0, 3)


@dataclass(frozen=True)
class IdleRun:
    idle_s: float  # trailing time at or under the threshold (0: busy now)
    peak_pct: float  # highest sample in that run
    stopped_by: str  # "busy" | "gap" | "start" (data begins) | "stale" | "none"
    last_busy_pct: float = 0.0


def idle_run(now_s: float, samples: Sequence[tuple[float, float]], threshold_pct: float, max_gap_s: float) -> IdleRun:
    """The trailing idle run of ``samples`` (timestamp_s, util_pct), newest last after sorting."""
    pts = sorted((t, v) for t, v in samples if t <= now_s and not math.isnan(v))
    if not pts:
        return IdleRun(0.0, 0.0, "none")
    if now_s - pts[-1][0] > max_gap_s:
        return IdleRun(0.0, 0.0, "stale")
    start, peak, why, busy = pts[-1][0], -1.0, "start", 0.0
    nxt = None
    for t, v in reversed(pts):
        if nxt is not None and nxt - t > max_gap_s:
            why = "gap"
            break
        if v > threshold_pct:
            why, busy = "busy", v
            break
        start, peak, nxt = t, max(peak, v), t
    if peak < 0:  # the newest sample is busy
        return IdleRun(0.0, 0.0, "busy", busy)
    return IdleRun(now_s - start, peak, why, busy)


def _fmt(s: float) -> str:
    if s >= 3600:
        h, m = divmod(int(round(s / 60)), 60)
        return f"{h}h{m:02d}m"
    return f"{int(round(s / 60))}m"


def _truthy(v: Any) -> bool:
    return str(v).strip().lower() in _TRUE


def decide(now_s: float, pods: Iterable[PodInfo], util: Mapping[str, Sequence[tuple[float, float]]],
           config: ReclaimConfig | Mapping[str, NamespacePolicy],
           pdbs: Iterable[PodDisruptionBudget] = ()) -> list[Action]:
    """One action per pod that needs one (busy pods with nothing to clear need none), in pod-key order.

    ``util`` maps ``namespace/pod`` to ``[(timestamp_s, gpu_util_pct)]``; for a
    multi-GPU pod, its busiest GPU per timestamp.
    """
    if not isinstance(config, ReclaimConfig):
        config = ReclaimConfig(dict(config))
    pods = sorted(pods, key=lambda p: p.key)
    budgets = Budgets(tuple(pdbs), {p.key: p.facts() for p in pods})
    planned: list[str] = []  # evictions this round already plans: they spend the same budgets
    out: list[Action] = []
    for p in pods:
        key = p.key
        pol = config.for_namespace(p.namespace)
        warned_raw = p.annotations.get(ann.IDLE_WARNING)

        def act(kind: str, reason: str, idle_s: float = 0.0, key: str = key, gpus: float = p.gpus) -> None:
            out.append(Action(key, kind, reason, gpus, idle_s))

        if _truthy(p.annotations.get(ann.RECLAIM_OPT_OUT, "")):
            act("protect", f"opted out ({ann.RECLAIM_OPT_OUT})")
            continue
        age = now_s - p.created_s
        if age < pol.window_s:
            act("protect", f"younger ({_fmt(age)}) than the {_fmt(pol.window_s)} window")
            continue
        if p.priority >= pol.protect_priority:
            act("protect", f"priority {p.priority} >= protected {pol.protect_priority}")
            continue
        if p.priority_class and p.priority_class in pol.protect_priority_classes:
            act("protect", f"priority class {p.priority_class} is protected")
            continue
        if p.owner_kind == "DaemonSet":
            act("protect", f"owned by DaemonSet {p.owner_name}: eviction would bring it back on the same node")
            continue
        run = idle_run(now_s, util.get(key, ()), pol.idle_util_pct, pol.max_gap_s)
        idle_s = min(run.idle_s, age)
        if idle_s < pol.window_s:
            if run.stopped_by == "none":
                act("protect", "no utilisation data for this pod")
            elif run.stopped_by == "stale":
                act("protect", "utilisation data is stale (no sample in the last "
                    f"{_fmt(pol.max_gap_s)}): the exporter or Prometheus may be down")
            elif run.stopped_by in ("gap", "start") and idle_s > 0:
                act("protect", f"idle for {_fmt(idle_s)} but the data before that has a gap or ends: not enough "
                    f"data to cover the {_fmt(pol.window_s)} window")
            elif warned_raw is not None and pol.action in ("warn", "evict"):
                act("clear", f"busy again (GPU utilisation {run.last_busy_pct:.0f}% > {pol.idle_util_pct:g}%): warning withdrawn")
            continue

        what = (f"GPU utilisation <= {pol.idle_util_pct:g}% for {_fmt(idle_s)} (window {_fmt(pol.window_s)}, "
                f"peak {run.peak_pct:.1f}%), holding {p.gpus:g} GPU")
        if pol.action == "report":
            act("report", what, idle_s)
            continue
        warned_at = None
        if warned_raw is not None:
            try:
                warned_at = parse_time(key, f"metadata.annotations[{ann.IDLE_WARNING}]", warned_raw)
            except InvalidPodSpec:
                warned_at = None  # unreadable: warn again, which rewrites it
        # a warning from before this idle run belongs to an earlier episode
        if warned_at is not None and (warned_at < now_s - idle_s or warned_at > now_s):
            warned_at = None
        if warned_at is None:
            tail = f"; eviction after a {_fmt(pol.grace_s)} grace period" if pol.action == "evict" else ""
            act("warn", what + tail, idle_s)
            continue
        since = now_s - warned_at
        if pol.action == "warn":
            act("report", what + f"; warned {_fmt(since)} ago", idle_s)
            continue
        if since < pol.grace_s:
            act("report", what + f"; warned {_fmt(since)} ago, eviction in {_fmt(pol.grace_s - since)}", idle_s)
            continue
        broken = budgets.check([*planned, key])
        if broken:
            act("protect", f"idle, but {broken} with this round's evictions (idle {_fmt(idle_s)}, "
                f"holding {p.gpus:g} GPU)", idle_s)
            continue
        planned.append(key)
        tail = f"; warned {_fmt(since)} ago"
        if not p.owner_kind:
            tail += "; bare pod: nothing will recreate it"
        act("evict", what + tail, idle_s)
    return out


def summarize(actions: Sequence[Action]) -> dict[str, float]:
    """Counts per action, GPUs and idle GPU-hours of what is evicted or flagged."""
    s: dict[str, float] = {a: 0 for a in ("report", "warn", "evict", "clear", "protect")}
    for a in actions:
        s[a.action] += 1
    s["gpus_evicted"] = round(sum(a.gpus for a in actions if a.action == "evict"), 3)
    s["gpu_hours_returned"] = round(sum(a.gpu_hours for a in actions if a.action == "evict"), 3)
    s["gpu_hours_idle_flagged"] = round(sum(a.gpu_hours for a in actions if a.action in ("report", "warn", "evict")), 3)
    return s
