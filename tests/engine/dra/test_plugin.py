"""DRA pods through the engine: DynamicResources with the policies, claims holding devices, reasons, dry runs."""

from __future__ import annotations

from dataclasses import replace

import pytest

from gpufleet.engine.dra.objects import parse_claim
from gpufleet.engine.dra.plugin import DRA_ALLOCATIONS, ensure_dra
from gpufleet.engine.dra.pods import PodClaim, PodClaims
from gpufleet.engine.framework import Scheduler
from gpufleet.engine.model import PodRequest
from gpufleet.engine.state import ClusterState
from gpufleet.engine.status import Code
from gpufleet.policies import build_profile
from gpufleet.simulator.traces.dra import DRIVER, ClaimShaper, catalog

from ..builders import gpu_node


def setup(policy="default", nodes=None, seed=3):
    nodes = nodes or [gpu_node("a", gpus=8, model="A100", memory_mib=81_920), gpu_node("b", gpus=8, model="A100", memory_mib=81_920)]
    state = ClusterState(nodes)
    state.dra = catalog(nodes)
    prof = build_profile(policy)
    ensure_dra(prof)
    return Scheduler(prof, state, seed=seed), ClaimShaper(nodes), state


def pod(name, gpus=0, milli=1000, cpu=1000):
    return PodRequest(name, cpu_milli=cpu, memory_mib=1024, gpu_count=gpus, gpu_milli=milli if gpus else 0)


def with_claim(r: PodRequest, spec: dict, name="c") -> PodRequest:
    c = parse_claim({"metadata": {"name": f"{r.name}-{name}", "namespace": r.namespace, "uid": f"u-{r.name}"}, "spec": spec})
    return replace(r, dra=PodClaims(r.name, (PodClaim(name, c),)))


def test_whole_gpus_and_shares_hold_their_gpus():
    sched, shape, state = setup()
    d = sched.schedule(shape(pod("w", gpus=2)))
    assert d.ok and d.assignment.gpu_indices == () and d.assignment.claims == ("default/w-gpu",)
    h = state.claim_holds["default/w-gpu"]
    assert [(j, m) for j, m, _ in h.gpus] == [(0, 1000), (1, 1000)]
    node = state.index[d.assignment.node]
    assert state.gpu_free_milli[node, :2].tolist() == [0, 0]
    # two 400-milli shares go on one GPU (best fit), each with its memory
    s1 = sched.schedule(shape(pod("s1", gpus=1, milli=400)))
    s2 = sched.schedule(shape(pod("s2", gpus=1, milli=400)))
    g1, g2 = state.claim_holds["default/s1-gpu"], state.claim_holds["default/s2-gpu"]
    assert (s1.assignment.node, g1.gpus[0][0]) == (s2.assignment.node, g2.gpus[0][0])
    n1 = state.index[s1.assignment.node]
    assert state.gpu_free_milli[n1, g1.gpus[0][0]] == 200
    assert state.dra.allocated.shared  # the allocator's view agrees
    # the allocation the adapter writes: shares with their consumed capacity
    sched2, shape2, _ = setup()
    cycle, dec = sched2._schedule(shape2(pod("s", gpus=1, milli=250)))
    [(claim, alloc)] = cycle.read(DRA_ALLOCATIONS)
    r = alloc.results[0]
    assert r.driver == DRIVER and r.share_id and r.consumed_capacity[f"{DRIVER}/gpuMilli"] == 250


def test_full_cluster_and_release():
    sched, shape, state = setup()
    for i in range(2):
        assert sched.schedule(shape(pod(f"w{i}", gpus=8))).ok
    d = sched.schedule(shape(pod("x", gpus=1)))
    assert not d.ok and "fewer than 1 free device(s) of class gpu.gpufleet.io" in d.status.message
    state.unreserve("default/w0")  # a pod leaving does not free the claim: the API deallocates it
    assert not sched.schedule(shape(pod("x", gpus=1))).ok
    state.release_claim("default/w0-gpu")
    assert sched.schedule(shape(pod("x", gpus=1))).ok


def test_eviction_dry_run_frees_a_claim_with_no_other_user():
    sched, shape, state = setup()
    for i in range(2):
        assert sched.schedule(shape(pod(f"w{i}", gpus=8))).ok
    with state.transaction() as tx:
        tx.evict("default/w0")
        assert "default/w0-gpu" not in state.claim_holds
        assert sched.explain(shape(pod("x", gpus=1))).ok  # fits in the dry run
    # rolled back: the claim holds its GPUs again
    assert "default/w0-gpu" in state.claim_holds and "default/w0" in state.assignments
    assert int(state.gpu_free_milli.sum()) == 0 and not sched.explain(shape(pod("x", gpus=1))).ok


