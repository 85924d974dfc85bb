"""NodeAffinity: nodeSelector and required terms filter, with kube-scheduler's reason; preferred terms score."""

from __future__ import annotations

import pytest

from gpufleet.engine.model import Requirement, SelectorTerm
from gpufleet.engine.plugins._common import term_matches
from gpufleet.engine.plugins.nodeaffinity import NodeAffinity

from tests.builders import affinity, expr, make_node, make_pod, scores, state_of, verdicts

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


def test_preferred_node_affinity_weights():
    st = state_of(make_node("a", labels={"zone": "a", "ssd": "1"}), make_node("b", labels={"zone": "b", "ssd": "1"}), make_node("c"))
    pod = make_pod(affinity=affinity(preferred=[(80, [expr("zone", "In", "a")]), (20, [expr("ssd", "Exists")])]))
    s = scores(NodeAffinity(), pod, st)
    assert s.tolist() == pytest.approx([100.0, 20.0, 0.0])
    assert scores(NodeAffinity(), make_pod(), st).tolist() == [0.0, 0.0, 0.0]
