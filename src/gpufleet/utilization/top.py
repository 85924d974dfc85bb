"""``gpufleet top`` rendering: GPU allocation and utilisation per node and per namespace (pure)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class NodeRow:
    node: str
    model: str
    gpus: int
    allocated_milli: int
    util_pct: float | None


def bar(frac: float, width: int = 20) -> str:
    n = max(0, min(width, round(frac * width)))
    return "#" * n + "." * (width - n)


def render(nodes: list[NodeRow], by_namespace: dict[str, tuple[float, float | None]]) -> str:
    lines = [f"{'NODE':<24} {'MODEL':<24} {'GPUS':>4}  {'ALLOCATED':<28} {'UTIL':>5}"]
    tot_g = sum(n.gpus for n in nodes)
    tot_a = sum(n.allocated_milli for n in nodes)
    for n in sorted(nodes, key=lambda n: n.node):
        frac = n.allocated_milli / (n.gpus * 1000) if n.gpus else 0.0
        u = f"{n.util_pct:4.0f}%" if n.util_pct is not None else "    -"
        lines.append(f"{n.node:<24} {n.model[:24]:<24} {n.gpus:>4}  {bar(frac)} {frac * 100:5.1f}% {u}")
    lines.append(f"{'TOTAL':<24} {'':<24} {tot_g:>4}  {bar(tot_a / (tot_g * 1000) if tot_g else 0)} "
                 f"{(tot_a / (tot_g * 1000) * 100 if tot_g else 0):5.1f}%")
    lines.append("")
    lines.append(f"{'NAMESPACE':<24} {'GPUS':>7} {'UTIL':>6}")
    for ns, (g, u) in sorted(by_namespace.items(), key=lambda kv: -kv[1][0]):
        lines.append(f"{ns:<24} {g:>7.2f} {(f'{u:5.0f}%' if u is not None else '     -')}")
    return "\n".join(lines)
