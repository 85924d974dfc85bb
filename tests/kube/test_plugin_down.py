"""kube/plugin_down: a pod kubelet refused because the GPU device plugin was down holds GPU pods off its node until
the agent says it registered again, and a refused bare pod is re-created (docs/safety.md, an agent crash)."""

from __future__ import annotations

import copy
import json

from gpufleet.agent.endpoint import iso_now
from gpufleet.kube.plugin_down import MAX_GENERATIONS, refusal, replacement
from tests.kube.fake_api import FakeApi

from .test_interruption import _sync
from .test_loop import Clock, make, node, pod

# what kubelet 1.37 wrote on the pods of the real-node drill (docs/safety.md)
EOF_MSG = "Pod was rejected: Allocate failed due to rpc error: code = Unavailable desc = error reading from server: EOF, which is unexpected"
UNHEALTHY = ("Pod was rejected: Allocate failed due to no healthy devices present; cannot allocate unhealthy devices "
             "nvidia.com/gpu, which is unexpected")
PREFERRED = ("Pod was rejected: Allocate failed due to device plugin GetPreferredAllocation rpc failed with err: rpc error: "
             "code = Canceled desc = grpc: the client connection is closing, which is unexpected")
GUARD = ("Pod was rejected: Allocate failed due to rpc error: code = FailedPrecondition desc = kubelet picked a GPU another "
         "pod uses for a pod that did not ask to share (GPU 0 (GPU-h100-00) is used by optout/p0), which is unexpected")


def refuse(api: FakeApi, key: str, message: str, start: str = "2026-11-27T05:00:00Z") -> None:
    """kubelet fails the pod at admission; the scheduler's watch (live pods only) reports it DELETED with its last
    live state, while a GET shows it Failed -- as kube-apiserver does with a field selector."""
    with api._cv:
        p = api.pods[key]
        last = copy.deepcopy(p)
        p["status"] = {"phase": "Failed", "reason": "UnexpectedAdmissionError", "message": message, "startTime": start}
        api._touch("pod", "DELETED", last)


def announce(api: FakeApi, name: str, when: str) -> None:
    n = api.nodes[name]
    n["metadata"]["annotations"]["gpufleet.io/device-plugin-registered"] = when
    api.update_node(n)


def step(api, loop, clock):
    _sync(api, loop)
    clock.t += 2
    loop.schedule_due()
    _sync(api, loop)


def placed_a():
    """A 2-GPU node n1 and gpufleet's pod ml/a placed there, the loop's cache in step with the API."""
    api, clock = FakeApi(), Clock()
    api.add_node(node("n1", gpus=2, inventory=True))
    api.add_pod(pod("a"))
    loop = make(api, clock)
    loop.schedule_due()
    assert dict(api.binds) == {"ml/a": "n1"}
    _sync(api, loop)
    return api, clock, loop


def test_kubelet_messages_of_a_dead_plugin_are_told_from_the_node_guard_and_other_failures():
    def failed(msg, reason="UnexpectedAdmissionError"):
        return {"status": {"phase": "Failed", "reason": reason, "message": msg}}
    assert refusal(failed(EOF_MSG)) == EOF_MSG.removeprefix("Pod was rejected: ")
    assert refusal(failed(UNHEALTHY)) and refusal(failed(PREFERRED))
    assert refusal(failed(GUARD)) is None  # the agent answered: a verdict, not an outage
    assert refusal(failed(UNHEALTHY, reason="OutOfcpu")) is None
    assert refusal({"status": {"phase": "Running"}}) is None


