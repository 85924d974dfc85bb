"""Property: forgetting old pods changes how much the default's learned workload weighs, not what it says.

A long-running scheduler fades what it has learned (``memory_pods``) so that a drifting mix shows through.
Fading alone, with no new pod, must leave the learned mix as it was: the same target shapes and frequencies,
the same CPU and memory per GPU and the same pinned share, and a total weight scaled by the factor. Shapes
too light to keep are the only thing it may drop.
"""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpufleet.engine.model import PodRequest
from gpufleet.policies.default import WorkloadArgs, WorkloadModel

SETTINGS = settings(max_examples=60, deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.too_slow])

POD = st.tuples(
    st.integers(min_value=0, max_value=64_000),  # CPU milli
    st.sampled_from([0, 50, 230, 470, 810, 1000]),  # GPU milli per GPU (0: a CPU-only pod)
    st.integers(min_value=1, max_value=8),  # GPUs
    st.sampled_from([(), ("Tesla-T4",), ("Tesla-T4", "NVIDIA-A100-SXM4-80GB")]),  # pinned models
)


def learned(pods) -> WorkloadModel:
    p = WorkloadModel(WorkloadArgs(learn_online=False))
    reqs = []
    for i, (cpu, milli, count, allow) in enumerate(pods):
        gpus = count if milli == 1000 else (1 if milli else 0)
        reqs.append(PodRequest(name=f"p{i}", cpu_milli=cpu, memory_mib=4096, gpu_count=gpus, gpu_milli=milli if gpus else 0,
                               gpu_models_allow=frozenset(allow) if allow and gpus else None))
    p.prime(reqs)
    return p


@SETTINGS
@given(st.lists(POD, min_size=1, max_size=60), st.floats(min_value=0.05, max_value=1.0))
def test_fading_keeps_the_learned_mix_and_scales_its_weight(pods, keep):
    p = learned(pods)
    before = (sum(p._counts.values()), dict(p._counts), list(p.sums), p.cpu_all, dict(p.pinned), dict(p.share_sizes),
              dict(p.ratios))
    p._forget(keep)
    weight, counts, sums, cpu_all, pinned, shares, ratios = before
    kept = {k: v * keep for k, v in counts.items() if v * keep >= 0.01}
    assert p._counts.keys() == kept.keys()
    for k, v in kept.items():
        assert np.isclose(p._counts[k], v)
    assert np.isclose(sum(p._counts.values()), weight * keep)  # a pod weighs >= 1, so nothing here is dropped
    for now, was in zip(p.sums, sums):
        assert np.isclose(now, was * keep)
    assert np.isclose(p.cpu_all, cpu_all * keep)
    if sums[0] > 0:  # CPU per GPU milli, as the stranding term reads it
        assert np.isclose(p.sums[1] / p.sums[0], sums[1] / sums[0])
    total_pinned = sum(pinned.values())
    if total_pinned:
        assert np.isclose(sum(p.pinned.values()), total_pinned * keep)
        for k, v in pinned.items():
            assert np.isclose(p.pinned[k] / sum(p.pinned.values()), v / total_pinned)
    assert set(p.share_sizes) == set(shares)
    for k, v in shares.items():
        assert np.isclose(p.share_sizes[k], v * keep)
    assert set(p.ratios) == set(ratios)  # the CPU-per-GPU histogram keeps its shape
    total = sum(ratios.values())
    for k, v in ratios.items():
        assert np.isclose(p.ratios[k] / sum(p.ratios.values()), v / total)
