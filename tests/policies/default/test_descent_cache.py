"""The descent's (and FGD's) cached scores: a pod is scored for its own resources, whatever pod of its shape came before."""

from __future__ import annotations

import numpy as np
import pytest

from gpufleet.engine.framework import Cycle, GpuChoice, Profile, Scheduler
from gpufleet.engine.model import Assignment, PodRequest
from gpufleet.engine.state import ClusterState
from gpufleet.policies import build_profile
from gpufleet.policies.default.reserves import WHOLE_KEPT
from tests.builders import A100, make_node
from tests.policies.default.test_policy import Parts


def primed(**kw) -> tuple[Parts, Scheduler]:
    """A fixed target of whole-GPU pods with 16 GiB each, on two nodes with roomy CPU: on "tight", 64 GiB of memory
    feeds 4 of its 8 GPUs (memory strands GPUs there); on "roomy", memory feeds all."""
    p = Parts(learn_online=False, **kw)
    p.prime([PodRequest(name=f"w{i}", cpu_milli=4000, memory_mib=16_384, gpu_count=1, gpu_milli=1000) for i in range(100)])
    state = ClusterState([make_node("tight", 8, A100, cpu_milli=512_000, memory_mib=65_536),
                          make_node("roomy", 8, A100, cpu_milli=512_000, memory_mib=1 << 20)])
    return p, Scheduler(Profile("descent", scores=[(p.descent, 1)], gpu_selector=p.descent), state)


def cycle(r: PodRequest) -> Cycle:
    return Cycle(request=r, rng=np.random.default_rng(0))


@pytest.mark.parametrize("milli", [1000, 500])  # a whole GPU (node scores), a share (per-GPU scores)
def test_pods_differing_only_in_memory_are_scored_for_their_own_memory(milli):
    small, big = (PodRequest(name=n, cpu_milli=4000, memory_mib=m, gpu_count=1, gpu_milli=milli)
                  for n, m in (("small", 1024), ("big", 32_768)))
    nodes = np.arange(2)
    _, sched = primed()
    sched._score(cycle(small), nodes)  # fills the caches for the shape
    got = sched._score(cycle(big), nodes)
    _, fresh = primed()
    want = fresh._score(cycle(big), nodes)  # the same plugin state, nothing cached
    np.testing.assert_array_equal(got, want)
    assert want[0] < want[1]  # the big pod's memory strands GPUs on "tight": it goes where memory is
    assert fresh._score(cycle(small), nodes)[0] > want[0]


def test_memory_is_left_out_of_the_key_where_the_descent_does_not_read_it():
    small, big = (PodRequest(name=n, cpu_milli=4000, memory_mib=m, gpu_count=1, gpu_milli=500)
                  for n, m in (("small", 1024), ("big", 32_768)))
    on, _ = primed()
    off, _ = primed(memory_strand=False)
    assert on.descent.cache_key(cycle(small)) != on.descent.cache_key(cycle(big))
    assert off.descent.cache_key(cycle(small)) == off.descent.cache_key(cycle(big))  # one cached score for both


@pytest.mark.parametrize("policy", ["fgd", "default"])
@pytest.mark.parametrize("held_milli", [(100, 300), (300, 100)])
def test_a_share_asking_gpu_memory_gets_a_gpu_with_that_memory_after_one_of_its_shape_that_asked_none(policy, held_milli):
    state = ClusterState([make_node("n1", 2, A100, gpu_memory_mib=40_960, cpu_milli=64_000, memory_mib=262_144),
                          make_node("n2", 1, A100, gpu_memory_mib=40_960, cpu_milli=64_000, memory_mib=262_144)])
    # n1: GPU 0 has 10 GiB of memory free, GPU 1 39 GiB
    state.reserve(Assignment("default/x", "n1", 1000, 1024, gpu_indices=(0,), gpu_milli=held_milli[0], gpu_memory_mib=(30_720,)))
    state.reserve(Assignment("default/y", "n1", 1000, 1024, gpu_indices=(1,), gpu_milli=held_milli[1], gpu_memory_mib=(1024,)))
    sched = Scheduler(build_profile(policy), state, seed=0)
    nodes = np.arange(2)
    plain = PodRequest(name="plain", cpu_milli=1000, memory_mib=1024, gpu_count=1, gpu_milli=500)
    sched._score(cycle(plain), nodes)  # fills the caches for the shape
    asks = PodRequest(name="asks", cpu_milli=1000, memory_mib=1024, gpu_count=1, gpu_milli=500, gpu_memory_mib=20_480)
    c = cycle(asks)
    sched._score(c, nodes)
    assert sched.profile.gpu_selector.select_gpus(c, state, 0) == GpuChoice((1,))


def test_scores_of_an_older_workload_version_are_dropped_and_decisions_do_not_change():
    """The default learns its workload online; at each refresh its version moves and every cached score of the older
    version is dead.  The framework (and the per-GPU cache) forget them, and the decisions are those made keeping them."""
    nodes = [make_node(f"n{i}", 8, A100, cpu_milli=64_000, memory_mib=262_144) for i in range(40)]
    pods = [PodRequest(name=f"p{i}", cpu_milli=1000 * (1 + i % 5), memory_mib=4096 * (1 + i % 3), gpu_count=1,
                       gpu_milli=[1000, 250, 500, 300][i % 4]) for i in range(300)]

    def run(keep: bool) -> tuple[list, Scheduler]:
        s = Scheduler(build_profile("default"), ClusterState(nodes), seed=0)
        if keep:
            s._drop_older = lambda name, version: None  # type: ignore[method-assign]
        out = [(d.assignment.node, d.assignment.gpu_indices, d.score) if d.ok and d.assignment else d.status.code
               for d in (s.schedule(r) for r in pods)]
        return out, s

    dropped, s = run(keep=False)
    kept, k = run(keep=True)
    assert dropped == kept
    descent = next(p for p, _ in s.profile.scores if p.name == "DescentScore")
    assert descent.cache_version() > 3  # it refreshed several times in these 300 pods
    versions = {ck[1][0][1] if ck[1][-1] is WHOLE_KEPT else ck[1][1] for ck in s._cache if ck[0] == "DescentScore"}
    assert versions == {descent.cache_version()}
    assert len(s._cache) < len(k._cache)
    assert {key[1] for key in descent._gsel} == {descent.cache_version()}
