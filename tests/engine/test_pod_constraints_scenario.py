"""Pod-to-pod constraints through the whole cycle: replicas, spread, gangs, preemption, explain."""

from __future__ import annotations

from collections import Counter

import pytest

from gpufleet.engine.framework import Scheduler
from gpufleet.engine.gang import place_gang
from gpufleet.engine.podspec import parse_pod
from gpufleet.engine.preemption import find_victims
from gpufleet.engine.state import ClusterState
from gpufleet.policies import build_profile
from tests.builders import snapshot
from tests.engine.builders import HOST, ZONE, kpod, place, spread_c, term, zoned


def sched(nodes, policy="default"):
    return Scheduler(build_profile(policy), ClusterState(nodes), seed=1)


def web(i, **kw):
    return parse_pod(kpod(f"web-{i}", {"app": "web"}, **kw))


@pytest.mark.parametrize("policy", ["default", "fgd", "bestfit", "random"])
def test_replicas_with_required_anti_affinity_land_on_distinct_nodes(policy):
    s = sched(zoned({"n1": "a", "n2": "a", "n3": "b"}), policy)
    anti = (term(HOST, app="web"),)
    nodes = [s.schedule(web(i, anti=anti)).assignment.node for i in range(3)]
    assert sorted(nodes) == ["n1", "n2", "n3"]
    d = s.schedule(web(3, anti=anti))
    assert not d.ok
    assert d.status.reasons == ("0/3 nodes are available: 3 node(s) didn't match pod anti-affinity rules.",)


def test_explain_counts_each_reason_like_kube_scheduler():
    nodes = zoned({f"n{i}": "abc"[i % 3] for i in range(12)})
    s = sched(nodes)
    for i in range(9):
        place(s.state, kpod(f"db-{i}", {"app": "db"}), f"n{i}")
    for i in (9, 10, 11):
        place(s.state, kpod(f"x-{i}", {"app": "x"}, host_ports=((80,),)), f"n{i}")
    d = s.explain(parse_pod(kpod("p", {"app": "p"}, anti=(term(HOST, app="db"),), host_ports=((80,),))))
    assert not d.ok
    assert d.diagnosis.message() == ("0/12 nodes are available: 9 node(s) didn't match pod anti-affinity rules, "
                                     "3 node(s) didn't have free ports for the requested pod ports.")
    assert d.diagnosis.by_node["n0"] == "node(s) didn't match pod anti-affinity rules"


def test_spread_over_three_zones_max_skew_one():
    s = sched(zoned({f"n{i}": "abc"[i % 3] for i in range(9)}))
    zone_of = {n.name: n.labels[ZONE] for n in s.state.nodes}
    got = Counter()
    for i in range(9):
        d = s.schedule(web(i, spread=(spread_c(1, app="web"),)))
        assert d.ok, d.status
        got[zone_of[d.assignment.node]] += 1
        assert max(got.values()) - min(got.get(z, 0) for z in "abc") <= 1
    assert got == {"a": 3, "b": 3, "c": 3}


def test_pod_affinity_follows_a_running_pod():
    s = sched(zoned({"n1": "a", "n2": "b", "n3": "c"}))
    place(s.state, kpod("db", {"app": "db"}), "n2")
    for i in range(3):
        assert s.schedule(web(i, aff=(term(ZONE, app="db"),))).assignment.node == "n2"


def test_gang_members_respect_each_others_anti_affinity_all_or_nothing():
    anti = (term(HOST, app="web"),)
    members = [parse_pod(kpod(f"g-{i}", {"app": "web"}, anti=anti, annotations={"gpufleet.io/pod-group": "g"})) for i in range(3)]
    s = sched(zoned({"n1": "a", "n2": "a"}))
    before = snapshot(s.state)
    res = place_gang(s, "default/g", members)
    assert not res.ok and "only 2 of the 3" in res.status.message
    after = snapshot(s.state)
    assert after["assignments"] == before["assignments"] and not s.state.pod_index.pods
    s = sched(zoned({"n1": "a", "n2": "a", "n3": "b"}))
    res = place_gang(s, "default/g", members)
    assert res.ok and sorted(d.assignment.node for d in res.placed) == ["n1", "n2", "n3"]


def test_preemption_evicts_the_pod_that_breaks_anti_affinity():
    s = sched(zoned({"n1": "a"}))
    place(s.state, kpod("db", {"app": "db"}), "n1")
    s.state.assignments["default/db"]  # placed with priority 0
    hi = parse_pod(kpod("web", {"app": "web"}, anti=(term(HOST, app="db"),), priority=100))
    assert not s.schedule(hi).ok
    plan = find_victims(s, hi)
    assert plan is not None and [a.pod_key for a in plan.victims] == ["default/db"]
    s.forget("default/db")
    assert s.schedule(hi).ok


def test_preemption_keeps_the_preemptors_spread():
    # zone a holds two low-priority web pods, zone b none and no room: evicting in b cannot help; in a it must
    # leave the skew within 1 once the preemptor lands
    nodes = zoned({"a1": "a", "b1": "b"}, cpu_milli=1000)
    s = sched(nodes)
    place(s.state, kpod("w0", {"app": "web"}, cpu="400m"), "a1")
    place(s.state, kpod("w1", {"app": "web"}, cpu="400m"), "a1")
    place(s.state, kpod("filler", {"app": "other"}, cpu="900m"), "b1")
    hi = parse_pod(kpod("w2", {"app": "web"}, cpu="500m", spread=(spread_c(1, app="web"),), priority=10))
    assert not s.schedule(hi).ok
    plan = find_victims(s, hi)
    assert plan is not None and plan.node == "b1" and [a.pod_key for a in plan.victims] == ["default/filler"]
