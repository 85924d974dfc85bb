"""Pending pods by decision group (``engine.pending``): one list per group in queue order, the cheap "could it fit"
tests, and a retry pass that tries only what a change may let fit."""

from __future__ import annotations

import numpy as np
import pytest

from gpufleet.engine.model import Assignment, PodRequest
from gpufleet.engine.pending import FitScreen, PendingGroups, could_fit, room_mask
from gpufleet.engine.schedqueue import room_need

from tests.builders import T4, RoundShell, make_node, state_of


def req(name: str, gpu_milli: int = 1000, gpu_count: int = 1, cpu_milli: int = 1000, priority: int = 0) -> PodRequest:
    return PodRequest(name, "t", cpu_milli=cpu_milli, memory_mib=1024, gpu_count=gpu_count, gpu_milli=gpu_milli, priority=priority)


def test_a_group_is_kept_in_queue_order_and_dropped_when_empty():
    reqs = [req("c"), req("a"), req("b"), req("share", gpu_milli=500)]
    w = PendingGroups(reqs, {})
    assert len(w.group_list) == 2  # the three whole-GPU pods decide alike
    w.add(0, 1.0)
    w.add(1, 5.0)
    w.add(2, 1.0)
    w.add(2, 0.0)  # already waiting: keeps its place
    group = w.group_of[0]
    assert [e[3] for e in w.groups[group]] == [2, 0, 1]  # first seen, then name
    assert w.head(group) == 2 and 2 in w and len(w) == 3
    assert w.count.tolist() == [3, 0]  # per group id: what the retry round skips when 0
    assert [q.key for q in w.first(group, 2)] == ["t/b", "t/c"]
    for i in (2, 0, 1):
        w.remove(i)
    assert w.head(group) is None and group not in w.groups and len(w) == 0
    w.remove(1)  # not waiting: nothing happens
    assert w.count.tolist() == [0, 0]


def test_with_room_agrees_with_counting_each_gpu():
    """``with_room`` looks up each group's GPU count in a node's sorted free milli; the same answers as counting the
    GPUs with the group's milli free, on nodes of 1 to 4 GPUs, for groups asking none, some, or more than a node has."""
    rng = np.random.default_rng(3)
    st = state_of(*[make_node(f"n{k}", 1 + k % 4, T4, cpu_milli=8_000) for k in range(8)])
    reqs = [req(f"g{k}", gpu_milli=int(m), gpu_count=int(c), cpu_milli=int(cpu))
            for k, (m, c, cpu) in enumerate(zip(rng.choice([100, 250, 500, 1000], 60), rng.integers(0, 6, 60),
                                                  rng.integers(0, 9, 60) * 1000))]
    w = PendingGroups(reqs, {})
    placed: list[str] = []
    looked = 0
    for step in range(400):
        n = int(rng.integers(len(st)))
        free = [j for j in range(int(st.gpu_n[n])) if st.gpu_free_milli[n, j] >= 250]
        if rng.random() < 0.3 and placed:  # amounts go up again too
            st.unreserve(placed.pop(int(rng.integers(len(placed)))))
        elif free and st.cpu_free[n] >= 500:
            st.reserve(Assignment(f"t/x{step}", st.nodes[n].name, 500, int(rng.choice([0, 512, 2048])),
                                  gpu_indices=(free[0],), gpu_milli=250, gpu_memory_mib=(0,)))
            placed.append(f"t/x{step}")
        if step % 100 == 99:  # the live queue's groups come later: the per-class answers are made again
            w.register(req(f"late{step}", gpu_milli=int(rng.choice([300, 700])), gpu_count=2, cpu_milli=1500 + step))
        nodes = sorted({int(d) for d in rng.integers(len(st), size=int(rng.integers(0, 4)))})
        looked += len(nodes)
        counted = np.zeros(len(w.count), dtype=bool)
        for d in nodes:
            counted |= (w.cpu_milli <= st.cpu_free[d]) & (w.memory_mib <= st.mem_free[d]) & \
                ((st.gpu_free_milli[d][None, :] >= w.gpu_milli[:, None]).sum(axis=1) >= w.gpu_count)
        assert w.with_room(st, nodes).tolist() == counted.tolist(), step
    assert w._parts is not None and len(w._parts[1][5]) < looked / 2  # most nodes' GPU amounts fell in a class seen


