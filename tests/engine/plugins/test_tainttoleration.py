"""TaintToleration: untolerated NoSchedule/NoExecute taints filter, each named; PreferNoSchedule scores lower."""

from __future__ import annotations

import pytest

from gpufleet.engine.model import Taint, Toleration
from gpufleet.engine.plugins.tainttoleration import TaintToleration

from tests.builders import make_node, make_pod, scores, state_of, verdicts

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


def test_prefer_no_schedule_taints_score_lower():
    st = state_of(
        make_node("clean"),
        make_node("one", taints=[("spot", "", "PreferNoSchedule")]),
        make_node("two", taints=[("spot", "", "PreferNoSchedule"), ("old", "", "PreferNoSchedule"), ("x", "", "NoSchedule")]),
    )
    assert scores(TaintToleration(), make_pod(), st).tolist() == pytest.approx([100.0, 50.0, 0.0])
    tol = make_pod(tolerations=[{"key": "spot", "operator": "Exists"}])
    assert scores(TaintToleration(), tol, st).tolist() == pytest.approx([100.0, 100.0, 0.0])
    assert scores(TaintToleration(), make_pod(), state_of(make_node("a"))).tolist() == [100.0]


@pytest.mark.parametrize("tol, taint, ok", [
    # TaintTolerationComparisonOperators (alpha in 1.35): the taint's integer value against the toleration's
    (Toleration("mem", "Gt", "40", ""), Taint("mem", "80", "NoSchedule"), True),
    (Toleration("mem", "Gt", "40", ""), Taint("mem", "40", "NoSchedule"), False),
    (Toleration("mem", "Lt", "40", ""), Taint("mem", "20", "NoSchedule"), True),
    (Toleration("mem", "Lt", "40", ""), Taint("mem", "80", "NoSchedule"), False),
    (Toleration("mem", "Gt", "40", ""), Taint("mem", "lots", "NoSchedule"), False),
    (Toleration("mem", "Gt", "40", ""), Taint("other", "80", "NoSchedule"), False),
    (Toleration("mem", "Gt", "40", "NoExecute"), Taint("mem", "80", "NoSchedule"), False),
])
def test_comparison_operators(tol, taint, ok):
    assert tol.tolerates(taint) is ok


def test_a_comparison_operator_needs_an_integer_named_by_field():
    from gpufleet.engine.errors import InvalidPodSpec

    with pytest.raises(InvalidPodSpec) as exc:
        make_pod(tolerations=[{"key": "mem", "operator": "Gt", "value": "big"}])
    assert exc.value.field == "spec.tolerations[0].value"
