"""Evictions: one eviction (Eviction API) per victim, in flight until the watch shows it gone, 404 = already gone,
429 = a PodDisruptionBudget said no."""

from __future__ import annotations

from types import SimpleNamespace

from gpufleet.engine.model import Assignment
from tests.kube.fake_api import FakeApi
from gpufleet.kube.loop import Stats
from tests.kube.test_loop import Clock


class Events:
    def __init__(self):
        self.sent = []

    def send(self, pod, type_, reason, message):
        self.sent.append((pod["metadata"]["name"], reason, message))


def setup(grace_s=None, timeout_s=None):
    from gpufleet.kube.evictor import Evictions

    api = FakeApi()
    bound = {}
    for n in ("v1", "v2"):
        p = {"metadata": {"name": n, "namespace": "ml", "uid": f"u-{n}"}, "spec": {"nodeName": "n0"}, "status": {}}
        api.add_pod(p)
        bound[f"ml/{n}"] = p
    clock, events, stats = Clock(), Events(), Stats()
    ev = Evictions(api, events, stats, clock, grace_s, timeout_s)
    return SimpleNamespace(api=api, bound=bound, clock=clock, events=events, stats=stats, ev=ev)


def victim(key):
    return Assignment(pod_key=key, node="n0", gpu_indices=(0,), gpu_milli=1000, cpu_milli=1000, memory_mib=1024)


def test_one_delete_one_event_one_count_and_never_twice():
    t = setup(grace_s=0)
    api, bound, events, stats, ev = t.api, t.bound, t.events, t.stats, t.ev
    assert ev.evict([victim("ml/v1")], bound, "reclaimed: queue qb needs its quota back for tb/b0", "reclaimed", "tb/b0") == ({"ml/v1"}, set())
    assert ev.evict([victim("ml/v1")], bound, "again", "reclaimed", "tb/b1") == (set(), set())  # in flight: no DELETE
    assert api.evicted == [("ml/v1", 0)] and stats.reclaimed == 1
    assert events.sent == [("v1", "Preempted", "reclaimed: queue qb needs its quota back for tb/b0")]
    assert ev.leaving(bound) == {"ml/v1"}
    ev.forget("ml/v1")  # the watch showed it gone
    assert ev.leaving(bound) == set()


def test_a_404_is_already_gone_and_a_failure_is_not_in_flight():
    t = setup()
    api, bound, events, stats, ev = t.api, t.bound, t.events, t.stats, t.ev
    api.delete_pod("ml/v1")  # gone before our DELETE
    assert ev.evict([victim("ml/v1")], bound, "r", "preempted", "ml/p") == (set(), {"ml/v1"})
    assert stats.already_gone == 1 and stats.preempted == 0 and events.sent == []
    api.evict_pod = lambda *a, **k: (_ for _ in ()).throw(ConnectionError("reset"))
    assert ev.evict([victim("ml/v2")], bound, "r", "preempted", "ml/p") == (set(), set())
    assert ev.leaving(bound) == {"ml/v1"} and stats.preempted == 0  # v2 may be planned again
    assert ev.evict([victim("ml/nope")], bound, "r", "preempted", "ml/p") is None  # not bound: nothing done


def test_in_flight_ends_at_its_timeout_and_terminating_pods_are_leaving():
    t = setup(grace_s=None)
    bound, clock, ev = t.bound, t.clock, t.ev
    assert ev.timeout_s == 90.0  # the default 30 s grace period + 60 s
    ev.evict([victim("ml/v1")], bound, "r", "preempted", "ml/p")
    clock.t = 89.0
    assert ev.leaving(bound) == {"ml/v1"}
    clock.t = 90.0
    assert ev.leaving(bound) == set()  # a lost delete: it may be chosen again
    bound["ml/v2"]["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    assert ev.leaving(bound) == {"ml/v2"}


def _pdb(allowed, selector=None, generation=1, observed=1, policy=None):
    spec = {"minAvailable": 1, "selector": selector if selector is not None else {"matchExpressions": [
        {"key": "app", "operator": "In", "values": ["db"]}]}}
    if policy:
        spec["unhealthyPodEvictionPolicy"] = policy
    return {"metadata": {"name": "db", "namespace": "ml", "generation": generation}, "spec": spec,
            "status": {"observedGeneration": observed, "disruptionsAllowed": allowed, "currentHealthy": 2, "desiredHealthy": 1}}


def _running(t, ready=True):
    for p in t.bound.values():
        p["metadata"]["labels"] = {"app": "db"}
        p["status"] = {"phase": "Running", "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}
        t.api.update_pod(p)


def test_the_api_server_keeps_the_budget_and_a_refusal_deletes_nothing():
    t = setup(grace_s=0)
    _running(t)
    t.api.put_object("pdb", _pdb(allowed=1))
    # the snapshot planned both (its view of the budget was behind): the API admits one, refuses the other
    assert t.ev.evict([victim("ml/v1"), victim("ml/v2")], t.bound, "r", "preempted", "ml/p") == ({"ml/v1"}, set())
    assert t.api.evicted == [("ml/v1", 0)] and "ml/v2" in t.api.pods
    assert t.stats.preempted == 1 and t.stats.eviction_refused == 1
    assert t.ev.leaving(t.bound) == {"ml/v1"}  # v2 is not in flight: it stays, and may be planned again
    pdb = t.api.objects["pdb"]["ml/db"]
    assert pdb["status"]["disruptionsAllowed"] == 0 and "v1" in pdb["status"]["disruptedPods"]


def test_the_fake_eviction_subresource_follows_the_api_servers_rules():
    from gpufleet.kube.api import ApiError, EvictionRefused

    t = setup()
    _running(t)
    t.api.put_object("pdb", _pdb(allowed=5, generation=2, observed=1))  # status older than the spec
    try:
        t.api.evict_pod("ml", "v1")
        raise AssertionError("a stale budget admitted an eviction")
    except EvictionRefused:
        pass
    t.api.put_object("pdb", _pdb(allowed=0, policy="AlwaysAllow"))
    _running(t, ready=False)
    t.api.evict_pod("ml", "v1")  # not Ready, AlwaysAllow: goes without spending a disruption
    other = _pdb(allowed=3, selector={"matchLabels": {"app": "db"}})
    other["metadata"]["name"] = "db2"
    t.api.put_object("pdb", other)
    try:
        t.api.evict_pod("ml", "v2")  # two budgets cover it
        raise AssertionError("a pod under two budgets was evicted")
    except ApiError as exc:
        assert exc.status == 500
