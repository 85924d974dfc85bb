"""The loop's harder cases: lost replies, conflicts, stale events, node churn, 410 Gone, async binds, leases."""

from __future__ import annotations

import json
import threading

import pytest

from tests.kube.fake_api import FakeApi
from gpufleet.kube.convert import node_from_json
from gpufleet.kube.leader import LeaseElector, MemoryLeaseStore
from gpufleet.kube.loop import SchedulerLoop
from gpufleet.kube.runner import Runner, wait_until
from gpufleet.policies import build_profile

from .test_loop import Clock, make, node, pod


def gpu_use(api):
    use = {}
    for p in api.pods.values():
        a = (p["metadata"].get("annotations") or {}).get("gpufleet.io/assignment")
        if a:
            a = json.loads(a)
            for g in a["gpus"]:
                use[(a["node"], g["index"])] = use.get((a["node"], g["index"]), 0) + a["gpu_milli"]
    return use


def feed(loop, api):
    for kind in ("node", "pod"):
        for t, obj in api.watch(kind, loop.cache.rv[kind]):
            loop.handle(kind, t, obj)


def test_lost_bind_reply_is_checked_not_retried():
    api = FakeApi()
    api.add_node(node("n1", gpus=1))
    api.add_pod(pod("a"))
    api.add_pod(pod("b"))
    loop = make(api)
    api.lost_bind_replies = 1  # the bind lands, the reply is lost
    loop.schedule_due()
    assert api.binds == [("ml/a", "n1")]  # b did not get a's GPU
    assert loop.stats.binds == 1 and "ml/a" in loop.cache.state.assignments
    assert [e["reason"] for e in api.events if e["pod"] == "ml/a"] == ["Scheduled"]
    assert "Insufficient nvidia.com/gpu" in next(e["message"] for e in api.events if e["pod"] == "ml/b")


def test_conflict_with_another_scheduler_takes_their_assignment():
    api = FakeApi()
    api.add_node(node("n1", gpus=2))
    api.add_pod(pod("a"))
    loop = make(api)
    # someone else binds it between our list and our bind
    api.pods["ml/a"]["spec"]["nodeName"] = "n1"
    loop.schedule_due()
    assert not api.binds and loop.stats.attempts["error"] == 1
    assert loop.cache.state.assignments["ml/a"].node == "n1"  # modelled from their binding
    assert "ml/a" not in loop.queue.pending and "ml/a" not in loop.binder.binding


def test_deleted_while_pending_bind_is_dropped():
    api = FakeApi()
    api.add_node(node("n1", gpus=1))
    api.add_pod(pod("a"))
    loop = make(api)
    del api.pods["ml/a"]  # the bind will answer 404
    loop.schedule_due()
    assert not loop.cache.state.assignments and not loop.queue.pending and not loop.binder.binding


def test_bookmarks_and_stale_events_are_ignored():
    api = FakeApi()
    api.add_node(node("n1", gpus=1))
    loop = make(api)
    loop.handle("node", "BOOKMARK", {"metadata": {"resourceVersion": "999"}})
    assert len(loop.cache.state) == 1 and loop.cache.rv["node"] == "999"
    p = pod("a")
    api.add_pod(p)
    old = json.loads(json.dumps(api.pods["ml/a"]))
    loop.handle("pod", "ADDED", old)
    loop.schedule_due()
    assert api.binds == [("ml/a", "n1")]
    loop.handle("pod", "MODIFIED", old)  # an event older than the bound pod we hold
    assert "ml/a" not in loop.queue.pending and "ml/a" in loop.cache.state.assignments


def test_not_ready_node_keeps_its_pods_and_takes_no_new_ones():
    api = FakeApi()
    api.add_node(node("n1", gpus=2, inventory=True))
    api.add_pod(pod("a"))
    loop = make(api)
    loop.schedule_due()
    api.update_node(node("n1", gpus=2, inventory=True, ready=False))
    api.add_pod(pod("b"))
    feed(loop, api)
    loop.schedule_due()
    assert "node.kubernetes.io/not-ready" in next(e["message"] for e in api.events if e["pod"] == "ml/b")
    assert "ml/a" in loop.cache.state.assignments
    api.update_node(node("n1", gpus=2, inventory=True))
    api.add_pod(pod("c"))
    feed(loop, api)
    loop.schedule_due()
    assert {k for k, _ in api.binds} == {"ml/a", "ml/b"} and "ml/c" in loop.queue.pending  # 2 GPUs, never 3
    assert all(v <= 1000 for v in gpu_use(api).values())


