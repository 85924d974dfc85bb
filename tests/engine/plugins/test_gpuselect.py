"""GPU selection on the chosen node: best fit for shares, NVLink islands for multi-GPU, MIG instances."""

from __future__ import annotations

import pytest

from gpufleet.engine import annotations as ann
from gpufleet.engine.framework import GpuChoice
from gpufleet.engine.model import Assignment, PodRequest
from gpufleet.engine.plugins.gpuselect import BestFitGpu, islands, pick_whole

from tests.builders import A100, T4, container, cycle_for, make_node, make_pod, state_of


def select(st, pod, node=0):
    return BestFitGpu().select_gpus(cycle_for(pod), st, node)


def _used(st, node, per_gpu_milli, mem_mib=0):
    for j, m in enumerate(per_gpu_milli):
        if m:
            st.reserve(Assignment(f"default/{node}-u{j}", node, 0, 0, gpu_indices=(j,), gpu_milli=m, gpu_memory_mib=(mem_mib,)))


def share(milli, mem=None):
    a = {ann.GPU_MILLI: str(milli)}
    if mem:
        a[ann.GPU_MEMORY] = mem
    return make_pod(annotations=a)


@pytest.mark.parametrize(
    "used, milli, expected",
    [
        ((0, 600, 400, 0), 300, (1,)),  # GPU 1 has 400 free: the tightest that fits
        ((0, 600, 400, 0), 400, (1,)),  # exact fit
        ((0, 600, 400, 0), 500, (2,)),  # 600 free
        ((0, 600, 400, 0), 700, (0,)),  # only empty GPUs; lowest index first
        ((0, 0, 0, 0), 100, (0,)),  # all equal -> lowest index
        ((300, 300, 0, 0), 100, (0,)),  # tie among the fullest -> lowest index
        ((1000, 1000, 1000, 950), 50, (3,)),
    ],
)
def test_best_fit_share(used, milli, expected):
    st = state_of(make_node("n", 4, T4))
    _used(st, "n", used)
    assert select(st, share(milli)) == GpuChoice(expected)


def test_best_fit_share_respects_gpu_memory():
    st = state_of(make_node("n", 3, T4))  # 15360 MiB each
    _used(st, "n", (900, 500, 0), mem_mib=8_192)
    # GPU 0 is the fullest but has 7168 MiB left; GPU 1 too; GPU 2 has all 15360
    assert select(st, share(100, "6Gi")) == GpuChoice((0,))
    assert select(st, share(100, "8Gi")) == GpuChoice((2,))


def test_share_with_no_gpu_that_fits_returns_none():
    st = state_of(make_node("n", 2, T4))
    _used(st, "n", (800, 900))
    assert select(st, share(300)) is None


def test_best_fit_share_ignores_disallowed_models():
    st = state_of(make_node("n", 2, T4))
    _used(st, "n", (500, 0))
    pod = make_pod(annotations={ann.GPU_MILLI: "100", ann.GPU_MODELS_DENY: T4})
    assert select(st, pod) is None


# --- whole GPUs and NVLink -------------------------------------------------------------

TWO_ISLANDS = [[0, 1, 2, 3], [4, 5, 6, 7]]


@pytest.mark.parametrize(
    "used, k, expected",
    [
        ((), 1, (0,)),
        ((), 4, (0, 1, 2, 3)),
        ((), 8, tuple(range(8))),
        ((0,), 1, (1,)),
        ((0,), 2, (1, 2)),  # the 3-GPU remnant island, keeping the 4-island whole
        ((0,), 3, (1, 2, 3)),
        ((0,), 4, (4, 5, 6, 7)),  # only the intact island holds 4
        ((0,), 5, (1, 2, 3, 4, 5)),  # no island holds 5: first eligible GPUs
        ((0, 5), 3, (1, 2, 3)),  # two 3-GPU islands: lowest first
        ((0, 1, 4), 2, (2, 3)),  # smallest island that holds 2: {2,3} over {5,6,7}
        ((0, 1, 2, 4), 2, (5, 6)),  # {3} too small
    ],
)
def test_whole_gpus_nvlink_island(used, k, expected):
    st = state_of(make_node("n", 8, A100, nvlink=TWO_ISLANDS))
    for j in used:
        st.reserve(Assignment(f"default/u{j}", "n", 0, 0, gpu_indices=(j,), gpu_milli=1000))
    assert select(st, make_pod(gpu=str(k))) == GpuChoice(expected)