def test_a_queue_made_like_another_copies_its_groups():
    """``like``: a replay's runs of one workload share the groups worked out once; the copy is a queue of its own."""
    reqs = [req("a"), req("b", gpu_milli=500), req("c"), req("d", priority=7)]
    first = PendingGroups(list(reqs), {})
    w = PendingGroups(list(reqs), {"GpuFit": "room"}, like=first)
    for name in ("by_key", "group_of", "group_ids", "group_list", "need", "priorities"):
        assert getattr(w, name) == getattr(first, name), name
    for name in ("cpu_milli", "memory_mib", "gpu_count", "gpu_milli", "priority", "count"):
        assert getattr(w, name).tolist() == getattr(first, name).tolist(), name
    w.add(0, 1.0)
    w.register(req("e", gpu_count=2))
    assert len(first) == 0 and len(first.group_list) == 3 and first.count.tolist() == [0, 0, 0]
    assert len(w) == 1 and len(w.group_list) == 4 and w.hints == {"GpuFit": "room"}
    with pytest.raises(ValueError):
        PendingGroups(reqs[:2], {}, like=first)


def test_each_groups_front_follows_its_list():
    """``front[gid]`` (what a retry pass orders its groups by) is always the group's first (sort key, index), or
    None for a group with nobody waiting: through adds, removals and placements (a replay's queue, its pods known up
    front), and through pods that come and go (the live queue's, registered one by one)."""
    rng = np.random.default_rng(5)
    reqs = [req(f"p{k}", gpu_milli=int(rng.choice([250, 1000])), priority=int(rng.choice([0, 5]))) for k in range(30)]
    for w in (PendingGroups(list(reqs), {}), PendingGroups([], {}, group_by=lambda r: (r.gpu_milli, r.priority))):
        live = not w.reqs
        for step in range(600):
            what = rng.random()
            if live and what < 0.3:
                w.add(w.register(req(f"l{step}", gpu_milli=int(rng.choice([100, 250, 1000])))), float(step % 40))
            elif live and what < 0.45 and len(w):
                w.unregister(list(w.queued)[int(rng.integers(len(w)))])
            elif not live and what < 0.45:
                w.add(int(rng.integers(len(w.reqs))), float(rng.integers(0, 50)))
            elif len(w):
                w.placed(list(w.queued)[int(rng.integers(len(w)))])
            for gid, g in enumerate(w.group_list):
                lst = w.groups.get(g)
                assert w.front[gid] == (lst[0] if lst else None), step
            assert len(w.front) == len(w.count)
        assert len(w.group_list) > 2


def test_priority_splits_groups():
    w = PendingGroups([req("low"), req("high", priority=100)], {})
    assert w.group_of[0] != w.group_of[1]


@pytest.mark.parametrize("used, pod, fits", [
    ((0, 0), req("whole"), True),
    ((1000, 1000), req("whole"), False),
    ((600, 1000), req("share", gpu_milli=400), True),
    ((700, 1000), req("share", gpu_milli=400), False),
    ((0, 600), req("two", gpu_count=2), False),
    ((0, 0), req("cpu", cpu_milli=20_000), False),
])
def test_room_tests_agree_with_each_other(used, pod, fits):
    st = state_of(make_node("n", 2, T4, cpu_milli=16_000))
    for g, m in enumerate(used):
        if m:
            st.reserve(Assignment(f"t/u{g}", "n", 0, 0, gpu_indices=(g,), gpu_milli=m, gpu_memory_mib=(0,)))
    w = PendingGroups([pod], {})
    assert w.with_room(st, [0]).tolist() == [fits]
    assert w.fits_on(0, st, [0]) is fits
    assert could_fit(st, pod) is fits
    assert w.with_room(st, []).tolist() == [False]  # no node gained room: nothing to try


def test_every_arrival_is_counted_once_in_the_progress_bar_also_when_it_preempts():
    """A pod placed by preempting used to skip its progress tick: the bar stopped short of the pods replayed."""
    from gpufleet.simulator.experiments.replay import run_replay
    from gpufleet.simulator.traces.workload import Workload

    from tests.builders import make_node as node

    nodes = [node("n0", 4, T4, cpu_milli=32_000)]
    reqs = [req(f"be{i}") for i in range(4)] + [req(f"ls{i}", priority=100) for i in range(2)]
    wl = Workload(reqs, np.array([0.0, 1, 2, 3, 100, 101]), np.array([10_000.0] * 4 + [100.0] * 2), np.full(6, np.nan))
    ticks: list[int] = []
    r = run_replay(nodes, wl, "bestfit", warmup=0.0, frag=False, progress=ticks.append)
    assert r.preemptions == 2 and r.pods_arrived == 6
    assert sum(ticks) == 6


