"""parse_pod on real Kubernetes Pod JSON: resource arithmetic, GPU requests, placement constraints, bad input."""

from __future__ import annotations

import copy

import pytest

from gpufleet.engine import annotations as ann
from gpufleet.engine.errors import GpufleetError, InvalidPodSpec
from gpufleet.engine.gpu_models import LARGEST_GPU_MEMORY_MIB, mig_profile_memory_mib
from gpufleet.engine.model import PreferredTerm, Requirement, SelectorTerm, Toleration
from gpufleet.engine.podspec import effective_requests, parse_pod

from tests.builders import affinity, container, expr, make_pod_json

# --- resource arithmetic ------------------------------------------------------------

RESOURCE_CASES = [
    # id, pod kwargs, expected (cpu_milli, memory_mib)
    ("one container", dict(cpu="500m", memory="16Gi"), (500, 16_384)),
    ("exponent cpu", dict(cpu="1e0", memory="1e9"), (1000, 954)),
    ("no requests at all", dict(cpu=None, memory=None), (0, 0)),
    (
        "containers are summed",
        dict(containers=[container("a", cpu="500m", memory="1Gi"), container("b", cpu="1.5", memory="512Mi")]),
        (2000, 1536),
    ),
    (
        "requests default to limits",
        dict(containers=[container(limits={"cpu": "2", "memory": "4Gi"})]),
        (2000, 4096),
    ),
    (
        "requests win over limits",
        dict(containers=[container(requests={"cpu": "1"}, limits={"cpu": "4", "memory": "2Gi"})]),
        (1000, 2048),
    ),
    (
        "init container bigger than the app: max",
        dict(containers=[container(cpu="1", memory="2Gi")], init_containers=[container("init", cpu="4", memory="1Gi")]),
        (4000, 2048),
    ),
    (
        "init containers run one at a time: max, not sum",
        dict(
            containers=[container(cpu="1", memory="1Gi")],
            init_containers=[container("i1", cpu="3", memory="1Gi"), container("i2", cpu="2", memory="3Gi")],
        ),
        (3000, 3072),
    ),
    (
        "sidecar is summed with the app",
        dict(containers=[container(cpu="1")], init_containers=[container("side", cpu="500m", restart_policy="Always")], memory=None),
        (1500, 0),
    ),
    (
        "init container after a sidecar runs beside it",
        dict(
            containers=[container(cpu="1")],
            init_containers=[container("side", cpu="500m", restart_policy="Always"), container("init", cpu="2")],
        ),
        (2500, 0),
    ),
    (
        "init container before a sidecar runs alone",
        dict(
            containers=[container(cpu="1")],
            init_containers=[container("init", cpu="2"), container("side", cpu="500m", restart_policy="Always")],
        ),
        (2000, 0),
    ),
    (
        "overhead is added",
        dict(cpu="1", memory="1Gi", overhead={"cpu": "250m", "memory": "128Mi"}),
        (1250, 1152),
    ),
    (
        "overhead on top of the init max",
        dict(containers=[container(cpu="1")], init_containers=[container("i", cpu="3")], overhead={"cpu": "100m"}),
        (3100, 0),
    ),
    ("other resources are ignored", dict(containers=[container(requests={"cpu": "1", "ephemeral-storage": "1Ti", "example.com/foo": "3"})]), (1000, 0)),
]


@pytest.mark.parametrize("kw, expected", [c[1:] for c in RESOURCE_CASES], ids=[c[0] for c in RESOURCE_CASES])
def test_cpu_and_memory(kw, expected):
    r = parse_pod(make_pod_json("p", **kw))
    assert (r.cpu_milli, r.memory_mib) == expected


