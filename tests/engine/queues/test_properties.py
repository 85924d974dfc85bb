"""Property: under random pod streams (arrivals, departures, reclaim, gangs) no queue ever exceeds
its quota + borrowing limit, the pool is never over-lent, and usage accounting matches a recount."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpufleet.engine.gang import place_gang
from gpufleet.engine.queues import Queue, apply_reclaim

from .helpers import brute_usage, cluster, gpu_pod

NAMES = ["a", "b", "c"]

queue_cfg = st.tuples(st.integers(0, 6), st.one_of(st.none(), st.integers(0, 4)), st.integers(1, 3))
op = st.tuples(st.sampled_from(["add", "add", "add", "gang", "leave", "reclaim"]), st.sampled_from(NAMES),
               st.sampled_from([1, 1, 2, 4, 0]), st.integers(0, 3), st.integers(0, 10_000))


def check(state, tree, qs):
    use = tree.usage()
    assert {q: {k: v for k, v in u.items() if v} for q, u in use.items()} == brute_usage(state, tree)
    for q in qs:
        u = use[q.name].get("gpu_milli", 0)
        if "gpu_milli" in q.borrowing_limit:
            assert u <= q.quota["gpu_milli"] + q.borrowing_limit["gpu_milli"], q
    parent = use["org"].get("gpu_milli", 0)
    assert parent <= 9000  # the parent's quota, borrowing limit 0
    assert sum(use[r].get("gpu_milli", 0) for r in tree.roots) <= tree.pool("gpu_milli")
    assert state.allocated_gpu_milli() <= 12_000


@settings(max_examples=150, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(queue_cfg, min_size=3, max_size=3), st.lists(op, min_size=1, max_size=40))
def test_no_queue_exceeds_quota_plus_borrowing_limit(cfgs, ops):
    # a, b under parent "org" (quota 9 GPUs, no borrowing); c on its own
    qs = [Queue(n, {"gpu_milli": q * 1000}, {} if bl is None else {"gpu_milli": bl * 1000}, w, parent="org" if n != "c" else None)
          for n, (q, bl, w) in zip(NAMES, cfgs)]
    qs.append(Queue("org", {"gpu_milli": 9000}, {"gpu_milli": 0}))
    state, s, tree = cluster(n_nodes=3, gpus=4, queues=qs)
    for i, (kind, q, n, prio, x) in enumerate(ops):
        if kind == "add":
            milli = 500 if n == 0 else 1000
            s.schedule(gpu_pod(f"p{i}", n=max(n, 1), queue=q, prio=prio, milli=milli))
        elif kind == "gang":
            place_gang(s, f"g{i}", [gpu_pod(f"g{i}-{j}", n=max(n, 1), queue=q, prio=prio, group=f"g{i}") for j in range(2)])
        elif kind == "leave" and state.assignments:
            keys = sorted(state.assignments)
            s.forget(keys[x % len(keys)])
        elif kind == "reclaim":
            r = gpu_pod(f"r{i}", n=max(n, 1), queue=q, prio=prio)
            plan = tree.plan_reclaim(s, r)
            if plan is not None:
                assert all(v.queue != q for v in plan.victims)
                apply_reclaim(s, plan)
                assert s.schedule(r).ok  # reclaim frees enough for the pod it was planned for
        check(state, tree, qs)


# min members, GPUs each, run ticks, whether its last member ever arrives
gang_spec = st.tuples(st.integers(1, 4), st.sampled_from([1, 2]), st.integers(1, 4), st.sampled_from([True, True, False]))


@settings(max_examples=80, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(gang_spec, min_size=2, max_size=4), st.randoms(use_true_random=False), st.integers(1, 6))
def test_gangs_never_deadlock_and_all_run(specs, rnd, timeout):
    """Members of several gangs arrive interleaved; at most one gang holds tentative reservations,
    no gang ever runs with fewer than its min members, and every complete gang runs eventually --
    also when a gang whose last member never comes holds reservations (its hold times out)."""
    from gpufleet.engine.gang import GangScheduler

    state, s, _ = cluster(n_nodes=2, gpus=4)
    gs = GangScheduler(s, timeout_s=timeout)
    members = [(f"g{g}", gpu_pod(f"g{g}-{m}", n=n, group=f"g{g}", group_min=k)) for g, (k, n, _, whole) in enumerate(specs)
               for m in range(k if whole else k - 1)]
    complete = {f"g{i}" for i, sp in enumerate(specs) if sp[3]}
    rnd.shuffle(members)
    ran: set[str] = set()
    ends: dict[str, int] = {}
    for tick in range(400):
        if members:
            gs.add(members.pop()[1], tick)
        for g, end in list(ends.items()):
            if end <= tick:  # the gang finished
                for p in [k for k, a in state.assignments.items() if a.pod_group == g]:
                    gs.remove(p)
                del ends[g]
        for r in gs.step(tick):
            if r.ok and r.placed:
                g = r.group.split("/", 1)[1]
                ran.add(g)
                ends.setdefault(g, tick + specs[int(g[1:])][2])
        held = {state.assignments[k].pod_group for k in gs.held}
        assert len(held) <= 1 and (not held or gs.holder == f"default/{held.pop()}")
        committed: dict[str, int] = {}
        for k, a in state.assignments.items():
            if k not in gs.held:
                committed[a.pod_group] = committed.get(a.pod_group, 0) + 1
        for g, c in committed.items():
            assert c >= specs[int(g[1:])][0], (g, c)  # all or nothing
        if ran >= complete and not members:
            break
    assert ran == complete


gang_op = st.tuples(st.sampled_from(["member", "member", "member", "solo", "leave", "tick"]), st.sampled_from(["g1", "g2"]),
                    st.integers(1, 3), st.integers(0, 10_000))


@settings(max_examples=120, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(gang_op, min_size=1, max_size=40))
def test_a_hold_never_outlives_its_reason(ops):
    """Members of two gangs (min 3) arrive one by one among small pods and departures; after every
    step: at most one gang holds, never a complete one, never past its timeout, held pods count
    against no quota, and usage matches a recount."""
    from gpufleet.engine.gang import GangScheduler

    state, s, tree = cluster(n_nodes=2, gpus=4, queues=[Queue("t", {"gpu_milli": 6000})])
    gs = GangScheduler(s, timeout_s=50)
    t = 0.0
    live: list[str] = []
    for i, (kind, g, n, x) in enumerate(ops):
        if kind == "member":
            gs.add(gpu_pod(f"{g}-{i}", n=n, queue="t", group=g, group_min=3), t)
        elif kind == "solo":
            if s.schedule(gpu_pod(f"solo{i}", n=n, queue="t")).ok:
                live.append(f"default/solo{i}")
        elif kind == "leave":
            members = sorted(k for gg in gs.gangs.values() for k in [*gg.members, *gg.running])
            pool = members + live
            if pool:
                k = pool[x % len(pool)]
                if k in live:
                    live.remove(k)
                    s.forget(k)
                else:
                    gs.remove(k)
        else:
            t += 20
        gs.step(t)
        assert all(state.assignments[k].queue is None for k in gs.held)  # capacity, not quota
        check_use = tree.usage()
        assert {q: {k: v for k, v in u.items() if v} for q, u in check_use.items()} == brute_usage(state, tree)
        if gs.holder is not None:
            gang = gs.gangs[gs.holder]
            assert len(gang.members) < gang.need and not gang.placed  # incomplete: still arriving
            assert gs.hold_deadline() is not None and t <= gs.hold_deadline()  # not past its timeout
            assert set(gs.held) <= set(gang.members)
        else:
            assert gs.held == []
        held_or_placed = set(gs.held) | {k for gg in gs.gangs.values() for k in gg.running} | set(live)
        assert set(state.assignments) == held_or_placed  # nothing reserved that nobody holds
