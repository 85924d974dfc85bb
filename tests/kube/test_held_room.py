"""Room a policy holds for pods not yet here (the default's CPU reserve) goes before running pods.

A pod that could preempt, or a queue that could reclaim, must not evict a running pod while the
CPU it needs sits free, kept for GPU pods that have not come: the live loop, the replay and the
gang paths place it in that held room instead (``schedqueue.plan_room`` plans ``held``).
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from gpufleet.engine.gang import GangScheduler
from gpufleet.engine.model import PodRequest
from gpufleet.engine.schedqueue import plan_room
from tests.kube.fake_api import FakeApi
from gpufleet.policies.default import CpuReserve
from tests.builders import T4, make_node, scheduler
from tests.kube.test_loop import Clock, make, node, pod

R = CpuReserve.REASON


# --- the planner -----------------------------------------------------------------------------------

def _gpu_pod(name: str) -> PodRequest:
    return PodRequest(name=name, cpu_milli=4000, memory_mib=1024, gpu_count=1, gpu_milli=1000)


def _cpu_pod(name: str, cpu: int, priority: int = 0, on: str | None = None, group: str | None = None) -> PodRequest:
    return PodRequest(name=name, cpu_milli=cpu, memory_mib=1024, priority=priority,
                      node_selector=((("kubernetes.io/hostname", on),) if on else ()),
                      pod_group=group, pod_group_min=2 if group else 0)


def _cpu_short(cpu_reserve: float = 1.0):
    """g0 (32 cores, 4 T4), g1 (24 cores, 4 T4), c0 (16 cores); a learned workload at 4 cores per GPU
    whose CPU demand outruns the cluster's: a free GPU keeps 4 cores from CPU-only pods.
    A low-priority 16-core pod fills c0, an 8-core one sits on g0 beside g0's reserve (16 of 24 free)."""
    s = scheduler([make_node("g0", 4, T4, cpu_milli=32_000), make_node("g1", 4, T4, cpu_milli=24_000),
                   make_node("c0", 0, cpu_milli=16_000)], "default")
    for p in s.profile.filters:
        if isinstance(p, CpuReserve):
            p.args = replace(p.args, cpu_reserve=cpu_reserve)
    for r in [_gpu_pod(f"seen-g{i}") for i in range(64)] + [_cpu_pod(f"seen-c{i}", 8000) for i in range(48)]:
        s.observe(r)
    assert s.schedule(_cpu_pod("low-c0", 16_000, on="c0")).ok
    assert s.schedule(_cpu_pod("low-g0", 8000, on="g0")).ok
    return s


def test_a_pod_that_could_preempt_takes_held_room_and_nobody_is_evicted():
    s = _cpu_short()
    urgent = _cpu_pod("urgent", 12_000, priority=100)
    d = s.schedule(urgent)
    assert not d.ok and R in d.status.message  # only the reserve keeps it out: g0 has 24 cores free
    rp = plan_room(s, None, urgent)
    assert rp is not None and rp.kind == "held" and rp.victims == [] and rp.node in ("g0", "g1")
    assert "rather than evict" in rp.explanation[0]
    d = s.schedule(urgent, take_held=True)
    assert d.ok and d.assignment.node == rp.node


def test_without_a_reserve_the_same_pod_preempts():
    # the control: the policy with the reserve off evicts as before (and no held plan is made up)
    s = _cpu_short(cpu_reserve=0.0)
    urgent = _cpu_pod("urgent", 28_000, priority=100)  # more than any node has free: someone must go
    rp = plan_room(s, None, urgent)
    assert rp is not None and rp.kind == "preempted" and [v.pod_key for v in rp.victims] == ["default/low-g0"]


def test_held_room_that_is_not_enough_still_preempts_and_the_pod_takes_both():
    s = _cpu_short()
    urgent = _cpu_pod("urgent", 28_000, priority=100)  # g0 has 24 free: only an eviction makes room
    rp = plan_room(s, None, urgent)
    # one victim, not more: the 16 cores g0 keeps for its free GPUs go to the pod that evicts as well
    assert rp is not None and rp.kind == "preempted" and [v.pod_key for v in rp.victims] == ["default/low-g0"]
    s.forget("default/low-g0")
    assert not s.schedule(urgent).ok  # without held room it would still not fit: the caller must pass take_held
    d = s.schedule(urgent, take_held=True)
    assert d.ok and d.assignment.node == "g0"


