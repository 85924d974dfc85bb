"""The structured allocator against kube-scheduler's semantics, one feature at a time."""

from __future__ import annotations

from fractions import Fraction

import pytest

from gpufleet.engine.dra.allocator import AllocatedState, AllocationError, Allocator, Inventory, NoAllocation
from gpufleet.engine.dra.objects import parse_claim, parse_device_class, parse_slice

from .builders import claim, device_class, gpu_device, mig_device, request, slice_

GIB = 2**30


def make(slices, classes=None, allocated=None, **kw):
    inv = Inventory([parse_slice(s) for s in slices])
    cls = {c.name: c for c in (parse_device_class(x) for x in (classes or [device_class()]))}
    return Allocator(inv, cls, allocated or AllocatedState(), share_id=iter(f"share-{i}" for i in range(1000)).__next__, **kw)


def alloc(a, claims, node="n1", labels=None):
    return a.allocate(node, labels or {}, [parse_claim(c) for c in claims])


def devices(allocation):
    return [r.device for r in allocation.results]


def test_one_gpu_is_pinned_to_the_node():
    a = make([slice_(gpus=2)])
    [got] = alloc(a, [claim()])
    assert devices(got) == ["gpu-0"]
    assert got.results[0].request == "gpu" and got.results[0].driver == "gpu.nvidia.com" and got.results[0].pool == "n1"
    assert got.node_name == "n1"
    assert got.node_selector == {"nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]}]}


def test_devices_in_use_are_skipped_and_a_full_node_fails_with_a_reason():
    st = AllocatedState(exclusive={("gpu.nvidia.com", "n1", "gpu-0")})
    a = make([slice_(gpus=2)], allocated=st)
    assert devices(alloc(a, [claim()])[0]) == ["gpu-1"]
    with pytest.raises(NoAllocation, match=r"request gpu: needs 2, 2 match class gpu.nvidia.com, 1 of them free"):
        alloc(a, [claim(requests=[request(count=2)])])


def test_two_claims_of_one_pod_never_share_a_device():
    a = make([slice_(gpus=2)])
    got = alloc(a, [claim("a"), claim("b")])
    assert [devices(x) for x in got] == [["gpu-0"], ["gpu-1"]]
    with pytest.raises(NoAllocation):
        alloc(a, [claim("a"), claim("b"), claim("c")])


def test_match_attribute_picks_gpus_under_one_pcie_root():
    # gpu-0..3 under root 00, gpu-4..7 under 01; 0..2 taken: a pair must come from 4..7
    st = AllocatedState(exclusive={("gpu.nvidia.com", "n1", f"gpu-{i}") for i in range(3)})
    a = make([slice_(gpus=8)], allocated=st)
    c = claim(requests=[request(count=2)], constraints=[{"matchAttribute": "resource.kubernetes.io/pcieRoot"}])
    assert devices(alloc(a, [c])[0]) == ["gpu-4", "gpu-5"]
    c5 = claim(requests=[request(count=5)], constraints=[{"matchAttribute": "resource.kubernetes.io/pcieRoot"}])
    with pytest.raises(NoAllocation, match="pcieRoot constraint .* cannot be met"):
        alloc(a, [c5])


def test_match_attribute_names_the_driver_domain_or_the_bare_attribute():
    a = make([slice_(gpus=2)])
    c = claim(requests=[request(count=2)], constraints=[{"matchAttribute": "gpu.nvidia.com/productName"}])
    assert len(alloc(a, [c])[0].results) == 2
    c = claim(requests=[request(count=2)], constraints=[{"matchAttribute": "other.example.com/productName"}])
    with pytest.raises(NoAllocation):
        alloc(a, [c])


def test_distinct_attribute():
    a = make([slice_(gpus=8)])
    c = claim(requests=[request(count=2)], constraints=[{"distinctAttribute": "resource.kubernetes.io/pcieRoot"}])
    assert devices(alloc(a, [c])[0]) == ["gpu-0", "gpu-4"]
    c = claim(requests=[request(count=3)], constraints=[{"distinctAttribute": "resource.kubernetes.io/pcieRoot"}])
    with pytest.raises(NoAllocation):
        alloc(a, [c])


def test_constraint_over_two_requests():
    a = make([slice_(gpus=8)])
    c = claim(requests=[request("a"), request("b", count=2)],
              constraints=[{"requests": ["a", "b"], "matchAttribute": "resource.kubernetes.io/pcieRoot"}])
    got = alloc(a, [c])[0]
    assert [(r.request, r.device) for r in got.results] == [("a", "gpu-0"), ("b", "gpu-1"), ("b", "gpu-2")]


def test_all_mode_takes_every_matching_device_and_waits_for_incomplete_pools():
    a = make([slice_(gpus=3)])
    assert devices(alloc(a, [claim(requests=[request(mode="All")])])[0]) == ["gpu-0", "gpu-1", "gpu-2"]
    st = AllocatedState(exclusive={("gpu.nvidia.com", "n1", "gpu-1")})
    with pytest.raises(NoAllocation):
        alloc(make([slice_(gpus=3)], allocated=st), [claim(requests=[request(mode="All")])])
    incomplete = [slice_(gpus=3, count=2)]
    with pytest.raises(NoAllocation, match="being updated"):
        alloc(make(incomplete), [claim(requests=[request(mode="All")])])
    with pytest.raises(NoAllocation):  # nothing is allocated from an incomplete pool at all
        alloc(make(incomplete), [claim()])


def test_newest_generation_only():
    old = slice_(gpus=2, name="old", generation=1)
    new = slice_(devices=[gpu_device(7)], name="new", generation=2)
    assert devices(alloc(make([old, new]), [claim()])[0]) == ["gpu-7"]


def test_first_available_takes_the_first_subrequest_that_fits():
    a = make([slice_(gpus=2, product="NVIDIA A100-SXM4-40GB")])
    big = {"name": "big", "deviceClassName": "gpu.nvidia.com",
           "selectors": [{"cel": {"expression": "device.capacity['gpu.nvidia.com'].memory.compareTo(quantity('80Gi')) >= 0"}}]}
    two = {"name": "two", "deviceClassName": "gpu.nvidia.com", "count": 2}
    got = alloc(a, [claim(requests=[request("gpu", first_available=[big, two])])])[0]
    # every device here has 80Gi by the builder: the first subrequest fits
    assert [r.request for r in got.results] == ["gpu/big"]
    small = make([slice_(devices=[gpu_device(0, memory="40Gi"), gpu_device(1, memory="40Gi")])])
    got = alloc(small, [claim(requests=[request("gpu", first_available=[big, two])])])[0]
    assert [r.request for r in got.results] == ["gpu/two", "gpu/two"]


def test_selectors_of_class_and_request_with_quantity_and_semver():
    devs = [gpu_device(0, memory="40Gi"), gpu_device(1, memory="80Gi", extra={"driverVersion": {"version": "560.1.0"}})]
    a = make([slice_(devices=devs)])
    sel = ["device.capacity['gpu.nvidia.com'].memory.isGreaterThan(quantity('40Gi'))"]
    assert devices(alloc(a, [claim(requests=[request(selectors=sel)])])[0]) == ["gpu-1"]
    sel = ["device.attributes['gpu.nvidia.com'].driverVersion.isLessThan(semver('555.0.0'))"]
    assert devices(alloc(a, [claim(requests=[request(selectors=sel)])])[0]) == ["gpu-0"]


def test_missing_class_and_cel_errors_name_the_object():
    a = make([slice_(gpus=1)])
    with pytest.raises(AllocationError, match="device class nope does not exist") as e:
        alloc(a, [claim(requests=[request(cls="nope")])])
    assert e.value.obj == "ResourceClaim default/c"
    with pytest.raises(AllocationError, match="selector #0: CEL compile error") as e:
        a.compile_check(parse_claim(claim(requests=[request(selectors=["device.attributes[ ==="])])))
    assert e.value.obj == "ResourceClaim default/c"
    with pytest.raises(AllocationError, match="on device gpu.nvidia.com/n1/gpu-0: CEL runtime error: .*nosuch") as e:
        alloc(a, [claim(requests=[request(selectors=["device.attributes['gpu.nvidia.com'].nosuch == 1"])])])
    bad_class = make([slice_(gpus=1)], classes=[device_class(expr="device.attributes['gpu.nvidia.com'].x > 1")])
    with pytest.raises(AllocationError, match="class gpu.nvidia.com: selector #0 on device") as e:
        alloc(bad_class, [claim()])
    assert e.value.obj == "DeviceClass gpu.nvidia.com"


def test_consumable_capacity_shares_a_device():
    dev = gpu_device(0, share=True, caps={"memory": {"value": "80Gi", "requestPolicy": {
        "default": "80Gi", "validRange": {"min": "1Gi", "step": "1Gi"}}}})
    st = AllocatedState()
    a = make([slice_(devices=[dev])], allocated=st)
    share = claim(requests=[request(capacity={"memory": "19.5Gi"})])
    [got] = alloc(a, [share])
    r = got.results[0]
    assert r.share_id == "share-0" and r.consumed_capacity == {"gpu.nvidia.com/memory": Fraction(20 * GIB)}  # rounded up a step
    st.add(got)
    for _ in range(3):
        st.add(alloc(a, [share])[0])
    with pytest.raises(NoAllocation, match="1 without the requested capacity left"):  # 4 x 20Gi taken
        alloc(a, [share])
    # no capacity request: the policy's default (the whole device) is what a claim takes
    st2 = AllocatedState()
    a2 = make([slice_(devices=[dev])], allocated=st2)
    st2.add(alloc(a2, [claim()])[0])
    with pytest.raises(NoAllocation):
        alloc(a2, [share])


def test_capacity_request_a_device_lacks_skips_it():
    a = make([slice_(gpus=1)])
    with pytest.raises(NoAllocation, match="1 without the requested capacity"):
        alloc(a, [claim(requests=[request(capacity={"cores": "1"})])])
    with pytest.raises(NoAllocation, match="without the requested capacity"):
        alloc(a, [claim(requests=[request(capacity={"memory": "81Gi"})])])


def test_admin_access_may_use_a_device_in_use():
    st = AllocatedState(exclusive={("gpu.nvidia.com", "n1", "gpu-0")})
    a = make([slice_(gpus=1)], allocated=st)
    got = alloc(a, [claim(requests=[request(admin=True)])])[0]
    assert got.results[0].admin_access is True and devices(got) == ["gpu-0"]


def test_taints_and_tolerations():
    t = [{"key": "gpu.nvidia.com/xid", "value": "79", "effect": "NoSchedule"}]
    a = make([slice_(devices=[gpu_device(0, taints=t)])])
    with pytest.raises(NoAllocation, match="1 with untolerated taints"):
        alloc(a, [claim()])
    tol = [{"key": "gpu.nvidia.com/xid", "operator": "Exists"}]
    got = alloc(a, [claim(requests=[request(tolerations=tol)])])[0]
    assert got.results[0].tolerations[0].key == "gpu.nvidia.com/xid"
    a = make([slice_(devices=[gpu_device(0, taints=[{"key": "k", "effect": "None"}])])])
    assert devices(alloc(a, [claim()])[0]) == ["gpu-0"]


def test_malformed_attribute_leaves_the_device_out_and_says_where():
    bad = gpu_device(1, extra={"driverVersion": {"version": "550.54"}})
    s = parse_slice(slice_(devices=[gpu_device(0), bad]))
    assert [str(p) for p in s.problems] == [
        "ResourceSlice n1-gpu.nvidia.com: field spec.devices[1].attributes[driverVersion].version: "
        "'550.54' is not a semantic version (semver 2.0.0)"]
    a = make([slice_(devices=[gpu_device(0), bad])])
    assert devices(alloc(a, [claim(requests=[request(count=1)])])[0]) == ["gpu-0"]
    with pytest.raises(NoAllocation):
        alloc(a, [claim(requests=[request(count=2)])])
    with pytest.raises(NoAllocation, match="invalid"):
        alloc(a, [claim(requests=[request(mode="All")])])


def test_mig_profile_by_selector_and_parent_constraint():
    migs = [mig_device(0, "1g.10gb", 0), mig_device(0, "1g.10gb", 1), mig_device(1, "1g.10gb", 2), mig_device(1, "3g.40gb", 3)]
    mig_class = device_class("mig.nvidia.com", "device.attributes['gpu.nvidia.com'].type == 'mig'")
    a = make([slice_(devices=migs)], classes=[mig_class])
    sel = ["device.attributes['gpu.nvidia.com'].profile == '1g.10gb'"]
    got = alloc(a, [claim(requests=[request(cls="mig.nvidia.com", count=2, selectors=sel)],
                          constraints=[{"matchAttribute": "gpu.nvidia.com/parentUUID"}])])[0]
    assert devices(got) == ["gpu-0-mig-1g10gb-0", "gpu-0-mig-1g10gb-1"]


def test_partitionable_devices_share_counters():
    s = slice_(devices=[])
    s["spec"]["sharedCounters"] = [{"name": "gpu-0-counters", "counters": {"memory": {"value": "80Gi"}}}]
    s["spec"]["devices"] = [
        {"name": f"part-{i}", "attributes": {"type": {"string": "gpu"}}, "consumesCounters": [
            {"counterSet": "gpu-0-counters", "counters": {"memory": {"value": "40Gi"}}}]} for i in range(3)]
    a = make([s])
    assert devices(alloc(a, [claim(requests=[request(count=2)])])[0]) == ["part-0", "part-1"]
    with pytest.raises(NoAllocation, match="shared counters"):
        alloc(a, [claim(requests=[request(count=3)])])
    st = AllocatedState(exclusive={("gpu.nvidia.com", "n1", "part-2")})
    with pytest.raises(NoAllocation):
        alloc(make([s], allocated=st), [claim(requests=[request(count=2)])])


def test_class_and_claim_config_in_the_result():
    cfg = [{"opaque": {"driver": "gpu.nvidia.com", "parameters": {"kind": "GpuConfig"}}}]
    a = make([slice_(gpus=1)], classes=[device_class(config=cfg)])
    got = alloc(a, [claim(config=[{"requests": ["gpu"], "opaque": {"driver": "gpu.nvidia.com", "parameters": {"x": 1}}}])])[0]
    assert [c["source"] for c in got.config] == ["FromClass", "FromClaim"]
    assert "requests" not in got.config[0] and "requests" not in got.config[1]  # they apply to every request
    assert got.to_api()["devices"]["config"][0]["opaque"]["parameters"] == {"kind": "GpuConfig"}


def test_shared_pool_with_node_selector():
    s = slice_(gpus=1, name="net")
    del s["spec"]["nodeName"]
    s["spec"]["nodeSelector"] = {"nodeSelectorTerms": [{"matchExpressions": [{"key": "rack", "operator": "In", "values": ["r1"]}]}]}
    a = make([s])
    got = alloc(a, [claim()], node="n2", labels={"rack": "r1"})[0]
    assert got.node_name is None
    assert got.node_selector == {"nodeSelectorTerms": [{"matchExpressions": [{"key": "rack", "operator": "In", "values": ["r1"]}]}]}
    with pytest.raises(NoAllocation):
        alloc(a, [claim()], node="n3", labels={"rack": "r2"})


def test_other_nodes_devices_are_invisible():
    a = make([slice_("n1", gpus=1), slice_("n2", gpus=1)])
    assert alloc(a, [claim()], node="n2")[0].results[0].pool == "n2"
