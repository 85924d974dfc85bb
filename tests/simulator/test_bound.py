"""The offline bound: a MIP over node groups with per-GPU packing patterns and per-node integrality cuts."""

from __future__ import annotations

import os

import pytest

from gpufleet.engine.gpu_models import lookup
from gpufleet.engine.model import Gpu, Node
from gpufleet.simulator.experiments import packing
from gpufleet.simulator.bounds.bound import bound_placing_first, lp_bound, offline_bound
from gpufleet.simulator.traces.trace import TracePod


def node(name: str, cpu: int, ngpu: int, model: str = "T4") -> Node:
    gpus = tuple(Gpu(j, f"{name}-g{j}", model, lookup(model).memory_mib) for j in range(ngpu))
    return Node(name=name, cpu_milli=cpu, memory_mib=65536, gpus=gpus, labels={"nvidia.com/gpu.product": model}, max_pods=10**6)


def pod(i: int, cpu: int, ngpu: int = 1, milli: int = 1000, spec: tuple[str, ...] = ()) -> TracePod:
    return TracePod(name=f"p{i:03d}", cpu_milli=cpu, memory_mib=1024, num_gpu=ngpu, gpu_milli=milli, gpu_spec=spec)


def test_per_node_cpu_integrality_the_lp_misses():
    # two 2-GPU nodes with 10 cores; every pod wants 1 GPU and 6 cores: one pod per node fits.
    # Pooled, 20 cores feed 3.33 pods (LP: 16.7% idle); per node, 2 of 4 GPUs stay idle (50%).
    nodes = [node("a", 10_000, 2), node("b", 10_000, 2)]
    pods = [pod(i, 6_000) for i in range(4)]
    b = offline_bound(nodes, pods, seed=1, tune=0, lp=True)
    assert b.lp_pct == pytest.approx(100 - 100 * 20 / 6 / 4, abs=0.01)
    assert b.unallocated_gpu_pct == pytest.approx(50.0, abs=1e-6)
    assert b.optimal and b.gap_pct == pytest.approx(0.0, abs=1e-6)
    run = packing.run_packing(nodes, pods, "default", seed=1, tune=0)
    assert run.unallocated_gpu_pct == pytest.approx(50.0)  # the bound is reached here: it is tight


def test_gpu_spec_is_honoured():
    # 4 T4 GPUs and 4 P100 GPUs; all pods pinned to P100: at most half the GPUs can be used
    nodes = [node("t", 64_000, 4, "T4"), node("p", 64_000, 4, "P100")]
    pods = [pod(i, 1_000, spec=("P100",)) for i in range(8)]
    b = offline_bound(nodes, pods, seed=1, tune=0)
    assert b.unallocated_gpu_pct == pytest.approx(50.0, abs=1e-6)


def test_per_gpu_shares_and_multi_gpu_pods():
    # one 2-GPU node: 600-milli shares cannot share a GPU; three arrive (1800 milli), two fit: 40% idle
    nodes = [node("a", 64_000, 2)]
    pods = [pod(i, 1_000, milli=600) for i in range(4)]
    b = offline_bound(nodes, pods, seed=3, tune=0)
    assert b.pods == 3 and b.unallocated_gpu_pct == pytest.approx(40.0, abs=1e-6)
    # a 2-GPU pod needs both GPUs of one node: on two 1-GPU nodes nothing of it fits
    two = [node("a", 64_000, 1), node("b", 64_000, 1)]
    assert offline_bound(two, [pod(0, 1_000, ngpu=2)], seed=1, tune=0).unallocated_gpu_pct == pytest.approx(100.0)


def test_a_share_cannot_pool_its_idle_milli_with_another_gpu():
    # 4 GPUs, 4,000 milli asked: three 810s, two 470s and a 630. Pooled per node they "fit" and the LP says 0%;
    # per GPU each 810 and the 630 need a GPU of their own, so the best placement puts the 470s together and
    # leaves the 630 out: 15.75% idle
    nodes = [node("a", 64_000, 2), node("b", 64_000, 2)]
    pods = [pod(i, 1_000, milli=m) for i, m in enumerate([810, 810, 810, 470, 470, 630])]
    b = offline_bound(nodes, pods, seed=1, tune=0, lp=True)
    assert b.pods == 6 and b.lp_pct == pytest.approx(0.0, abs=1e-6)
    assert b.unallocated_gpu_pct == pytest.approx(15.75, abs=1e-6) and b.optimal
    assert b.left_out == {"630 milli": [1, 1]}
    assert b.method == "mip-node-groups+gpu-patterns"