def test_a_refusal_holds_gpu_pods_off_the_node_until_the_agent_registers_and_the_bare_pod_is_recreated():
    api, clock, loop = placed_a()
    refuse(api, "ml/a", EOF_MSG)
    api.add_pod(pod("b"))
    api.add_pod(pod("cpu", gpus=0))
    step(api, loop, clock)
    # held: the GPU pod waits with a reason a user reads; the pod without GPUs is placed
    assert "ml/b" not in dict(api.binds) and dict(api.binds)["ml/cpu"] == "n1"
    why = [e["message"] for e in api.events if e["pod"] == "ml/b" and e["reason"] == "FailedScheduling"]
    assert why and "GPU device plugin down" in why[-1], why
    down = [e for e in api.object_events if e["reason"] == "GpuPluginDown"]
    assert len(down) == 1 and down[0]["name"] == "n1" and "ml/a" in down[0]["message"] and "EOF" in down[0]["message"]
    # the bare pod is re-created: a copy, unbound, that says what it replaces; it waits like b
    copy_ = api.pods["ml/a-r1"]
    moved = json.loads(copy_["metadata"]["annotations"]["gpufleet.io/moved-from"])
    assert moved["pod"] == "ml/a" and moved["node"] == "n1" and moved["generation"] == 1 and "EOF" in moved["reason"]
    assert "nodeName" not in copy_["spec"] and "gpufleet.io/assignment" not in copy_["metadata"]["annotations"]
    assert [e["reason"] for e in api.events if e["pod"] == "ml/a"][-1] == "Recreated"
    assert loop.stats.plugin_holds == 1 and loop.stats.recreated == 1
    step(api, loop, clock)
    assert "ml/a-r1" not in dict(api.binds) and "ml/b" not in dict(api.binds)
    # a registration from before the refusal does not end the hold; one after it does
    announce(api, "n1", "2026-11-27T04:59:58.000Z")
    step(api, loop, clock)
    assert "ml/b" not in dict(api.binds)
    announce(api, "n1", "2026-11-27T05:00:01.250Z")
    step(api, loop, clock)
    assert dict(api.binds)["ml/b"] == "n1" and dict(api.binds)["ml/a-r1"] == "n1"
    assert [e["reason"] for e in api.object_events if e["name"] == "n1"] == ["GpuPluginDown", "GpuPluginBack"]
    assert not loop.plugin_down.holds


def test_no_hold_when_the_agent_registered_again_before_the_scheduler_saw_the_refusal():
    api, clock, loop = placed_a()
    announce(api, "n1", "2026-11-27T05:00:02.000Z")
    refuse(api, "ml/a", UNHEALTHY)
    api.add_pod(pod("b"))
    step(api, loop, clock)
    assert dict(api.binds)["ml/b"] == "n1" and not loop.plugin_down.holds
    assert "ml/a-r1" in api.pods  # still re-created: kubelet refused it all the same


def test_what_is_not_recreated_and_what_it_is_told():
    api, clock = FakeApi(), Clock()
    api.add_node(node("n1", gpus=4, inventory=True))
    owned = pod("owned")
    owned["metadata"]["ownerReferences"] = [{"kind": "ReplicaSet", "name": "rs", "controller": True, "uid": "rs"}]
    for p in (owned, pod("optout", annotations={"gpufleet.io/recreate-on-refusal": "false"}), pod("guarded"),
              pod("forbidden")):
        api.add_pod(p)
    loop = make(api, clock)
    loop.schedule_due()
    assert len(api.binds) == 4
    _sync(api, loop)
    refuse(api, "ml/owned", UNHEALTHY)  # its ReplicaSet replaces it
    refuse(api, "ml/optout", UNHEALTHY)
    refuse(api, "ml/guarded", GUARD)  # the node guard's verdict: no hold, no copy
    step(api, loop, clock)
    assert not {"ml/owned-r1", "ml/optout-r1", "ml/guarded-r1"} & set(api.pods)
    assert loop.plugin_down.held("n1") and loop.stats.recreated == 0
    # without RBAC to create pods (the shipped manifests): the pod is told why and how
    api.forbid_pod_create = True
    refuse(api, "ml/forbidden", UNHEALTHY)
    step(api, loop, clock)
    told = [e for e in api.events if e["pod"] == "ml/forbidden" and e["reason"] == "NotRecreated"]
    assert told and "403" in told[0]["message"] and "deploy/overlays/recreate-refused-pods" in told[0]["message"]
    assert "ml/forbidden-r1" not in api.pods