GPU_CASES = [
    # id, pod kwargs, expected (gpu_count, gpu_milli, gpu_memory_mib, mig_profile)
    ("no GPU", dict(), (0, 0, 0, None)),
    ("whole GPUs from limits", dict(gpu="2"), (2, 1000, 0, None)),
    ("whole GPU as an int", dict(gpu=1), (1, 1000, 0, None)),
    ("GPUs summed over containers", dict(containers=[container("a", gpu="1"), container("b", gpu="2")]), (3, 1000, 0, None)),
    ("GPUs: init max", dict(containers=[container(gpu="1")], init_containers=[container("i", gpu="4")]), (4, 1000, 0, None)),
    ("zero GPUs", dict(gpu="0"), (0, 0, 0, None)),
    (
        "MIG profile",
        dict(containers=[container(limits={"nvidia.com/mig-1g.10gb": "2"})]),
        (2, 0, mig_profile_memory_mib("1g.10gb"), "1g.10gb"),
    ),
    (
        "MIG 3g.40gb",
        dict(containers=[container(limits={"nvidia.com/mig-3g.40gb": 1})]),
        (1, 0, mig_profile_memory_mib("3g.40gb"), "3g.40gb"),
    ),
    ("share annotation alone", dict(annotations={ann.GPU_MILLI: "250"}), (1, 250, 0, None)),
    ("share with one nvidia.com/gpu", dict(gpu="1", annotations={ann.GPU_MILLI: "500"}), (1, 500, 0, None)),
    ("share of 1000 is a whole GPU", dict(annotations={ann.GPU_MILLI: "1000"}), (1, 1000, 0, None)),
    ("GPU memory alone", dict(annotations={ann.GPU_MEMORY: "10Gi"}), (1, 0, 10_240, None)),
    ("share and memory", dict(annotations={ann.GPU_MILLI: " 300 ", ann.GPU_MEMORY: "4096Mi"}), (1, 300, 4096, None)),
    ("largest GPU memory exactly", dict(annotations={ann.GPU_MEMORY: f"{LARGEST_GPU_MEMORY_MIB}Mi"}), (1, 0, LARGEST_GPU_MEMORY_MIB, None)),
]


@pytest.mark.parametrize("kw, expected", [c[1:] for c in GPU_CASES], ids=[c[0] for c in GPU_CASES])
def test_gpu_request(kw, expected):
    r = parse_pod(make_pod_json("p", **kw))
    assert (r.gpu_count, r.gpu_milli, r.gpu_memory_mib, r.mig_profile) == expected


def test_whole_shared_and_mig_flags():
    whole = parse_pod(make_pod_json(gpu="2"))
    shared = parse_pod(make_pod_json(annotations={ann.GPU_MILLI: "100"}))
    mig = parse_pod(make_pod_json(containers=[container(limits={"nvidia.com/mig-1g.10gb": "1"})]))
    assert whole.whole_gpus and not whole.shared_gpu and whole.total_gpu_milli == 2000
    assert shared.shared_gpu and not shared.whole_gpus and shared.total_gpu_milli == 100
    assert mig.wants_gpu and not mig.whole_gpus and not mig.shared_gpu


def test_effective_requests_keeps_raw_resource_names():
    pod = make_pod_json(containers=[container(cpu="1", gpu="1"), container("b", limits={"nvidia.com/mig-1g.10gb": "1"})])
    assert effective_requests(pod) == {"cpu": 1000, "nvidia.com/gpu": 1, "nvidia.com/mig-1g.10gb": 1}


# --- placement constraints and metadata ---------------------------------------------


def test_model_allow_and_deny_lists():
    r = parse_pod(make_pod_json(annotations={ann.GPU_MILLI: "100", ann.GPU_MODELS: "Tesla-T4, NVIDIA-A10,", ann.GPU_MODELS_DENY: "P100"}))
    assert r.gpu_models_allow == frozenset({"Tesla-T4", "NVIDIA-A10"})
    assert r.gpu_models_deny == frozenset({"P100"})
    plain = parse_pod(make_pod_json(gpu="1"))
    assert plain.gpu_models_allow is None and plain.gpu_models_deny == frozenset()


def test_node_selector_sorted_and_stringified():
    r = parse_pod(make_pod_json(nodeSelector={"zone": "b", "gpu": True, "accelerator": "t4"}))
    assert r.node_selector == (("accelerator", "t4"), ("gpu", "True"), ("zone", "b"))