class _Shell(RoundShell):
    """The smallest shell of the round: the pending pods, a scheduler, no queues; nothing lower to preempt
    unless ``lower`` (then every plan is allowed)."""

    def __init__(self, reqs: list[PodRequest], nodes: list, lower: bool = False) -> None:
        from gpufleet.engine.round import SchedulingRound
        from gpufleet.engine.schedqueue import requeue_hints

        from tests.builders import scheduler

        self.reqs, self.sched, self.tree, self.lower = reqs, scheduler(nodes), None, lower
        self.pending = PendingGroups(reqs, requeue_hints(self.sched.profile))
        self.round = SchedulingRound(self, self, self)
        self.tries: list[tuple[str, bool | None]] = []

    def attempt(self, i: int, fits: bool | None, plan: bool):
        self.tries.append((self.reqs[i].key, fits))
        return self.round.try_pod(self.reqs[i], 0.0, 0.0, fits=fits, plan=plan)

    def retry(self) -> None:
        self.pending.retry(self.round, 0.0, self.attempt)



def test_a_retry_pass_tries_only_what_the_freed_room_may_take_in_queue_order():
    """Three groups wait for one GPU; a pod leaves the only GPU node: the first come is placed, and the two
    others, which no node has room for any more, are passed over without a cycle."""
    reqs = [req("run", cpu_milli=500), req("late", cpu_milli=1000), req("first", cpu_milli=2000),
            req("second", cpu_milli=3000), req("cpu-only", gpu_count=0, gpu_milli=0, cpu_milli=64_000)]
    sh = _Shell(reqs, [make_node("n", 1, T4, cpu_milli=16_000)])
    assert sh.sched.schedule(reqs[0]).ok
    for i, seen in ((1, 3.0), (2, 1.0), (3, 2.0), (4, 0.0)):
        sh.pending.add(i, seen)
    sh.retry()
    assert sh.tries == []  # nothing changed: nothing is tried
    sh.sched.forget("t/run")
    sh.pending.freed.add(0)
    sh.retry()
    assert sh.tries == [("t/first", True)]  # 'cpu-only' asks more CPU than the node has: never tried
    assert "t/first" in sh.sched.state.assignments and len(sh.pending) == 3 and not sh.pending.freed


def test_a_group_kept_out_by_a_count_or_back_in_the_queue_is_tried_without_room():
    reqs = [req("run"), req("a", cpu_milli=2000), req("b", cpu_milli=3000)]
    sh = _Shell(reqs, [make_node("n", 1, T4)])
    assert sh.sched.schedule(reqs[0]).ok
    sh.pending.add(1, 1.0)
    sh.pending.requeue(2, 2.0)  # a victim, as its controller's new pod
    sh.pending.kept_out.add(sh.pending.group_of[1])
    sh.retry()
    assert sh.tries == [("t/a", None), ("t/b", None)]  # the shell's screen decides (no node has the room)
    assert len(sh.pending) == 2 and not sh.pending.fresh


def test_with_lower_priority_pods_running_a_pod_without_room_still_goes_to_the_round():
    """Passing over a pod is only right when a try could do nothing but make it wait: with something lower to
    preempt (and planning allowed), the round must see it (``only_waits``)."""
    reqs = [req("run"), req("first", cpu_milli=2000), req("second", cpu_milli=3000)]
    for lower, expected in ((False, [("t/first", True)]), (True, [("t/first", True), ("t/second", False)])):
        sh = _Shell(reqs, [make_node("n", 1, T4)], lower=lower)
        assert sh.sched.schedule(reqs[0]).ok
        sh.pending.add(1, 1.0)
        sh.pending.add(2, 2.0)
        assert sh.round.only_waits(reqs[2], 0.0) is not lower
        sh.sched.forget("t/run")
        sh.pending.freed.add(0)
        sh.retry()
        assert sh.tries == expected