def test_another_schedulers_refused_pod_holds_the_node_and_is_told_why_it_is_not_recreated():
    """Kubernetes 1.35 (no routing): kube-scheduler bound a bare GPU pod, kubelet refused it for the dead plugin.  The
    refusal holds the node like one of gpufleet's; without --recreate-other-schedulers-pods the pod is told why it
    stays Failed (and nothing is created)."""
    api, clock = FakeApi(), Clock()
    api.add_node(node("n1", gpus=2, inventory=True))
    api.add_pod(pod("d", scheduler="default-scheduler", node_name="n1"))  # kube-scheduler's bind: no assignment
    api.add_pod(pod("cpu", scheduler="default-scheduler", gpus=0, node_name="n1"))
    loop = make(api, clock)
    refuse(api, "ml/d", EOF_MSG)
    refuse(api, "ml/cpu", "Pod was rejected: Node didn't have enough resource: cpu")  # not a GPU pod: not looked at
    api.add_pod(pod("b"))
    step(api, loop, clock)
    assert loop.plugin_down.held("n1") and "ml/b" not in dict(api.binds)
    told = [e for e in api.events if e["pod"] == "ml/d" and e["reason"] == "NotRecreated"]
    assert len(told) == 1 and "default-scheduler placed it" in told[0]["message"], api.events
    assert "--recreate-other-schedulers-pods" in told[0]["message"] and "deploy/admission" in told[0]["message"]
    assert "ml/d-r1" not in api.pods and loop.stats.recreated == 0
    assert not [e for e in api.events if e["pod"] == "ml/cpu"]


def test_with_the_option_another_schedulers_pod_is_recreated_once_the_plugin_is_back():
    """Its copy goes back to kube-scheduler, which binds by allocatable (stale while the plugin is down): so the copy
    is made only when the hold ends, and keeps its scheduler name."""
    api, clock = FakeApi(), Clock()
    api.add_node(node("n1", gpus=2, inventory=True))
    d = pod("d", scheduler="default-scheduler", node_name="n1")
    d["spec"]["initContainers"] = [{"name": "i", "resources": {}}]
    api.add_pod(d)
    api.add_pod(pod("optout", scheduler="default-scheduler", node_name="n1",
                    annotations={"gpufleet.io/recreate-on-refusal": "false"}))
    loop = make(api, clock)
    loop.plugin_down.recreate_foreign = True
    refuse(api, "ml/d", UNHEALTHY)
    refuse(api, "ml/optout", UNHEALTHY)
    step(api, loop, clock)
    assert loop.plugin_down.held("n1") and "ml/d-r1" not in api.pods  # not while the plugin is down
    step(api, loop, clock)
    assert "ml/d-r1" not in api.pods
    announce(api, "n1", "2026-11-27T05:00:01.250Z")
    step(api, loop, clock)
    assert not loop.plugin_down.holds
    c = api.pods["ml/d-r1"]
    assert c["spec"]["schedulerName"] == "default-scheduler" and "nodeName" not in c["spec"]
    assert json.loads(c["metadata"]["annotations"]["gpufleet.io/moved-from"])["pod"] == "ml/d"
    assert "ml/d-r1" not in dict(api.binds)  # kube-scheduler's to place, not gpufleet's
    assert "ml/optout-r1" not in api.pods and loop.stats.recreated == 1
    # refused when the agent had registered already (no hold): copied at once
    api.add_pod(pod("e", scheduler="default-scheduler", node_name="n1"))
    _sync(api, loop)
    refuse(api, "ml/e", UNHEALTHY, start="2026-11-27T05:00:00.500Z")
    step(api, loop, clock)
    assert "ml/e-r1" in api.pods and not loop.plugin_down.holds
    # refused by the node guard (kubelet gave it a GPU gpufleet's pod uses: the two schedulers raced): no hold, a copy
    api.add_pod(pod("f", scheduler="default-scheduler", node_name="n1"))
    _sync(api, loop)
    refuse(api, "ml/f", GUARD)
    step(api, loop, clock)
    assert "ml/f-r1" in api.pods and not loop.plugin_down.holds
    assert api.pods["ml/f-r1"]["spec"]["schedulerName"] == "default-scheduler"


