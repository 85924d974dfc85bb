"""InterPodAffinity, table-driven: existing pods placed on nodes, one incoming pod, the verdict per node."""

from __future__ import annotations

import numpy as np
import pytest

from gpufleet.engine.plugins.interpodaffinity import (
    AFFINITY,
    ANTI_AFFINITY,
    EXISTING_ANTI,
    InterPodAffinity,
)
from gpufleet.engine.podspec import parse_pod
from gpufleet.engine.state import ClusterState

from tests.builders import cycle_for, verdicts

from ..builders import HOST, ZONE, kpod, place, term, zoned

NODES = {"a1": "a", "a2": "a", "b1": "b", "b2": "b", "n": ""}  # n has no zone label

CASES = [
    # (id, existing [(pod, node)], incoming pod, expected {node: reason or None})
    ("no terms, nothing placed", [], kpod("x", {"app": "web"}), {k: None for k in NODES}),
    ("required anti-affinity by hostname",
     [(kpod("w1", {"app": "web"}), "a1")],
     kpod("x", {"app": "web"}, anti=(term(HOST, app="web"),)),
     {"a1": ANTI_AFFINITY, "a2": None, "b1": None, "b2": None, "n": None}),
    ("required anti-affinity by zone; a node without the key passes",
     [(kpod("w1", {"app": "web"}), "a1")],
     kpod("x", {"app": "web"}, anti=(term(ZONE, app="web"),)),
     {"a1": ANTI_AFFINITY, "a2": ANTI_AFFINITY, "b1": None, "b2": None, "n": None}),
    ("anti-affinity ignores other namespaces by default",
     [(kpod("w1", {"app": "web"}, namespace="other"), "a1")],
     kpod("x", {"app": "web"}, anti=(term(HOST, app="web"),)),
     {k: None for k in NODES}),
    ("anti-affinity with explicit namespaces",
     [(kpod("w1", {"app": "web"}, namespace="other"), "a1")],
     kpod("x", {"app": "web"}, anti=(term(HOST, namespaces=["other"], app="web"),)),
     {"a1": ANTI_AFFINITY, "a2": None, "b1": None, "b2": None, "n": None}),
    ("namespaceSelector {} means every namespace",
     [(kpod("w1", {"app": "web"}, namespace="other"), "b2")],
     kpod("x", {"app": "web"}, anti=(term(HOST, ns_selector={}, app="web"),)),
     {"a1": None, "a2": None, "b1": None, "b2": ANTI_AFFINITY, "n": None}),
    ("symmetry: an existing pod's anti-affinity keeps a matching pod away",
     [(kpod("db", {"app": "db"}, anti=(term(ZONE, app="web"),)), "b1")],
     kpod("x", {"app": "web"}),
     {"a1": None, "a2": None, "b1": EXISTING_ANTI, "b2": EXISTING_ANTI, "n": None}),
    ("symmetry does not apply to a pod the term does not match",
     [(kpod("db", {"app": "db"}, anti=(term(ZONE, app="web"),)), "b1")],
     kpod("x", {"app": "cache"}),
     {k: None for k in NODES}),
    ("required affinity to a running pod's zone",
     [(kpod("db", {"app": "db"}), "b2")],
     kpod("x", {"app": "web"}, aff=(term(ZONE, app="db"),)),
     {"a1": AFFINITY, "a2": AFFINITY, "b1": None, "b2": None, "n": AFFINITY}),
    ("required affinity, no match anywhere, pod does not match itself",
     [],
     kpod("x", {"app": "web"}, aff=(term(ZONE, app="db"),)),
     {k: AFFINITY for k in NODES}),
    ("the first pod of a self-matching group may start it where the key exists",
     [],
     kpod("x", {"app": "web"}, aff=(term(ZONE, app="web"),)),
     {"a1": None, "a2": None, "b1": None, "b2": None, "n": AFFINITY}),
    ("required affinity counts a pod only if it matches every term",
     [(kpod("db", {"app": "db"}), "a1"), (kpod("c", {"tier": "cache"}), "b1")],
     kpod("x", {"app": "web"}, aff=(term(ZONE, app="db"), term(ZONE, tier="cache"))),
     {k: AFFINITY for k in NODES}),
    ("matchLabelKeys narrows the selector to the pod's own value",
     [(kpod("w1", {"app": "web", "rev": "1"}), "a1"), (kpod("w2", {"app": "web", "rev": "2"}), "b1")],
     kpod("x", {"app": "web", "rev": "2"}, anti=(term(HOST, match_label_keys=["rev"], app="web"),)),
     {"a1": None, "a2": None, "b1": ANTI_AFFINITY, "b2": None, "n": None}),
]