def test_pods_that_come_and_go_reuse_indices_and_groups():
    """The live queue's pods are not known up front: ``register`` makes a pod's index (and its group when new),
    ``unregister`` gives both back once the last pod of the group is gone; the arrays grow as groups come."""
    w = PendingGroups([], {})
    a, b = w.register(req("a")), w.register(req("b"))
    assert (a, b) == (0, 1) and w.group_of[a] == w.group_of[b] and w.register(req("a")) == a
    shares = [w.register(req(f"s{k}", gpu_milli=100 + k)) for k in range(10)]  # ten groups: the arrays grow
    assert len(w.group_ids) == 11 and len(w.count) >= 11
    w.failed(a, 0.0, ["NodeResourcesFit"])
    w.failed(shares[3], 0.0, ["NodeResourcesFit"])
    assert len(w) == 2 and w.count[w.group_ids[w.group_of[shares[3]]]] == 1
    gid = w.group_ids[w.group_of[shares[3]]]
    w.unregister(shares[3])  # the group's only pod: the group goes, its id is free
    assert len(w) == 1 and w.group_of[shares[3]] not in w.group_ids and w.count[gid] == 0
    c = w.register(req("c", gpu_milli=700))  # takes the freed index and the freed group id
    assert c == shares[3] and w.group_ids[w.group_of[c]] == gid and w.need[gid] == (1000, 1024, 1, 700)
    w.unregister(a)
    assert w.group_of[b] in w.group_ids  # b still in it
    changed = w.register(req("b", gpu_milli=300))  # the pod's request changed: a new registration
    assert w.reqs[changed].gpu_milli == 300 and w.by_key["t/b"] == changed


def test_woken_is_what_a_retry_pass_would_try():
    """What a change may let fit, for the live queue: groups with room on a node that gained room, and, only when
    a pod left, groups kept out by a count; ``changes`` is taken (a second call sees nothing new)."""
    st = state_of(make_node("n0", 1, T4, cpu_milli=16_000), make_node("n1", 4, T4, cpu_milli=16_000))
    st.reserve(Assignment("t/u", "n1", 0, 0, gpu_indices=(0, 1, 2, 3), gpu_milli=1000, gpu_memory_mib=(0,) * 4))
    hints = {"NodeResourcesFit": "room", "Spread": "pods"}
    w = PendingGroups([], hints)
    one, two, counted = w.register(req("one")), w.register(req("two", gpu_count=2)), w.register(req("c", gpu_milli=500))
    w.failed(one, 0.0, ["NodeResourcesFit"])
    w.failed(two, 0.0, ["NodeResourcesFit"])
    w.failed(counted, 0.0, ["Spread"])
    assert w.woken(st) == []  # nothing changed
    w.freed.add(0)  # n0: one GPU free
    assert sorted(w.woken(st)) == [one, counted] and w.woken(st) == []
    w.fresh.add(w.group_of[two])  # back in the queue: tried against every node
    assert w.woken(st) == [two]


def test_a_pass_ends_once_nothing_queued_fits_and_everything_left_would_only_wait(monkeypatch):
    """Twelve groups fit on the node a pod left; the first four placed fill it: the others have no room any more
    and a try could only make them wait, so none is tried and ``only_waits`` is asked for none (the pass ends, or
    passes them over by their priority: the replay's retries spent most of their time asking pod by pod)."""
    reqs = [req("run", gpu_count=4)] + [req(f"w{k}", cpu_milli=1000 + k) for k in range(12)]
    sh = _Shell(reqs, [make_node("n", 4, T4, cpu_milli=64_000), make_node("full", 1, T4, cpu_milli=64_000)])
    assert sh.sched.schedule(reqs[0]).ok
    assert sh.sched.schedule(req("other")).ok  # 'full' has no GPU left
    for k in range(1, 13):
        sh.pending.add(k, float(k))
    asked: list[str] = []
    only_waits = sh.round.only_waits
    monkeypatch.setattr(sh.round, "only_waits", lambda r, now: asked.append(r.key) or only_waits(r, now))
    sh.sched.forget("t/run")
    sh.pending.freed.add(0)
    sh.retry()
    assert sh.tries == [(f"t/w{k}", True) for k in range(4)]  # four GPUs: the first four come are placed
    assert asked == [] and len(sh.pending) == 8


def test_waits_by_priority_is_only_waits_for_a_pod_without_nomination():
    from gpufleet.engine.round import Nomination

    reqs = [req("run"), req("p0"), req("p100", priority=100)]
    for lower in (False, True):
        sh = _Shell(reqs, [make_node("n", 1, T4)], lower=lower)
        for r in reqs[1:]:
            assert sh.round.waits_by_priority(r.priority) is sh.round.only_waits(r, 0.0) is not lower
        sh.round.nominations["t/p0"] = Nomination(reqs[1], "n", set())  # a nominated pod is asked per pod
        assert sh.round.only_waits(reqs[1], 0.0) is False
        sh.round.preemption = False
        assert sh.round.waits_by_priority(0) is True and sh.round.only_waits(reqs[2], 0.0) is True


