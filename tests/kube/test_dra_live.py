"""The live scheduler allocates ResourceClaims itself (kube/dra), against the in-process fake API server.

The node publishes the agent's own slices (``gpufleet agent --dra``'s devices for a fake A100 node: GPUs 0-1 in
MIG mode, 2-7 whole with consumable capacity), the DeviceClasses are the shipped ones.
"""

from __future__ import annotations

import json

import pytest

from gpufleet.kube.api import Conflict

from .dra_fixtures import (
    DRIVER,
    add_dra_node,
    allocation,
    claim,
    claim_controller,
    claim_of,
    devices,
    devices_of,
    dra_api,
    make_loop,
    pod,
    request,
    run,
    sync,
    template,
)

WHOLE = [f"gpu-{i}" for i in range(2, 8)]


def test_a_dra_nodes_gpus_are_its_slices():
    api = dra_api(1)
    loop = make_loop(api)
    gpus = loop.cache.state.nodes[0].gpus
    assert len(gpus) == 8 and [g.mig_enabled for g in gpus] == [True, True] + [False] * 6
    assert gpus[2].model == "NVIDIA A100-SXM4-80GB" and gpus[2].memory_mib == 81920 and gpus[2].uuid.endswith("-d0")
    assert sorted({m.profile for m in gpus[0].mig_instances}) and all(m.memory_mib > 0 for m in gpus[0].mig_instances)