def test_constraint_and_selector_reasons():
    sched, _, state = setup()
    spec = {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": DRIVER, "count": 5}}],
                        "constraints": [{"matchAttribute": "resource.kubernetes.io/pcieRoot"}]}}
    d = sched.schedule(with_claim(pod("p", gpus=5), spec))
    assert not d.ok and "resource.kubernetes.io/pcieRoot constraint" in d.status.message
    spec = {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": DRIVER, "count": 4}}],
                        "constraints": [{"matchAttribute": "resource.kubernetes.io/pcieRoot"}]}}
    d = sched.schedule(with_claim(pod("q", gpus=4), spec))
    assert d.ok
    roots = {g for g, _, _ in state.claim_holds["default/q-c"].gpus}
    assert roots in ({0, 1, 2, 3}, {4, 5, 6, 7})
    sel = {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": DRIVER, "selectors": [
        {"cel": {"expression": f"device.attributes['{DRIVER}'].productName == 'H100'"}}]}}]}}
    d = sched.schedule(with_claim(pod("h", gpus=1), sel))
    assert not d.ok and "no device of class gpu.gpufleet.io matches its selectors" in d.status.message


@pytest.mark.parametrize("spec, want", [
    ({"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "nope"}}]}},
     "claim default/p-c, request gpu: device class nope does not exist"),
    ({"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": DRIVER, "selectors": [
        {"cel": {"expression": "device.attributes["}}]}}]}}, "selector #0: CEL compile error"),
    ({"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": DRIVER, "selectors": [
        {"cel": {"expression": f"device.attributes['{DRIVER}'].nosuch == 1"}}]}}]}}, "CEL runtime error"),
])
def test_bad_claims_are_unresolvable_and_others_keep_being_served(spec, want):
    sched, shape, _ = setup()
    d = sched.schedule(with_claim(pod("p", gpus=1), spec))
    # a missing class or a selector that does not compile stops the pod before any node is tried; a runtime
    # error stops it on the first device that raises it (kube-scheduler aborts the attempt on both)
    assert not d.ok and want in d.status.message
    assert d.status.code == (Code.UNSCHEDULABLE if "runtime" in want else Code.UNRESOLVABLE)
    assert sched.schedule(shape(pod("ok", gpus=1))).ok


def test_missing_claim_waits_with_its_reason():
    sched, _, _ = setup()
    r = replace(pod("p", gpus=1), dra=PodClaims("p", (PodClaim("gpu", None, "waiting for ResourceClaim default/p-gpu (template t)"),)))
    d = sched.schedule(r)
    assert not d.ok and "waiting for ResourceClaim default/p-gpu" in d.status.message


