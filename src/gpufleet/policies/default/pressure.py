"""GPU-model pressure: a score that keeps pods with a choice of GPU model off the models pinned pods need.

Why: where a share of the pods pins GPU models (``gpu_spec``), the default used to lose to FGD because it
filled the scarce models' GPUs with pods that could have run anywhere (on a pinned variant, 144 of 265 P100
GPUs held unpinned pods vs FGD's 66).  The workload model learns, from every GPU pod seen (also the ones no
node can take: those are the pinned pods a full model turns away), which share of all GPU demand is pinned
to each model; demand pinned to several models is spread over them by water-filling, so that it lands where
the pinned load per GPU is lowest.  Each cycle, pressure = that share x the cluster's free GPU milli / the
model's free GPU milli (how much of the model's free GPUs the pinned pods still to come want, if demand keeps
its mix), and a placement pays ``model_weight`` x pressure (at most ``pressure_cap``) per milli-GPU it uses
there, in the descent's score steps (``quant_milli``), so the two add up.  It is recomputed every cycle (it
feeds back as pods with a choice use a model up), so it is not cached per node: one lookup per node.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ...engine.args import PluginArgs, arg
from ...engine.framework import Cycle, SharedObserver, StateKey
from ...engine.model import GPU_MILLI
from ...engine.state import ClusterState
from .workload import WorkloadModel, model_of

# [model id + 1]: this cycle's cost per milli-GPU used on each model (index -1: no GPU, 0)
PRESSURE_COST: StateKey[np.ndarray] = StateKey("ModelPressure/cost")


@dataclass(frozen=True)
class ModelPressureArgs(PluginArgs):
    model_weight: float = arg(16.0)  # descent steps per milli-GPU at pressure 1; 0: off
    pressure_cap: float = arg(4.0)  # pressure counted at most this
    quant_milli: float = arg(40.0)  # the descent's step (DescentScore's quant_milli): the cost is counted in it


class ModelPressure(SharedObserver):
    """Score: minus the model pressure of the GPUs a pod would use on each node (see the module docstring).
    Applies only to GPU pods once any pinned demand was seen."""

    name = "ModelPressure"

    def __init__(self, args: ModelPressureArgs | None = None, model: WorkloadModel | None = None) -> None:
        self.args = args or ModelPressureArgs()
        self.model = model or WorkloadModel()
        self._pressure: tuple | None = None
        self._gpu_index: tuple | None = None  # (epoch, flat indices of usable GPUs, their model ids)

    @classmethod
    def from_config(cls, handle: Any = None, **cfg: Any) -> ModelPressure:
        return cls(ModelPressureArgs.from_config(cls.name, cfg), model_of(handle))

    def applies(self, cycle: Cycle, state: ClusterState) -> bool:
        return bool(self.model.pinned and self.args.model_weight and cycle.request.total_gpu_milli)

    def cache_key(self, cycle: Cycle) -> None:
        return None  # changes with every placement

    def normalize(self, raw: np.ndarray) -> np.ndarray:
        return raw

    def score(self, cycle: Cycle, state: ClusterState, nodes: np.ndarray) -> np.ndarray:
        model = state.gpu_model[nodes, 0] if state.gpu_model.shape[1] else np.full(nodes.size, -1)
        return -(self.cost(cycle, state)[model] * cycle.request.total_gpu_milli)

    def pin_rates(self, state: ClusterState) -> np.ndarray:
        """[model]: the share of all GPU demand seen that pinned pods bring to each model.

        A pod pinned to several models is spread over them so that their pinned
        load per GPU comes out as even as it can (water-filling in small steps),
        not by capacity: demand pinned to {big model, scarce model} lands on the
        big one when the scarce one has its own pinned pods to serve.
        """
        m = self.model
        key = (m.version, state.epoch, len(m.pinned))
        if self._pressure is not None and self._pressure[0] == key:
            return self._pressure[1]
        nm = len(state.model_names)
        models = state.gpu_model[state.gpu_exists & state.gpu_usable] if state.gpu_model.size else np.zeros(0, np.int32)
        cap = np.bincount(models[models >= 0], minlength=nm).astype(float)[:nm] * GPU_MILLI
        ids = {name: i for i, name in enumerate(state.model_names)}
        load = np.zeros(nm)
        sets = []
        for allow, milli in m.pinned.items():
            # sorted: a frozenset of names iterates in hash order, which differs per process (ties in argmin below)
            idx = np.array(sorted(ids[x] for x in allow if x in ids and cap[ids[x]] > 0), dtype=int)
            if idx.size:
                sets.append((idx, float(milli)))
        steps = 16
        for _ in range(steps):  # round-robin over the sets, a 1/steps slice each time
            for idx, milli in sets:
                j = idx[np.argmin((load[idx] + milli / steps) / cap[idx])]
                load[j] += milli / steps
        total = max(m.sums[0], 1.0)
        r = load / total
        self._pressure = (key, r)
        return r

    def cost(self, cycle: Cycle, state: ClusterState) -> np.ndarray:
        """[model id + 1]: cost per milli-GPU used on each model (index -1: no GPU, 0), once per cycle.

        pressure = (pinned share of demand for the model) x (free GPU milli in the cluster) /
        (free GPU milli of the model): the part of the model's free GPUs that the pinned pods
        still to come will want, if demand keeps its mix.  It rises as pods with a choice use
        the model up, which is the feedback a static share lacks.
        """
        t = cycle.read(PRESSURE_COST)
        if t is not None:
            return t
        a = self.args
        nm = len(state.model_names)
        out = np.zeros(nm + 1)
        if a.model_weight and self.model.pinned and nm:
            r = self.pin_rates(state)
            g = self._gpu_index
            if g is None or g[0] != state.epoch:
                ok = (state.gpu_exists & state.gpu_usable & (state.gpu_model >= 0)).ravel()
                flat = np.flatnonzero(ok)
                g = self._gpu_index = (state.epoch, flat, state.gpu_model.ravel()[flat])
            free = np.bincount(g[2], weights=state.gpu_free_milli.ravel()[g[1]], minlength=nm)[:nm]
            ftot = free.sum()
            with np.errstate(invalid="ignore", divide="ignore"):
                p = np.where(free > 0, r * ftot / free, a.pressure_cap)
            out[:nm] = a.model_weight * np.minimum(p, a.pressure_cap) / max(a.quant_milli, 1.0)
        cycle.write(PRESSURE_COST, out)
        return out


__all__ = ["ModelPressure", "ModelPressureArgs", "PRESSURE_COST"]