def test_allocation_reservation_and_finalizer_are_written_before_the_binding():
    api = dra_api(1)
    api.put_object("resourceclaim", claim("c1"))
    api.add_pod(pod("p1", claims={"gpu": "c1"}))
    order = []
    real_patch, real_bind = api.patch_object, api.bind
    api.patch_object = lambda *a, **k: (order.append(("patch", a[0], a[4] if len(a) > 4 else k.get("subresource", ""))), real_patch(*a, **k))[1]
    api.bind = lambda *a, **k: (order.append(("bind",)), real_bind(*a, **k))[1]
    loop = make_loop(api)
    run(api, loop)
    assert order == [("patch", "resourceclaim", ""), ("patch", "resourceclaim", "status"), ("bind",)]
    c = api.objects["resourceclaim"]["ml/c1"]
    assert c["metadata"]["finalizers"] == ["resource.kubernetes.io/delete-protection"]
    a = c["status"]["allocation"]
    (r,) = a["devices"]["results"]
    assert (r["request"], r["driver"], r["pool"]) == ("gpu", DRIVER, "d0") and r["device"] in WHOLE
    assert r["shareID"] and r["consumedCapacity"]["gpu.gpufleet.io/memory"] == "80Gi"  # a whole GPU: all its memory
    assert a["nodeSelector"] == {"nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["d0"]}]}]}
    assert a["allocationTimestamp"]
    assert c["status"]["reservedFor"] == [{"resource": "pods", "name": "p1", "uid": "uid-p1"}]
    assert api.binds == [("ml/p1", "d0")]
    assert json.loads(api.pods["ml/p1"]["metadata"]["annotations"]["gpufleet.io/assignment"])["gpus"] == []  # the claim holds it
    assert loop.cache.state.claim_holds["ml/c1"].gpus[0][1:] == (1000, 81920)


def test_claims_from_templates_wait_for_the_controller_then_never_share_a_device():
    api = dra_api(1)
    api.put_object("resourceclaimtemplate", template("one-gpu"))
    for i in range(7):
        api.add_pod(pod(f"p{i}", templates={"gpu": "one-gpu"}))
    loop = make_loop(api)
    run(api, loop, rounds=1)
    assert not api.binds
    msg = [e["message"] for e in api.events if e["pod"] == "ml/p0"][-1]
    assert "waiting for the ResourceClaim of spec.resourceClaims[0] ('gpu') from template one-gpu" in msg
    assert claim_controller(api) == 7
    run(api, loop)
    bound = sorted(k for k, _ in api.binds)
    assert len(bound) == 6  # six whole GPUs; the seventh pod waits
    used = [d for k in bound for d in devices_of(api, claim_of(api, k))]
    assert sorted(used) == WHOLE
    waiting = next(f"ml/p{i}" for i in range(7) if f"ml/p{i}" not in bound)
    assert allocation(api, claim_of(api, waiting)) is None
    assert "fewer than 1 free device(s) of class gpu.gpufleet.io" in [e["message"] for e in api.events if e["pod"] == waiting][-1]


def test_one_claim_shared_by_two_pods_is_allocated_once_and_reserved_for_both():
    api = dra_api(2)
    api.put_object("resourceclaim", claim("shared"))
    api.add_pod(pod("a", claims={"gpu": "shared"}))
    api.add_pod(pod("b", claims={"gpu": "shared"}))
    loop = make_loop(api)
    run(api, loop)
    assert {n for _, n in api.binds} == {api.binds[0][1]} and len(api.binds) == 2  # both on the claim's node
    c = api.objects["resourceclaim"]["ml/shared"]
    assert sorted(r["name"] for r in c["status"]["reservedFor"]) == ["a", "b"]
    assert len(c["status"]["allocation"]["devices"]["results"]) == 1
    assert c["metadata"]["finalizers"] == ["resource.kubernetes.io/delete-protection"]


def test_two_gpus_under_match_attribute_share_a_pcie_root():
    api = dra_api(1)
    api.put_object("resourceclaim", claim("pair", request("gpus", count=2),
                                          constraints=[{"requests": ["gpus"], "matchAttribute": "resource.kubernetes.io/pcieRoot"}]))
    # gpu-2 and gpu-5 taken by another scheduler: a pair on one root needs two of 3,4 or two of 6,7
    other = claim("other", request("gpus", count=2))
    api.put_object("resourceclaim", other)
    api.patch_object("resourceclaim", "ml", "other", {"status": {"allocation": {"devices": {"results": [
        {"request": "gpus", "driver": DRIVER, "pool": "d0", "device": d} for d in ("gpu-2", "gpu-5")]}}}}, "status")
    api.add_pod(pod("p", claims={"gpus": "pair"}))
    loop = make_loop(api)
    run(api, loop)
    got = devices_of(api, "ml/pair")
    assert len(got) == 2 and (set(got) <= {"gpu-3", "gpu-4"} or set(got) <= {"gpu-6", "gpu-7"})


def test_two_20gib_shares_go_on_one_gpu_by_consumable_capacity():
    api = dra_api(1)
    share = request(cls="gpu-share.gpufleet.io", capacity={"memory": "20Gi", "gpuMilli": "300"})
    api.put_object("resourceclaimtemplate", template("share", share))
    for n in ("s1", "s2"):
        api.add_pod(pod(n, templates={"gpu": "share"}))
    loop = make_loop(api)
    claim_controller(api)
    run(api, loop)
    r1, r2 = (allocation(api, claim_of(api, f"ml/{n}"))["devices"]["results"][0] for n in ("s1", "s2"))
    assert r1["device"] == r2["device"] and r1["shareID"] != r2["shareID"]
    assert r1["consumedCapacity"]["gpu.gpufleet.io/memory"] == "20Gi" and r1["consumedCapacity"]["gpu.gpufleet.io/gpuMilli"] == "300"
    i = int(r1["device"].split("-")[1])
    st = loop.cache.state
    assert int(st.gpu_free_milli[0, i]) == 400 and int(st.gpu_mem_free[0, i]) == 81920 - 2 * 20480


def test_a_mig_slice():
    api = dra_api(1)
    mig = request("mig", cls="mig.gpufleet.io", selectors=["device.attributes['gpu.gpufleet.io'].profile == '1g.10gb'"])
    api.put_object("resourceclaim", claim("m", mig))
    api.add_pod(pod("p", claims={"mig": "m"}))
    loop = make_loop(api)
    r = loop.cache.request("ml/p", api.pods["ml/p"])
    assert (r.gpu_count, r.mig_profile) == (1, "1g.10gb")  # what the claim asks, for the policies
    run(api, loop)
    (d,) = devices_of(api, "ml/m")
    assert "-mig-1g10gb-" in d
    assert sum(len(v) for v in loop.cache.state.mig_free[0].values()) == sum(len(g.mig_instances) for g in loop.cache.state.nodes[0].gpus) - 1


def test_every_claim_any_scheduler_allocated_is_counted_and_a_restart_rebuilds_from_claims_alone():
    api = dra_api(1)
    # kube-scheduler allocated gpu-2..gpu-4 to its pods' claims
    for i, d in enumerate(("gpu-2", "gpu-3", "gpu-4")):
        api.put_object("resourceclaim", claim(f"ks{i}"))
        api.patch_object("resourceclaim", "ml", f"ks{i}", {"status": {"allocation": {"devices": {"results": [
            {"request": "gpu", "driver": DRIVER, "pool": "d0", "device": d}]}}}}, "status")
    api.put_object("resourceclaimtemplate", template("one-gpu"))
    for i in range(4):
        api.add_pod(pod(f"p{i}", templates={"gpu": "one-gpu"}))
    loop = make_loop(api)
    claim_controller(api)
    run(api, loop)
    ours = sorted(d for i in range(4) for d in devices_of(api, claim_of(api, f"ml/p{i}")) if f"ml/p{i}" in dict(api.binds))
    assert sorted(ours) == ["gpu-5", "gpu-6", "gpu-7"] and len(api.binds) == 3
    free_before = loop.cache.state.gpu_free_milli.copy()
    fresh = make_loop(api)  # a restarted scheduler: everything from the API
    assert (fresh.cache.state.gpu_free_milli == free_before).all() and set(fresh.cache.state.claim_holds) == set(loop.cache.state.claim_holds)
    run(api, fresh)
    assert len(api.binds) == 3  # still no device for the fourth


def test_deallocation_frees_the_device_for_a_waiting_pod():
    api = dra_api(1)
    api.put_object("resourceclaimtemplate", template("one-gpu"))
    for i in range(7):
        api.add_pod(pod(f"p{i}", templates={"gpu": "one-gpu"}))
    loop = make_loop(api)
    claim_controller(api)
    run(api, loop)
    assert len(api.binds) == 6
    done = api.binds[0][0]
    key = claim_of(api, done)
    # the pod finishes; the resourceclaim controller deallocates its claim (clears allocation and reservedFor, the finalizer)
    api.delete_pod(done)
    api.patch_object("resourceclaim", *key.split("/"), {"status": {"allocation": None, "reservedFor": None}}, "status")
    api.patch_object("resourceclaim", *key.split("/"), {"metadata": {"finalizers": None}})
    run(api, loop)
    assert len(api.binds) == 7 and key not in loop.cache.state.claim_holds


def test_a_claim_allocated_elsewhere_meanwhile_fails_the_bind_and_nothing_is_double_booked():
    api = dra_api(1)
    api.put_object("resourceclaim", claim("c"))
    api.add_pod(pod("p", claims={"gpu": "c"}))
    loop = make_loop(api)
    real = api.patch_object
    raced = []

    def patch(kind, ns, name, body, subresource=""):
        if kind == "resourceclaim" and subresource == "status" and not raced:
            raced.append(1)  # kube-scheduler got there first, with gpu-7
            real(kind, ns, name, {"status": {"allocation": {"devices": {"results": [
                {"request": "gpu", "driver": DRIVER, "pool": "d0", "device": "gpu-7"}]}}}}, "status")
            raise Conflict("the object has been modified")
        return real(kind, ns, name, body, subresource)
    api.patch_object = patch
    loop.schedule_due()
    assert not api.binds and "got allocated elsewhere in the meantime" in api.events[-1]["message"]
    sync(api, loop)
    assert [r.device for r in loop.cache.state.claim_holds["ml/c"].allocation.results] == ["gpu-7"]
    assert int(loop.cache.state.gpu_free_milli[0].sum()) == 5 * 1000  # only the other allocator's hold


def test_a_bind_that_fails_after_the_claim_was_written_takes_the_reservation_back():
    api = dra_api(1)
    api.put_object("resourceclaim", claim("c"))
    api.add_pod(pod("p", claims={"gpu": "c"}))
    api.fail_binds = 1
    loop = make_loop(api)
    loop.schedule_due()
    c = api.objects["resourceclaim"]["ml/c"]
    assert c["status"].get("reservedFor") is None and c["status"]["allocation"]  # unreserved, still allocated
    run(api, loop)
    assert api.binds == [("ml/p", "d0")] and len(api.objects["resourceclaim"]["ml/c"]["status"]["reservedFor"]) == 1


def test_a_pod_that_cannot_run_where_its_claim_was_allocated_gets_it_deallocated():
    api = dra_api(1)
    add_dra_node(api, "d1")
    api.put_object("resourceclaim", claim("c"))
    api.patch_object("resourceclaim", "ml", "c", {"metadata": {"finalizers": ["resource.kubernetes.io/delete-protection"]},
                                                  "status": {"allocation": {"devices": {"results": [
                                                      {"request": "gpu", "driver": DRIVER, "pool": "d0", "device": "gpu-2"}]},
                                                      "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
                                                          {"key": "metadata.name", "operator": "In", "values": ["d0"]}]}]}}}})
    api.patch_object("resourceclaim", "ml", "c", {"status": {"allocation": {"devices": {"results": [
        {"request": "gpu", "driver": DRIVER, "pool": "d0", "device": "gpu-2"}]}, "nodeSelector": {"nodeSelectorTerms": [
            {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["d0"]}]}]}}}}, "status")
    api.add_pod(pod("p", claims={"gpu": "c"}, cpu="100"))  # d0 has 64 CPUs
    api.nodes["d1"]["status"]["allocatable"]["cpu"] = "128"
    api.update_node(api.nodes["d1"])
    loop = make_loop(api)
    run(api, loop)
    assert api.binds == [("ml/p", "d1")] and devices_of(api, "ml/c")[0] in WHOLE
    assert allocation(api, "ml/c")["nodeSelector"]["nodeSelectorTerms"][0]["matchFields"][0]["values"] == ["d1"]