def test_the_scheduler_flag_for_other_schedulers_pods_is_off_by_default():
    import argparse

    from gpufleet.kube import cli
    p = argparse.ArgumentParser()
    cli.add_arguments(p)
    assert p.parse_args([]).recreate_other_schedulers_pods is False
    assert p.parse_args(["--recreate-other-schedulers-pods"]).recreate_other_schedulers_pods is True


def test_a_pod_that_lost_a_race_for_its_gpu_is_recreated_without_a_hold():
    """The agent refused a share gpufleet placed on a GPU kubelet had given kube-scheduler's pod first (1.35, no
    routing): the plugin is fine, so no hold; the bare pod is placed again (the copy), the snapshot holding the other
    pod's GPU by then."""
    from gpufleet.engine.annotations import RACED_REFUSAL
    from gpufleet.kube.plugin_down import raced

    msg = ("Pod was rejected: Allocate failed due to rpc error: code = FailedPrecondition desc = pod ml/a: its "
           "gpufleet.io/assignment names a GPU kubelet has already given to a pod another scheduler placed (GPU 1 "
           f"(GPU-h100-01) to ml/d0): {RACED_REFUSAL}; refusing rather than share it unasked, which is unexpected")
    assert raced({"status": {"phase": "Failed", "reason": "UnexpectedAdmissionError", "message": msg}})
    assert refusal({"status": {"phase": "Failed", "reason": "UnexpectedAdmissionError", "message": msg}}) is None
    assert raced({"status": {"phase": "Failed", "reason": "UnexpectedAdmissionError", "message": UNHEALTHY}}) is None
    api, clock, loop = placed_a()
    refuse(api, "ml/a", msg)
    api.add_pod(pod("b"))
    step(api, loop, clock)
    assert not loop.plugin_down.holds and dict(api.binds)["ml/b"] == "n1"
    moved = json.loads(api.pods["ml/a-r1"]["metadata"]["annotations"]["gpufleet.io/moved-from"])
    assert moved["pod"] == "ml/a" and RACED_REFUSAL in moved["reason"]
    step(api, loop, clock)
    assert dict(api.binds)["ml/a-r1"] == "n1"


def test_copies_refused_again_are_numbered_and_stop_after_the_limit():
    api, clock = FakeApi(), Clock()
    api.add_node(node("n1", gpus=2, inventory=True))
    api.add_pod(pod("a"))
    loop = make(api, clock)
    name = "a"
    for gen in range(1, MAX_GENERATIONS + 2):
        loop.plugin_down.holds.clear()  # each copy is placed and refused again
        loop.cache.refresh_node("n1")
        step(api, loop, clock)
        assert dict(api.binds).get(f"ml/{name}") == "n1", (name, api.binds)
        refuse(api, f"ml/{name}", UNHEALTHY)
        step(api, loop, clock)
        if gen <= MAX_GENERATIONS:
            assert f"ml/a-r{gen}" in api.pods
            name = f"a-r{gen}"
    assert f"ml/a-r{MAX_GENERATIONS + 1}" not in api.pods
    assert [e["reason"] for e in api.events if e["pod"] == f"ml/a-r{MAX_GENERATIONS}"][-1] == "NotRecreated"


