"""The closed Status type and the Kubernetes-style aggregated diagnosis."""

from __future__ import annotations

import pytest

from gpufleet.engine import annotations as ann
from gpufleet.engine.status import Code, Diagnosis, Status

from tests.builders import T4, make_node, make_pod, profile_config, scheduler


@pytest.mark.parametrize(
    "total, counts, expected",
    [
        (0, {}, "0/0 nodes are available: no nodes in the cluster."),
        (1, {"Insufficient cpu": 1}, "0/1 nodes are available: 1 Insufficient cpu."),
        (
            3,
            {"node(s) had untolerated taint {gpu: true}": 1, "Insufficient GPU milli": 2},
            "0/3 nodes are available: 2 Insufficient GPU milli, 1 node(s) had untolerated taint {gpu: true}.",
        ),
        (
            1213,
            {"node(s) had untolerated taint {gpu}": 313, "Insufficient GPU milli": 900},
            "0/1213 nodes are available: 900 Insufficient GPU milli, 313 node(s) had untolerated taint {gpu}.",
        ),
        (  # equal counts: alphabetical, so the text is deterministic
            4,
            {"b reason": 2, "a reason": 2},
            "0/4 nodes are available: 2 a reason, 2 b reason.",
        ),
    ],
)
def test_diagnosis_message(total, counts, expected):
    d = Diagnosis(total, dict(counts))
    assert d.message() == expected
    st = d.status()
    assert st.code is Code.UNSCHEDULABLE and not st.ok and st.reasons == (expected,)


@pytest.mark.parametrize(
    "status, ok, code, message",
    [
        (Status.success(), True, Code.SUCCESS, "success"),
        (Status.unschedulable("a", "b"), False, Code.UNSCHEDULABLE, "unschedulable: a; b"),
        (Status.unresolvable("bad"), False, Code.UNRESOLVABLE, "unresolvable: bad"),
        (Status.wait("quota"), False, Code.WAIT, "wait: quota"),
        (Status.error("bind failed: x", plugin="B"), False, Code.ERROR, "error: bind failed: x"),
        (Status.error(), False, Code.ERROR, "error"),
    ],
)
def test_status(status, ok, code, message):
    assert status.ok is ok and status.code is code
    assert status.message == message == str(status)


def test_status_codes_are_closed():
    assert {c.value for c in Code} == {"success", "unschedulable", "unresolvable", "wait", "error"}


def test_failed_cycle_aggregates_first_failing_reason_per_node():
    nodes = [
        make_node("small-1", 1, T4, cpu_milli=1_000),
        make_node("small-2", 1, T4, cpu_milli=1_000),
        make_node("tainted", 1, T4, taints=[("gpu", "true", "NoSchedule")]),
        make_node("cordoned", 1, T4, unschedulable=True, taints=[("gpu", "true", "NoSchedule")]),
        make_node("cpu-only", 0),
        make_node("pods-full", 1, T4, max_pods=0),
    ]
    s = scheduler(nodes, profile_config())
    d = s.schedule(make_pod("big", cpu="2", annotations={ann.GPU_MILLI: "500"}))
    assert not d.ok and d.status.code is Code.UNSCHEDULABLE and d.assignment is None
    assert d.diagnosis.counts == {
        "Insufficient cpu": 2,
        "node(s) had untolerated taint {gpu: true}": 1,
        "node(s) were unschedulable": 1,  # the first failing filter wins, the taint is not counted
        "Insufficient GPU milli": 1,
        "Too many pods": 1,
    }
    assert d.status.reasons == (
        "0/6 nodes are available: 2 Insufficient cpu, 1 Insufficient GPU milli, 1 Too many pods, "
        "1 node(s) had untolerated taint {gpu: true}, 1 node(s) were unschedulable.",
    )
    assert str(d.status).startswith("unschedulable: 0/6 nodes are available: ")


def test_explain_reports_every_node():
    nodes = [make_node("fits", 1, T4), make_node("no-gpu"), make_node("zone-b", 1, T4, labels={"zone": "b"})]
    s = scheduler(nodes, profile_config())
    d = s.explain(make_pod(gpu="1", nodeSelector={"kubernetes.io/hostname": "fits"}))
    assert d.ok and d.assignment.node == "fits" and d.feasible_nodes == 1
    assert d.diagnosis.by_node == {
        "fits": "fits",
        "no-gpu": "node(s) didn't match Pod's node affinity/selector",
        "zone-b": "node(s) didn't match Pod's node affinity/selector",
    }
    assert s.state.assignments == {}  # explain never reserves