def test_node_deleted_and_readded_brings_its_pods_back():
    api = FakeApi()
    api.add_node(node("n1", gpus=1, inventory=True))
    api.add_pod(pod("a"))
    loop = make(api)
    loop.schedule_due()
    api.delete_node("n1")
    feed(loop, api)
    assert len(loop.cache.state) == 0
    api.add_node(node("n1", gpus=1, inventory=True))
    api.add_pod(pod("b"))
    feed(loop, api)
    loop.schedule_due()
    assert "ml/a" in loop.cache.state.assignments and "ml/b" in loop.queue.pending and len(api.binds) == 1


def test_node_heartbeats_do_not_wake_waiting_pods():
    api = FakeApi()
    api.add_node(node("n1", gpus=1))
    api.add_pod(pod("big", gpus=2))
    clock = Clock()
    loop = make(api, clock)
    loop.schedule_due()
    n = node("n1", gpus=1)
    n["status"]["conditions"][0]["lastHeartbeatTime"] = "2026-01-01T00:00:00Z"
    api.update_node(n)
    feed(loop, api)
    assert loop.schedule_due() == 0  # still backing off: nothing the engine sees changed


def test_bad_node_is_left_out_and_named_by_explain():
    api = FakeApi()
    bad = node("broken", gpus=2)
    bad["metadata"]["annotations"]["gpufleet.io/gpu-inventory"] = "{nope"
    api.add_node(bad)
    api.add_node(node("n1", gpus=1))
    loop = make(api)
    assert [n.name for n in loop.cache.state.nodes] == ["n1"]
    _, by_node = loop.explain(pod("x"))
    assert "gpufleet.io/gpu-inventory" in by_node["broken"] and by_node["n1"] == "fits"


def test_gfd_count_and_time_slicing_replicas():
    n = node("n1", gpus=16)
    n["metadata"]["labels"].update({"nvidia.com/gpu.count": "4", "nvidia.com/gpu.replicas": "4"})
    assert len(node_from_json(n).gpus) == 4
    n["metadata"]["labels"]["nvidia.com/gpu.count"] = "2"  # fewer physical GPUs than allocatable says
    assert len(node_from_json(n).gpus) == 2
    n["metadata"]["labels"]["nvidia.com/gpu.replicas"] = "0"
    with pytest.raises(Exception, match="nvidia.com/gpu.replicas"):
        node_from_json(n)


def test_async_binds_give_the_same_result():
    api = FakeApi()
    api.call_latency_s = 0.002
    for i in range(4):
        api.add_node(node(f"n{i}", gpus=4, inventory=True))
    for i in range(20):
        api.add_pod(pod(f"p{i}", milli=500 if i % 2 else None))
    loop = SchedulerLoop(api, build_profile("bestfit"), bind_workers=8, event_thread=True)
    loop.resync()
    loop.schedule_due()
    loop.close()
    assert len(api.binds) == 20 and not loop.binder.binding and loop.stats.binds == 20
    use = gpu_use(api)
    assert all(v <= 1000 for v in use.values()) and sum(use.values()) == 10 * 1000 + 10 * 500
    assert sum(e["reason"] == "Scheduled" for e in api.events) == 20


def test_async_bind_failure_is_requeued_with_its_reservation_released():
    api = FakeApi()
    api.add_node(node("n1", gpus=1))
    api.add_pod(pod("a"))
    clock = Clock()
    loop = SchedulerLoop(api, build_profile("bestfit"), bind_workers=2, clock=clock)
    loop.resync()
    api.fail_binds = 1
    loop.schedule_due()
    assert loop.binder.drain(block_s=2.0) == 1
    assert "ml/a" in loop.queue.pending and not loop.cache.state.assignments
    clock.t += 5
    loop.schedule_due()
    loop.close()
    assert api.binds == [("ml/a", "n1")]