@pytest.mark.parametrize(
    "e, req",
    [
        (expr("zone", "In", "a", "b"), Requirement("zone", "In", ("a", "b"))),
        (expr("zone", "NotIn", "c"), Requirement("zone", "NotIn", ("c",))),
        (expr("gpu", "Exists"), Requirement("gpu", "Exists")),
        (expr("spot", "DoesNotExist"), Requirement("spot", "DoesNotExist")),
        (expr("gpu-count", "Gt", 3), Requirement("gpu-count", "Gt", ("3",))),
        (expr("gpu-count", "Lt", "8"), Requirement("gpu-count", "Lt", ("8",))),
    ],
)
def test_required_affinity_operators(e, req):
    r = parse_pod(make_pod_json(affinity=affinity(required=[[e]])))
    assert r.required_terms == (SelectorTerm((req,)),)


def test_required_terms_are_ored_expressions_anded_and_match_fields():
    aff = affinity(required=[[expr("a", "Exists"), expr("b", "In", "1")], [expr("c", "DoesNotExist")]])
    aff["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"].append(
        {"matchFields": [expr("metadata.name", "In", "node-1")]}
    )
    r = parse_pod(make_pod_json(affinity=aff))
    assert r.required_terms == (
        SelectorTerm((Requirement("a", "Exists"), Requirement("b", "In", ("1",)))),
        SelectorTerm((Requirement("c", "DoesNotExist"),)),
        SelectorTerm((Requirement("metadata.name", "In", ("node-1",)),)),
    )


def test_preferred_affinity():
    r = parse_pod(make_pod_json(affinity=affinity(preferred=[(80, [expr("zone", "In", "a")]), (1, [expr("gpu", "Exists")])])))
    assert r.preferred_terms == (
        PreferredTerm(80, SelectorTerm((Requirement("zone", "In", ("a",)),))),
        PreferredTerm(1, SelectorTerm((Requirement("gpu", "Exists"),))),
    )
    assert r.required_terms == ()


def test_tolerations_priority_and_metadata():
    pod = make_pod_json(
        "train-0",
        namespace="ml",
        labels={"app": "train"},
        annotations={ann.QUEUE: "team-a", ann.POD_GROUP: "g1", ann.POD_GROUP_MIN: "4", "example.com/other": "x"},
        tolerations=[
            {"key": "gpu", "operator": "Exists", "effect": "NoSchedule"},
            {"key": "dedicated", "value": "ml"},
            {"operator": "Exists"},
        ],
        priority=1000,
    )
    r = parse_pod(pod)
    assert r.key == "ml/train-0" and r.uid == "uid-train-0"
    assert r.tolerations == (
        Toleration("gpu", "Exists", "", "NoSchedule"),
        Toleration("dedicated", "Equal", "ml", ""),
        Toleration("", "Exists", "", ""),
    )
    assert r.priority == 1000
    assert r.scheduler_name == "gpufleet"
    assert (r.queue, r.pod_group, r.pod_group_min) == ("team-a", "g1", 4)
    assert r.labels == (("app", "train"),)


def test_output_annotations_are_accepted_on_input():
    r = parse_pod(make_pod_json(annotations={ann.ASSIGNMENT: "{}", ann.IDLE_WARNING: "x"}))
    assert r.gpu_count == 0


def test_defaults_for_missing_metadata():
    r = parse_pod({"spec": {"containers": [container(cpu="1")]}})
    assert r.key == "default/<unnamed>" and r.cpu_milli == 1000 and r.priority == 0


def test_parse_does_not_mutate_the_pod():
    pod = make_pod_json(gpu="1", annotations={ann.GPU_MILLI: "100"}, init_containers=[container("i", cpu="2")])
    before = copy.deepcopy(pod)
    parse_pod(pod)
    assert pod == before


# --- bad input: typed error naming pod and field --------------------------------------

C0 = "spec.containers[0].resources"
NA = "spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0]"
PA = "spec.affinity.nodeAffinity.preferredDuringSchedulingIgnoredDuringExecution[0]"