@pytest.mark.parametrize("bad,reason", [
    (request(cls="nope"), "claim ml/c, request gpu: device class nope does not exist"),
    (request(selectors=["device.attributes['gpu.gpufleet.io'].productName =="]), "selector #0: CEL compile error"),
    (request(selectors=["device.attributes['gpu.gpufleet.io'].nosuch == 'x'"]), "CEL runtime error"),
])
def test_bad_claims_get_an_event_naming_claim_and_request_and_everyone_else_is_served(bad, reason):
    api = dra_api(1)
    api.put_object("resourceclaim", claim("c", bad))
    api.put_object("resourceclaim", claim("good"))
    api.add_pod(pod("bad", claims={"gpu": "c"}))
    api.add_pod(pod("fine", claims={"gpu": "good"}))
    loop = make_loop(api)
    run(api, loop)
    assert api.binds == [("ml/fine", "d0")]
    msg = [e["message"] for e in api.events if e["pod"] == "ml/bad"][-1]
    assert reason in msg and allocation(api, "ml/c") is None


def test_a_malformed_slice_attribute_is_reported_on_the_slice_and_the_rest_serves():
    api = dra_api(0)
    devs = devices("d0")
    bad = next(d for d in devs if d["name"] == "gpu-2")
    bad["attributes"]["driverVersion"] = {"version": "not-semver"}
    add_dra_node(api, "d0", devs=devs)
    api.put_object("resourceclaimtemplate", template("one-gpu"))
    for i in range(6):
        api.add_pod(pod(f"p{i}", templates={"gpu": "one-gpu"}))
    loop = make_loop(api)
    claim_controller(api)
    run(api, loop)
    (ev,) = [e for e in api.object_events if e["reason"] == "InvalidDevice"]
    assert ev["kind"] == "ResourceSlice" and "spec.devices[" in ev["message"] and "driverVersion" in ev["message"]
    used = sorted(d for k, _ in api.binds for d in devices_of(api, claim_of(api, k)))
    assert used == ["gpu-3", "gpu-4", "gpu-5", "gpu-6", "gpu-7"]


