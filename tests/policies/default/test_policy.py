"""The default policy's terms learned online: GPU-model pressure from pinned pods, stranding over ratio quantiles,
share patterns from the share-packing LP."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from gpufleet.engine.framework import Cycle
from gpufleet.engine.model import Assignment, PodRequest
from gpufleet.engine.state import ClusterState
from gpufleet.engine.args import PluginArgs
from gpufleet.policies.default import (DescentArgs, DescentScore, ModelPressure, ModelPressureArgs, SharePatternArgs,
                                       SharePatterns, WorkloadArgs, WorkloadModel, pattern_loads)
from tests.builders import A100, T4, make_node


class Parts:
    """The default's learned model and the plugins that read it, made from one set of keyword arguments
    (each goes to the part whose arguments name it), as a profile's handle would share them."""

    def __init__(self, **kw) -> None:
        def take(cls: type[PluginArgs]):
            names = {f for f in cls.__dataclass_fields__}
            return cls.from_config(cls.__name__, {k: kw.pop(k) for k in list(kw) if k in names})

        self.model = WorkloadModel(take(WorkloadArgs))
        self.descent = DescentScore(take(DescentArgs), self.model, SharePatterns(take(SharePatternArgs)))
        self.pressure = ModelPressure(take(ModelPressureArgs), self.model)
        assert not kw, kw

    def prime(self, pods) -> None:
        self.model.prime(pods)

    def observe(self, r) -> None:
        self.model.observe(r)


def req(name: str, cpu: int = 4000, milli: int = 1000, count: int = 1, allow: tuple[str, ...] = ()) -> PodRequest:
    return PodRequest(name=name, cpu_milli=cpu, memory_mib=4096, gpu_count=count, gpu_milli=milli,
                      gpu_models_allow=frozenset(allow) if allow else None)


def cluster() -> ClusterState:
    # 6 A100 nodes (48 GPUs) and 2 T4 nodes (8 GPUs), same CPU/memory per GPU
    nodes = [make_node(f"a{i}", 8, A100, cpu_milli=64_000, memory_mib=262_144) for i in range(6)]
    nodes += [make_node(f"t{i}", 4, T4, cpu_milli=32_000, memory_mib=131_072) for i in range(2)]
    return ClusterState(nodes)


def scores(p: Parts, state: ClusterState, r: PodRequest) -> np.ndarray:
    """What the framework adds up: the descent (cached per node) plus the model pressure (per cycle)."""
    c = Cycle(request=r, rng=np.random.default_rng(0))
    nodes = np.arange(len(state))
    s = p.descent.score(c, state, nodes)
    return s + p.pressure.score(c, state, nodes) if p.pressure.applies(c, state) else s


def cost(p: Parts, state: ClusterState) -> np.ndarray:
    return p.pressure.cost(Cycle(request=req("probe"), rng=np.random.default_rng(0)), state)


def seen(pinned_share: float) -> list[PodRequest]:
    out = []
    for i in range(200):
        allow = (T4,) if i < pinned_share * 200 else ()
        out.append(req(f"w{i}", allow=allow))
    return out


def test_pods_with_a_choice_avoid_the_model_pinned_pods_need():
    state = cluster()
    p = Parts(learn_online=False)
    p.prime(seen(0.2))  # a fifth of the demand pins T4, which is 1/7 of the GPUs
    c = cost(p, state)
    t4 = state.model_names.index(T4)
    a100 = state.model_names.index(A100)
    assert c[t4] > 0.0 and c[a100] == 0.0 and c[-1] == 0.0
    s = scores(p, state, req("free"))
    assert s[:6].min() > s[6:].max()  # an unpinned pod goes to an A100 node
    # a pod pinned to T4 still scores its only nodes alike (the term is the same on all of them)
    s_pin = scores(p, state, req("pin", allow=(T4,)))
    assert s_pin[6] == s_pin[7]


def test_demand_pinned_to_several_models_goes_where_pinned_load_is_lowest():
    # T4 has its own pinned pods; pods that may use A100 or T4 are counted on A100 (water-filling),
    # not split by capacity, so they do not make the big model look pressured
    state = cluster()
    p = Parts(learn_online=False)
    p.prime([req(f"t{i}", allow=(T4,)) for i in range(20)] + [req(f"b{i}", allow=(A100, T4)) for i in range(20)]
            + [req(f"u{i}") for i in range(160)])
    r = p.pressure.pin_rates(state)
    t4 = state.model_names.index(T4)
    a100 = state.model_names.index(A100)
    assert r[t4] == 0.1  # only its own 20 of 200 pods
    assert abs(r[a100] - 0.1) < 1e-9
    # per GPU, T4's pinned load (0.1 of demand on 8 GPUs) is far above A100's (0.1 on 48)
    c = cost(p, state)
    assert c[t4] > 5 * c[a100] > 0



