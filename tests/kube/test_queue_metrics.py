"""Pending demand per team queue (``gpufleet_queue_pending_pods`` / ``_gpus``): what a HorizontalPodAutoscaler
scales a team's workers on through the external metrics API (deploy/autoscaling)."""

from __future__ import annotations

import threading

from gpufleet.engine.errors import InvalidPodSpec
from gpufleet.engine.model import PodRequest
from tests.kube.fake_api import FakeApi
from gpufleet.kube.cli import Metrics
from gpufleet.kube.loop import SchedulerLoop
from gpufleet.kube.queue_metrics import QueueGauges, pending_by_queue, request_gpus
from gpufleet.kube.runner import Runner, wait_until
from gpufleet.policies import build_profile
from tests.kube.test_loop import node
from tests.kube.test_teams_live import namespace, pod, queue


def test_request_gpus_counts_as_queue_quota_does():
    assert request_gpus(PodRequest("a", gpu_count=2, gpu_milli=1000)) == 2
    assert request_gpus(PodRequest("a", gpu_count=1, gpu_milli=250)) == 0.25
    assert request_gpus(PodRequest("a", gpu_count=2, mig_profile="3g.40gb")) == 6 / 7
    assert request_gpus(PodRequest("a", gpu_count=1, gpu_milli=0, gpu_memory_mib=10240)) == 0  # memory-only share
    assert request_gpus(PodRequest("a", cpu_milli=4000)) == 0


def test_pending_by_queue():
    reqs = {"a/1": PodRequest("1", "a", gpu_count=1, gpu_milli=1000, queue="qa"),
            "a/2": PodRequest("2", "a", gpu_count=1, gpu_milli=500, queue="qa"),
            "a/3": PodRequest("3", "a", cpu_milli=1000, queue="qa"),
            "b/1": PodRequest("1", "b", gpu_count=4, gpu_milli=1000, queue="qc"),  # a queue the cluster no longer has
            "x/1": PodRequest("1", "x", gpu_count=1, gpu_milli=1000)}  # no queue

    def request(key, _pod):
        if key == "bad/1":
            raise InvalidPodSpec(key, "metadata.annotations[gpufleet.io/gpu-milli]", "must be an integer")
        return reqs[key]

    pending = {k: {} for k in [*reqs, "bad/1"]}
    assert pending_by_queue(pending, request, ["qa", "qb"]) == {"qa": (3, 1.5), "qb": (0, 0.0), "qc": (1, 4.0)}


def test_gauges_drop_a_queue_that_is_gone():
    m = Metrics()
    g = QueueGauges(m.queue_pending_pods, m.queue_pending_gpus)
    g.update({"qa": (2, 1.5), "qb": (0, 0.0)})
    val = m.registry.get_sample_value
    assert val("gpufleet_queue_pending_gpus", {"queue": "qa"}) == 1.5 and val("gpufleet_queue_pending_pods", {"queue": "qb"}) == 0
    g.update({"qa": (0, 0.0)})
    assert val("gpufleet_queue_pending_gpus", {"queue": "qa"}) == 0 and val("gpufleet_queue_pending_pods", {"queue": "qb"}) is None


def test_the_scheduler_exports_pending_pods_and_gpus_per_queue():
    """The runner as `gpufleet scheduler` runs it: a 2-GPU node, queue qa (namespace team-a) with quota 4, queue qb
    idle; 4 whole-GPU pods and a 500-milli share in team-a: 2 bind, the rest wait (no room)."""
    api = FakeApi()
    api.add_node(node("n0", gpus=2, cpu="64"))
    api.put_object("queue", queue("qa", 4))
    api.put_object("queue", queue("qb", 2))
    api.put_object("namespace", namespace("team-a", "qa"))
    for i in range(4):
        api.add_pod(pod(f"w{i}"))
    api.add_pod(pod("share", annotations={"gpufleet.io/gpu-milli": "500"}))
    api.add_pod(pod("elsewhere", ns="nobody", gpus=3))  # no queue, no room: in gpufleet_pending_pods only
    m = Metrics()
    loop = SchedulerLoop(api, build_profile("bestfit"), backoff_initial_s=0.05, backoff_max_s=0.2)
    r = Runner(api, loop, None, m, watch_timeout_s=1, slice_s=0.05, queue_metrics_every_s=0.05)
    stop = threading.Event()
    t = threading.Thread(target=r.run, args=(stop,), daemon=True)
    t.start()
    val = m.registry.get_sample_value
    try:
        assert r.ready.wait(5)
        assert wait_until(lambda: len(api.binds) == 2 and val("gpufleet_queue_pending_pods", {"queue": "qa"}) == 3, 5), \
            (api.binds, val("gpufleet_queue_pending_pods", {"queue": "qa"}))
        waiting = [k for k in loop.queue.pending if k.startswith("team-a/")]
        want = sum(0.5 if k.endswith("share") else 1.0 for k in waiting)
        assert val("gpufleet_queue_pending_gpus", {"queue": "qa"}) == want
        assert val("gpufleet_queue_pending_pods", {"queue": "qb"}) == 0 and val("gpufleet_queue_pending_gpus", {"queue": "qb"}) == 0
        assert val("gpufleet_pending_pods") == 4
        for k in waiting:  # the team's work is withdrawn: its demand falls to 0, the series stays
            api.delete_pod(k)
        assert wait_until(lambda: val("gpufleet_queue_pending_gpus", {"queue": "qa"}) == 0, 5)
        assert val("gpufleet_queue_pending_pods", {"queue": "qa"}) == 0
        api.delete_object("queue", "qb")
        assert wait_until(lambda: val("gpufleet_queue_pending_pods", {"queue": "qb"}) is None, 5)
    finally:
        stop.set()
        t.join(5)