def test_the_fit_screen_answers_as_could_fit_whatever_changed():
    """``FitScreen`` remembers why it answered (a node with room and its version, or the versions' sum); across
    reservations, releases, a rolled-back transaction and a node added, its answers are ``could_fit``'s."""
    from gpufleet.engine.model import Assignment as A

    rng = np.random.default_rng(7)
    st = state_of(*[make_node(f"n{k}", 2 + k % 3, T4, cpu_milli=8_000) for k in range(6)])
    screen = FitScreen(st)
    pods = [req(f"q{k}", gpu_milli=int(m), gpu_count=int(c), cpu_milli=int(cpu))
            for k, (m, c, cpu) in enumerate(zip(rng.choice([250, 500, 1000], 40), rng.integers(0, 4, 40),
                                                  rng.integers(0, 9, 40) * 1000))]
    placed: list[str] = []
    last: dict[tuple, bool] = {}
    came_back = 0  # a need no node had room for, then one had (only a node that changed may have: tested alone)
    for step in range(400):
        r = pods[int(rng.integers(len(pods)))]
        ans = screen(r)
        assert ans is could_fit(st, r), step
        need = room_need(r)
        if ans:  # the node it remembers has room
            assert room_mask(st, need)[screen._seen[need][1]], step
            came_back += last.get(need) is False
        last[need] = ans
        what = rng.random()
        if what < 0.45:  # place one where the scheduler's rules are not needed: any node with room, by hand
            n = int(rng.integers(len(st)))
            free = [j for j in range(int(st.gpu_n[n])) if st.gpu_free_milli[n, j] >= 500]
            if st.cpu_free[n] >= 1000 and free:
                key = f"t/x{step}"
                st.reserve(A(key, st.nodes[n].name, 1000, 0, gpu_indices=(free[0],), gpu_milli=500, gpu_memory_mib=(0,)))
                placed.append(key)
        elif what < 0.8 and placed:
            st.unreserve(placed.pop(int(rng.integers(len(placed)))))
        elif what < 0.9 and placed:
            with st.transaction() as tx:  # a dry run: rolls back
                tx.evict(placed[0])
        elif step % 97 == 0:
            st.add_node(make_node(f"new{step}", 4, T4, cpu_milli=8_000))
    assert came_back >= 1


def test_a_retry_pass_over_groups_registered_later():
    """The live queue's arrays grow ahead of its groups (``register``): a pass still tries what fits, in order."""
    reqs = [req("run", gpu_count=2)]
    sh = _Shell(reqs, [make_node("n", 2, T4, cpu_milli=64_000)])
    assert sh.sched.schedule(reqs[0]).ok
    late = [sh.pending.register(req(f"s{k}", gpu_milli=100 * (k + 1))) for k in range(9)]
    assert len(sh.pending.count) > len(sh.pending.group_list)
    for k, i in enumerate(late):
        sh.pending.add(i, float(k))
    sh.sched.forget("t/run")
    sh.pending.freed.add(0)
    sh.retry()
    assert [k for k, _ in sh.tries][:3] == ["t/s0", "t/s1", "t/s2"] and all(f for _, f in sh.tries)


def test_a_pod_nominated_during_a_pass_goes_first_when_its_group_comes_back():
    """A pass orders heads by their entries alone while nobody is nominated; should a head that comes back into the
    pass be nominated by then, it goes before the others, as ``sort_key`` with the nominations says."""
    reqs = [req("run", gpu_count=4), req("a1", gpu_milli=500), req("a2", gpu_milli=500), req("b1", gpu_milli=250)]
    for nominate in (False, True):
        sh = _Shell(list(reqs), [make_node("n", 4, T4, cpu_milli=64_000)])
        assert sh.sched.schedule(reqs[0]).ok
        for i, seen in ((1, 0.0), (2, 2.0), (3, 1.0)):
            sh.pending.add(i, seen)
        sh.sched.forget("t/run")
        sh.pending.freed.add(0)
        inner = sh.attempt

        def attempt(i, fits, plan, inner=inner, sh=sh, nominate=nominate):
            a = inner(i, fits, plan)
            if nominate and sh.reqs[i].name == "a1":
                sh.pending.nominated.add("t/a2")  # (as if victims were deleted for it meanwhile)
            return a

        sh.pending.retry(sh.round, 0.0, attempt)
        assert [k for k, _ in sh.tries] == (["t/a1", "t/a2", "t/b1"] if nominate else ["t/a1", "t/b1", "t/a2"])
