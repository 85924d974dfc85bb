"""Each filter plugin's accept/reject cases, with the reason string it reports."""

from __future__ import annotations

import pytest

from gpufleet.engine import annotations as ann
from gpufleet.engine.model import Assignment, PodRequest, Requirement, SelectorTerm, Taint, Toleration
from gpufleet.engine.plugins.filters import (
    GpuFit,
    NodeAffinity,
    NodeResourcesFit,
    NodeUnschedulable,
    TaintToleration,
    eligible_gpus,
    term_matches,
)

from tests.builders import A100, T4, V100, affinity, container, expr, make_node, make_pod, state_of, verdicts

# --- NodeUnschedulable ------------------------------------------------------------------

UNSCHED = "node(s) were unschedulable"


@pytest.mark.parametrize(
    "tolerations, cordoned_ok",
    [
        ([], False),
        ([{"key": "node.kubernetes.io/unschedulable", "operator": "Exists", "effect": "NoSchedule"}], True),
        ([{"key": "node.kubernetes.io/unschedulable", "operator": "Exists"}], True),
        ([{"operator": "Exists"}], True),  # tolerates everything
        ([{"key": "node.kubernetes.io/unschedulable", "operator": "Exists", "effect": "NoExecute"}], False),
        ([{"key": "other", "operator": "Exists"}], False),
    ],
)
def test_node_unschedulable(tolerations, cordoned_ok):
    st = state_of(make_node("open"), make_node("cordoned", unschedulable=True))
    v = verdicts(NodeUnschedulable(), make_pod(tolerations=tolerations), st)
    assert v == {"open": None, "cordoned": None if cordoned_ok else UNSCHED}


# --- NodeAffinity -------------------------------------------------------------------------

AFF = "node(s) didn't match Pod's node affinity/selector"
LABELS = {
    "n1": {"zone": "a", "gpu-count": "4", "spot": "true"},
    "n2": {"zone": "b", "gpu-count": "8"},
    "n3": {"gpu-count": "many"},
}


def _aff_state():
    return state_of(*(make_node(n, labels=lab) for n, lab in LABELS.items()))


