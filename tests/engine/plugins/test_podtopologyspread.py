"""PodTopologySpread, table-driven: maxSkew, minDomains, inclusion policies, missing keys, scoring."""

from __future__ import annotations

import numpy as np
import pytest

from gpufleet.engine.model import Taint
from gpufleet.engine.plugins.podtopologyspread import MISSING, SPREAD, PodTopologySpread
from gpufleet.engine.podspec import parse_pod
from gpufleet.engine.state import ClusterState

from tests.builders import cycle_for, verdicts

from ..builders import HOST, ZONE, gpu_node, kpod, place, spread_c, zoned

NODES = {"a1": "a", "a2": "a", "b1": "b", "c1": "c", "n": ""}
WEB = {"app": "web"}


def _state(placed, nodes=None):
    st = ClusterState(nodes or zoned(NODES))
    for i, node in enumerate(placed):
        place(st, kpod(f"w{i}", WEB), node)
    return st


CASES = [
    ("empty cluster: every zoned node fits, the unlabelled one lacks the key", [], spread_c(1, **WEB),
     {"a1": None, "a2": None, "b1": None, "c1": None, "n": MISSING}),
    ("one pod in zone a: a is at skew 2 with maxSkew 1", ["a1"], spread_c(1, **WEB),
     {"a1": SPREAD, "a2": SPREAD, "b1": None, "c1": None, "n": MISSING}),
    ("maxSkew 2 allows a second pod in zone a", ["a1"], spread_c(2, **WEB),
     {"a1": None, "a2": None, "b1": None, "c1": None, "n": MISSING}),
    ("balanced a,b,c: any zone", ["a1", "b1", "c1"], spread_c(1, **WEB),
     {"a1": None, "a2": None, "b1": None, "c1": None, "n": MISSING}),
    ("a pod that does not match its own selector adds nothing", ["a1"], spread_c(1, app="db"),
     {"a1": None, "a2": None, "b1": None, "c1": None, "n": MISSING}),
    ("ScheduleAnyway never filters", ["a1", "a2"], spread_c(1, hard=False, **WEB), {k: None for k in NODES}),
    ("minDomains 4 > 3 zones: global minimum is 0", ["b1", "c1"], spread_c(1, minDomains=4, **WEB),
     {"a1": None, "a2": None, "b1": SPREAD, "c1": SPREAD, "n": MISSING}),
    ("hostname key", ["a1"], spread_c(1, key=HOST, **WEB),
     {"a1": SPREAD, "a2": None, "b1": None, "c1": None, "n": None}),
]


@pytest.mark.parametrize("placed,constraint,expected", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_filter(placed, constraint, expected):
    st = _state(placed)
    assert verdicts(PodTopologySpread(), parse_pod(kpod("x", WEB, spread=(constraint,))), st) == expected


def test_node_affinity_policy_honor_vs_ignore():
    # zone c is outside the pod's node affinity: with Honor it does not count as a domain (min over a,b)
    st = _state(["a1", "b1"])
    sel = {"nodeSelector": {"pool": "x"}}
    nodes = [gpu_node(n, labels={ZONE: z, "pool": "x" if z != "c" else "y"}) for n, z in NODES.items() if z]
    st = ClusterState(nodes)
    place(st, kpod("w0", WEB), "a1")
    place(st, kpod("w1", WEB), "b1")
    honor = parse_pod(kpod("x", WEB, spread=(spread_c(1, **WEB),), **sel))
    ignore = parse_pod(kpod("x", WEB, spread=(spread_c(1, nodeAffinityPolicy="Ignore", **WEB),), **sel))
    assert verdicts(PodTopologySpread(), honor, st)["a2"] is None  # min 1 over {a, b}
    assert verdicts(PodTopologySpread(), ignore, st)["a2"] == SPREAD  # zone c (0 pods) counts: min 0


def test_node_taints_policy():
    nodes = zoned({"a1": "a", "b1": "b"}) + [gpu_node("c1", labels={ZONE: "c"}, taints=(Taint("t", "", "NoSchedule"),))]
    st = ClusterState(nodes)
    place(st, kpod("w0", WEB), "a1")
    place(st, kpod("w1", WEB), "b1")
    ignore = parse_pod(kpod("x", WEB, spread=(spread_c(1, **WEB),)))
    honor = parse_pod(kpod("x", WEB, spread=(spread_c(1, nodeTaintsPolicy="Honor", **WEB),)))
    assert verdicts(PodTopologySpread(), ignore, st)["a1"] == SPREAD  # tainted zone c counts (0 pods)
    assert verdicts(PodTopologySpread(), honor, st)["a1"] is None


def test_match_label_keys():
    st = ClusterState(zoned(NODES))
    place(st, kpod("old", {"app": "web", "hash": "1"}), "a1")
    x = parse_pod(kpod("x", {"app": "web", "hash": "2"}, spread=(spread_c(1, matchLabelKeys=["hash"], **WEB),)))
    assert verdicts(PodTopologySpread(), x, st)["a1"] is None  # the old revision does not count


def _scores(st, p, plugin=None):
    plugin = plugin or PodTopologySpread()
    raw = plugin.score(cycle_for(parse_pod(p)), st, np.arange(len(st)))
    return dict(zip([n.name for n in st.nodes], plugin.normalize(raw)))


def test_score_prefers_emptier_domains_and_system_defaults():
    st = _state(["a1", "a2", "b1"])
    s = _scores(st, kpod("x", WEB, spread=(spread_c(1, hard=False, **WEB),)))
    assert s["c1"] > s["b1"] > s["a1"] and s["n"] == 0
    # system defaults: pods of one controller spread over hosts and zones; no owner, no preference
    st = ClusterState(zoned(NODES))
    for i, node in enumerate(["a1", "a1", "b1"]):
        place(st, kpod(f"r{i}", WEB, owner="rs1"), node)
    s = _scores(st, kpod("x", WEB, owner="rs1"))
    assert s["c1"] > s["a1"] and s["a2"] > s["a1"]
    s = _scores(st, kpod("x", WEB))
    assert len(set(s.values())) == 1
    s = _scores(st, kpod("x", WEB, owner="rs1"), PodTopologySpread(defaultConstraints="none"))
    assert len(set(s.values())) == 1
