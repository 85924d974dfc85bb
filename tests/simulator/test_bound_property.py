"""Property tests for the offline bounds: a lower bound must never exceed what a real placement reaches.

Random small clusters (GPU models, GPU counts, CPU) and pod lists (milli shares on and off the 10-milli grid,
whole and multi-GPU pods, CPU-only pods, ``gpu_spec`` pins) go through the packing experiment with several
policies; each run is a real placement of the arrived pods, so the offline MIP bound may not exceed any run's
unallocated %, and the bound for placements keeping a run's first pods may not exceed that run's.  A checker
that packs two GPUs exactly (brute force over every placement) holds the MIP bound to the true optimum.
"""

from __future__ import annotations

from itertools import product

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpufleet.engine.gpu_models import lookup
from gpufleet.engine.model import Gpu, Node
from gpufleet.simulator.experiments import packing
from gpufleet.simulator.bounds.bound import arrived_pods, offline_bound
from gpufleet.simulator.traces.trace import TracePod

SETTINGS = settings(max_examples=40, deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
MODELS = ["T4", "P100", "V100M32"]
TOL = 2e-3  # both sides are rounded to 4 decimals


def _node(i: int, model: str, ngpu: int, cpu: int) -> Node:
    gpus = tuple(Gpu(j, f"n{i}-g{j}", model, lookup(model).memory_mib) for j in range(ngpu))
    return Node(name=f"n{i}", cpu_milli=cpu, memory_mib=65536, gpus=gpus, labels={"nvidia.com/gpu.product": model},
                max_pods=10**6)


@st.composite
def cluster(draw) -> tuple[list[Node], list[TracePod]]:
    nodes = [_node(i, draw(st.sampled_from(MODELS)), draw(st.sampled_from([1, 2, 4])), draw(st.sampled_from([4000, 16000, 64000])))
             for i in range(draw(st.integers(1, 4)))]
    pods = []
    for i in range(draw(st.integers(1, 30))):
        kind = draw(st.sampled_from(["share", "share", "odd", "whole", "multi", "cpu"]))
        cpu = draw(st.sampled_from([500, 2000, 6000]))
        spec = tuple(draw(st.sets(st.sampled_from(MODELS), min_size=1, max_size=2))) if draw(st.integers(0, 4)) == 0 else ()
        if kind == "share":
            n, milli = 1, draw(st.sampled_from([110, 160, 230, 250, 320, 470, 500, 650, 810]))
        elif kind == "odd":
            n, milli = 1, draw(st.integers(1, 999))  # off the 5-milli grid: rounded down in the pattern model
        elif kind == "whole":
            n, milli = 1, 1000
        elif kind == "multi":
            n, milli = 2, 1000
        else:
            n, milli, spec = 0, 0, ()
        pods.append(TracePod(name=f"p{i:03d}", cpu_milli=cpu, memory_mib=1024, num_gpu=n, gpu_milli=milli, gpu_spec=spec))
    return nodes, pods


@SETTINGS
@given(cluster(), st.sampled_from([0.0, 1.3]), st.integers(0, 3))
def test_no_policy_beats_either_bound(c, tune, seed):
    nodes, pods = c
    b = offline_bound(nodes, pods, seed=seed, tune=tune, time_limit_s=10)
    assert b.best_found_pct is None or b.unallocated_gpu_pct <= b.best_found_pct + TOL
    for policy in ("random", "bestfit", "fgd", "default"):
        run = packing.run_packing(nodes, pods, policy, seed=seed, tune=tune)
        assert run.idle is not None
        got = run.idle.unallocated_pct
        assert b.unallocated_gpu_pct <= got + TOL, (policy, b, got)
        keep = run.idle.bound_placing_first_pct
        assert keep is not None and keep <= got + TOL, (policy, keep, got)


def _best_two_gpus(sizes: list[int]) -> int:
    """Most milli any placement of ``sizes`` (each on GPU 0, GPU 1 or left out) puts on two 1000-milli GPUs."""
    best = 0
    for assign in product((0, 1, 2), repeat=len(sizes)):
        load = [0, 0]
        for m, g in zip(sizes, assign):
            if g < 2:
                load[g] += m
        if load[0] <= 1000 and load[1] <= 1000:
            best = max(best, load[0] + load[1])
    return best


@settings(max_examples=60, deadline=None, derandomize=True, database=None)
@given(st.lists(st.sampled_from([50, 110, 160, 190, 230, 320, 470, 510, 550, 650, 810, 900]), min_size=1, max_size=9),
       st.integers(0, 5))
def test_two_gpu_bound_never_exceeds_the_exact_optimum(sizes, seed):
    # one node, two GPUs, plenty of CPU: brute force over every placement gives the true optimum
    nodes = [_node(0, "T4", 2, 64000)]
    pods = [TracePod(name=f"p{i}", cpu_milli=100, memory_mib=64, num_gpu=1, gpu_milli=m) for i, m in enumerate(sizes)]
    arrived, capacity = arrived_pods(nodes, pods, seed, 0)
    exact = 100.0 - 100.0 * _best_two_gpus([p.gpu_milli for p in arrived]) / capacity
    b = offline_bound(nodes, pods, seed=seed, tune=0, time_limit_s=10)
    assert b.unallocated_gpu_pct <= exact + TOL
