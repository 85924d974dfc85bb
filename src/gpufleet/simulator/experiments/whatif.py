"""Capacity what-ifs: the same workload on a cluster with nodes added or removed.

Spec grammar (``--what-if``, several allowed, applied left to right):

* ``+N`` ``x`` SHAPE / ``-N`` ``x`` SHAPE: add / remove N nodes of SHAPE;
* ``+P%`` / ``-P%``: add / remove P% of the nodes, spread over the node shapes in
  proportion (largest remainders), so the mix stays the same.

SHAPE is a GPU model, optionally with the GPUs per node: ``A100-80GB`` or
``8xA100-80GB`` (so ``+4x8xA100-80GB`` is four 8-GPU nodes).  A model the
cluster already has is added with the CPU and memory of its most common node of
that model (and its GPU count unless given); a model it lacks gets
``DEFAULT_NODE`` (8 GPUs, 96 cores, 768 GiB).  Removal takes the last-listed
nodes of that shape, deterministically.  Model names are matched like node
lists' (``gpu_models.lookup``): ``A100-80GB`` finds ``NVIDIA-A100-80GB-PCIe``.

Why the load stays relative to the original cluster: a what-if asks how the
*same* workload fares on another cluster, so ``--load`` is computed against the
reference cluster's GPUs and the arrival process is identical across what-ifs.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ...engine.errors import GpufleetError
from ...engine.gpu_models import MODELS, lookup
from ...engine.model import Gpu, Node

DEFAULT_NODE = {"gpus": 8, "cpu_milli": 96000, "memory_mib": 786432}
_SPEC = re.compile(r"^([+-])(?:(\d+(?:\.\d+)?)%|(\d+)x(?:(\d+)x)?([A-Za-z0-9][A-Za-z0-9_.-]*))$")


class WhatIfError(GpufleetError):
    pass


@dataclass(frozen=True)
class Change:
    sign: int
    count: int | None = None
    percent: float | None = None
    gpus_per_node: int | None = None
    model: str | None = None

    def __str__(self) -> str:
        s = "+" if self.sign > 0 else "-"
        if self.percent is not None:
            return f"{s}{self.percent:g}%"
        g = f"{self.gpus_per_node}x" if self.gpus_per_node else ""
        return f"{s}{self.count}x{g}{self.model}"


def parse(spec: str) -> Change:
    m = _SPEC.match(spec.strip())
    if not m:
        raise WhatIfError(f"--what-if {spec!r}: expected +Nx<model>, -Nx<model>, +Nx<gpus>x<model> or +P%/-P% "
                          f"(e.g. +8xA100-80GB, -10%)")
    sign = 1 if m.group(1) == "+" else -1
    if m.group(2) is not None:
        pct = float(m.group(2))
        if pct <= 0 or (sign < 0 and pct >= 100):
            raise WhatIfError(f"--what-if {spec!r}: the percentage must be > 0 (and < 100 to remove)")
        return Change(sign, percent=pct)
    n = int(m.group(3))
    g = int(m.group(4)) if m.group(4) else None
    if n <= 0 or (g is not None and not 1 <= g <= 16):
        raise WhatIfError(f"--what-if {spec!r}: need a positive node count and 1..16 GPUs per node")
    return Change(sign, count=n, gpus_per_node=g, model=m.group(5))


def _model_of(n: Node) -> str:
    return n.gpus[0].model if n.gpus else ""


def _resolve(model: str, nodes: Sequence[Node]) -> str:
    have = {_model_of(n) for n in nodes if n.gpus}
    if model in have:
        return model
    gm = lookup(model)
    if gm is not None:
        for h in have:
            hm = lookup(h)
            if hm is not None and hm.name == gm.name:
                return h
        return gm.name
    tokens = [t for t in model.lower().replace("_", "-").split("-") if t]
    for h in sorted(have) + list(MODELS):  # loose: "A100-80GB" finds "NVIDIA-A100-SXM4-80GB"
        if all(t in h.lower().split("-") for t in tokens):
            return h
    raise WhatIfError(f"--what-if: unknown GPU model {model!r}; the cluster has {', '.join(sorted(have)) or 'no GPUs'}")


def node_shape(model: str, nodes: Sequence[Node], gpus: int | None = None) -> tuple[int, int, int, str]:
    """(GPUs, cpu_milli, memory_mib, model) of a node to add."""
    model = _resolve(model, nodes)
    same = [n for n in nodes if _model_of(n) == model]
    if same:
        (g, c, m), _ = Counter((len(n.gpus), n.cpu_milli, n.memory_mib) for n in same).most_common(1)[0]
        return gpus or g, c, m, model
    return gpus or DEFAULT_NODE["gpus"], DEFAULT_NODE["cpu_milli"], DEFAULT_NODE["memory_mib"], model


def new_node(name: str, gpus: int, cpu_milli: int, memory_mib: int, model: str, like: Node | None = None) -> Node:
    gm = lookup(model)
    mem = gm.memory_mib if gm else 32768
    labels = dict(like.labels) if like is not None else {}
    labels["kubernetes.io/hostname"] = name
    if gpus:
        labels["nvidia.com/gpu.product"] = model
    return Node(name=name, cpu_milli=cpu_milli, memory_mib=memory_mib,
                gpus=tuple(Gpu(j, f"{name}-gpu{j}", model, mem) for j in range(gpus)), labels=labels,
                max_pods=like.max_pods if like is not None else 10**6)


def apply(nodes: Sequence[Node], changes: Sequence[Change]) -> list[Node]:
    out = list(nodes)
    k = 0
    for ch in changes:
        if ch.percent is not None:
            by_shape: dict[tuple, list[Node]] = {}
            for n in out:
                by_shape.setdefault((len(n.gpus), n.cpu_milli, n.memory_mib, _model_of(n)), []).append(n)
            want = ch.percent / 100 * len(out)
            exact = {s: want * len(v) / len(out) for s, v in by_shape.items()}
            take = {s: int(x) for s, x in exact.items()}
            for s in sorted(exact, key=lambda s: -(exact[s] - take[s]))[: round(want) - sum(take.values())]:
                take[s] += 1
            for s, n_take in take.items():
                if ch.sign > 0:
                    like = by_shape[s][0]
                    for _ in range(n_take):
                        k += 1
                        out.append(new_node(f"whatif-{k}", s[0], s[1], s[2], s[3], like))
                else:
                    drop = {n.name for n in by_shape[s][len(by_shape[s]) - n_take:]}
                    out = [n for n in out if n.name not in drop]
            continue
        assert ch.model is not None and ch.count is not None
        g, c, m, model = node_shape(ch.model, out, ch.gpus_per_node)
        if ch.sign > 0:
            like2 = next((n for n in out if _model_of(n) == model), None)
            for _ in range(ch.count):
                k += 1
                out.append(new_node(f"whatif-{k}-{model}", g, c, m, model, like2))
        else:
            same = [n for n in out if _model_of(n) == model and (ch.gpus_per_node is None or len(n.gpus) == ch.gpus_per_node)]
            if len(same) < ch.count:
                raise WhatIfError(f"--what-if {ch}: the cluster has only {len(same)} such node(s)")
            drop = {n.name for n in same[len(same) - ch.count:]}
            out = [n for n in out if n.name not in drop]
    if not out:
        raise WhatIfError("--what-if: no nodes left")
    return out


def describe(nodes: Sequence[Node]) -> str:
    c = Counter(_model_of(n) or "cpu" for n in nodes)
    return f"{len(nodes)} nodes, {sum(len(n.gpus) for n in nodes)} GPUs ({', '.join(f'{v} {k}' for k, v in c.most_common())})"


@dataclass
class SearchPoint:
    added: int
    p99_s: float
    p50_s: float
    mean_gpu_alloc_pct: float
    never_placed: int


def smallest_addition(evaluate: Callable[[int], SearchPoint], target_p99_s: float, most: int = 4096) -> tuple[int | None, list[SearchPoint]]:
    """The fewest nodes to add so that p99 wait <= target: doubling, then bisection (p99 falls
    as nodes are added, up to noise).  Returns (n or None if even ``most`` is not enough, points)."""
    pts: dict[int, SearchPoint] = {}

    def ev(n: int) -> SearchPoint:
        if n not in pts:
            pts[n] = evaluate(n)
        return pts[n]

    def good(n: int) -> bool:
        p = ev(n)
        return p.p99_s <= target_p99_s and p.never_placed == 0

    if good(0):
        return 0, [pts[0]]
    lo, hi = 0, 1
    while not good(hi):
        lo = hi
        if hi >= most:
            return None, sorted(pts.values(), key=lambda p: p.added)
        hi = min(hi * 2, most)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if good(mid):
            hi = mid
        else:
            lo = mid
    return hi, sorted(pts.values(), key=lambda p: p.added)


__all__ = ["Change", "SearchPoint", "WhatIfError", "apply", "describe", "node_shape", "parse", "smallest_addition"]
