"""Gangs, team queues, preemption and explain with pods that ask by ResourceClaim (the live loop, fake API)."""

from __future__ import annotations

from .dra_fixtures import (
    allocation,
    claim,
    claim_controller,
    claim_of,
    dra_api,
    make_loop,
    pod,
    request,
    run,
    template,
)


def queue(name: str, gpus: int) -> dict:
    return {"apiVersion": "gpufleet.io/v1alpha1", "kind": "Queue", "metadata": {"name": name},
            "spec": {"quota": {"nvidia.com/gpu": str(gpus)}}}


def controller_deallocates(api, pod_key: str) -> None:
    """The pod is gone; kube-controller-manager's resourceclaim controller deallocates its claims."""
    p = api.pods.get(pod_key)
    keys = [claim_of(api, pod_key)] if p is not None else []
    if p is not None:
        api.delete_pod(pod_key)
    for k in keys:
        ns, name = k.split("/")
        api.patch_object("resourceclaim", ns, name, {"status": {"allocation": None, "reservedFor": None}}, "status")
        api.patch_object("resourceclaim", ns, name, {"metadata": {"finalizers": None}})


def test_a_team_queue_counts_the_devices_claims_hold_also_after_a_restart():
    api = dra_api(1)
    api.put_object("queue", queue("qa", 2))
    api.put_object("namespace", {"metadata": {"name": "ml", "labels": {"gpufleet.io/queue": "qa"}}})
    api.put_object("resourceclaimtemplate", template("one-gpu"))
    for i in range(3):
        api.add_pod(pod(f"p{i}", templates={"gpu": "one-gpu"}))
    loop = make_loop(api)
    claim_controller(api)
    run(api, loop)
    assert len(api.binds) == 2  # quota 2 GPUs; six are free
    waiting = next(k for k in api.pods if k not in dict(api.binds))
    assert "queue qa" in [e["message"] for e in api.events if e["pod"] == waiting][-1]
    assert loop.cache.tree.used("qa", "gpu_milli") == 2000
    fresh = make_loop(api)  # from the claims alone
    assert fresh.cache.tree.used("qa", "gpu_milli") == 2000 and fresh.cache.tree.used("qa", "gpu_memory_mib") == 2 * 81920
    run(api, fresh)
    assert len(api.binds) == 2


def test_a_gang_of_dra_pods_is_placed_whole_or_not_at_all():
    api = dra_api(1)
    api.put_object("resourceclaimtemplate", template("two", request(count=2)))
    g = {"gpufleet.io/pod-group": "train", "gpufleet.io/pod-group-min-member": "3"}
    for i in range(3):
        api.add_pod(pod(f"t{i}", templates={"gpu": "two"}, annotations=g))
    big = {"gpufleet.io/pod-group": "big", "gpufleet.io/pod-group-min-member": "2"}
    for i in range(2):
        api.add_pod(pod(f"b{i}", templates={"gpu": "two"}, annotations=big))
    loop = make_loop(api)
    claim_controller(api)
    run(api, loop)
    bound = {k for k, _ in api.binds}
    # six whole GPUs: one gang of three 2-GPU pods fits, the other gang gets nothing (no claim allocated)
    gangs = [{"ml/t0", "ml/t1", "ml/t2"}, {"ml/b0", "ml/b1"}]
    assert bound in gangs
    other = gangs[1] if bound == gangs[0] else gangs[0]
    assert all(allocation(api, claim_of(api, k)) is None for k in other)
    assert all(k.split("/")[0] == "ml" for k in loop.cache.state.claim_holds) and len(loop.cache.state.claim_holds) == len(bound)


def test_preemption_evicts_a_lower_priority_dra_pod_and_the_preemptor_gets_its_device():
    api = dra_api(1)
    api.put_object("resourceclaimtemplate", template("one-gpu"))
    for i in range(6):
        api.add_pod(pod(f"low{i}", templates={"gpu": "one-gpu"}))
    loop = make_loop(api)
    claim_controller(api)
    run(api, loop)
    assert len(api.binds) == 6
    api.add_pod(pod("urgent", templates={"gpu": "one-gpu"}, priority=100))
    claim_controller(api)
    run(api, loop, rounds=2)
    (victim, _), = api.evicted
    assert victim.startswith("ml/low") and "ml/urgent" not in dict(api.binds)
    # the victim is gone but its claim is not deallocated yet: the pod waits for it, and nobody else is evicted
    run(api, loop, rounds=3)
    assert len(api.evicted) == 1 and "ml/urgent" not in dict(api.binds)
    assert "waiting for ResourceClaim(s) ml/" + victim.split("/")[1] in [e["message"] for e in api.events if e["pod"] == "ml/urgent"][-1]
    # the victim's claim is deallocated by the controller once it is gone
    key = next(k for k in api.objects["resourceclaim"] if k.startswith(victim + "-"))
    ns, name = key.split("/")
    dev = allocation(api, key)["devices"]["results"][0]["device"]
    api.patch_object("resourceclaim", ns, name, {"status": {"allocation": None, "reservedFor": None}}, "status")
    run(api, loop)
    assert ("ml/urgent", "d0") in api.binds
    assert allocation(api, claim_of(api, "ml/urgent"))["devices"]["results"][0]["device"] == dev


def test_explain_names_the_claim_the_request_and_the_constraint():
    api = dra_api(1)
    api.put_object("resourceclaim", claim("h100", request(selectors=["device.attributes['gpu.gpufleet.io'].productName.contains('H100')"])))
    api.put_object("resourceclaim", claim("four", request("gpus", count=4),
                                          constraints=[{"requests": ["gpus"], "matchAttribute": "resource.kubernetes.io/pcieRoot"}]))
    api.add_pod(pod("a", claims={"gpu": "h100"}))
    api.add_pod(pod("b", claims={"gpus": "four"}))
    loop = make_loop(api)
    summary, by_node = loop.explain(api.pods["ml/a"])
    assert "claim ml/h100, request gpu: no device of class gpu.gpufleet.io matches its selectors" in summary
    summary, by_node = loop.explain(api.pods["ml/b"])
    assert "claim ml/four, request gpus" in by_node["d0"] and "resource.kubernetes.io/pcieRoot constraint" in by_node["d0"]