_PIN_RATES = """
from gpufleet.engine.state import ClusterState
from tests.builders import A100, T4, V100, make_node
from tests.policies.default.test_policy import Parts, req
# three models with as many GPUs each, and demand that may use any of them: 16 water-filling slices over
# three models give one of them a slice more, and which one is a tie
state = ClusterState([make_node(m, 4, m, cpu_milli=64_000, memory_mib=262_144) for m in (A100, T4, V100)])
p = Parts(learn_online=False)
p.prime([req(f"b{i}", allow=(A100, T4, V100)) for i in range(7)] + [req(f"u{i}") for i in range(20)])
print(p.pressure.pin_rates(state).round(6).tolist())
"""


def test_pinned_demand_is_spread_the_same_in_every_process():
    # a frozenset of model names iterates in hash order, which Python randomises per process: the spread
    # (and so the placements of pinned variants) once depended on PYTHONHASHSEED
    import os
    import subprocess
    import sys

    out = set()
    for hash_seed in range(6):
        env = dict(os.environ, PYTHONHASHSEED=str(hash_seed))
        run = subprocess.run([sys.executable, "-c", _PIN_RATES], env=env, capture_output=True, text=True, check=True)
        out.add(run.stdout.strip())
    assert len(out) == 1, out


def test_pressure_rises_as_pods_with_a_choice_use_the_model_up():
    state = cluster()
    p = Parts(learn_online=False)
    p.prime(seen(0.1))
    t4 = state.model_names.index(T4)
    before = cost(p, state)[t4]
    state.gpu_free_milli[6, :3] = 0  # three of the eight T4 GPUs taken
    after = cost(p, state)[t4]
    assert after > before * 1.4


def test_a_pod_no_node_fits_is_still_learned_and_a_retried_pod_once():
    from gpufleet.engine.framework import Scheduler
    from gpufleet.policies import build_profile

    state = cluster()
    sched = Scheduler(build_profile("default"), state, seed=1)
    model = sched.profile.gpu_selector.model
    big = PodRequest(name="huge", cpu_milli=4000, memory_mib=4096, gpu_count=16, gpu_milli=1000,
                     gpu_models_allow=frozenset({T4}))
    for _ in range(3):  # retried: learned once
        assert not sched.schedule(big).ok
    assert model.pinned == {frozenset({T4}): 16_000}
    assert model.sums[0] == 16_000
    assert all(p.model is model for p in [*sched.profile.filters[-2:], sched.profile.scores[1][0]])  # one model, shared


def test_no_pinned_pods_no_model_term():
    state = cluster()
    a = Parts(learn_online=False)
    b = Parts(learn_online=False, model_weight=0.0)
    for p in (a, b):
        p.prime(seen(0.0))
    np.testing.assert_array_equal(scores(a, state, req("x")), scores(b, state, req("x")))


def test_stranding_over_ratio_quantiles_is_smooth_where_the_mean_ratio_is_a_hinge():
    # GPU pods: half want 1 core per GPU, half 15; the mean ratio (8 cores per GPU) strands nothing on a
    # node with 8 cores per free GPU, while the CPU-heavy half could not run there: the quantiles see it
    p = Parts(learn_online=False, strand_quantiles=4)
    mean_only = Parts(learn_online=False, strand_quantiles=0)
    workload = [req(f"l{i}", cpu=1000) for i in range(50)] + [req(f"h{i}", cpu=15000) for i in range(50)]
    for x in (p, mean_only):
        x.prime(workload)
    roomy = ClusterState([make_node(f"a{i}", 8, A100, cpu_milli=512_000, memory_mib=1 << 20) for i in range(4)])
    p.descent._q_rhos = p.descent._rho_quantiles(roomy)  # as where CPU binds (see the next test)
    cpu = np.array([32_000.0])
    gpu = np.full((1, 4), 1000)
    mem = np.array([1e9])
    assert mean_only.descent._penalty(cpu, gpu, mem)[0] == 0.0
    assert p.descent._penalty(cpu, gpu, mem)[0] > 0.0
    np.testing.assert_allclose(p.descent._q_rhos, [1.0, 1.0, 15.0, 15.0])