def run_runner(api, elector=None, **kw):
    loop = SchedulerLoop(api, build_profile("bestfit"), backoff_initial_s=0.05, backoff_max_s=0.2, **kw)
    r = Runner(api, loop, elector, watch_timeout_s=1, slice_s=0.05)
    stop = threading.Event()
    t = threading.Thread(target=r.run, args=(stop,), daemon=True)
    t.start()
    assert r.ready.wait(5)
    return r, stop, t


def test_runner_relists_after_410_gone_and_keeps_scheduling():
    api = FakeApi()
    api.add_node(node("n1", gpus=1))
    r, stop, t = run_runner(api)
    try:
        api.add_pod(pod("a"))
        assert wait_until(lambda: len(api.binds) == 1, 5)
        api.compact()  # the watch's resourceVersion is now too old
        api.add_node(node("n2", gpus=2))
        api.add_pod(pod("b", gpus=2))
        assert wait_until(lambda: len(api.binds) == 2, 5), api.events
        assert r.relists["node"] + r.relists["pod"] >= 1
        assert dict(api.binds)["ml/b"] == "n2"
        api.delete_pod("ml/a")
        assert wait_until(lambda: "ml/a" not in r.loop.cache.state.assignments, 5)
    finally:
        stop.set()
        t.join(5)



class CutWatchApi(FakeApi):
    """Every watch is cut mid-stream; ``stop`` is set first when the cut is the scheduler shutting down."""

    def __init__(self, stop: threading.Event, shutting_down: bool):
        super().__init__()
        self.stop, self.shutting_down, self.watches = stop, shutting_down, 0

    def watch(self, kind, rv, timeout_s=None):
        self.watches += 1
        if self.shutting_down or self.watches > 1:
            self.stop.set()
        raise ConnectionError("Response ended prematurely")
        yield  # a generator, like the real watch


@pytest.mark.parametrize("shutting_down, warned", [(False, True), (True, False)])
def test_a_watch_cut_by_shutdown_is_not_reported_as_a_failure(caplog, shutting_down, warned):
    # seen in the apiserver tier: watches cut when the test apiserver went away after the scheduler had
    # stopped logged "watch failed ... reconnecting" from threads that were already on their way out
    stop = threading.Event()
    api = CutWatchApi(stop, shutting_down)
    r = Runner(api, SchedulerLoop(api, build_profile("bestfit")), watch_timeout_s=1)
    r._reflect("node", "0", stop)  # returns once stop is set
    failed = [m for m in caplog.messages if "watch failed" in m]
    assert bool(failed) == warned


def test_runner_only_the_leader_binds_and_a_standby_takes_over():
    api = FakeApi()
    api.add_node(node("n1", gpus=4))
    store = MemoryLeaseStore()
    ea = LeaseElector(store, "a", lease_s=3, renew_deadline_s=2, retry_s=0.1)
    ra, stop_a, ta = run_runner(api, ea)
    assert wait_until(lambda: ea.is_leader, 3)
    eb = LeaseElector(store, "b", lease_s=3, renew_deadline_s=2, retry_s=0.1)
    rb, stop_b, tb = run_runner(api, eb)
    try:
        api.add_pod(pod("p0"))
        assert wait_until(lambda: len(api.binds) == 1, 5)
        assert ra.loop.stats.binds == 1 and rb.loop.stats.binds == 0 and not eb.is_leader
        stop_a.set()
        ta.join(5)  # releases the lease
        assert wait_until(lambda: eb.is_leader, 3)
        api.add_pod(pod("p1"))
        assert wait_until(lambda: len(api.binds) == 2, 5)
        assert rb.loop.stats.binds == 1 and store.rec.holder == "b"
        assert all(v <= 1000 for v in gpu_use(api).values())
    finally:
        stop_a.set()
        stop_b.set()
        tb.join(5)


def test_leader_steps_down_when_it_cannot_renew_before_the_deadline():
    store = MemoryLeaseStore()
    clock = Clock()
    a = LeaseElector(store, "a", lease_s=15, renew_deadline_s=10, retry_s=2, clock=clock)
    assert a.tick()
    store.fail = 100
    clock.t += 5
    assert a.tick()  # a blip: still leading
    clock.t += 6
    assert not a.tick()  # past the renew deadline (11 s) and before anyone may take over (15 s)