def test_a_gang_takes_held_room_before_it_evicts():
    s = _cpu_short()
    gangs = GangScheduler(s)
    for i in range(2):
        gangs.add(_cpu_pod(f"w{i}", 10_000, priority=100, group="job"), now=0.0)
    assert not any(r.ok for r in gangs.step(now=1.0))  # 2 x 10 cores: only in g0's or g1's reserve
    res = gangs.place_in_held_room("default/job", now=2.0)
    assert res is not None and res.ok and len(res.placed) == 2
    assert {d.assignment.node for d in res.placed} <= {"g0", "g1"} and "default/low-g0" in s.state.assignments


def test_a_gang_that_waited_past_the_limit_may_use_the_reserve():
    s = _cpu_short()
    gangs = GangScheduler(s)
    for i in range(2):
        gangs.add(_cpu_pod(f"w{i}", 10_000, group="job"), now=0.0)
    assert not any(r.ok for r in gangs.step(now=599.0))
    res = {r.group: r for r in gangs.step(now=600.0)}["default/job"]  # since it was first seen, like a single pod
    assert res.ok and np.all([d.assignment.node in ("g0", "g1") for d in res.placed])


# --- the replay --------------------------------------------------------------------------------------

def _replay(urgent_cpu: int, gang: bool = False):
    """The planner's cluster in the trace replay: 64 GPU pods that ask 33 cores per GPU (they never fit;
    they are learned from), then a low-priority 16-core pod (c0), then urgent CPU-only work."""
    from gpufleet.engine.model import Gpu, Node
    from gpufleet.simulator.experiments.replay import run_replay
    from gpufleet.simulator.traces.workload import Workload

    def n(name, gpus, cores):
        return Node(name, cores * 1000, 262144, tuple(Gpu(j, f"{name}-g{j}", "T4", 15360) for j in range(gpus)),
                    labels={"kubernetes.io/hostname": name}, max_pods=110)

    reqs = [PodRequest(f"gpu{k}", "t", cpu_milli=33_000, memory_mib=1024, gpu_count=1, gpu_milli=1000) for k in range(64)]
    reqs.append(PodRequest("low", "t", cpu_milli=16_000, memory_mib=1024))
    if gang:
        reqs += [PodRequest(f"w{k}", "t", cpu_milli=urgent_cpu, memory_mib=1024, priority=100, pod_group="job",
                            pod_group_min=2) for k in range(2)]
    else:
        reqs.append(PodRequest("urgent", "t", cpu_milli=urgent_cpu, memory_mib=1024, priority=100))
    t = np.array([0.0] * 64 + [1.0] + [2.0] * (len(reqs) - 65))
    wl = Workload(reqs, t, np.full(len(reqs), 1000.0), np.full(len(reqs), np.nan))
    return run_replay([n("g0", 4, 32), n("g1", 4, 24), n("c0", 0, 16)], wl, "default", warmup=0.0, frag=False)


def test_replay_a_high_priority_pod_takes_held_cpu_and_nobody_is_preempted():
    r = _replay(8_000)
    assert r.preemptions == 0 and r.held_taken == 1
    assert r.pods_placed == 2  # low and urgent; the GPU pods never fit


def test_replay_a_high_priority_gang_takes_held_cpu_and_nobody_is_preempted():
    r = _replay(10_000, gang=True)
    assert r.preemptions == 0 and r.held_taken == 2 and r.pods_placed == 3


def test_replay_a_pod_too_big_for_any_node_preempts_nobody():
    r = _replay(40_000)
    assert r.preemptions == 0 and r.held_taken == 0 and r.pods_placed == 1


# --- the live loop (in-process fake API) --------------------------------------------------------------