def test_shared_claim_second_pod_follows_the_first():
    sched, _, state = setup()
    spec = {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": DRIVER}}]}}
    c = parse_claim({"metadata": {"name": "shared", "namespace": "default", "uid": "u"}, "spec": spec})
    r1 = replace(pod("p1", gpus=1), dra=PodClaims("p1", (PodClaim("gpu", c),)))
    r2 = replace(pod("p2", gpus=1), dra=PodClaims("p2", (PodClaim("gpu", c),)))
    d1 = sched.schedule(r1)
    d2 = sched.schedule(r2)  # the claim is allocated in flight: p2 goes where its devices are, taking nothing more
    assert d1.ok and d2.ok and d1.assignment.node == d2.assignment.node
    assert list(state.claim_holds) == ["default/shared"] and state.claim_users["default/shared"] == {"default/p1", "default/p2"}


def test_dra_shaped_requests_place_like_device_plugin_ones():
    """The same pods, by device plugin and by claim, get the same GPUs from each policy."""
    for policy in ("default", "fgd", "bestfit"):
        plain = Scheduler(build_profile(policy), ClusterState([gpu_node(n, gpus=4, model="A100", memory_mib=81_920) for n in "abc"]), seed=3)
        sched, shape, state = setup(policy, [gpu_node(n, gpus=4, model="A100", memory_mib=81_920) for n in "abc"])
        for i, (g, m) in enumerate([(1, 500), (2, 1000), (1, 300), (1, 700), (1, 1000), (3, 1000), (1, 200)]):
            p = pod(f"p{i}", gpus=g, milli=m)
            a = plain.schedule(p)
            b = sched.schedule(shape(p))
            assert a.ok == b.ok
            if a.ok:
                held = state.claim_holds[f"default/p{i}-gpu"]
                assert (a.assignment.node, a.assignment.gpu_indices) == (b.assignment.node, tuple(j for j, _, _ in held.gpus)), policy


def test_row_counts_equal_a_sum_along_each_row():
    """The DRA filter's per-node count of fitting GPUs (a popcount for 8 GPUs a node, a product otherwise)."""
    import numpy as np

    from gpufleet.engine.dra.plugin import row_counts

    rng = np.random.default_rng(7)
    for g in (1, 3, 8, 16):
        m = rng.random((53, g)) > 0.4
        for grid in (m, np.asfortranarray(m), m[::2]):
            assert row_counts(grid).tolist() == grid.sum(axis=1).tolist()
            assert row_counts(grid).dtype == np.int64


def test_kept_per_node_counts_equal_a_fresh_count_through_binds_releases_and_copies():
    """The fast filter keeps its per-node counts and recomputes only nodes whose version moved: after every
    placement, release and snapshot copy the kept counts must equal a count over the whole grid from scratch."""
    import numpy as np

    from gpufleet.engine.dra.plugin import DynamicResources, _gpu_counts

    nodes = [gpu_node(f"n{i}", gpus=4, model="A100", memory_mib=81_920) for i in range(6)]
    sched, shape, state = setup(nodes=nodes)
    plugin = next(p for p in sched.profile.filters if isinstance(p, DynamicResources))
    rng = np.random.default_rng(7)

    def check(st):
        table = st.dra.catalog.table(st)
        for key, holder in [(k, v) for k, v in table.need_cache.items() if k[0] == "gpu-count" and v[0] is not None]:
            memo = [v for k, v in table.need_cache.items() if k[0] == "per-node-of" and v[1] is not None and v[1][3] is holder]
            assert memo, key
            _, grid, blocked, _ = memo[0][1]
            plugin._gpu_counts_now(grid, blocked, holder, st)
            assert holder[1].tolist() == _gpu_counts(grid, blocked, st, slice(None)).tolist()

    placed = []
    for i in range(60):
        milli = int(rng.choice([1000, 250, 500]))
        d = sched.schedule(shape(pod(f"p{i}", gpus=int(rng.integers(1, 3)) if milli == 1000 else 1, milli=milli)))
        if d.ok:
            placed.append(f"default/p{i}-gpu")
        if placed and rng.random() < 0.3:  # a claim deallocated: its GPUs free again
            state.release_claim(placed.pop(int(rng.integers(len(placed)))))
        check(state)
        if i % 20 == 19:  # a what-if copy shares the device table: its counts are its own
            c = state.copy()
            c.release_claim(placed[0]) if placed else None
            check(c)
            check(state)


def test_request_with_is_replace():
    from gpufleet.engine.dra.pods import request_with

    r = PodRequest("p", cpu_milli=100, memory_mib=10, gpu_count=0, scalars=(("x", 1),))
    got = request_with(r, gpu_count=2, gpu_milli=1000, scalars=())
    want = replace(r, gpu_count=2, gpu_milli=1000, scalars=())
    assert got == want and got.__dict__ == want.__dict__ and r.gpu_count == 0
    with pytest.raises(TypeError, match="no field"):
        request_with(r, gpu_cuont=1)


def test_share_ids_are_random_version_4_uuids():
    import uuid

    from gpufleet.engine.dra.allocator import random_share_id

    ids = {random_share_id() for _ in range(200)}
    assert len(ids) == 200
    for s in ids:
        u = uuid.UUID(s)
        assert str(u) == s and u.version == 4 and u.variant == uuid.RFC_4122


def test_mig_claims_place_like_device_plugin_mig_pods():
    """MIG pods by claim (class mig.gpufleet.io, a selector on the profile; the trace's slices publish each instance
    as the agent does) get the same node and instance as by device plugin, from each policy; when the instances of a
    profile run out both are turned away."""
    from gpufleet.engine.model import Gpu, MigInstance, Node

    def host(name):
        layouts = (("1g.10gb",) * 7, ("3g.40gb", "2g.20gb", "2g.20gb"))
        mem = {"1g.10gb": 9_728, "2g.20gb": 19_968, "3g.40gb": 40_192}
        gpus = tuple(Gpu(j, f"GPU-{name}-{j}", "NVIDIA-A100-SXM4-80GB", 81_920, mig_enabled=True,
                         mig_instances=tuple(MigInstance(p, mem[p], k) for k, p in enumerate(lay))) for j, lay in enumerate(layouts))
        return Node(name, 64_000, 512_000, gpus + (Gpu(2, f"GPU-{name}-2", "NVIDIA-A100-SXM4-80GB", 81_920),))

    for policy in ("default", "fgd", "bestfit"):
        plain = Scheduler(build_profile(policy), ClusterState([host(n) for n in "ab"]), seed=3)
        sched, shape, state = setup(policy, [host(n) for n in "ab"])
        asks = ["2g.20gb", "1g.10gb", "3g.40gb", "2g.20gb", "2g.20gb", "3g.40gb", "2g.20gb", "2g.20gb", "1g.10gb"]
        results = []
        for i, prof in enumerate(asks):
            p = replace(pod(f"m{i}", gpus=1, milli=0), gpu_milli=0, gpu_memory_mib=1, mig_profile=prof)
            a = plain.schedule(p)
            b = sched.schedule(shape(p))
            assert a.ok == b.ok, (policy, i)
            results.append(a.ok)
            if a.ok:
                held = state.claim_holds[f"default/m{i}-gpu"]
                assert (a.assignment.node, a.assignment.mig) == (b.assignment.node, tuple(inst for _, inst in held.mig)), policy
        assert results.count(False) == 1  # the fifth 2g.20gb: two hosts have four
