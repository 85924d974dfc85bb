"""The binder's operations for binds the scheduler extender sends itself (``begin_external`` /
``end_external``): the cache updated as for the loop's own binds, nothing kube-scheduler does itself."""

from __future__ import annotations

import json
from dataclasses import replace

from gpufleet.engine import annotations as ann
from gpufleet.engine.inventory import assignment_to_json
from gpufleet.engine.podspec import parse_pod
from tests.kube.fake_api import FakeApi
from gpufleet.kube.extender import ExtenderLoop
from gpufleet.kube.loop import slim_pod
from gpufleet.policies import build_profile

from .test_loop import node, pod

KEY = "ml/a"


def begun():
    """Pod ml/a assumed on one of two one-GPU nodes, its external bind begun."""
    api = FakeApi()
    for name in ("n1", "n2"):
        api.add_node(node(name, gpus=1, inventory=True))
    p = pod("a", scheduler="default-scheduler")
    api.add_pod(p)
    loop = ExtenderLoop(api, build_profile("default"))
    loop.resync()
    cycle = loop.cache.sched.new_cycle(parse_pod(p))
    a = loop.cache.sched.decide(cycle).assignment
    assert a is not None and loop.cache.sched.reserve(cycle).ok
    loop.binder.begin_external(KEY, slim_pod(p), a, 0.0)
    st = loop.cache.state
    annotations = {ann.ASSIGNMENT: assignment_to_json(a, {g.index: g.uuid for g in st.nodes[st.index[a.node]].gpus})}
    return api, loop, a, annotations


def test_a_bound_external_bind_is_held_as_bound_and_counted_without_an_attempt_or_event():
    api, loop, a, annotations = begun()
    assert loop.binder.is_in_flight(KEY)
    assert loop.binder.end_external(KEY, "bound", None, annotations)
    held = loop.cache.bound_pods[KEY]
    assert held["spec"]["nodeName"] == a.node
    assert json.loads(held["metadata"]["annotations"][ann.ASSIGNMENT])["node"] == a.node
    assert loop.cache.state.assignments[KEY] == a and not loop.binder.is_in_flight(KEY)
    assert loop.stats.binds == 1 and not any(loop.stats.attempts.values()) and not api.events


def test_a_failed_external_bind_drops_the_assumption_and_leaves_the_retry_to_kube_scheduler():
    api, loop, a, annotations = begun()
    assert loop.binder.end_external(KEY, "failed", None, annotations)
    assert KEY not in loop.cache.state.assignments and KEY not in loop.cache.bound_pods and KEY not in loop.queue.pending
    assert loop.stats.binds == 0 and not any(loop.stats.attempts.values()) and not api.events and not loop.binder.is_in_flight(KEY)


def test_an_external_bind_someone_else_won_holds_their_placement():
    api, loop, a, annotations = begun()
    other = "n2" if a.node == "n1" else "n1"
    seen = pod("a", scheduler="default-scheduler", node_name=other)
    assert loop.binder.end_external(KEY, "taken", seen, annotations)
    assert loop.cache.state.assignments[KEY].node == other and loop.cache.bound_pods[KEY]["spec"]["nodeName"] == other
    assert loop.stats.binds == 0


def test_a_failed_external_bind_leaves_an_assumption_that_is_no_longer_its_own():
    api, loop, a, annotations = begun()
    moved = replace(a, node="n2" if a.node == "n1" else "n1")
    loop.cache.sched.forget(KEY)
    loop.cache.state.reserve(moved)  # e.g. a relist placed the pod from what the watch showed
    assert loop.binder.end_external(KEY, "failed", None, annotations)
    assert loop.cache.state.assignments[KEY] == moved


def test_an_external_bind_of_a_pod_deleted_meanwhile_applies_nothing():
    api, loop, a, annotations = begun()
    loop.drop_pod(KEY)  # the watch showed it deleted while the Binding was out
    assert not loop.binder.is_in_flight(KEY) and KEY not in loop.cache.state.assignments
    assert not loop.binder.end_external(KEY, "bound", None, annotations)
    assert KEY not in loop.cache.bound_pods and loop.stats.binds == 0
