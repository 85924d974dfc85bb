"""Queueing hints (``schedqueue.QueueingHint``, ``PendingGroups.asleep``): a waiting pod that the plugins which turned
it away show no node can pass is left asleep, and only such a pod (a try of it fails); the replay's outputs are the
same with and without them."""

from __future__ import annotations

import numpy as np
import pytest

from gpufleet.engine.model import PodRequest
from gpufleet.engine.pending import PendingGroups
from gpufleet.engine.round import SchedulingRound
from gpufleet.engine.schedqueue import queueing_hints, requeue_hints
from gpufleet.policies import build_profile, profile_config

from tests.builders import T4, RoundShell, make_node, scheduler

REASON = "node(s) kept their whole GPUs for pods that fill them (whole GPUs are scarce)"


def share(name: str, milli: int, cpu: int = 2000, node: str | None = None) -> PodRequest:
    sel = (("kubernetes.io/hostname", node),) if node else ()
    return PodRequest(name=name, cpu_milli=cpu, memory_mib=1024, gpu_count=1, gpu_milli=milli, node_selector=sel)


def default_with_reserve() -> dict:
    cfg = dict(profile_config("default")["profiles"][0])
    cfg["pluginConfig"] = {"WholeGpuReserve": {"whole_reserve": 1.0}}
    return cfg


class _Shell(RoundShell):
    """The smallest shell of the round over the default profile: two nodes of 4 T4s, a workload learned in which the
    whole-GPU reserve keeps whole GPUs once they are scarce; nothing lower to preempt."""

    def __init__(self, reqs: list[PodRequest]) -> None:
        self.sched = scheduler([make_node("n0", 4, T4, cpu_milli=64_000), make_node("n1", 4, T4, cpu_milli=64_000)],
                               default_with_reserve())
        for k, milli in enumerate([1000] * 32 + [810] * 24 + [470] * 8):
            self.sched.observe(share(f"seen{k}", milli))
        self.reqs, self.tree = reqs, None
        for r in reqs:
            self.sched.observe(r)  # as the replay shows every pod when it arrives
        self.pending = PendingGroups(reqs, requeue_hints(self.sched.profile))
        self.round = SchedulingRound(self, self, self)
        self.tries: list[str] = []

    def attempt(self, i: int, fits: bool | None, plan: bool):
        self.tries.append(self.reqs[i].key)
        return self.round.try_pod(self.reqs[i], 0.0, 0.0, fits=fits, plan=plan)

    def retry(self, hints: bool = True) -> None:
        self.pending.retry(self.round, 0.0, self.attempt, (lambda i: 0.0) if hints else None)

    def arrive(self, i: int) -> None:
        self.attempt(i, None, True)



def scarce(sh: _Shell) -> None:
    """n0: a 150 and an 810 on one GPU (40 free), two whole GPUs in use, one whole GPU free; n1 full: 1 of 8 whole."""
    for k, (node, milli) in enumerate((("n0", 150), ("n0", 1000), ("n0", 1000), ("n1", 1000), ("n1", 1000),
                                       ("n1", 1000), ("n1", 1000))):
        assert sh.sched.schedule(share(f"placed{k}", milli, node=node)).ok
    d = sh.sched.schedule(share("x", 810))
    assert d.ok and d.assignment is not None and d.assignment.node == "n0"


def test_the_hints_of_a_profile_are_its_filters_that_give_one():
    assert set(queueing_hints(build_profile("default"))) == {"WholeGpuReserve"}
    assert queueing_hints(build_profile("fgd")) == {} and queueing_hints(build_profile("bestfit")) == {}


