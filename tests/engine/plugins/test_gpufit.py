"""GpuFit: whole GPUs, shares by milli and memory, MIG, model lists; the filter agrees with eligible_gpus."""

from __future__ import annotations

import pytest

from gpufleet.engine import annotations as ann
from gpufleet.engine.model import Assignment, PodRequest
from gpufleet.engine.plugins.gpufit import GpuFit, eligible_gpus

from tests.builders import A100, T4, V100, container, make_node, make_pod, state_of, verdicts

NO_GPU = "Insufficient nvidia.com/gpu"
NO_MILLI = "Insufficient GPU milli"
NO_GMEM = "Insufficient GPU memory"
NO_MODEL = "node(s) had no GPU of an allowed model"


def _gpu_state():
    """cpu: no GPU; t4x2: two T4, GPU 0 has 600 milli / 10 GiB used; a100: one A100 whole and free;
    v100x4: four V100, GPU 3 unhealthy; mig: A100 in MIG mode (2 x 1g.10gb) + one plain A100."""
    st = state_of(
        make_node("cpu"),
        make_node("t4x2", 2, T4),
        make_node("a100", 1, A100),
        make_node("v100x4", 4, V100, unhealthy=[3]),
        make_node("mig", 2, A100, mig={0: ["1g.10gb", "1g.10gb"]}),
    )
    st.reserve(Assignment("default/sharer", "t4x2", 0, 0, gpu_indices=(0,), gpu_milli=600, gpu_memory_mib=(10_240,)))
    return st


def shared(milli=None, mem=None, models=None, deny=None, gpu=None):
    a = {}
    if milli is not None:
        a[ann.GPU_MILLI] = str(milli)
    if mem is not None:
        a[ann.GPU_MEMORY] = mem
    if models:
        a[ann.GPU_MODELS] = models
    if deny:
        a[ann.GPU_MODELS_DENY] = deny
    return make_pod(annotations=a, gpu=gpu)


GPU_CASES = [
    ("cpu-only pod fits everywhere", make_pod(), {"cpu": None, "t4x2": None, "a100": None, "v100x4": None, "mig": None}),
    ("1 whole GPU", make_pod(gpu="1"), {"cpu": NO_GPU, "t4x2": None, "a100": None, "v100x4": None, "mig": None}),
    ("2 whole GPUs: partly used GPU and MIG GPU do not count", make_pod(gpu="2"), {"cpu": NO_GPU, "t4x2": NO_GPU, "a100": NO_GPU, "v100x4": None, "mig": NO_GPU}),
    ("3 whole GPUs: unhealthy GPU does not count", make_pod(gpu="3"), {"cpu": NO_GPU, "t4x2": NO_GPU, "a100": NO_GPU, "v100x4": None, "mig": NO_GPU}),
    ("4 whole GPUs", make_pod(gpu="4"), {"cpu": NO_GPU, "t4x2": NO_GPU, "a100": NO_GPU, "v100x4": NO_GPU, "mig": NO_GPU}),
    ("share 400 fits on the used T4 too", shared(400), {"cpu": NO_MILLI, "t4x2": None, "a100": None, "v100x4": None, "mig": None}),
    ("share 1000 via annotation is whole", shared(1000), {"cpu": NO_GPU, "t4x2": None, "a100": None, "v100x4": None, "mig": None}),
    ("GPU memory 12Gi: T4 GPU 1 has 15Gi", shared(100, "12Gi"), {"cpu": NO_MILLI, "t4x2": None, "a100": None, "v100x4": None, "mig": None}),
    ("GPU memory 16Gi: more than a T4", shared(100, "16Gi"), {"cpu": NO_MILLI, "t4x2": NO_GMEM, "a100": None, "v100x4": None, "mig": None}),
    ("GPU memory only", shared(mem="40Gi"), {"cpu": NO_MILLI, "t4x2": NO_GMEM, "a100": None, "v100x4": NO_GMEM, "mig": None}),
    ("allow list", shared(100, models=f"{A100}"), {"cpu": NO_MODEL, "t4x2": NO_MODEL, "a100": None, "v100x4": NO_MODEL, "mig": None}),
    ("deny list", shared(100, deny=f"{T4},{A100}"), {"cpu": NO_MODEL, "t4x2": NO_MODEL, "a100": NO_MODEL, "v100x4": None, "mig": NO_MODEL}),
    ("allow list with whole GPUs", make_pod(gpu="2", annotations={ann.GPU_MODELS: T4}), {"cpu": NO_MODEL, "t4x2": NO_GPU, "a100": NO_MODEL, "v100x4": NO_MODEL, "mig": NO_MODEL}),
    (
        "MIG 1g.10gb x2",
        make_pod(containers=[container(limits={"nvidia.com/mig-1g.10gb": "2"})]),
        {n: (None if n == "mig" else "Insufficient nvidia.com/mig-1g.10gb") for n in ("cpu", "t4x2", "a100", "v100x4", "mig")},
    ),
    (
        "MIG 1g.10gb x3: too many",
        make_pod(containers=[container(limits={"nvidia.com/mig-1g.10gb": "3"})]),
        {n: "Insufficient nvidia.com/mig-1g.10gb" for n in ("cpu", "t4x2", "a100", "v100x4", "mig")},
    ),
    (
        "MIG profile the node lacks",
        make_pod(containers=[container(limits={"nvidia.com/mig-3g.40gb": "1"})]),
        {n: "Insufficient nvidia.com/mig-3g.40gb" for n in ("cpu", "t4x2", "a100", "v100x4", "mig")},
    ),
]