AFFINITY_CASES = [
    ("nothing asked", {}, {"n1", "n2", "n3"}),
    ("nodeSelector", dict(nodeSelector={"zone": "a"}), {"n1"}),
    ("nodeSelector two labels", dict(nodeSelector={"zone": "b", "gpu-count": "8"}), {"n2"}),
    ("nodeSelector no match", dict(nodeSelector={"zone": "c"}), set()),
    ("hostname label", dict(nodeSelector={"kubernetes.io/hostname": "n3"}), {"n3"}),
    ("In", dict(affinity=affinity(required=[[expr("zone", "In", "a", "b")]])), {"n1", "n2"}),
    ("NotIn matches missing label", dict(affinity=affinity(required=[[expr("zone", "NotIn", "a")]])), {"n2", "n3"}),
    ("Exists", dict(affinity=affinity(required=[[expr("spot", "Exists")]])), {"n1"}),
    ("DoesNotExist", dict(affinity=affinity(required=[[expr("zone", "DoesNotExist")]])), {"n3"}),
    ("Gt", dict(affinity=affinity(required=[[expr("gpu-count", "Gt", "4")]])), {"n2"}),
    ("Gt not integer label never matches", dict(affinity=affinity(required=[[expr("gpu-count", "Gt", "-100")]])), {"n1", "n2"}),
    ("Lt", dict(affinity=affinity(required=[[expr("gpu-count", "Lt", "8")]])), {"n1"}),
    ("Lt missing label", dict(affinity=affinity(required=[[expr("nope", "Lt", "8")]])), set()),
    ("expressions are ANDed", dict(affinity=affinity(required=[[expr("zone", "Exists"), expr("gpu-count", "Gt", "5")]])), {"n2"}),
    ("terms are ORed", dict(affinity=affinity(required=[[expr("spot", "Exists")], [expr("zone", "DoesNotExist")]])), {"n1", "n3"}),
    (
        "nodeSelector AND affinity",
        dict(nodeSelector={"zone": "a"}, affinity=affinity(required=[[expr("zone", "In", "a", "b")]])),
        {"n1"},
    ),
    (
        "matchFields metadata.name",
        dict(affinity={"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [{"matchFields": [expr("metadata.name", "In", "n2")]}]}}}),
        {"n2"},
    ),
    ("preferred only never filters", dict(affinity=affinity(preferred=[(10, [expr("zone", "In", "zzz")])])), {"n1", "n2", "n3"}),
]


@pytest.mark.parametrize("kw, passing", [c[1:] for c in AFFINITY_CASES], ids=[c[0] for c in AFFINITY_CASES])
def test_node_affinity(kw, passing):
    v = verdicts(NodeAffinity(), make_pod(**kw), _aff_state())
    assert {n for n, why in v.items() if why is None} == passing
    assert {why for why in v.values() if why is not None} <= {AFF}


def test_empty_selector_term_matches_nothing():
    assert not term_matches(SelectorTerm(()), {"a": "b"}, "n")
    assert term_matches(SelectorTerm((Requirement("a", "In", ("b",)),)), {"a": "b"}, "n")


def test_affinity_mask_not_stale_after_node_update():
    st = _aff_state()
    plugin = NodeAffinity()
    pod = make_pod(nodeSelector={"zone": "a"})
    assert verdicts(plugin, pod, st)["n3"] == AFF
    st.update_node(make_node("n3", labels={"zone": "a"}))
    assert verdicts(plugin, pod, st)["n3"] is None


def test_affinity_mask_not_shared_between_states():
    """One plugin instance (one profile) serving two snapshots must not mix their labels up."""
    plugin = NodeAffinity()
    pod = make_pod(nodeSelector={"zone": "a"})
    wrong = []
    for k in range(200):  # states die and are re-created: CPython reuses their ids
        zone = "a" if k % 2 else "b"
        st = state_of(make_node("n", labels={"zone": zone}))
        if verdicts(plugin, pod, st)["n"] != (None if zone == "a" else AFF):
            wrong.append(k)
        del st
    assert wrong == []


# --- TaintToleration ------------------------------------------------------------------------

T_GPU = "node(s) had untolerated taint {gpu: true}"
T_DED = "node(s) had untolerated taint {dedicated}"


def _taint_state():
    return state_of(
        make_node("clean"),
        make_node("gpu", taints=[("gpu", "true", "NoSchedule")]),
        make_node("ded", taints=[("dedicated", "", "NoExecute")]),
        make_node("soft", taints=[("spot", "yes", "PreferNoSchedule")]),
        make_node("both", taints=[("gpu", "true", "NoSchedule"), ("dedicated", "", "NoExecute")]),
    )


TAINT_CASES = [
    ("no tolerations", [], {"clean": None, "gpu": T_GPU, "ded": T_DED, "soft": None, "both": T_GPU}),
    ("Equal key+value", [{"key": "gpu", "value": "true"}], {"clean": None, "gpu": None, "ded": T_DED, "soft": None, "both": T_DED}),
    ("Equal wrong value", [{"key": "gpu", "operator": "Equal", "value": "false"}], {"clean": None, "gpu": T_GPU, "ded": T_DED, "soft": None, "both": T_GPU}),
    ("Exists on key", [{"key": "dedicated", "operator": "Exists"}], {"clean": None, "gpu": T_GPU, "ded": None, "soft": None, "both": T_GPU}),
    ("effect must match", [{"key": "gpu", "operator": "Exists", "effect": "NoExecute"}], {"clean": None, "gpu": T_GPU, "ded": T_DED, "soft": None, "both": T_GPU}),
    ("effect matching", [{"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}], {"clean": None, "gpu": None, "ded": T_DED, "soft": None, "both": T_DED}),
    ("Exists without key tolerates all", [{"operator": "Exists"}], {"clean": None, "gpu": None, "ded": None, "soft": None, "both": None}),
    (
        "two tolerations",
        [{"key": "gpu", "operator": "Exists"}, {"key": "dedicated", "operator": "Exists", "effect": "NoExecute"}],
        {"clean": None, "gpu": None, "ded": None, "soft": None, "both": None},
    ),
]


@pytest.mark.parametrize("tolerations, expected", [c[1:] for c in TAINT_CASES], ids=[c[0] for c in TAINT_CASES])
def test_taint_toleration(tolerations, expected):
    assert verdicts(TaintToleration(), make_pod(tolerations=tolerations), _taint_state()) == expected


@pytest.mark.parametrize(
    "tol, taint, ok",
    [
        (Toleration("k", "Equal", "v", ""), Taint("k", "v", "NoSchedule"), True),
        (Toleration("k", "Equal", "v", ""), Taint("k", "w", "NoSchedule"), False),
        (Toleration("k", "Exists", "", ""), Taint("k", "w", "NoExecute"), True),
        (Toleration("k", "Exists", "", "NoSchedule"), Taint("k", "w", "NoExecute"), False),
        (Toleration("", "Exists", "", ""), Taint("any", "x", "NoSchedule"), True),
        (Toleration("", "Exists", "", "PreferNoSchedule"), Taint("any", "x", "NoSchedule"), False),
        (Toleration("k", "Equal", "", ""), Taint("k", "", "NoSchedule"), True),
    ],
)
def test_toleration_matching(tol, taint, ok):
    assert tol.tolerates(taint) is ok


# --- NodeResourcesFit ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "cpu, memory, expected",
    [
        ("1", "1Gi", {"big": None, "small": None, "full": "Too many pods"}),
        ("4", "8Gi", {"big": None, "small": None, "full": "Too many pods"}),  # exactly the free amount fits
        ("4001m", "1Gi", {"big": None, "small": "Insufficient cpu", "full": "Too many pods"}),
        ("1", "9Gi", {"big": None, "small": "Insufficient memory", "full": "Too many pods"}),
        ("5", "9Gi", {"big": None, "small": "Insufficient cpu", "full": "Too many pods"}),  # cpu reported first
        ("65", "1Gi", {"big": "Insufficient cpu", "small": "Insufficient cpu", "full": "Too many pods"}),
    ],
)
def test_node_resources_fit(cpu, memory, expected):
    st = state_of(
        make_node("big", cpu_milli=64_000, memory_mib=262_144),
        make_node("small", cpu_milli=4_000, memory_mib=8_192),
        make_node("full", cpu_milli=64_000, memory_mib=262_144, max_pods=1),
    )
    st.reserve(Assignment("default/running", "full", 0, 0))
    assert verdicts(NodeResourcesFit(), make_pod(cpu=cpu, memory=memory), st) == expected


def test_node_resources_fit_sees_reservations():
    st = state_of(make_node("n", cpu_milli=4_000, memory_mib=8_192))
    pod = make_pod(cpu="3", memory="1Gi")
    assert verdicts(NodeResourcesFit(), pod, st) == {"n": None}
    st.reserve(Assignment("default/x", "n", 2_000, 0))
    assert verdicts(NodeResourcesFit(), pod, st) == {"n": "Insufficient cpu"}


# --- GpuFit -----------------------------------------------------------------------------------------

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