def test_a_share_the_reserve_keeps_out_sleeps_until_a_node_passes_it():
    """An 810 waits: the one whole GPU left is kept (scarce) and no GPU in use has 810 free.  A whole GPU freed on n0
    gives it room there but the reserve still keeps it: the hint leaves it asleep (no try), and a full try says the
    same.  Once the 810 beside the 150 leaves, a GPU in use has 850 free: it is woken and placed there."""
    sh = _Shell([share("y", 810)])
    scarce(sh)
    sh.arrive(0)
    assert "default/y" not in sh.sched.state.assignments and sh.pending.rejected[0] >= {"WholeGpuReserve"}
    sh.sched.forget("default/placed1")  # a whole GPU of n0 free again: room for y there by count and milli
    sh.pending.freed.add(0)
    assert sh.pending.fits_on(0, sh.sched.state, [0])
    sh.retry()
    assert sh.tries == ["default/y"] and 0 in sh.pending  # only its arrival: asleep
    assert not sh.sched.decide(sh.sched.new_cycle(share("y", 810))).ok  # a try would have failed
    sh.pending.freed.add(0)
    sh.retry(hints=False)  # without the hints: tried, and told to wait as before
    assert sh.tries == ["default/y", "default/y"] and 0 in sh.pending and sh.pending.rejected[0] >= {"WholeGpuReserve"}
    sh.sched.forget("default/x")  # the GPU with the 150 has 850 free
    sh.pending.freed.add(0)
    sh.retry()
    assert sh.tries == ["default/y"] * 3 and "default/y" in sh.sched.state.assignments and 0 not in sh.pending


def test_a_node_that_changed_without_a_pod_leaving_counts_too():
    """The reserve keeps the whole GPU freed on n1 from the 810, but a 150 placed meanwhile on n0's whole GPU left 850
    free on a GPU in use there (a placement: no node gained room).  The try would place the 810 on n0: it is woken,
    and placed there."""
    sh = _Shell([share("y", 810)])
    scarce(sh)
    sh.arrive(0)
    assert 0 in sh.pending
    small = share("small", 150, node="n0")
    sh.sched.observe(small)
    assert sh.sched.schedule(small).ok and int(sh.sched.state.gpu_free_milli[0].max()) == 850
    sh.sched.forget("default/placed3")  # a whole GPU on n1: kept by the reserve
    sh.pending.freed.add(1)
    assert not sh.pending.asleep(0, sh.round, 0.0)
    sh.retry()
    assert sh.tries == ["default/y"] * 2 and sh.sched.state.assignments["default/y"].node == "n0"


def test_the_live_queue_leaves_the_same_pods_asleep():
    """The live loop's wake-ups ask the same hints: with the round and the pods' waits, a pod the hints leave asleep
    is not woken (its backoff still runs out); without them, or once it waited past the reserve's limit, it is."""
    from gpufleet.engine.schedqueue import Change
    from gpufleet.kube.scheduling_queue import SchedulingQueue

    sh = _Shell([share("y", 810)])
    scarce(sh)
    sh.arrive(0)
    sh.sched.forget("default/placed1")
    st, rnd = sh.sched.state, sh.round
    for waited, woken in ((None, [0]), (0.0, []), (600.0, [0])):
        sh.pending.freed.add(0)
        by_pod = None if waited is None else {0: waited}.__getitem__
        assert sh.pending.woken(st, rnd if by_pod is not None else None, by_pod) == woken, waited
    q = SchedulingQueue(lambda: 0.0, hints=requeue_hints(sh.sched.profile))
    y = sh.reqs[0]
    for with_round, due in ((True, []), (False, [y.key])):
        q.add(y.key, {})
        q.defer(y.key, rejected=(y, sh.pending.rejected[0]))  # parked, backing off
        q.changed(Change((0,)), st, rnd if with_round else None)
        assert [k for k, _ in q.ready(0.0)] == due, with_round


def test_a_pod_is_not_left_asleep_when_a_try_could_do_more_than_fail():
    """Nominated pods, a pod a learner has not seen, a pod that waited past the reserve's limit: always tried."""
    sh = _Shell([share("y", 810)])
    scarce(sh)
    sh.arrive(0)
    sh.sched.forget("default/placed1")
    rnd, y = sh.round, sh.reqs[0]
    assert sh.pending.asleep(0, rnd, 0.0)
    assert not sh.pending.asleep(0, rnd, 600.0)  # waited long enough: the reserve steps aside
    rnd.nominate(share("other", 1000), "n1")
    assert not sh.pending.asleep(0, rnd, 0.0)  # room kept for a nominated pod: the round's business
    rnd.nominations.clear()
    learner = sh.sched._observers[0]
    learner._keys.pop(y.uid or y.key)
    assert sh.sched.learns_from(y) and not sh.pending.asleep(0, rnd, 0.0)  # its try would teach the learner
    learner._keys[y.uid or y.key] = None
    assert sh.pending.asleep(0, rnd, 0.0)
    hints = sh.pending.hints
    sh.pending.hints = {**hints, "GpuFit": "pods"}  # a filter its cycle runs could keep its group out by a count
    assert not sh.pending.asleep(0, rnd, 0.0)
    sh.pending.hints = hints
    assert sh.pending.asleep(0, rnd, 0.0)
    sh.pending.rejected[0] = frozenset({"CouldFit"})  # turned away by the shell's screen: no plugin to ask
    assert not sh.pending.asleep(0, rnd, 0.0)