def test_a_claim_allocated_to_a_device_that_no_longer_exists_gets_an_event():
    api = dra_api(1)
    api.put_object("resourceclaim", claim("ghost"))
    api.patch_object("resourceclaim", "ml", "ghost", {"status": {"allocation": {"devices": {"results": [
        {"request": "gpu", "driver": DRIVER, "pool": "d0", "device": "gpu-42"}]}}}}, "status")
    api.put_object("resourceclaim", claim("c"))
    api.add_pod(pod("p", claims={"gpu": "c"}))
    loop = make_loop(api)
    run(api, loop)
    (ev,) = [e for e in api.object_events if e["reason"] == "AllocatedDeviceMissing"]
    assert ev["name"] == "ml/ghost" and "status.allocation.devices.results[0].device: device gpu-42 of pool d0" in ev["message"]
    assert api.binds == [("ml/p", "d0")]


def test_a_missing_device_class_that_appears_later_lets_the_pod_run():
    api = dra_api(1)
    api.put_object("resourceclaim", claim("c", request(cls="late.gpufleet.io")))
    api.add_pod(pod("p", claims={"gpu": "c"}))
    loop = make_loop(api)
    run(api, loop, rounds=1)
    assert not api.binds
    api.put_object("deviceclass", {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": "late.gpufleet.io"},
                                   "spec": {"selectors": [{"cel": {"expression": "device.driver == 'gpu.gpufleet.io'"}}]}})
    run(api, loop)
    assert api.binds == [("ml/p", "d0")]