@pytest.mark.parametrize("existing,incoming,expected", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_filter(existing, incoming, expected):
    st = ClusterState(zoned(NODES))
    for p, node in existing:
        place(st, p, node)
    assert verdicts(InterPodAffinity(), parse_pod(incoming), st) == expected


def test_namespace_selector_uses_namespace_labels():
    st = ClusterState(zoned(NODES))
    st.set_namespace_labels({"team-a": {"team": "a"}, "team-b": {"team": "b"}})
    place(st, kpod("w1", {"app": "web"}, namespace="team-a"), "a1")
    place(st, kpod("w2", {"app": "web"}, namespace="team-b"), "b1")
    x = parse_pod(kpod("x", {"app": "web"}, anti=(term(HOST, ns_selector={"matchLabels": {"team": "a"}}, app="web"),)))
    v = verdicts(InterPodAffinity(), x, st)
    assert v["a1"] == ANTI_AFFINITY and v["b1"] is None
    st.set_namespace_labels({"team-a": {"team": "a"}, "team-b": {"team": "a"}})  # relabelled: both now match
    v = verdicts(InterPodAffinity(), x, st)
    assert v["a1"] == ANTI_AFFINITY and v["b1"] == ANTI_AFFINITY


def test_counts_follow_reserve_and_unreserve_without_rescans():
    st = ClusterState(zoned(NODES))
    place(st, kpod("w1", {"app": "web"}), "a1")
    x = parse_pod(kpod("x", {"app": "web"}, anti=(term(ZONE, app="web"),)))
    plugin = InterPodAffinity()
    assert verdicts(plugin, x, st)["a2"] == ANTI_AFFINITY
    scans = st.pod_index.scans
    st.unreserve("default/w1")
    assert verdicts(plugin, x, st)["a2"] is None
    place(st, kpod("w2", {"app": "web"}), "b2")
    assert verdicts(plugin, x, st)["b1"] == ANTI_AFFINITY and verdicts(plugin, x, st)["a1"] is None
    assert st.pod_index.scans == scans  # the matcher was kept current, not rebuilt
    c = st.copy()
    c.unreserve("default/w2")
    assert verdicts(plugin, x, c)["b1"] is None and verdicts(plugin, x, st)["b1"] == ANTI_AFFINITY


def _scores(st, p):
    plugin = InterPodAffinity()
    nodes = np.arange(len(st))
    raw = plugin.score(cycle_for(parse_pod(p)), st, nodes)
    return dict(zip([n.name for n in st.nodes], plugin.normalize(raw)))


def test_preferred_terms_and_symmetric_scoring():
    st = ClusterState(zoned(NODES))
    place(st, kpod("db", {"app": "db"}), "b1")
    s = _scores(st, kpod("x", {"app": "web"}, pref_aff=((50, term(ZONE, app="db")),)))
    assert s["b1"] == s["b2"] == 100 and s["a1"] == 0
    s = _scores(st, kpod("x", {"app": "web"}, pref_anti=((50, term(HOST, app="db")),)))
    assert s["b1"] == 0 and s["a1"] == 100
    # an existing pod's preferred anti-affinity towards web pods lowers its own node for them
    place(st, kpod("cache", {"app": "cache"}, pref_anti=((10, term(HOST, app="web")),)), "a2")
    s = _scores(st, kpod("y", {"app": "web"}))
    assert s["a2"] == 0 and s["a1"] == 100
    # an existing pod's required affinity counts with weight 1 for pods it matches
    st2 = ClusterState(zoned(NODES))
    place(st2, kpod("w", {"app": "web"}, aff=(term(ZONE, app="db"),)), "a1")
    s = _scores(st2, kpod("d", {"app": "db"}))
    assert s["a1"] == s["a2"] == 100 and s["b1"] == 0