def test_asleep_only_when_no_node_passes_the_cycle():
    """Shares come and go at random on the two nodes; whenever the hints leave a waiting pod asleep, its cycle fails
    (the certificate is exact), and they do so more than a few times (the test can fail)."""
    rng = np.random.default_rng(11)
    # 810s often, a few 150s: what is seen seldom fills an 810's 190 (the reserve keeps whole GPUs from 810s), and a
    # 150 on a whole GPU leaves 850 on a GPU in use, where an 810 passes without any pod leaving
    sizes = [810, 810, 470, 1000, 300, 150]
    waiting = [share(f"w{k}", m) for k, m in enumerate([810, 470, 860, 300, 1000])]
    sh = _Shell(waiting)
    running: list[str] = []
    asleep = checked = 0
    for step in range(300):
        if running and (rng.random() < 0.45 or len(running) > 12):
            key = running.pop(int(rng.integers(len(running))))
            node = sh.sched.state.assignments[key].node
            sh.sched.forget(key)
            sh.pending.freed.add(sh.sched.state.index[node])
        else:
            r = share(f"s{step}", int(rng.choice(sizes)), node=str(rng.choice(["n0", "n1"])))
            sh.sched.observe(r)
            if sh.sched.schedule(r).ok:
                running.append(r.key)
        for i, r in enumerate(waiting):
            if i not in sh.pending:
                sh.arrive(i)  # waits, or is placed: then it leaves at once and comes again next step
                if r.key in sh.sched.state.assignments:
                    sh.sched.forget(r.key)
                continue
            if sh.pending.asleep(i, sh.round, 0.0):
                asleep += 1
                assert not sh.sched.decide(sh.sched.new_cycle(r)).ok, (step, r.key)
            checked += 1
        sh.pending.freed.clear()
    assert asleep > 10 and checked > asleep


@pytest.mark.slow
def test_a_replay_gives_the_same_with_and_without_the_hints(monkeypatch):
    """The default policy on part of the bundled trace, where the reserve turns shares away: the hints leave a few
    hundred tries out, and every placement (pod, node, GPUs, time) and every figure of the run is the same."""
    from gpufleet.cli import replay_cli
    from gpufleet.engine import pending
    from gpufleet.simulator.experiments import replay
    from gpufleet.simulator.traces import trace as tracemod

    nodes, tr, _ = replay_cli._load(None, str(tracemod.bundled(tracemod.DEFAULT_PODS)), False, 1.0)
    slept = [0]
    asleep = pending.PendingGroups.asleep

    def counted(self, *a):
        out = asleep(self, *a)
        slept[0] += out
        return out

    monkeypatch.setattr(pending.PendingGroups, "asleep", counted)
    binds = replay._Replay.bind
    runs = []
    for hints in (False, True):
        placed: list[tuple] = []

        def bind(self, attempt, placed=placed):
            a = attempt.decision.assignment
            placed.append((attempt.request.key, a.node, a.gpu_indices, a.gpu_milli, self.now))
            binds(self, attempt)

        monkeypatch.setattr(replay._Replay, "hints", hints)
        monkeypatch.setattr(replay._Replay, "bind", bind)
        r = replay.run_replay(nodes[:200], tr.pods[:2000], "default", load=1.0, copies=1, warmup=0.0)
        runs.append((r.to_json() | {"wall_s": 0}, placed))
        assert slept[0] > (100 if hints else -1)
        if not hints:
            assert slept[0] == 0
    assert runs[0][1] and runs[0] == runs[1]