def _live_cpu_short():
    """The live test's cluster: GPU pods waiting ask 33 cores per GPU, so every GPU node keeps all its CPU."""
    api = FakeApi()
    api.add_node(node("g0", gpus=4, inventory=True, cpu="32"))
    api.add_node(node("g1", gpus=4, inventory=True, cpu="24"))
    api.add_node(node("c0", gpus=0, cpu="16"))
    for i in range(64):
        api.add_pod(pod(f"gpu-{i}", gpus=1, cpu="33"))
    api.add_pod(pod("low", gpus=0, cpu="16"))
    clock = Clock()
    loop = make(api, clock, policy="default")
    loop.schedule_due()
    assert api.binds == [("ml/low", "c0")]
    return api, loop, clock


def _live_pod(name: str, cpu: str, priority: int = 0, annotations: dict | None = None) -> dict:
    p = pod(name, gpus=0, cpu=cpu, annotations=annotations)
    p["spec"]["priority"] = priority
    return p


def _submit(api, loop, clock, *pods: dict) -> None:
    """The pods are created, the loop sees them through its watches, and a second later tries them."""
    for p in pods:
        api.add_pod(p)
    for kind in loop.cache.watch_kinds:
        for t, obj in api.watch(kind, loop.cache.rv[kind]):
            loop.handle(kind, t, obj)
    clock.t += 1
    loop.schedule_due()


def test_live_a_high_priority_pod_takes_held_cpu_instead_of_evicting_a_running_pod():
    api, loop, clock = _live_cpu_short()
    _submit(api, loop, clock, _live_pod("urgent", "8", priority=100))
    assert not api.evicted
    assert api.binds[-1][0] == "ml/urgent" and api.binds[-1][1] in ("g0", "g1")
    assert loop.stats.held_room == 1 and loop.stats.preempted == 0
    assert not [e for e in api.events if e["pod"] == "ml/urgent" and e["reason"] in ("FailedScheduling", "Preempting")]


def test_live_a_pod_of_equal_priority_still_waits_for_the_reserve():
    api, loop, clock = _live_cpu_short()
    _submit(api, loop, clock, _live_pod("same", "8"))
    assert not api.evicted and [b for b in api.binds if b[0] == "ml/same"] == []
    assert loop.stats.held_room == 0
    assert R in [e for e in api.events if e["pod"] == "ml/same"][-1]["message"]


def test_live_a_high_priority_gang_takes_held_cpu_instead_of_evicting():
    api, loop, clock = _live_cpu_short()
    g = {"gpufleet.io/pod-group": "job", "gpufleet.io/pod-group-min-member": "2"}
    _submit(api, loop, clock, *[_live_pod(f"w{i}", "10", priority=100, annotations=g) for i in range(2)])
    assert not api.evicted
    assert sorted(b[0] for b in api.binds if b[0].startswith("ml/w")) == ["ml/w0", "ml/w1"]
    assert loop.stats.held_room == 2


def test_explain_says_a_pod_that_could_preempt_takes_held_room():
    api, loop, _ = _live_cpu_short()
    summary, _ = loop.explain(_live_pod("urgent", "8", priority=100))
    assert R in summary and "held room (dry run): fits on g" in summary and "rather than evict anyone" in summary
    assert "preemption (dry run)" not in summary and "ml/low" in loop.cache.state.assignments
    summary, _ = loop.explain(_live_pod("same", "8"))  # priority 0: nothing to preempt, so it waits for the reserve
    assert R in summary and "held room" not in summary


def test_explain_counts_how_long_the_pod_has_waited():
    # the reserve lets a pod in once it has waited reserve_max_wait_s since its creation; explain must say what the
    # scheduler's next try would do, not what it did when the pod was new
    import datetime

    api, loop, clock = _live_cpu_short()
    old = _live_pod("old", "8")
    created = datetime.datetime.now(datetime.timezone.utc) - datetime.timedelta(minutes=11)
    old["metadata"]["creationTimestamp"] = created.strftime("%Y-%m-%dT%H:%M:%SZ")
    api.add_pod(old)
    for kind in loop.cache.watch_kinds:
        for t, obj in api.watch(kind, loop.cache.rv[kind]):
            loop.handle(kind, t, obj)
    summary, _ = loop.explain(old)
    assert summary.startswith("fits: best node g"), summary
    summary, _ = loop.explain(_live_pod("new", "8"))  # not seen by the queue yet: it has not waited
    assert R in summary