def test_keeping_the_pods_placed_first_can_cost_more_than_the_offline_bound():
    # the same 4 GPUs; a scheduler that placed the 630 and the three 810s as they came has no GPU left for the 470s
    # (23.5% idle), while the offline bound leaves the 630 out (15.75%)
    nodes = [node("a", 64_000, 2), node("b", 64_000, 2)]
    pods = [pod(i, 1_000, milli=m) for i, m in enumerate([630, 810, 810, 810, 470, 470])]
    assert bound_placing_first(nodes, pods, [], 4000) == pytest.approx(15.75, abs=1e-6)
    assert bound_placing_first(nodes, pods, pods[:1], 4000) == pytest.approx(20.25, abs=1e-6)  # 630 kept: an 810 goes
    assert bound_placing_first(nodes, pods, pods[:4], 4000) == pytest.approx(23.5, abs=1e-6)
    assert bound_placing_first(nodes, pods, pods, 4000) is None  # not all of them fit
    # kept pods that are not the arrival order's prefix (counted on their own, not from the arrived pods' shapes)
    assert bound_placing_first(nodes, pods, [pods[3], pods[0]], 4000) == pytest.approx(20.25, abs=1e-6)
    assert bound_placing_first(nodes, pods, pods[3::-1], 4000) == pytest.approx(23.5, abs=1e-6)


def _keep_rows_cold(nodes, arrived, placed, capacity):
    """The keep-first LP as its own ">= kept" rows below the program, solved from scratch (no starting basis)."""
    from collections import Counter

    import numpy as np

    from gpufleet.simulator.bounds.bound import Sparse, _program, _shapes, _solve

    prog = _program(nodes, arrived, node_cuts=True, cpu_only=True)
    must = _shapes(placed, cpu_only=True) if placed else Counter()
    at = [(i, must[sh]) for i, sh in enumerate(prog.S) if must.get(sh)]
    cols = [np.flatnonzero(prog.var[:, 0] == i) for i, _ in at]
    below = Sparse(len(at), prog.obj.size, np.concatenate([np.full(c.size, k) for k, c in enumerate(cols)] or [np.zeros(0, int)]),
                   np.concatenate(cols or [np.zeros(0, int)]), np.ones(sum(c.size for c in cols)))
    res = _solve(-prog.obj, prog.A.stacked(below), np.r_[prog.lo, [float(n) for _, n in at]],
                 np.r_[prog.hi, np.full(len(at), np.inf)], np.zeros(prog.obj.size))
    if not res.optimal:
        return None
    return max(0.0, round(100.0 - 100.0 * min(-float(res.fun), float(capacity)) / capacity, 4))


@pytest.mark.parametrize("seed", [3, 11, 29])
def test_kept_counts_as_lower_bounds_of_the_count_rows_give_what_keep_rows_give(seed):
    # bound_placing_first asks "at least kept(s)" on each shape's count row and starts from the optimal basis of the
    # program without keeps; the same LP written with a row of its own per kept shape, solved cold, gives the same
    import random

    rng = random.Random(seed)
    nodes = [node(f"n{i}", rng.choice([16_000, 32_000, 64_000]), g, m)
             for i, (g, m) in enumerate([(8, "V100M32")] * 3 + [(2, "T4")] * 5 + [(4, "P100")] * 3 + [(0, "T4")] * 2)]
    sizes = [100, 250, 300, 470, 500, 630, 810, 1000]
    pods = [pod(i, rng.choice([1_000, 4_000, 8_000, 24_000]), g, 1000 if g != 1 else rng.choice(sizes),
                ("T4",) if rng.random() < 0.1 and g else ())
            for i, g in enumerate(rng.choice([0, 1, 1, 1, 2, 4]) for _ in range(160))]
    capacity = sum(len(n.gpus) for n in nodes) * 1000
    arrived = pods[:40]  # about the cluster's GPUs: keeping more costs more, keeping all of some seeds' is infeasible
    for k in (0, 1, 10, 20, 30, 40):
        got = bound_placing_first(nodes, arrived, arrived[:k], capacity)
        assert got == _keep_rows_cold(nodes, arrived, arrived[:k], capacity), k
    # first a pod no node group holds (4 T4s; a T4 node has 2): its shape has no count row, the others' rows move up
    odd = [pod(999, 1_000, 4, 1000, ("T4",)), *arrived]
    for k in (1, 10, 20):
        got = bound_placing_first(nodes, odd, arrived[:k], capacity)  # kept pods not the arrival's prefix
        assert got is not None and got == _keep_rows_cold(nodes, odd, arrived[:k], capacity), k
    assert bound_placing_first(nodes, odd, odd[:2], capacity) is None  # keeping the pod no group holds


def test_small_shares_fill_the_holes_beside_large_ones():
    # 2 GPUs: 810 + 190 and 600 + 250 + 150 pack exactly (any order of arrival): the bound says 0% and places all.
    # Five pods on a 2-GPU node: a per-node cut that counted each share as a GPU of its own allowed two.
    nodes = [node("a", 64_000, 2)]
    pods = [pod(i, 1_000, milli=m) for i, m in enumerate([150, 810, 250, 190, 600])]
    b = offline_bound(nodes, pods, seed=5, tune=0)
    assert b.unallocated_gpu_pct == pytest.approx(0.0, abs=1e-6) and b.left_out == {}