def test_ratio_quantiles_apply_only_where_cpu_binds_first_and_not_far_beyond():
    # 32 GPUs, 256 cores; GPU pods bring 6 cores per GPU of demand (tightness 0.75), CPU-only pods the rest
    state = ClusterState([make_node(f"a{i}", 8, A100, cpu_milli=64_000, memory_mib=1 << 20) for i in range(4)])
    light = [req(f"g{i}", cpu=4000) for i in range(50)] + [req(f"x{i}", cpu=8000, milli=1000) for i in range(50)]

    def cpu_only(n: int) -> list[PodRequest]:
        return [PodRequest(name=f"c{i}", cpu_milli=64_000, memory_mib=1024) for i in range(n)]

    for pods, tight, quantiles in (
        (light, 0.75, False),  # GPUs run out first: the mean ratio
        (light + cpu_only(4), 1.07, True),  # CPU runs out first: the ratio quantiles
        (light + cpu_only(60), 5.55, False),  # CPU far too short: the mean ratio again
    ):
        p = Parts(learn_online=False)
        p.prime(pods)
        assert abs(p.model.cpu_tight(state) - tight) < 0.01
        scores(p, state, req("probe"))
        assert (p.descent._q_rhos is not None) is quantiles, tight


def test_ratio_quantiles_leave_out_the_cpu_hungriest_demand_the_cpu_cannot_feed():
    # half the GPU demand at 1 core per GPU, half at 15; 160 cores for 32 GPUs: 300 cores of the CPU
    # demand (scaled to the cluster's GPUs) cannot run, and the 15-core pods are the ones to give it up
    state = ClusterState([make_node(f"a{i}", 8, A100, cpu_milli=40_000, memory_mib=1 << 20) for i in range(4)])
    workload = [req(f"l{i}", cpu=1000) for i in range(50)] + [req(f"h{i}", cpu=15000) for i in range(50)]
    trimmed = Parts(learn_online=False)
    whole = Parts(learn_online=False, quantile_trim=False)
    for x in (trimmed, whole):
        x.prime(workload)
    np.testing.assert_allclose(whole.descent._rho_quantiles(state), [1.0, 1.0, 15.0, 15.0])
    np.testing.assert_allclose(trimmed.descent._rho_quantiles(state), [1.0, 1.0, 1.0, 15.0])


def test_a_fresh_scheduler_relearns_its_target_at_each_doubling_while_little_is_known():
    # found on the real node: the target learned from the first pod alone was kept for 64 pods, so a fresh
    # scheduler judged every early placement against one shape
    p = Parts()
    shapes = [req("a", milli=500), req("b", milli=250), req("c", milli=300), req("d", milli=1000)] * 40
    sizes_after, refreshed, nxt = {}, [], 0
    for i, r in enumerate(shapes, 1):
        p.observe(r)
        sizes_after[i] = len(p.model.workload.gpu_milli)
        if p.model._next_refresh != nxt:
            refreshed.append(i)
            nxt = p.model._next_refresh
    assert refreshed == [1, 2, 4, 8, 16, 32, 64, 128]  # each doubling, then every 64 pods as before
    assert [sizes_after[i] for i in (1, 2, 3, 4)] == [1, 2, 2, 4]  # not at every pod: a refresh re-scores every node



def refreshes(p: Parts, pods: list[PodRequest]) -> list[int]:
    out, nxt = [], p.model._next_refresh
    for i, r in enumerate(pods, 1):
        p.observe(r)
        if p.model._next_refresh != nxt:
            out.append(i)
            nxt = p.model._next_refresh
    return out


def test_a_long_running_scheduler_relearns_at_least_every_refresh_max_pods():
    pods = [req(f"p{i}", milli=500) for i in range(1000)]
    capped = refreshes(Parts(refresh_max_pods=100, memory_pods=0), pods)
    doubling = refreshes(Parts(refresh_max_pods=0, memory_pods=0), pods)
    assert [i for i in doubling if i >= 512] == [512]  # the next doubling, 1024, is past the end
    assert [i for i in capped if i >= 512] == [512, 612, 712, 812, 912]


