"""The default policy's whole-GPU reserve: while whole GPUs are scarce, a share that would waste most of one goes on a used GPU."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpufleet.engine.framework import Cycle
from gpufleet.engine.model import PodRequest
from gpufleet.engine.state import ClusterState
from gpufleet.policies import profile_config
from gpufleet.policies.default import WHOLE_KEPT, WholeGpuReserve, WholeGpuReserveArgs, WorkloadModel
from tests.builders import T4, make_node, scheduler, verdicts

R = WholeGpuReserve.REASON


def share(name: str, milli: int, cpu: int = 2000, node: str | None = None) -> PodRequest:
    sel = (("kubernetes.io/hostname", node),) if node else ()
    return PodRequest(name=name, cpu_milli=cpu, memory_mib=1024, gpu_count=1, gpu_milli=milli, node_selector=sel)


def nodes():
    # 8 T4s on two nodes with CPU to spare: GPUs bind first
    return [make_node("n0", 4, T4, cpu_milli=64_000), make_node("n1", 4, T4, cpu_milli=64_000)]


def learned(mix=((1000, 32), (810, 24), (470, 8)), cpu_only: int = 0, **kw) -> WholeGpuReserve:
    """A workload of whole GPUs, 810s (whose 190 nothing seen fills) and 470s (which fill each other's 530)."""
    model = WorkloadModel()
    i = 0
    for milli, n in mix:
        for _ in range(n):
            model.observe(share(f"seen{i}", milli))
            i += 1
    for j in range(cpu_only):
        model.observe(PodRequest(name=f"cpu{j}", cpu_milli=64_000, memory_mib=1024))
    return WholeGpuReserve(WholeGpuReserveArgs.from_config("WholeGpuReserve", kw), model)


def cluster(*placed: tuple[str, int]) -> ClusterState:
    """The two nodes with shares of (node, milli) placed, each on a whole GPU of its own."""
    s = scheduler(nodes(), "bestfit")
    for k, (node, milli) in enumerate(placed):
        assert s.schedule(share(f"placed{k}", milli, node=node)).ok
    return s.state


# n0: a 150-milli share (850 free), two GPUs in use, one whole; n1: two in use, two whole.  3 of 8 whole
SCARCE = (("n0", 150), ("n0", 1000), ("n0", 1000), ("n1", 1000), ("n1", 1000))


VERDICT_CASES = [
    ("whole GPUs plentiful", {"whole_reserve": 1.0}, (), share("x", 810), {"n0": None, "n1": None}),
    ("scarce: only the node with a used GPU that takes it", {"whole_reserve": 1.0}, SCARCE, share("x", 810), {"n0": None, "n1": R}),
    ("scarce, and no used GPU takes it", {"whole_reserve": 1.0}, (("n0", 300), *SCARCE[1:]), share("x", 810), {"n0": R, "n1": R}),
    ("scarce, a share size never seen", {"whole_reserve": 1.0}, (("n0", 100), *SCARCE[1:]), share("x", 860), {"n0": None, "n1": None}),
    ("scarce, but its room is filled by what is seen", {"whole_reserve": 1.0}, SCARCE, share("x", 470), {"n0": None, "n1": None}),
    ("scarce, a whole-GPU pod", {"whole_reserve": 1.0}, SCARCE, share("x", 1000), {"n0": None, "n1": None}),
    ("scarce, reserve off", {"whole_reserve": 0.0}, SCARCE, share("x", 810), {"n0": None, "n1": None}),
    ("no pod seen asks one whole GPU: nothing to keep them for", {"whole_reserve": 1.0, "mix": ((810, 40), (470, 24))}, SCARCE,
     share("x", 810), {"n0": None, "n1": None}),
    ("kept in proportion to that demand: 3 whole of 8 is enough at half of 1.0", {"whole_reserve": 1.0, "mix": ((1000, 16), (810, 40), (470, 8))},
     SCARCE, share("x", 810), {"n0": None, "n1": None}),
    ("scarce by the default share? 3 of 8 whole is not", {}, SCARCE, share("x", 810), {"n0": None, "n1": None}),
    ("scarce, small shares seen fill the 190", {"whole_reserve": 1.0, "mix": ((1000, 32), (810, 24), (160, 24))}, SCARCE,
     share("x", 810), {"n0": None, "n1": None}),
    ("scarce, but CPU binds first", {"whole_reserve": 1.0, "cpu_only": 16}, SCARCE, share("x", 810), {"n0": None, "n1": None}),
    ("scarce, no workload learned yet", {"whole_reserve": 1.0, "mix": ((1000, 16), (810, 16))}, SCARCE, share("x", 810),
     {"n0": None, "n1": None}),
]


@pytest.mark.parametrize("case, policy, placed, pod, want", VERDICT_CASES)
def test_whole_reserve_verdicts(case, policy, placed, pod, want):
    assert verdicts(learned(**policy), pod, cluster(*placed)) == want, case


@pytest.mark.parametrize("case, policy, placed, pod, want", VERDICT_CASES)
def test_the_queueing_hint_is_the_filters_verdict(case, policy, placed, pod, want):
    """``may_pass`` (the reserve's queueing hint) on one node at a time: it rules a node out exactly where the filter
    turns the pod away; on both nodes at once, it rules them out only when the filter turns it away from both."""
    plugin, state = learned(**policy), cluster(*placed)
    res = plugin.filter(Cycle(request=pod, rng=np.random.default_rng(0)), state)
    for d, name in enumerate(("n0", "n1")):
        where = plugin.may_pass(pod, state, 0.0, np.array([d]))
        assert (where is not None and not where[0]) == (want[name] is not None) == (not res.ok[d]), (case, name)
    both = plugin.may_pass(pod, state, 0.0, np.arange(2))
    assert (both is not None and not both.any()) == (not res.ok.any()), case
    assert plugin.may_pass(pod, state, 600.0, np.arange(2)) is None  # a pod that waited this long may take a whole GPU


@pytest.mark.parametrize("waited_s, take_held, kept", [(0.0, False, True), (599.0, False, True), (600.0, False, False),
                                                        (0.0, True, False)])
def test_a_pod_that_waited_or_would_evict_may_take_a_whole_gpu(waited_s, take_held, kept):
    cyc = Cycle(request=share("x", 810), rng=np.random.default_rng(0), waited_s=waited_s, take_held=take_held)
    res = learned(whole_reserve=1.0).filter(cyc, cluster(*SCARCE))
    assert (not res.ok[1]) == kept and res.passes_all == (not kept)
    assert (cyc.read(WHOLE_KEPT) is not None) == kept  # the descent reads which nodes keep their whole GPUs


def default_with(**args) -> dict:
    cfg = dict(profile_config("default")["profiles"][0])
    cfg["pluginConfig"] = {"WholeGpuReserve": args}
    return cfg


def test_the_share_joins_the_used_gpu_not_a_whole_one_on_the_same_node():
    s = scheduler(nodes(), default_with(whole_reserve=1.0))
    for i, milli in enumerate([1000] * 32 + [810] * 24 + [470] * 8):
        s.observe(share(f"seen{i}", milli))
    for k, (node, milli) in enumerate((("n0", 150), ("n0", 1000), ("n1", 1000), ("n1", 1000), ("n1", 1000), ("n1", 1000))):
        assert s.schedule(share(f"placed{k}", milli, node=node)).ok
    # 2 of 8 GPUs whole, both on n0 beside the 150: the 810 joins the 150 (850 free), not a whole GPU
    before = s.state.gpu_free_milli[0].copy()
    d = s.schedule(share("x", 810))
    assert d.ok and d.assignment.node == "n0"
    g = d.assignment.gpu_indices[0]
    assert before[g] == 850 and s.state.gpu_free_milli[0, g] == 40
    # the next 810 finds no used GPU with room: it waits, and says why
    d = s.schedule(share("y", 810))
    assert not d.ok and R in d.status.message
    # a whole-GPU pod still gets one
    assert s.schedule(share("z", 1000)).ok


def test_whole_gpu_counts_kept_between_cycles_follow_every_placement_and_release():
    """The per-node whole-GPU counts are kept between cycles (WholeGpuReserve._whole_gpus): after every placement
    and release, one plugin's verdicts and kept nodes equal a fresh plugin's."""
    s = scheduler(nodes(), "bestfit")
    warm = learned(whole_reserve=1.0)
    kept_at = []

    def check(step):
        cw, cf = (Cycle(request=share("x", 810), rng=np.random.default_rng(0)) for _ in range(2))
        a, b = warm.filter(cw, s.state), learned(whole_reserve=1.0).filter(cf, s.state)
        assert (a.ok == b.ok).all() and a.passes_all == b.passes_all, step
        ka, kb = cw.read(WHOLE_KEPT), cf.read(WHOLE_KEPT)
        assert (ka is None) == (kb is None) and (ka is None or (ka == kb).all()), step
        kept_at.append(ka is not None)

    for k, (node, milli) in enumerate([*SCARCE, ("n1", 300), ("n0", 1000)]):
        assert s.schedule(share(f"placed{k}", milli, node=node)).ok
        check(k)
    s.state.unreserve("placed3")
    check("released")
    assert any(kept_at) and not all(kept_at)  # the reserve was on at some steps, off at others


@settings(max_examples=200, deadline=None, derandomize=True, database=None)
@given(st.data())
def test_fed_sum_is_the_floor_division_sum(data):
    """fed_sum gives np.minimum(whole, max(cpu, 0) // per).sum() exactly, near the floor division's edges too; fed_lower
    is a part of it."""
    from gpufleet.policies.default.reserves import fed_lower, fed_sum

    g = data.draw(st.sampled_from([1, 2, 4, 8, 16]))
    k = data.draw(st.integers(0, 60))
    per = data.draw(st.one_of(st.floats(0.5, 64_000.0), st.sampled_from([1000.0, 1234.5678, 333.3333333333333, 0.1 * 3])))
    whole = np.array(data.draw(st.lists(st.integers(0, g), min_size=k, max_size=k)), dtype=np.int64)
    near = st.builds(lambda q, d: int(q * per) + d, st.integers(0, g + 3), st.integers(-2, 2))  # at multiples of per
    cpu = np.array(data.draw(st.lists(st.one_of(st.integers(-5_000, 600_000), near), min_size=k, max_size=k)), dtype=np.int64)
    want = np.minimum(whole, np.maximum(cpu, 0) // per).sum()
    got = fed_sum(whole, cpu, per, g)
    assert got == want and float(got) == float(want)
    # fed_lower: the whole GPUs of the nodes fed_sum counts in full, never above it (_scarce's early "no")
    lower = fed_lower(whole, cpu, per, g)
    assert lower == int(whole[np.maximum(cpu, 0) >= (g + 2) * per].sum()) and lower <= got