def test_shares_off_the_milli_grid_are_rounded_down_and_the_bound_stays_below_every_policy():
    # sizes with gcd 1 (333, 667, 401, ...): the pattern graph rounds them down to 5 milli, a looser model
    nodes = [node(f"n{i}", 64_000, 4) for i in range(3)]
    sizes = [333, 667, 401, 599, 251, 749, 1000, 123, 877]
    pods = [pod(i, 1_000, milli=sizes[i % len(sizes)]) for i in range(40)]
    b = offline_bound(nodes, pods, seed=7, tune=1.3)
    for pol in ("fgd", "bestfit", "default"):
        u = packing.run_packing(nodes, pods, pol, seed=7, tune=1.3).unallocated_gpu_pct
        if u is not None:
            assert b.unallocated_gpu_pct <= u + 1e-6


def test_bound_is_at_most_every_policy_and_at_least_the_lp():
    nodes = [node(f"n{i}", 32_000, g, m) for i, (g, m) in enumerate([(8, "V100M32")] * 6 + [(2, "T4")] * 9 + [(4, "P100")] * 6)]
    shapes = [(4000, 1, 500), (8000, 1, 1000), (2000, 1, 250), (16000, 2, 1000), (3000, 1, 700), (12000, 1, 300)]
    pods = [pod(i, c, g, m, ("T4",) if i % 7 == 0 else ()) for i, (c, g, m) in enumerate(shapes * 60)]
    b = offline_bound(nodes, pods, seed=42, lp=True)
    assert b.unallocated_gpu_pct >= lp_bound(nodes, pods, seed=42).unallocated_gpu_pct - 1e-6
    seen = 0
    for pol in ("fgd", "bestfit", "default"):
        run = packing.run_packing(nodes, pods, pol, seed=42)
        u = run.unallocated_gpu_pct
        if u is not None:  # None: no sample near 100% arrived on so small a cluster
            assert b.unallocated_gpu_pct <= u + 1e-6
            # the run keeps its own first pods, so it is one of the placements the second bound ranges over (an LP:
            # on so small a cluster it can sit below the MIP's offline bound)
            assert run.idle is not None and run.idle.bound_placing_first_pct is not None
            assert run.idle.bound_placing_first_pct <= run.idle.unallocated_pct + 1e-6
            seen += 1
    assert seen
    assert b.solve_s < 30 and b.best_found_pct is not None and b.best_found_pct >= b.unallocated_gpu_pct


def test_solver_chatter_on_the_file_descriptors_is_dropped_and_they_are_restored(capfd):
    from gpufleet.simulator.bounds.bound import _quiet_solver

    with _quiet_solver():
        os.write(1, b"HighsMipSolverData::transformNewIntegerFeasibleSolution tmpSolver.run();\n")
        os.write(2, b"chatter\n")
    os.write(2, b"after\n")
    out, err = capfd.readouterr()
    assert out == "" and err == "after\n"


def test_the_solver_call_is_scipy_milps_own():
    """The bounds call HiGHS through highspy with what ``scipy.optimize.milp`` passed it (the matrix column-wise as
    ``csc_array`` holds it, the same options): the same release gives the same answers bit for bit."""
    import numpy as np
    from scipy.optimize import Bounds, LinearConstraint, milp
    from scipy.sparse import csc_array, csr_matrix

    from gpufleet.simulator.bounds.bound import Sparse, _solve

    rng = np.random.default_rng(3)
    for trial in range(6):
        m, n = int(rng.integers(3, 12)), int(rng.integers(4, 16))
        k = int(rng.integers(m, 4 * m))
        rows, cols = rng.integers(0, m, k), rng.integers(0, n, k)  # repeats: entries at one place are summed
        vals = rng.integers(-2, 9, k).astype(float)  # zeros: kept as entries
        a = Sparse(m, n, rows, cols, vals)
        ref = csc_array(csr_matrix((vals, (rows, cols)), shape=(m, n)))
        start, index, value = a.csc()
        assert np.array_equal(start, ref.indptr) and np.array_equal(index, ref.indices) and np.array_equal(value, ref.data)
        c = -rng.integers(1, 20, n).astype(float)
        hi = rng.integers(5, 40, m).astype(float)
        integrality = (rng.random(n) < 0.5).astype(np.uint8) if trial % 2 else np.zeros(n, dtype=np.uint8)
        below = Sparse(1, n, np.zeros(n, dtype=np.int64), np.arange(n), np.ones(n))  # sum x <= 10, as a second constraint
        got = _solve(c, a.stacked(below), np.r_[np.full(m, -np.inf), -np.inf], np.r_[hi, 10.0], integrality, 30.0)
        want = milp(c, constraints=[LinearConstraint(csr_matrix((vals, (rows, cols)), shape=(m, n)), -np.inf, hi),
                                    LinearConstraint(np.ones((1, n)), -np.inf, 10.0)],
                    integrality=integrality, bounds=Bounds(0, np.inf), options={"time_limit": 30.0, "disp": False})
        assert got.optimal is (want.status == 0)
        assert got.fun == want.fun and np.array_equal(got.x, want.x)
        if integrality.any():
            assert got.mip_dual_bound == want.mip_dual_bound
