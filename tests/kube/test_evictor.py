"""Evictions: one DELETE per victim, in flight until the watch shows it gone, 404 = already gone."""

from __future__ import annotations

from types import SimpleNamespace

from gpufleet.engine.model import Assignment
from gpufleet.kube.api import FakeApi
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