# --- extended resources backed by DRA (nvidia.com/gpu on a DRA node) ----------------------------------------------

def gpu_pod(name: str, n: int = 1, **kw) -> dict:
    p = pod(name, limits={"nvidia.com/gpu": str(n)}, **kw)
    p["spec"]["containers"][0]["resources"]["requests"]["nvidia.com/gpu"] = str(n)
    return p


def test_nvidia_gpu_on_a_dra_node_gets_a_claim_and_the_pod_status_kube_scheduler_writes():
    api = dra_api(1)
    api.add_pod(gpu_pod("x"))
    loop = make_loop(api)
    run(api, loop)
    assert api.binds == [("ml/x", "d0")]
    st = api.pods["ml/x"]["status"]["extendedResourceClaimStatus"]
    assert st["requestMappings"] == [{"containerName": "c", "resourceName": "nvidia.com/gpu", "requestName": "container-0-request-2"}]
    c = api.objects["resourceclaim"][f"ml/{st['resourceClaimName']}"]
    m = c["metadata"]
    assert m["annotations"]["resource.kubernetes.io/extended-resource-claim"] == "true"
    assert m["ownerReferences"][0]["uid"] == "uid-x" and m["ownerReferences"][0]["controller"] is True
    assert m["finalizers"] == ["resource.kubernetes.io/delete-protection"]
    assert c["spec"]["devices"]["requests"] == [{"name": "container-0-request-2", "exactly": {
        "deviceClassName": "gpu-extended.gpufleet.io", "allocationMode": "ExactCount", "count": 1}}]
    (r,) = c["status"]["allocation"]["devices"]["results"]
    assert r["request"] == "container-0-request-2" and r["device"] in WHOLE
    assert c["status"]["reservedFor"] == [{"resource": "pods", "name": "x", "uid": "uid-x"}]
    # restarted: the pod's claim holds the GPU once (no device-plugin GPU modelled for it as well)
    fresh = make_loop(api)
    assert int(fresh.cache.state.gpu_free_milli[0].sum()) == 5 * 1000 and not fresh.cache.state.assignments["ml/x"].gpu_indices


def test_nvidia_gpu_goes_to_the_device_plugin_where_one_serves_it_and_to_dra_elsewhere():
    from .test_loop import node as dp_node

    api = dra_api(1)
    api.add_node(dp_node("plugin", gpus=1, inventory=True))
    for i in range(3):
        api.add_pod(gpu_pod(f"g{i}"))
    loop = make_loop(api, policy="bestfit")
    run(api, loop)
    where = dict(api.binds)
    assert len(where) == 3 and list(where.values()).count("plugin") == 1
    for k, n in where.items():
        st = api.pods[k]["status"].get("extendedResourceClaimStatus")
        gpus = json.loads(api.pods[k]["metadata"]["annotations"]["gpufleet.io/assignment"])["gpus"]
        if n == "plugin":
            assert st is None and len(gpus) == 1  # the device plugin's GPU, as before
        else:
            assert st and not gpus and devices_of(api, f"ml/{st['resourceClaimName']}")[0] in WHOLE


