"""``gpufleet top``: GPU allocation and use per node and per namespace (pure: build the view, render it).

Allocation comes from the API server: a pod's ``gpufleet.io/assignment`` when
the gpufleet scheduler placed it, else its ``nvidia.com/gpu`` / MIG requests
(a share counts as its milli-GPU fraction, a MIG slice as its share of the
GPU).  Use comes from metrics, as "GPUs busy": the sum of the exporter's
``DCGM_FI_DEV_GPU_UTIL`` over a node's or namespace's series divided by 100,
so allocated vs used compare in the same unit and shared GPUs are not double
counted.  Without metrics the USED columns show "-".
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from ..engine.errors import GpufleetError
from ..engine.model import Node
from .podjson import gpus_held


@dataclass(frozen=True)
class NodeRow:
    node: str
    model: str
    gpus: int
    unhealthy: int
    allocated: float  # GPUs
    used: float | None  # GPUs busy (sum of utilisation / 100)
    pods: int


@dataclass(frozen=True)
class NamespaceRow:
    namespace: str
    allocated: float
    used: float | None
    pods: int
    pending: int  # GPU pods waiting for a node


@dataclass
class TopView:
    nodes: list[NodeRow]
    namespaces: list[NamespaceRow]
    skipped: list[str] = field(default_factory=list)

    @property
    def total_gpus(self) -> int:
        return sum(n.gpus for n in self.nodes)

    @property
    def total_allocated(self) -> float:
        return sum(n.allocated for n in self.nodes)


def build_view(nodes: Sequence[Node], pods: Sequence[Mapping[str, Any]], used_by_node: Mapping[str, float] | None = None,
               used_by_namespace: Mapping[str, float] | None = None) -> TopView:
    """Nodes (engine model, already converted) + Pod JSON + optional 'GPUs busy' maps -> the view."""
    alloc: dict[str, float] = {}
    npods: dict[str, int] = {}
    ns_alloc: dict[str, float] = {}
    ns_pods: dict[str, int] = {}
    ns_pending: dict[str, int] = {}
    skipped: list[str] = []
    gpu_total_mib = {(n.name, g.index): g.memory_mib for n in nodes for g in n.gpus}
    for p in pods:
        status = p.get("status") or {}
        if status.get("phase") in ("Succeeded", "Failed"):
            continue
        try:
            g = gpus_held(p, gpu_total_mib)
        except GpufleetError as exc:
            skipped.append(str(exc))
            continue
        if g <= 0:
            continue
        ns = (p.get("metadata") or {}).get("namespace") or "default"
        node = (p.get("spec") or {}).get("nodeName")
        if not node:
            ns_pending[ns] = ns_pending.get(ns, 0) + 1
            continue
        alloc[node] = alloc.get(node, 0.0) + g
        npods[node] = npods.get(node, 0) + 1
        ns_alloc[ns] = ns_alloc.get(ns, 0.0) + g
        ns_pods[ns] = ns_pods.get(ns, 0) + 1
    rows = []
    for n in nodes:
        if not n.gpus:
            continue
        models = sorted({g.model for g in n.gpus})
        rows.append(NodeRow(n.name, "/".join(models), len(n.gpus), sum(1 for g in n.gpus if not g.healthy),
                            round(alloc.get(n.name, 0.0), 3), None if used_by_node is None else round(used_by_node.get(n.name, 0.0), 3),
                            npods.get(n.name, 0)))
    rows.sort(key=lambda r: r.node)
    nss = []
    for ns in sorted(set(ns_alloc) | set(ns_pending)):
        nss.append(NamespaceRow(ns, round(ns_alloc.get(ns, 0.0), 3),
                                None if used_by_namespace is None else round(used_by_namespace.get(ns, 0.0), 3),
                                ns_pods.get(ns, 0), ns_pending.get(ns, 0)))
    nss.sort(key=lambda r: (-r.allocated, r.namespace))
    return TopView(rows, nss, skipped)


def bar(frac: float, width: int = 20) -> str:
    n = max(0, min(width, round(frac * width)))
    return "#" * n + "." * (width - n)


def _pct(num: float | None, den: float) -> str:
    if num is None:
        return "    -"
    return f"{100.0 * num / den:4.0f}%" if den > 0 else "    -"


def _used(u: float | None) -> str:
    return f"{u:6.2f}" if u is not None else "     -"


def render(view: TopView, max_rows: int | None = None) -> str:
    """Two tables: nodes (allocated bar, used) and namespaces; totals; at most ``max_rows`` rows each."""
    lines = [f"{'NODE':<28} {'MODEL':<24} {'GPUS':>4} {'BAD':>3}  {'ALLOCATED':<20} {'ALLOC':>6} {'USED':>6} {'UTIL':>5} {'PODS':>4}"]
    for r in view.nodes[:max_rows]:
        frac = r.allocated / r.gpus if r.gpus else 0.0
        lines.append(f"{r.node[:28]:<28} {r.model[:24]:<24} {r.gpus:>4} {r.unhealthy or '':>3}  {bar(frac)} "
                     f"{r.allocated:6.2f} {_used(r.used)} {_pct(r.used, r.allocated)} {r.pods:>4}")
    if max_rows is not None and len(view.nodes) > max_rows:
        lines.append(f"... {len(view.nodes) - max_rows} more node(s)")
    tot, al = view.total_gpus, view.total_allocated
    used_n = [r.used for r in view.nodes if r.used is not None]
    used = sum(used_n) if used_n and len(used_n) == len(view.nodes) else None
    bad = sum(r.unhealthy for r in view.nodes)
    lines.append(f"{'TOTAL':<28} {'':<24} {tot:>4} {bad or '':>3}  {bar(al / tot if tot else 0.0)} {al:6.2f} {_used(used)} "
                 f"{_pct(used, al)} {sum(r.pods for r in view.nodes):>4}")
    lines.append(f"allocated {100.0 * al / tot if tot else 0.0:.1f}% of {tot} GPUs"
                 + (f", busy {100.0 * used / tot:.1f}%" if used is not None and tot else "")
                 + (f", {bad} unhealthy" if bad else ""))
    lines.append("")
    lines.append(f"{'NAMESPACE':<28} {'ALLOC':>6} {'USED':>6} {'UTIL':>5} {'PODS':>4} {'PENDING':>7}")
    for ns in view.namespaces[:max_rows]:
        lines.append(f"{ns.namespace[:28]:<28} {ns.allocated:6.2f} {_used(ns.used)} {_pct(ns.used, ns.allocated)} {ns.pods:>4} "
                     f"{ns.pending or '':>7}")
    if max_rows is not None and len(view.namespaces) > max_rows:
        lines.append(f"... {len(view.namespaces) - max_rows} more namespace(s)")
    for s in view.skipped[:5]:
        lines.append(f"skipped: {s}")
    return "\n".join(lines)