def test_the_bind_fence_closes_at_the_renew_deadline_even_if_the_election_thread_never_ticks():
    # a tick stuck in a lease call (or a paused process) leaves is_leader True; binds check leading_now()
    store = MemoryLeaseStore()
    clock = Clock()
    a = LeaseElector(store, "a", lease_s=15, renew_deadline_s=10, retry_s=2, clock=clock)
    assert a.tick() and a.leading_now()
    clock.t += 9.9
    assert a.leading_now()
    clock.t += 0.2  # no tick: is_leader is stale, the fence is not
    assert a.is_leader and not a.leading_now()
    b = LeaseElector(store, "b", lease_s=15, renew_deadline_s=10, retry_s=2, clock=clock)
    assert not b.step()  # b first sees a's record now: it may take over only 15 s from here, when a is long fenced


def test_lease_expiry_uses_the_local_clock_not_the_holders():
    store = MemoryLeaseStore()
    clock = Clock()
    a = LeaseElector(store, "a", lease_s=15, clock=clock, wall_clock=lambda: 0.0)  # a's wall clock is far behind
    b = LeaseElector(store, "b", lease_s=15, clock=clock, wall_clock=lambda: 1e9)
    assert a.step() and not b.step()
    for _ in range(5):
        clock.t += 10
        assert a.step() and not b.step()  # a renews: the record changes, so b never sees it expire
    assert a.term == 1 and b.term == 0


def test_lease_store_conflict_means_only_one_winner():
    store = MemoryLeaseStore()
    clock = Clock()
    a = LeaseElector(store, "a", lease_s=3, renew_deadline_s=2, retry_s=1, clock=clock)
    b = LeaseElector(store, "b", lease_s=3, renew_deadline_s=2, retry_s=1, clock=clock)
    assert a.step()
    b.step()
    clock.t += 4
    rec = store.get()
    # both saw the same expired record; only the first update wins
    assert b.step()
    store.rec = store.rec  # noqa: PLW0127
    assert not store.update(rec)


def test_repeated_failures_do_not_repeat_the_same_event_and_bound_pods_are_slim():
    api = FakeApi()
    api.add_node(node("n1", gpus=1))
    big = pod("big", gpus=2)
    big["spec"]["affinity"] = {"podAntiAffinity": {}}
    api.add_pod(big)
    clock = Clock()
    loop = make(api, clock)
    for _ in range(4):
        loop.schedule_due()
        clock.t += 10
    assert loop.stats.attempts["unschedulable"] >= 3
    assert sum(e["reason"] == "FailedScheduling" for e in api.events) == 1
    clock.t += 61
    loop.schedule_due()
    assert sum(e["reason"] == "FailedScheduling" for e in api.events) == 2  # said again after a while
    theirs = pod("theirs", gpus=1, scheduler="default-scheduler", node_name="n1")
    theirs["spec"]["affinity"] = {"nodeAffinity": {}}
    theirs["metadata"]["annotations"]["other.io/x"] = "y" * 1000
    api.add_pod(theirs)
    feed(loop, api)
    held = loop.cache.bound_pods["ml/theirs"]
    assert "affinity" not in held["spec"] and held["metadata"]["annotations"] == {} and "ml/theirs" in loop.cache.state.assignments


def test_scheduling_gates_hold_a_pod_until_removed():
    api = FakeApi()
    api.add_node(node("n1", gpus=1))
    gated = pod("g")
    gated["spec"]["schedulingGates"] = [{"name": "example.com/quota"}]
    api.add_pod(gated)
    loop = make(api)
    assert loop.schedule_due() == 0 and not api.binds
    open_ = json.loads(json.dumps(api.pods["ml/g"]))
    del open_["spec"]["schedulingGates"]
    api.update_pod(open_)
    feed(loop, api)
    assert loop.schedule_due() == 1 and api.binds == [("ml/g", "n1")]


def test_bound_pod_with_a_contradicting_annotation_still_holds_its_gpus():
    api = FakeApi()
    api.add_node(node("n1", gpus=1))
    p = pod("odd", gpus=1, scheduler="default-scheduler", node_name="n1",
            annotations={"gpufleet.io/assignment": '{"node":"elsewhere","gpus":[{"index":0,"uuid":""}],"gpu_milli":1000}'})
    api.add_pod(p)
    api.add_pod(pod("mine"))
    loop = make(api)
    loop.schedule_due()
    assert "ml/odd" in loop.cache.state.assignments and not api.binds