@pytest.mark.parametrize("memory_pods, share_b_min, share_b_max", [(400, 0.95, 1.0), (0, 0.45, 0.55)])
def test_the_learned_target_follows_a_drifting_mix_only_with_a_memory(memory_pods, share_b_min, share_b_max):
    # 2,000 pods of 500-milli shares, then 2,000 of 250-milli ones with twice the CPU per GPU
    p = Parts(refresh_max_pods=200, memory_pods=memory_pods)
    for i in range(2000):
        p.observe(req(f"a{i}", cpu=4000, milli=500))
    for i in range(2000):
        p.observe(req(f"b{i}", cpu=4000, milli=250))
    tw = p.model.workload
    assert share_b_min <= float(tw.freq[tw.gpu_milli == 250].sum()) <= share_b_max
    b = p.model.share_sizes[25] / (p.model.share_sizes[25] + p.model.share_sizes[50])
    assert share_b_min <= b <= share_b_max  # the share patterns learn from the same faded counts
    cpu_per_gpu = p.model.sums[1] / p.model.sums[0]
    assert (cpu_per_gpu > 14.0) == bool(memory_pods)  # 16 for the 250s, 8 for the 500s
    assert set(p.descent.patterns.table(p.model.version, p.model.share_sizes)) == {25, 50}


def test_forgetting_keeps_the_learned_state_bounded_however_many_shapes_come_and_go():
    pods = [req(f"p{i}", cpu=1000 + i, milli=500) for i in range(3000)]  # every pod a new shape
    remember = Parts(refresh_max_pods=50, memory_pods=0)
    forget = Parts(refresh_max_pods=50, memory_pods=100)
    for r in pods:
        remember.observe(r)
        forget.observe(r)
    assert len(remember.model._counts) == 3000
    assert len(forget.model._counts) < 700
    assert sum(forget.model._counts.values()) <= 100 + 50


# --- share patterns --------------------------------------------------------------------------

@pytest.mark.parametrize(
    "sizes, size, ok, not_ok",
    [
        # two 810s and one 160 (10-milli units): (810, 160) + (810)
        ({81: 2, 16: 1}, 16, [16, 97], [32, 81]),
        ({81: 2, 16: 1}, 81, [81, 97], [16]),
        # the only 2-GPU packing of 470, 470, 650, 320 is (470, 470) + (650, 320): a 320 joins a 650, not a 470
        ({47: 2, 65: 1, 32: 1}, 32, [32, 97], [79, 65]),
        ({47: 2, 65: 1, 32: 1}, 47, [47, 94], [79, 97]),
        ({50: 2}, 50, [50, 100], [0]),
    ],
)
def test_pattern_loads_are_the_partial_sums_of_the_lp_patterns(sizes, size, ok, not_ok):
    table = pattern_loads(Counter(sizes))
    assert set(table) == set(sizes)
    assert all(table[size][load] for load in ok)
    assert not any(table[size][load] for load in not_ok)


def test_pattern_loads_of_nothing():
    assert pattern_loads(Counter()) == {}


def share_cluster() -> ClusterState:
    # three one-GPU nodes: one holds a 600 share, one a 330 share, one is empty
    state = ClusterState([make_node(n, 1, A100, cpu_milli=64_000, memory_mib=262_144) for n in ("six", "three30", "fresh")])
    state.reserve(Assignment("default/a", "six", 1000, 1024, gpu_indices=(0,), gpu_milli=600, gpu_memory_mib=(1024,)))
    state.reserve(Assignment("default/b", "three30", 1000, 1024, gpu_indices=(0,), gpu_milli=330, gpu_memory_mib=(1024,)))
    return state


def test_a_share_joins_the_gpu_whose_lp_pattern_it_continues():
    # shares seen: 600, 400 and 330 alike; the fewest GPUs pack them as (600, 400) and (330, 330, 330),
    # so a 330 belongs beside a 330 (load 660), not in the 400 left beside a 600 (load 930)
    learned = [req(f"s{i}-{m}", cpu=1000, milli=m) for i in range(30) for m in (600, 400, 330)]
    state = share_cluster()
    p = Parts(learn_online=False)
    p.prime(learned)
    s = scores(p, state, req("new", cpu=1000, milli=330))
    assert int(np.argmax(s)) == state.node_index("three30")
    assert s[state.node_index("six")] < s[state.node_index("fresh")]
    off = Parts(learn_online=False, pattern_weight=0.0, pattern_penalty=0.0)
    off.prime(learned)
    s_off = scores(off, state, req("new", cpu=1000, milli=330))
    assert int(np.argmax(s_off)) != state.node_index("three30")  # without patterns the descent alone goes elsewhere