def test_an_agent_without_the_annotation_is_released_by_allocatable_or_by_time():
    api, clock = FakeApi(), Clock()
    api.add_node(node("n1", gpus=2, inventory=True))
    api.add_node(node("n2", gpus=2, inventory=True))
    api.add_pod(pod("a", node_name="n1", annotations={"gpufleet.io/assignment": "{}"}))
    api.add_pod(pod("c", node_name="n2", annotations={"gpufleet.io/assignment": "{}"}))
    loop = make(api, clock)
    refuse(api, "ml/a", UNHEALTHY)
    refuse(api, "ml/c", UNHEALTHY)
    step(api, loop, clock)
    assert loop.plugin_down.held("n1") and loop.plugin_down.held("n2")
    n = api.nodes["n1"]
    n["status"]["allocatable"]["nvidia.com/gpu"] = "0"  # kubelet's next status: no device
    api.update_node(n)
    step(api, loop, clock)
    assert loop.plugin_down.held("n1")
    n["status"]["allocatable"]["nvidia.com/gpu"] = "20"  # the plugin registered: kubelet's devices back
    api.update_node(n)
    step(api, loop, clock)
    assert not loop.plugin_down.held("n1") and loop.plugin_down.held("n2")
    clock.t += loop.plugin_down.hold_max_s
    step(api, loop, clock)
    assert not loop.plugin_down.holds


def test_replacement_keeps_the_owners_fields_and_drops_the_servers():
    p = pod("a", annotations={"gpufleet.io/assignment": "{}", "team": "x"})
    p["metadata"].update({"resourceVersion": "9", "creationTimestamp": "t", "labels": {"app": "a"}, "managedFields": []})
    p["spec"].update({"nodeName": "n1", "priorityClassName": "hi", "priority": 5})
    r = replacement(p, "a-r1", {"pod": "ml/a"})
    assert r["metadata"]["name"] == "a-r1" and r["metadata"]["labels"] == {"app": "a"}
    assert set(r["metadata"]["annotations"]) == {"team", "gpufleet.io/moved-from"}
    assert not {"uid", "resourceVersion", "creationTimestamp", "managedFields"} & set(r["metadata"])
    assert "nodeName" not in r["spec"] and r["spec"]["priorityClassName"] == "hi" and "status" not in r


def test_explain_names_the_hold_read_back_from_the_api():
    """``gpufleet explain`` sees no refusal itself: it reads the hold back from the Failed pods and the agent's
    annotation, by the scheduler's rule, and names it (the node's reason, and a line saying why and until when)."""
    import time as _time

    from gpufleet.kube import explain_cli
    from gpufleet.policies import build_profile

    now = _time.time()
    api = FakeApi()
    api.add_node(node("n1", gpus=2, inventory=True))
    api.add_node(node("n2", gpus=2, inventory=True))
    api.nodes["n2"]["spec"]["taints"] = [{"key": "x", "value": "y", "effect": "NoSchedule"}]
    for name, n in (("a", "n1"), ("old", "n2")):
        api.add_pod(pod(name, node_name=n, annotations={"gpufleet.io/assignment": "{}"}))
    refuse(api, "ml/a", EOF_MSG, start=iso_now(now - 5))
    refuse(api, "ml/old", EOF_MSG, start=iso_now(now - 400))  # older than the hold's 300 s: no hold
    api.add_pod(pod("b"))
    api.add_pod(pod("cpu", gpus=0))
    prof = build_profile("bestfit")
    code, text = explain_cli.explain(api, prof, "ml/b")
    assert code == 0, text
    lines = text.splitlines()
    assert lines[0].startswith("ml/b: 0/2 nodes are available") and "GPU device plugin down" in lines[0], text
    held = [ln for ln in lines if ln.startswith("  held: ")]
    assert len(held) == 1 and held[0].startswith("  held: n1: GPU device plugin down since ") and "ml/a" in held[0]
    assert "EOF" in held[0] and "last registered: never" in held[0] and "at the latest until " in held[0]
    n1 = next(ln for ln in lines if ln.strip().startswith("n1 "))
    assert "GPU device plugin down" in n1, text
    # a pod without GPUs is not held, and is not told of it
    code, text = explain_cli.explain(api, prof, "ml/cpu")
    assert "held:" not in text and "fits" in text, text
    # the agent registered after the refusal: the hold is over, the pod fits there
    announce(api, "n1", iso_now(now - 1))
    code, text = explain_cli.explain(api, prof, "ml/b")
    assert code == 0 and "held:" not in text and "fits: best node n1" in text, text