BAD_CASES = [
    # id, pod kwargs, expected field, text expected in the message
    ("invalid cpu quantity", dict(cpu="lots"), f"{C0}.requests.cpu", "not a valid Kubernetes quantity"),
    ("invalid memory in limits", dict(containers=[container(limits={"memory": "2GB"})]), f"{C0}.limits.memory", "quantity"),
    ("invalid init container cpu", dict(init_containers=[container("i", cpu="1..")]), "spec.initContainers[0].resources.requests.cpu", "quantity"),
    ("invalid second container", dict(containers=[container(cpu="1"), container("b", memory="x")]), "spec.containers[1].resources.requests.memory", "quantity"),
    ("negative cpu", dict(cpu="-1"), f"{C0}.requests.cpu", "negative"),
    ("negative memory", dict(memory="-1Gi"), f"{C0}.requests.memory", "negative"),
    ("negative memory below a MiB", dict(memory="-1"), f"{C0}.requests.memory", "negative"),
    ("negative cpu below a milli", dict(cpu="-0.0001"), f"{C0}.requests.cpu", "negative"),
    ("negative GPUs", dict(gpu="-1"), f"{C0}.limits.nvidia.com/gpu", "negative"),
    ("fractional GPUs", dict(gpu="0.5"), f"{C0}.limits.nvidia.com/gpu", "whole number"),
    ("invalid GPU count", dict(gpu="one"), f"{C0}.limits.nvidia.com/gpu", "quantity"),
    (
        "GPU requests differ from limits",
        dict(containers=[container(requests={"nvidia.com/gpu": "1"}, limits={"nvidia.com/gpu": "2"})]),
        f"{C0}.requests.nvidia.com/gpu",
        "equal to limits",
    ),
    ("invalid overhead", dict(overhead={"cpu": "fast"}), "spec.overhead.cpu", "quantity"),
    ("negative overhead", dict(overhead={"memory": "-1Gi"}), "spec.overhead.memory", "negative"),
    ("unknown gpufleet annotation", dict(annotations={"gpufleet.io/gpu-mili": "100"}), "metadata.annotations[gpufleet.io/gpu-mili]", "unknown gpufleet annotation"),
    ("share not a number", dict(annotations={ann.GPU_MILLI: "half"}), f"metadata.annotations[{ann.GPU_MILLI}]", "'half'"),
    ("share fractional", dict(annotations={ann.GPU_MILLI: "2.5"}), f"metadata.annotations[{ann.GPU_MILLI}]", "integer"),
    ("share over 1000", dict(annotations={ann.GPU_MILLI: "1001"}), f"metadata.annotations[{ann.GPU_MILLI}]", "1..1000"),
    ("share zero", dict(annotations={ann.GPU_MILLI: "0"}), f"metadata.annotations[{ann.GPU_MILLI}]", "1..1000"),
    ("share negative", dict(annotations={ann.GPU_MILLI: "-5"}), f"metadata.annotations[{ann.GPU_MILLI}]", "-5"),
    ("share with two GPUs", dict(gpu="2", annotations={ann.GPU_MILLI: "500"}), f"metadata.annotations[{ann.GPU_MILLI}]", "one GPU"),
    (
        "share with a MIG profile",
        dict(containers=[container(limits={"nvidia.com/mig-1g.10gb": "1"})], annotations={ann.GPU_MILLI: "500"}),
        f"metadata.annotations[{ann.GPU_MILLI}]",
        "MIG",
    ),
    ("GPU memory with two GPUs", dict(gpu="2", annotations={ann.GPU_MEMORY: "8Gi"}), f"metadata.annotations[{ann.GPU_MEMORY}]", "one GPU"),
    (
        "GPU memory with a MIG profile",
        dict(containers=[container(limits={"nvidia.com/mig-1g.10gb": "1"})], annotations={ann.GPU_MEMORY: "8Gi"}),
        f"metadata.annotations[{ann.GPU_MEMORY}]",
        "MIG",
    ),
    ("GPU memory not a quantity", dict(annotations={ann.GPU_MEMORY: "big"}), f"metadata.annotations[{ann.GPU_MEMORY}]", "quantity"),
    ("GPU memory zero", dict(annotations={ann.GPU_MEMORY: "0"}), f"metadata.annotations[{ann.GPU_MEMORY}]", "positive"),
    ("GPU memory negative", dict(annotations={ann.GPU_MEMORY: "-2Gi"}), f"metadata.annotations[{ann.GPU_MEMORY}]", "positive"),
    ("GPU memory larger than any GPU", dict(annotations={ann.GPU_MEMORY: "200Gi"}), f"metadata.annotations[{ann.GPU_MEMORY}]", "more than any GPU model"),
    ("GPU memory one MiB too many", dict(annotations={ann.GPU_MEMORY: f"{LARGEST_GPU_MEMORY_MIB + 1}Mi"}), f"metadata.annotations[{ann.GPU_MEMORY}]", "more than any GPU model"),
    ("empty model allow list", dict(annotations={ann.GPU_MODELS: " , "}), f"metadata.annotations[{ann.GPU_MODELS}]", "at least one GPU model"),
    ("empty model deny list", dict(annotations={ann.GPU_MODELS_DENY: ""}), f"metadata.annotations[{ann.GPU_MODELS_DENY}]", "at least one GPU model"),
    ("unknown MIG profile", dict(containers=[container(limits={"nvidia.com/mig-9g.99gb": "1"})]), "nvidia.com/mig-9g.99gb", "unknown MIG profile"),
    (
        "two MIG profiles",
        dict(containers=[container(limits={"nvidia.com/mig-1g.10gb": "1", "nvidia.com/mig-3g.40gb": "1"})]),
        "spec.containers[*].resources",
        "more than one MIG profile",
    ),
    (
        "MIG and whole GPU",
        dict(containers=[container(gpu="1", limits={"nvidia.com/mig-1g.10gb": "1"})]),
        "spec.containers[*].resources",
        "both",
    ),
    ("nodeSelector not an object", dict(nodeSelector=["zone=a"]), "spec.nodeSelector", "object"),
    ("unknown operator", dict(affinity=affinity(required=[[expr("zone", "Like", "a")]])), f"{NA}.matchExpressions[0].operator", "'Like'"),
    ("In without values", dict(affinity=affinity(required=[[expr("zone", "In")]])), f"{NA}.matchExpressions[0].values", "at least one value"),
    ("NotIn without values", dict(affinity=affinity(required=[[expr("zone", "NotIn")]])), f"{NA}.matchExpressions[0].values", "at least one value"),
    ("Exists with values", dict(affinity=affinity(required=[[expr("zone", "Exists", "a")]])), f"{NA}.matchExpressions[0].values", "no values"),
    ("DoesNotExist with values", dict(affinity=affinity(required=[[expr("zone", "DoesNotExist", "a")]])), f"{NA}.matchExpressions[0].values", "no values"),
    ("Gt not an integer", dict(affinity=affinity(required=[[expr("n", "Gt", "3.5")]])), f"{NA}.matchExpressions[0].values", "integer"),
    ("Lt with two values", dict(affinity=affinity(required=[[expr("n", "Lt", "3", "4")]])), f"{NA}.matchExpressions[0].values", "exactly one"),
    ("empty key", dict(affinity=affinity(required=[[expr("", "Exists")]])), f"{NA}.matchExpressions[0].key", "non-empty"),
    (
        "matchFields on a label",
        dict(affinity={"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [{"matchFields": [expr("zone", "In", "a")]}]}}}),
        f"{NA}.matchFields[0].key",
        "metadata.name",
    ),
    ("preferred weight zero", dict(affinity=affinity(preferred=[(0, [expr("a", "Exists")])])), f"{PA}.weight", "1..100"),
    ("preferred weight too big", dict(affinity=affinity(preferred=[(101, [expr("a", "Exists")])])), f"{PA}.weight", "1..100"),
    ("preferred weight a string", dict(affinity=affinity(preferred=[("5", [expr("a", "Exists")])])), f"{PA}.weight", "'5'"),
    ("preferred bad operator", dict(affinity=affinity(preferred=[(5, [expr("a", "Near")])])), f"{PA}.preference.matchExpressions[0].operator", "'Near'"),
    ("toleration operator", dict(tolerations=[{"key": "a", "operator": "Matches"}]), "spec.tolerations[0].operator", "'Matches'"),
    ("toleration not an object", dict(tolerations=["gpu"]), "spec.tolerations[0]", "object"),
    ("priority a string", dict(priority="high"), "spec.priority", "'high'"),
    ("pod-group-min not positive", dict(annotations={ann.POD_GROUP_MIN: "0"}), f"metadata.annotations[{ann.POD_GROUP_MIN}]", "positive"),
    ("pod-group-min not a number", dict(annotations={ann.POD_GROUP_MIN: "four"}), f"metadata.annotations[{ann.POD_GROUP_MIN}]", "'four'"),
    # structurally broken JSON must also be a typed error, never an AttributeError/TypeError
    ("container not an object", dict(containers=["main"]), "spec.containers[0]", "object"),
    ("resources not an object", dict(containers=[{"name": "c", "resources": ["cpu"]}]), "spec.containers[0].resources", "object"),
    ("requests not an object", dict(containers=[{"name": "c", "resources": {"requests": ["cpu", "1"]}}]), f"{C0}.requests", "object"),
    ("limits not an object", dict(containers=[{"name": "c", "resources": {"limits": "cpu=1"}}]), f"{C0}.limits", "object"),
    ("containers not a list", dict(containers={"name": "c"}), "spec.containers", "list"),
    ("overhead not an object", dict(overhead=["cpu"]), "spec.overhead", "object"),
    ("affinity not an object", dict(affinity=["nodeAffinity"]), "spec.affinity", "object"),
]


@pytest.mark.parametrize("kw, field, text", [c[1:] for c in BAD_CASES], ids=[c[0] for c in BAD_CASES])
def test_bad_input_raises_typed_error_naming_pod_and_field(kw, field, text):
    pod = make_pod_json("bad-pod", namespace="team", **kw)
    with pytest.raises(InvalidPodSpec) as exc:
        parse_pod(pod)
    e = exc.value
    assert isinstance(e, GpufleetError)
    assert e.pod == "team/bad-pod"
    assert field in e.field, e.field
    msg = str(e)
    assert msg.startswith("pod team/bad-pod: field "), msg
    assert text in msg, msg


@pytest.mark.parametrize("pod", [None, "pod", ["a"], 3])
def test_non_object_pod(pod):
    with pytest.raises(InvalidPodSpec):
        parse_pod(pod)


def test_annotations_not_an_object():
    pod = make_pod_json("x")
    pod["metadata"]["annotations"] = ["gpufleet.io/gpu-milli=100"]
    with pytest.raises(InvalidPodSpec) as exc:
        parse_pod(pod)
    assert exc.value.field == "metadata.annotations"


def test_one_bad_pod_does_not_stop_a_batch():
    """What every adapter loop does: catch the typed error, keep going."""
    pods = [make_pod_json("a", gpu="1"), make_pod_json("b", annotations={ann.GPU_MILLI: "5000"}), make_pod_json("c", cpu="2")]
    ok, bad = [], []
    for p in pods:
        try:
            ok.append(parse_pod(p).name)
        except GpufleetError as exc:
            bad.append(str(exc))
    assert ok == ["a", "c"]
    assert len(bad) == 1 and "default/b" in bad[0] and ann.GPU_MILLI in bad[0]


def test_a_pod_deploy_admission_routed_is_a_valid_gpufleet_pod():
    # the annotation deploy/admission's policy writes is gpufleet's own: it must not make the pod invalid (seen on the
    # real node: every routed pod waited with "unknown gpufleet annotation")
    pod = {"metadata": {"name": "p", "annotations": {ann.ROUTED_BY: "MutatingAdmissionPolicy gpufleet-route-gpu-pods"}},
           "spec": {"containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}
    assert parse_pod(pod).gpu_count == 1
