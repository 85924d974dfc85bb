"""Property tests of the DRA allocator: never a device to two claims beyond its capacity; finds a solution when one exists."""

from __future__ import annotations

from collections import Counter
from fractions import Fraction

from hypothesis import given, settings
from hypothesis import strategies as st

from gpufleet.engine.dra.allocator import AllocatedState, Allocator, Inventory, NoAllocation
from gpufleet.engine.dra.objects import parse_claim, parse_device_class, parse_slice
from tests.engine.dra.builders import claim, device_class, gpu_device, request, slice_

GIB = 2**30


@st.composite
def clusters(draw):
    devs = []
    for i in range(draw(st.integers(1, 6))):
        share = draw(st.booleans())
        mem = draw(st.sampled_from([40, 80]))
        root = draw(st.sampled_from(["a", "b"]))
        taint = draw(st.sampled_from([None, "NoSchedule", "None"]))
        devs.append(gpu_device(i, memory=f"{mem}Gi", share=share, pcie_root=root,
                               taints=[{"key": "k", "effect": taint}] if taint else None))
    return devs


@st.composite
def claims(draw, i):
    reqs = []
    for j in range(draw(st.integers(1, 2))):
        cap = draw(st.sampled_from([None, {"memory": "10Gi"}, {"memory": "30Gi"}, {"memory": "50Gi"}]))
        tol = [{"key": "k", "operator": "Exists"}] if draw(st.booleans()) else None
        reqs.append(request(f"r{j}", count=draw(st.integers(1, 3)), capacity=cap, tolerations=tol))
    cons = None
    if draw(st.booleans()):
        kind = draw(st.sampled_from(["matchAttribute", "distinctAttribute"]))
        cons = [{kind: "resource.kubernetes.io/pcieRoot"}]
    return claim(f"c{i}", reqs, cons, uid=f"u{i}")


@settings(max_examples=150, deadline=None)
@given(clusters(), st.lists(st.integers(0, 10**6), min_size=1, max_size=8), st.data())
def test_never_over_allocates(devs, seeds, data):
    inv = Inventory([parse_slice(slice_(devices=devs))])
    state = AllocatedState()
    a = Allocator(inv, {"gpu.nvidia.com": parse_device_class(device_class())}, state)
    given_out = []
    for i, _ in enumerate(seeds):
        c = parse_claim(data.draw(claims(i)))
        try:
            [got] = a.allocate("n1", {}, [c])
        except NoAllocation:
            continue
        # the result answers every request with its count, honours taints and constraints
        per_req = Counter(r.request for r in got.results)
        assert per_req == Counter({r.name: r.exactly.count for r in c.spec.requests})
        by_name = {d["name"]: d for d in devs}
        for r in got.results:
            d = by_name[r.device]
            spec = next(x.exactly for x in c.spec.requests if x.name == r.request)
            if d.get("taints") and d["taints"][0]["effect"] == "NoSchedule":
                assert spec.tolerations
        for con in c.spec.constraints:
            roots = [by_name[r.device]["attributes"]["resource.kubernetes.io/pcieRoot"]["string"] for r in got.results]
            if con.match_attribute:
                assert len(set(roots)) == 1
            else:
                assert len(set(roots)) == len(roots)
        state.add(got)
        given_out.append(got)
    # invariants over everything allocated
    exclusive = Counter(r.device for g in given_out for r in g.results if r.share_id is None)
    assert all(n == 1 for n in exclusive.values())
    shared = {r.device for g in given_out for r in g.results if r.share_id is not None}
    assert not shared & set(exclusive)
    for dev in shared:
        used = sum((r.consumed_capacity or {}).get("gpu.nvidia.com/memory", Fraction(0))
                   for g in given_out for r in g.results if r.device == dev)
        cap = Fraction(int(next(d for d in devs if d["name"] == dev)["capacity"]["memory"]["value"][:-2]) * GIB)
        assert used <= cap


@settings(max_examples=150, deadline=None)
@given(st.lists(st.sampled_from(["a", "b", "c"]), min_size=1, max_size=8), st.lists(st.booleans(), min_size=8, max_size=8),
       st.integers(1, 5), st.booleans())
def test_finds_a_solution_whenever_one_exists(roots, taken, k, match):
    devs = [gpu_device(i, pcie_root=r) for i, r in enumerate(roots)]
    st_ = AllocatedState(exclusive={("gpu.nvidia.com", "n1", f"gpu-{i}") for i in range(len(roots)) if taken[i]})
    a = Allocator(Inventory([parse_slice(slice_(devices=devs))]), {"gpu.nvidia.com": parse_device_class(device_class())}, st_)
    free = Counter(r for i, r in enumerate(roots) if not taken[i])
    exists = (max(free.values(), default=0) >= k) if match else (sum(free.values()) >= k)
    cons = [{"matchAttribute": "resource.kubernetes.io/pcieRoot"}] if match else None
    try:
        a.allocate("n1", {}, [parse_claim(claim(requests=[request(count=k)], constraints=cons))])
        found = True
    except NoAllocation:
        found = False
    assert found == exists