@pytest.mark.parametrize("pod, expected", [c[1:] for c in GPU_CASES], ids=[c[0] for c in GPU_CASES])
def test_gpu_fit(pod, expected):
    assert verdicts(GpuFit(), pod, _gpu_state()) == expected


def test_share_is_per_gpu_not_per_node():
    """700 milli free in total (2 x 350) is not one GPU with 700 free."""
    st = state_of(make_node("n", 2, T4))
    for j in (0, 1):
        st.reserve(Assignment(f"default/x{j}", "n", 0, 0, gpu_indices=(j,), gpu_milli=650, gpu_memory_mib=(0,)))
    assert verdicts(GpuFit(), shared(350), st) == {"n": None}
    assert verdicts(GpuFit(), shared(351), st) == {"n": NO_MILLI}


def test_whole_gpu_blocked_by_memory_only_reservation():
    st = state_of(make_node("n", 1, T4))
    st.reserve(Assignment("default/m", "n", 0, 0, gpu_indices=(0,), gpu_milli=0, gpu_memory_mib=(1024,)))
    assert verdicts(GpuFit(), make_pod(gpu="1"), st) == {"n": NO_GPU}
    assert verdicts(GpuFit(), shared(1000), st) == {"n": NO_GPU}
    assert verdicts(GpuFit(), shared(999), st) == {"n": None}


def test_mig_instances_on_unhealthy_gpu_are_not_offered():
    st = state_of(make_node("n", 1, A100, mig={0: ["1g.10gb"]}, unhealthy=[0]))
    assert verdicts(GpuFit(), make_pod(containers=[container(limits={"nvidia.com/mig-1g.10gb": "1"})]), st) == {
        "n": "Insufficient nvidia.com/mig-1g.10gb"
    }


@pytest.mark.parametrize(
    "req, expected",
    [
        (PodRequest("w", gpu_count=1, gpu_milli=1000), [[False, True], [True, False]]),
        (PodRequest("s", gpu_count=1, gpu_milli=400), [[True, True], [True, False]]),
        (PodRequest("s", gpu_count=1, gpu_milli=401), [[False, True], [True, False]]),
        (PodRequest("m", gpu_count=1, gpu_milli=100, gpu_memory_mib=15_000), [[False, True], [True, False]]),
        (PodRequest("d", gpu_count=1, gpu_milli=100, gpu_models_deny=frozenset({T4})), [[False, False], [True, False]]),
    ],
)
def test_eligible_gpus_matches_filter(req, expected):
    st = state_of(make_node("t4", 2, T4), make_node("a10", 1, "NVIDIA-A10"))
    st.reserve(Assignment("default/x", "t4", 0, 0, gpu_indices=(0,), gpu_milli=600, gpu_memory_mib=(1_000,)))
    assert eligible_gpus(st, req).tolist() == expected


@pytest.mark.parametrize(
    "annotations, expected",
    [
        ({}, None),
        ({ann.GPU_MODELS: A100}, None),
        ({ann.GPU_MODELS: T4}, NO_MODEL),
        ({ann.GPU_MODELS_DENY: A100}, NO_MODEL),
        ({ann.GPU_MODELS_DENY: T4}, None),
    ],
)
def test_mig_request_honours_model_lists(annotations, expected):
    st = state_of(make_node("mig", 1, A100, mig={0: ["1g.10gb"]}))
    pod = make_pod(containers=[container(limits={"nvidia.com/mig-1g.10gb": "1"})], annotations=annotations)
    assert verdicts(GpuFit(), pod, st) == {"mig": expected}


def test_a_node_whose_device_plugin_is_down_takes_no_gpu_pod_and_says_why():
    # kube/plugin_down marks it: kubelet refused a pod there because gpufleet's agent was not serving the plugin
    from dataclasses import replace

    from gpufleet.engine.plugins.gpufit import PLUGIN_DOWN

    st = state_of(make_node("up", 2, A100), replace(make_node("down", 2, A100), gpu_plugin_down=True),
                  replace(make_node("migdown", 1, A100, mig={0: ["1g.10gb"]}), gpu_plugin_down=True))
    assert verdicts(GpuFit(), make_pod(gpu="1"), st) == {"up": None, "down": PLUGIN_DOWN, "migdown": PLUGIN_DOWN}
    assert verdicts(GpuFit(), shared(250), st)["down"] == PLUGIN_DOWN
    mig = make_pod(containers=[container(limits={"nvidia.com/mig-1g.10gb": "1"})])
    assert verdicts(GpuFit(), mig, st)["migdown"] == PLUGIN_DOWN
    assert verdicts(GpuFit(), make_pod(), st) == {"up": None, "down": None, "migdown": None}  # no GPU asked: not held
    assert "GPU device plugin down" in PLUGIN_DOWN
    st2 = state_of(make_node("up", 2, A100))
    assert not st2.any_plugin_down and st.any_plugin_down