def test_whole_gpus_without_nvlink_take_first_free():
    st = state_of(make_node("n", 4, T4))
    st.reserve(Assignment("default/u", "n", 0, 0, gpu_indices=(1,), gpu_milli=1000))
    assert select(st, make_pod(gpu="2")) == GpuChoice((0, 2))


def test_whole_gpus_skip_shared_and_unhealthy_gpus():
    st = state_of(make_node("n", 4, T4, unhealthy=[2]))
    _used(st, "n", (100, 0, 0, 0))
    assert select(st, make_pod(gpu="2")) == GpuChoice((1, 3))
    assert select(st, make_pod(gpu="3")) is None


def test_islands_helper():
    st = state_of(make_node("n", 6, A100, nvlink=[[0, 1, 2], [3, 4]]))
    assert islands(st, 0, [0, 2, 3, 4, 5]) == [[0, 2], [3, 4], [5]]
    assert pick_whole(st, 0, [0, 2, 3, 4, 5], 2) == (0, 2)
    assert pick_whole(st, 0, [0, 2, 5], 4) is None


# --- MIG ---------------------------------------------------------------------------------


def mig_pod(profile="1g.10gb", n=1):
    return make_pod(containers=[container(limits={f"nvidia.com/mig-{profile}": str(n)})])


def _mig_state():
    # GPU 0: three 1g.10gb; GPU 1: one 1g.10gb and a 3g.40gb; GPU 2: plain
    return state_of(make_node("n", 3, A100, mig={0: ["1g.10gb"] * 3, 1: ["1g.10gb", "3g.40gb"]}))


@pytest.mark.parametrize(
    "profile, n, expected",
    [
        ("1g.10gb", 1, ((1, 0),)),  # from the GPU with the fewest free instances of the profile
        ("1g.10gb", 2, ((1, 0), (0, 0))),
        ("1g.10gb", 4, ((1, 0), (0, 0), (0, 1), (0, 2))),
        ("3g.40gb", 1, ((1, 1),)),
    ],
)
def test_mig_instance_choice(profile, n, expected):
    assert select(_mig_state(), mig_pod(profile, n)) == GpuChoice(mig=expected)


def test_mig_not_enough_instances():
    assert select(_mig_state(), mig_pod("1g.10gb", 5)) is None
    assert select(_mig_state(), mig_pod("2g.20gb", 1)) is None


def test_mig_taken_instances_are_skipped():
    st = _mig_state()
    st.reserve(Assignment("default/m", "n", 0, 0, mig=((1, 0),), mig_profile="1g.10gb"))
    # GPU 1 has none of the profile left; GPU 0's first instance goes next
    assert select(st, mig_pod()) == GpuChoice(mig=((0, 0),))


def test_whole_gpu_pod_never_gets_a_mig_gpu():
    st = _mig_state()
    assert select(st, make_pod(gpu="1")) == GpuChoice((2,))
    assert select(st, make_pod(gpu="2")) is None


def test_pod_request_without_parse():
    """Selection works on a PodRequest built directly, as the simulator does."""
    st = state_of(make_node("n", 2, T4))
    _used(st, "n", (250, 0))
    assert select(st, PodRequest("x", gpu_count=1, gpu_milli=500)) == GpuChoice((0,))


def test_mig_instance_choice_honours_model_lists():
    from gpufleet.engine.model import Gpu, Node

    from tests.builders import mig_instances

    h100 = "NVIDIA-H100-80GB-HBM3"
    node = Node(
        "mixed",
        64_000,
        262_144,
        gpus=(
            Gpu(0, "u0", A100, 81_920, mig_enabled=True, mig_instances=mig_instances(A100, ["1g.10gb"])),
            Gpu(1, "u1", h100, 81_559, mig_enabled=True, mig_instances=mig_instances(h100, ["1g.10gb", "1g.10gb"])),
        ),
    )
    st = state_of(node)
    deny_h100 = make_pod(containers=[container(limits={"nvidia.com/mig-1g.10gb": "1"})], annotations={ann.GPU_MODELS_DENY: h100})
    assert select(st, deny_h100) == GpuChoice(mig=((0, 0),))
    only_h100 = make_pod(containers=[container(limits={"nvidia.com/mig-1g.10gb": "2"})], annotations={ann.GPU_MODELS: h100})
    assert select(st, only_h100) == GpuChoice(mig=((1, 0), (1, 1)))
    two_a100 = make_pod(containers=[container(limits={"nvidia.com/mig-1g.10gb": "2"})], annotations={ann.GPU_MODELS: A100})
    assert select(st, two_a100) is None
