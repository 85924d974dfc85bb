"""The live queue wakes a waiting pod only when a change may let it fit (schedqueue.may_fit_after), as the
replay does: a pod leaving a node the waiting pod could not fit on anyway does not wake it; its backoff runs."""

from __future__ import annotations

from tests.kube.fake_api import FakeApi
from tests.kube.test_loop import Clock, make, node, pod


def test_a_pod_leaving_wakes_only_waiting_pods_that_could_fit_where_it_left():
    api = FakeApi()
    api.add_node(node("n0", gpus=1))
    api.add_node(node("n1", gpus=4))
    api.add_pod(pod("a", gpus=1))
    api.add_pod(pod("b", gpus=4))
    clock = Clock()
    loop = make(api, clock)
    assert loop.schedule_due() == 2 and len(api.binds) == 2
    for k in ("ml/a", "ml/b"):
        loop.handle("pod", "MODIFIED", api.pods[k])
    api.add_pod(pod("big", gpus=2))
    loop.handle("pod", "ADDED", api.pods["ml/big"])
    assert loop.schedule_due() == 1 and "ml/big" in loop.queue.pending  # waits, backing off
    a = api.pods["ml/a"]
    api.delete_pod("ml/a")
    loop.handle("pod", "DELETED", a)  # n0 has 1 GPU free now: big (2 GPUs) still cannot fit there
    assert loop.schedule_due() == 0
    b = api.pods["ml/b"]
    api.delete_pod("ml/b")
    loop.handle("pod", "DELETED", b)  # n1 has 4 free: big is worth a try at once
    assert loop.schedule_due() == 1 and api.binds[-1] == ("ml/big", "n1")


def test_a_pod_kept_out_by_something_a_departure_may_change_wakes_on_any_departure():
    api = FakeApi()
    api.add_node(node("n0", gpus=1))
    api.add_pod(pod("a", gpus=1))
    clock = Clock()
    loop = make(api, clock)
    loop.schedule_due()
    loop.handle("pod", "MODIFIED", api.pods["ml/a"])
    api.add_pod(pod("bad", annotations={"gpufleet.io/gpu-milli": "2000"}))  # invalid: nothing known kept it out
    loop.handle("pod", "ADDED", api.pods["ml/bad"])
    loop.schedule_due()
    assert loop.schedule_due() == 0
    a = api.pods["ml/a"]
    api.delete_pod("ml/a")
    loop.handle("pod", "DELETED", a)
    assert loop.schedule_due() == 1  # tried again (and told again why it is invalid, as before)
