"""Wire formats: the node's GPU inventory annotation and the pod's assignment annotation."""

from __future__ import annotations

import json

import pytest

from gpufleet.engine.errors import InvalidNodeSpec, InvalidPodSpec
from gpufleet.engine.inventory import assignment_from_json, assignment_to_json, gpu_uuids_of, gpus_from_json, gpus_to_json
from gpufleet.engine.model import Assignment

from tests.builders import A100, make_node


def test_inventory_round_trip():
    node = make_node("n", 4, A100, nvlink=[[0, 1], [2, 3]], mig={3: ["1g.10gb", "3g.40gb"]}, unhealthy=[2])
    text = gpus_to_json(node.gpus)
    assert gpus_from_json("n", text) == node.gpus
    assert json.loads(text)["version"] == 1


def test_inventory_extra_fields_are_ignored_on_read():
    node = make_node("n", 1, A100)
    text = gpus_to_json(node.gpus, extra={0: {"temperature_c": 40}})
    assert "temperature_c" in text and gpus_from_json("n", text) == node.gpus


def _inv(gpus, **top):
    return json.dumps({"version": 1, "gpus": gpus, **top})


G0 = {"index": 0, "uuid": "u0", "model": "T4", "memory_mib": 15_360}
F = "metadata.annotations[gpufleet.io/gpu-inventory]"


@pytest.mark.parametrize(
    "text, field, message",
    [
        ("{not json", F, "not valid JSON"),
        (json.dumps([1]), F, "'gpus' list"),
        (_inv([], version=2), f"{F}.version", "unsupported version 2"),
        (_inv(["gpu"]), f"{F}.gpus[0]", "must be an object"),
        (_inv([{**G0, "index": 1}]), f"{F}.gpus[0].index", "index order"),
        (_inv([{**G0, "index": "0"}]), f"{F}.gpus[0].index", "integer"),
        (_inv([{**G0, "memory_mib": 0}]), f"{F}.gpus[0].memory_mib", ">= 1"),
        (_inv([{**G0, "memory_mib": True}]), f"{F}.gpus[0].memory_mib", "integer"),
        (_inv([{**G0, "nvlink_peers": "1,2"}]), f"{F}.gpus[0].nvlink_peers", "list of GPU indices"),
        (_inv([{**G0, "mig_instances": [{"memory_mib": 10}]}]), f"{F}.gpus[0].mig_instances[0]", "profile"),
        (_inv([{**G0, "mig_instances": [{"profile": "1g.10gb", "memory_mib": -1}]}]), f"{F}.gpus[0].mig_instances[0].memory_mib", ">= 0"),
    ],
)
def test_inventory_errors_name_node_and_field(text, field, message):
    with pytest.raises(InvalidNodeSpec) as exc:
        gpus_from_json("node-7", text)
    assert exc.value.node == "node-7" and exc.value.field == field
    assert str(exc.value).startswith("node node-7: field ") and message in str(exc.value)


@pytest.mark.parametrize(
    "a",
    [
        Assignment("ns/p", "n", 0, 0, gpu_indices=(1, 3), gpu_milli=1000, gpu_memory_mib=(81_920, 81_920)),
        Assignment("ns/p", "n", 0, 0, gpu_indices=(0,), gpu_milli=250, gpu_memory_mib=(4_096,)),
        Assignment("ns/p", "n", 0, 0, mig=((0, 1), (2, 0)), mig_profile="1g.10gb"),
        Assignment("ns/p", "n", 0, 0),
    ],
)
def test_assignment_round_trip(a):
    text = assignment_to_json(a, {1: "GPU-1", 3: "GPU-3"})
    assert assignment_from_json("ns/p", text) == a
    assert gpu_uuids_of(text) == [{1: "GPU-1", 3: "GPU-3"}.get(j, "") for j in a.gpu_indices]


def test_assignment_names_the_queue_the_pod_was_admitted_under():
    """The node agent labels its cost series with it (agent.allocation); without a queue the key is absent."""
    a = Assignment("ns/p", "n", 0, 0, gpu_indices=(0,), gpu_milli=250, gpu_memory_mib=(0,), queue="team-a")
    assert json.loads(assignment_to_json(a))["queue"] == "team-a"
    assert "queue" not in json.loads(assignment_to_json(Assignment("ns/p", "n", 0, 0)))


def test_assignment_carries_pod_resources_given_by_caller():
    a = assignment_from_json("ns/p", '{"node": "n"}', cpu_milli=500, memory_mib=64, priority=7)
    assert (a.cpu_milli, a.memory_mib, a.priority, a.gpu_indices) == (500, 64, 7, ())


A = "metadata.annotations[gpufleet.io/assignment]"


@pytest.mark.parametrize(
    "text, field",
    [
        ("nope", A),
        ('{"gpus": []}', A),
        ('{"node": "n", "gpus": [{"uuid": "x"}]}', f"{A}.gpus"),
        ('{"node": "n", "gpus": "0"}', f"{A}.gpus"),
        ('{"node": "n", "gpu_milli": 1001}', f"{A}.gpu_milli"),
        ('{"node": "n", "gpu_milli": -1}', f"{A}.gpu_milli"),
        ('{"node": "n", "gpus": [{"index": 0}], "gpu_memory_mib": [1, 2]}', f"{A}.gpu_memory_mib"),
        ('{"node": "n", "gpus": [{"index": 0}], "gpu_memory_mib": [-1]}', f"{A}.gpu_memory_mib"),
        ('{"node": "n", "mig": [{"gpu": 0}]}', f"{A}.mig"),
        ('{"node": "n", "mig": "0:1"}', f"{A}.mig"),
        ('{"node": "n", "mig": [{"gpu": "x", "instance_id": 1}]}', f"{A}.mig"),
    ],
)
def test_assignment_errors_name_pod_and_field(text, field):
    with pytest.raises(InvalidPodSpec) as exc:
        assignment_from_json("ns/p", text)
    assert exc.value.pod == "ns/p" and exc.value.field == field


def test_whole_gpu_assignment_without_memory_rebuilds_full_reservation():
    from tests.builders import state_of

    a = assignment_from_json("ns/p", '{"node": "n", "gpus": [{"index": 1, "uuid": "GPU-n-1"}], "gpu_milli": 1000}')
    st = state_of(make_node("n", 2, A100))
    st.reserve(a)
    assert st.gpu_mem_free[0].tolist() == [81_920, 0]
