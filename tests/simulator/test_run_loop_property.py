"""Property tests for the packing run's bulk bookkeeping against the per-pod reference it replaced.

``IdleRecorder.observe_many`` (every arrival of a run recorded in a few numpy calls) must leave the recorder exactly as
``observe`` called once per arrival does (the failure keys in the order they first failed, the saturation and the
first refusal, with no capacity too), however the arrivals are split into batches; and ``packing._running_frag`` (the
cluster's fragment and idle milli after each arrival, as running sums over the placements) must give the bits of the
per-placement loop of the run before it.
"""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpufleet.engine.gpu_models import lookup
from gpufleet.engine.model import Gpu, Node, PodRequest
from gpufleet.engine.state import ClusterState
from gpufleet.policies.paper.workload import TargetWorkload, frag_amount
from gpufleet.simulator.bounds.idle import ArrivalFacts, IdleRecorder
from gpufleet.simulator.experiments import packing, shared

SETTINGS = settings(max_examples=60, deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
MODELS = ["T4", "P100", "V100M32"]


def _node(i: int, model: str, ngpu: int, cpu: int) -> Node:
    gpus = tuple(Gpu(j, f"n{i}-g{j}", model, lookup(model).memory_mib) for j in range(ngpu))
    return Node(name=f"n{i}", cpu_milli=cpu, memory_mib=65536, gpus=gpus, labels={"nvidia.com/gpu.product": model},
                max_pods=10**6)


@st.composite
def nodes_st(draw) -> list[Node]:
    return [_node(i, draw(st.sampled_from(MODELS)), draw(st.sampled_from([0, 1, 2, 4])), draw(st.sampled_from([4000, 64000])))
            for i in range(draw(st.integers(1, 5)))]


@st.composite
def request_st(draw, i: int) -> PodRequest:
    count = draw(st.sampled_from([0, 0, 1, 1, 1, 2]))
    milli = draw(st.sampled_from([1000, 500, 810, 250])) if count == 1 else (1000 if count else 0)
    allow = draw(st.sampled_from([None, frozenset(), frozenset({"T4"}), frozenset({"P100", "T4"})]))
    return PodRequest(name=f"p{i}", cpu_milli=draw(st.sampled_from([0, 1000, 4000])), memory_mib=1024, gpu_count=count,
                      gpu_milli=milli, gpu_models_allow=allow)


@SETTINGS
@given(data=st.data())
def test_observe_many_is_observe_one_by_one(data):
    nodes = data.draw(nodes_st())
    state = ClusterState(nodes)
    n = data.draw(st.integers(0, 40))
    reqs = [data.draw(request_st(i)) for i in range(n)]
    where = np.array([data.draw(st.integers(-1, len(nodes) - 1)) for _ in range(n)], dtype=np.int64)
    capacity = data.draw(st.sampled_from([0, 1000, 5000, 100_000]))
    cuts = sorted(data.draw(st.lists(st.integers(0, n), max_size=3)))

    one = IdleRecorder(capacity)
    for req, w in zip(reqs, where.tolist()):
        one.observe(state, req, None if w < 0 else w)
    bulk = IdleRecorder(capacity)
    facts = ArrivalFacts.of(reqs)
    for a, b in zip([0, *cuts], [*cuts, n]):
        bulk.observe_many(state, facts, where, a, b)

    for f in ("capacity", "arrived", "allocated", "saturation", "first_refusal", "arrivals", "shapes", "cpu_only_failed",
              "cpu_only_failed_cpu_milli"):
        assert getattr(bulk, f) == getattr(one, f), f
    assert list(bulk.failed.items()) == list(one.failed.items())  # the same keys in the same order
    assert dict(bulk.used_by) == dict(one.used_by)


def _running_frag_one_by_one(empty, where, placed_at, placed_cpu, placed_left, gpu_usable, tw):
    """The run's loop before ``_running_frag`` (the reference)."""
    n, p = where.size, len(placed_at)
    placed_node = where[np.asarray(placed_at, dtype=np.int64)]
    placed_left[:p] *= gpu_usable[placed_node[:p]]
    placed_model = empty.model_of[placed_node]
    new_frag = frag_amount(placed_cpu[:p], placed_left[:p], placed_model[:p], tw, empty.access).tolist()
    new_idle = placed_left[:p].sum(axis=1).tolist()
    node_frag_l, idle_l = empty.node_frag.tolist(), empty.idle.tolist()
    frag_sum, idle_sum = empty.frag_sum, empty.idle_sum
    frag, idle_total = np.zeros(n), np.zeros(n)
    last = 0
    for row, k in enumerate(placed_at):
        frag[last:k] = frag_sum
        idle_total[last:k] = idle_sum
        i, f, li = int(placed_node[row]), new_frag[row], float(new_idle[row])
        frag_sum += f - node_frag_l[i]
        node_frag_l[i] = f
        idle_sum += li - idle_l[i]
        idle_l[i] = li
        last = k
    frag[last:] = frag_sum
    idle_total[last:] = idle_sum
    return frag, idle_total


@SETTINGS
@given(data=st.data())
def test_running_frag_is_the_sums_placement_by_placement(data):
    nodes = data.draw(nodes_st().filter(lambda ns: any(x.gpus for x in ns)))
    reqs = [data.draw(request_st(i)) for i in range(data.draw(st.integers(1, 12)))]
    state = ClusterState(nodes)
    tw = TargetWorkload.from_requests(reqs)
    shared._MEMO.clear()
    empty = packing._empty_cluster(nodes, [], state, tw)
    n = data.draw(st.integers(0, 30))
    placed_at = sorted(data.draw(st.sets(st.integers(0, n - 1), max_size=n))) if n else []
    where = np.full(n, -1, dtype=np.int64)
    for k in placed_at:
        where[k] = data.draw(st.integers(0, len(nodes) - 1))
    g = empty.gpus
    placed_cpu = np.array([data.draw(st.integers(0, 64000)) for _ in range(n)], dtype=state.cpu_free.dtype)
    placed_left = np.array([[data.draw(st.sampled_from([0, 190, 500, 1000])) for _ in range(g)] for _ in range(n)],
                           dtype=empty.left_dtype).reshape(n, g)
    usable = state.gpu_usable.copy()
    got = packing._running_frag(empty, where, placed_at, placed_cpu.copy(), placed_left.copy(), usable, tw)
    want = _running_frag_one_by_one(empty, where, placed_at, placed_cpu.copy(), placed_left.copy(), usable, tw)
    assert np.array_equal(got[0], want[0]) and np.array_equal(got[1], want[1])
    shared._MEMO.clear()