def test_an_extended_claim_left_by_an_attempt_that_did_not_bind_is_deleted_then_the_pod_runs():
    api = dra_api(1)
    api.add_pod(gpu_pod("x"))
    api.fail_binds = 1
    loop = make_loop(api)
    loop.schedule_due()
    assert not api.binds and not [k for k in api.objects["resourceclaim"]]  # the claim made for the failed try is gone
    # a claim an earlier scheduler made for the pod and never cleaned up
    from gpufleet.kube.dra.extended import claim_name

    api.create_object("resourceclaim", "ml", {"metadata": {"name": "x-old", "annotations": {
        "resource.kubernetes.io/extended-resource-claim": "true"}, "ownerReferences": [
        {"apiVersion": "v1", "kind": "Pod", "name": "x", "uid": "uid-x", "controller": True}]},
        "spec": {"devices": {"requests": [request("container-0-request-2", cls="gpu-extended.gpufleet.io")]}}})
    run(api, loop)
    assert "ml/x-old" not in api.objects["resourceclaim"] and api.binds == [("ml/x", "d0")]
    assert api.pods["ml/x"]["status"]["extendedResourceClaimStatus"]["resourceClaimName"] == claim_name("x", "uid-x")


def test_extended_requests_per_container_as_kube_scheduler_builds_them():
    from gpufleet.engine.dra.objects import parse_device_class
    from gpufleet.kube.dra.extended import requests_and_mappings

    cls = parse_device_class({"metadata": {"name": "g"}, "spec": {"extendedResourceName": "nvidia.com/gpu"}})
    p = {"spec": {"initContainers": [
        {"name": "init-a", "resources": {"requests": {"nvidia.com/gpu": "1"}}},
        {"name": "init-b", "resources": {"requests": {"nvidia.com/gpu": "3", "cpu": "1"}}},
        {"name": "sidecar", "restartPolicy": "Always", "resources": {"requests": {"nvidia.com/gpu": "1"}}}],
        "containers": [{"name": "main", "resources": {"requests": {"cpu": "1", "nvidia.com/gpu": "2"}}}]}}
    reqs, maps, amounts = requests_and_mappings(p, {"nvidia.com/gpu": cls})
    # the sidecar and main get their own requests; init-a reuses the sidecar's device, init-b the sidecar's and main's
    assert [(r["name"], r["exactly"]["count"]) for r in reqs] == [("container-2-request-0", 1), ("container-3-request-1", 2)]
    assert ("init-a", "nvidia.com/gpu", "container-2-request-0") in maps and ("main", "nvidia.com/gpu", "container-3-request-1") in maps
    assert ("init-b", "nvidia.com/gpu", "container-3-request-1") in maps and amounts == [("nvidia.com/gpu", 3)]


def test_an_older_watch_event_of_a_claim_we_wrote_never_frees_its_device():
    """The finalizer's update reaches the watch before the allocation's: applied alone, between two cycles, it must not
    free the device (what our write returned is known; older events are ignored)."""
    api = dra_api(0)
    add_dra_node(api, "d0", devs=[d for d in devices("d0") if d["name"] == "gpu-2"])
    api.put_object("resourceclaim", claim("c1"))
    api.put_object("resourceclaim", claim("c2"))
    api.add_pod(pod("p1", claims={"gpu": "c1"}))
    loop = make_loop(api)
    loop.schedule_due()  # p1: finalizer, allocation and reservation written, bound (inline)
    assert api.binds == [("ml/p1", "d0")]
    api.add_pod(pod("p2", claims={"gpu": "c2"}))
    for kind in loop.cache.watch_kinds:  # every event on its own, a scheduling cycle after each
        for t, obj in api.watch(kind, loop.cache.rv[kind]):
            loop.handle(kind, t, obj)
            loop.clock.t += 61
            loop.schedule_due()
    assert api.binds == [("ml/p1", "d0")] and allocation(api, "ml/c2") is None
