"""The live drain: an interruption notice moves a node's pods (priority first, gangs whole), replacements say why."""

from __future__ import annotations

import json

from tests.kube.fake_api import FakeApi
from gpufleet.kube.explain_cli import explain
from gpufleet.kube.loop import SchedulerLoop
from gpufleet.policies import build_profile

from .test_loop import Clock, node, pod

SPOT = {"karpenter.sh/capacity-type": "spot"}


def _node(name, labels=None, taints=None):
    n = node(name, gpus=4, inventory=True)
    n["metadata"]["labels"].update(labels or {})
    if taints:
        n["spec"]["taints"] = taints
    return n


def _pod(name, prio=0, spot="prefer", owner=None, group=None):
    ann = {"gpufleet.io/spot": spot} if spot else {}
    if group:
        ann["gpufleet.io/pod-group"] = group
    p = pod(name, annotations=ann)
    p["spec"]["priority"] = prio
    if owner:
        p["metadata"]["ownerReferences"] = [{"kind": "ReplicaSet", "name": owner, "controller": True, "uid": "rs"}]
    return p


def _sync(api, loop):
    for kind in ("node", "pod"):
        for t, obj in api.watch(kind, loop.cache.rv[kind]):
            loop.handle(kind, t, obj)


def _loop(api, clock):
    loop = SchedulerLoop(api, build_profile("default"), clock=clock)
    loop.resync()
    return loop


def test_a_notice_moves_the_pods_in_priority_order_and_the_replacements_say_why():
    api, clock = FakeApi(), Clock()
    api.add_node(_node("od"))
    api.add_node(_node("spot", SPOT))
    for name, prio in (("low", 1), ("high", 100), ("mid", 10)):
        api.add_pod(_pod(name, prio, owner="rs-" + name))
    api.add_pod(_pod("hp", 1000, spot=None))
    loop = _loop(api, clock)
    assert loop.schedule_due() == 4
    where = dict(api.binds)
    assert {where["ml/low"], where["ml/high"], where["ml/mid"]} == {"spot"} and where["ml/hp"] == "od"
    # Karpenter's notice
    n = api.nodes["spot"]
    n["spec"]["taints"] = [{"key": "karpenter.sh/disrupted", "effect": "NoSchedule"}]
    api.add_node(n)
    _sync(api, loop)
    clock.t += 1
    loop.schedule_due()
    assert [k for k, _ in api.evicted] == ["ml/high", "ml/mid", "ml/low"]  # highest priority first
    ev = [e for e in api.events if e["reason"] == "Interrupted"]
    assert [e["pod"] for e in ev] == ["ml/high", "ml/mid", "ml/low"]
    assert ev[0]["message"] == "moved: node spot is going away (taint karpenter.sh/disrupted)"
    assert loop.stats.interrupted == 3
    # the ReplicaSets create replacements; they are tagged and placed on the on-demand node
    for name, prio in (("high", 100), ("low", 1)):
        api.add_pod(_pod(name + "-2", prio, owner="rs-" + name))
    _sync(api, loop)
    clock.t += 1
    loop.schedule_due()
    moved = json.loads(api.pods["ml/high-2"]["metadata"]["annotations"]["gpufleet.io/moved-from"])
    assert moved["pod"] == "ml/high" and moved["node"] == "spot"
    assert dict(api.binds)["ml/high-2"] == "od" and dict(api.binds)["ml/low-2"] == "od"
    code, text = explain(api, build_profile("default"), "ml/high-2")
    assert code == 0 and "moved: replaces ml/high, evicted at" in text and "node spot is going away" in text


def test_a_gang_moves_whole_and_nothing_stays_on_a_gone_node():
    api, clock = FakeApi(), Clock()
    api.add_node(_node("a", SPOT))
    api.add_node(_node("b", SPOT))
    loop = _loop(api, clock)
    for i, n in enumerate(("a", "b")):  # a gang running across both spot nodes, bound before
        p = _pod(f"w{i}", group="job")
        p["spec"]["nodeName"] = n
        api.add_pod(p)
    loop.resync()
    n = api.nodes["a"]
    n["spec"]["taints"] = [{"key": "aws-node-termination-handler/spot-itn", "value": "1", "effect": "NoSchedule"}]
    api.add_node(n)
    _sync(api, loop)
    loop.schedule_due()
    assert sorted(k for k, _ in api.evicted) == ["ml/w0", "ml/w1"]  # w1 runs on b, but its gang lost w0
    msg = next(e["message"] for e in api.events if e["pod"] == "ml/w1" and e["reason"] == "Interrupted")
    assert "pod group ml/job lost ml/w0 on node a" in msg
    # a pod bound to a node that is deleted is evicted at once
    p = _pod("stray")
    p["spec"]["nodeName"] = "b"
    api.add_pod(p)
    _sync(api, loop)
    api.delete_node("b")
    _sync(api, loop)
    clock.t += 10
    loop.schedule_due()
    assert ("ml/stray", 0) in api.evicted and "ml/stray" not in api.pods


def _sync_pods_only(api, loop):
    for t, obj in api.watch("pod", loop.cache.rv["pod"]):
        loop.handle("pod", t, obj)


def test_a_pod_on_a_node_its_watch_has_not_brought_yet_is_left_alone():
    # nodes and pods come on separate watches: on a loaded apiserver a pod bound to a node that has just joined can
    # arrive before the node; the API is asked, and the pod (another scheduler's, here) stays
    api, clock = FakeApi(), Clock()
    api.add_node(_node("od"))
    loop = _loop(api, clock)
    api.add_node(_node("new"))
    p = _pod("web", spot=None)
    p["spec"]["nodeName"] = "new"
    api.add_pod(p)
    _sync_pods_only(api, loop)
    assert "new" not in loop.cache.node_objs and "ml/web" in loop.cache.bound_pods
    clock.t += 10
    loop.schedule_due()
    assert api.evicted == [] and "ml/web" in api.pods and loop.stats.interrupted == 0
    # the API failing while asked: nothing is evicted on a guess
    calls = []

    def down(name):
        calls.append(name)
        raise OSError("connection refused")

    api.node_exists = down
    api.delete_node("new")
    clock.t += 10
    loop.schedule_due()
    assert calls == ["new"] and api.evicted == []
    del api.node_exists
    # the node is really gone (deleted before the watch ever brought it): the pod goes, as the pod GC would do
    _sync(api, loop)
    clock.t += 10
    loop.schedule_due()
    assert api.evicted == [("ml/web", 0)] and "ml/web" not in api.pods
