"""Filters, scores, GPU selection, config validation and whole cycles through the framework."""

from __future__ import annotations

import pytest

from gpufleet.engine.errors import ConfigError
from gpufleet.engine.framework import Scheduler
from gpufleet.engine.model import Taint
from gpufleet.engine.podspec import parse_pod
from gpufleet.engine.state import ClusterState
from gpufleet.policies import build_profile, registry

from .builders import gpu_node, mig_node, pod


def sched(nodes, policy="bestfit"):
    return Scheduler(build_profile(policy), ClusterState(nodes), seed=0)


# (nodes, pod, expected reason fragment) -- every node fails for the same reason
REJECT = [
    ([gpu_node("a", 1)], pod(gpus=2), "Insufficient nvidia.com/gpu"),
    ([gpu_node("a", 1, cpu_milli=1000)], pod(cpu="2", gpus=1), "Insufficient cpu"),
    ([gpu_node("a", 1, mem_mib=512)], pod(memory="1Gi", gpus=1), "Insufficient memory"),
    ([gpu_node("a", 1, model="T4")], pod(gpus=1, annotations={"gpufleet.io/gpu-models": "H100"}), "allowed model"),
    ([gpu_node("a", 1, model="T4")], pod(gpus=1, annotations={"gpufleet.io/gpu-models-deny": "T4"}), "allowed model"),
    ([gpu_node("a", 1, memory_mib=16384)], pod(gpus=1, annotations={"gpufleet.io/gpu-memory": "20Gi"}), "GPU memory"),
    ([gpu_node("a", 1, taints=(Taint("gpu", "x", "NoSchedule"),))], pod(gpus=1), "taint"),
    ([gpu_node("a", 1, unschedulable=True)], pod(gpus=1), "unschedulable"),
    ([gpu_node("a", 1)], pod(gpus=1, nodeSelector={"zone": "b"}), "affinity"),
    ([gpu_node("a", 2)], pod(extra_resources={"nvidia.com/mig-1g.10gb": "1"}), "Insufficient nvidia.com/mig-1g.10gb"),
]


@pytest.mark.parametrize("nodes,p,reason", REJECT)
def test_filters_reject_with_reason(nodes, p, reason):
    s = sched(nodes)
    d = s.schedule(parse_pod(p))
    assert not d.ok
    assert reason in d.status.message
    assert d.status.message.startswith("unschedulable: 0/1 nodes are available")


def test_tolerated_taint_and_matching_affinity_pass():
    n = gpu_node("a", 1, taints=(Taint("gpu", "x", "NoSchedule"),), labels={"zone": "b", "gpus": "8"})
    p = pod(gpus=1, nodeSelector={"zone": "b"}, tolerations=[{"key": "gpu", "operator": "Equal", "value": "x", "effect": "NoSchedule"}],
            affinity={"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                {"matchExpressions": [{"key": "gpus", "operator": "Gt", "values": ["4"]}]}]}}})
    assert sched([n]).schedule(parse_pod(p)).ok


def test_diagnosis_aggregates_like_kubernetes():
    nodes = [gpu_node(f"t{i}", 1) for i in range(3)] + [gpu_node("tainted", 4, taints=(Taint("k", "v", "NoExecute"),))]
    d = sched(nodes).schedule(parse_pod(pod(gpus=2)))
    msg = d.status.message
    assert msg.startswith("unschedulable: 0/4 nodes are available: 3 Insufficient nvidia.com/gpu, 1 node(s) had untolerated taint")


def test_next_cycle_sees_reserved_gpus_and_unreserve_restores():
    s = sched([gpu_node("a", 2)])
    d1 = s.schedule(parse_pod(pod("p1", gpus=1)))
    d2 = s.schedule(parse_pod(pod("p2", gpus=1)))
    assert d1.ok and d2.ok and set(d1.assignment.gpu_indices) | set(d2.assignment.gpu_indices) == {0, 1}
    assert not s.schedule(parse_pod(pod("p3", gpus=1))).ok
    s.forget(d1.assignment.pod_key)
    assert s.schedule(parse_pod(pod("p3", gpus=1))).ok


def test_shared_pods_stack_on_one_gpu():
    s = sched([gpu_node("a", 2)])
    ds = [s.schedule(parse_pod(pod(f"s{i}", gpus=1, annotations={"gpufleet.io/gpu-milli": "250"}))) for i in range(4)]
    assert all(d.ok for d in ds)
    assert len({d.assignment.gpu_indices for d in ds}) == 1


def test_mig_pod_gets_a_mig_instance():
    s = sched([mig_node("m")])
    d = s.schedule(parse_pod(pod(extra_resources={"nvidia.com/mig-1g.10gb": "1"})))
    assert d.ok and d.assignment.mig and d.assignment.mig_profile == "1g.10gb"


def test_multi_gpu_pod_stays_on_one_nvlink_island():
    s = sched([gpu_node("a", 4, nvlink=True)])
    d = s.schedule(parse_pod(pod(gpus=2)))
    assert d.ok and len(d.assignment.gpu_indices) == 2


class FailingBinder:
    def bind(self, assignment):
        raise RuntimeError("apiserver said no")


def test_bind_failure_unreserves():
    s = sched([gpu_node("a", 1)])
    before = s.state.gpu_free_milli.copy()
    d = s.schedule_and_bind(parse_pod(pod(gpus=1)), FailingBinder())
    assert not d.ok and "bind failed" in d.status.message
    assert (s.state.gpu_free_milli == before).all()


def test_explain_lists_every_node():
    s = sched([gpu_node("a", 1), gpu_node("b", 0)])
    d = s.explain(parse_pod(pod(gpus=1)))
    assert d.ok and set(d.diagnosis.by_node) == {"a", "b"} and d.diagnosis.by_node["a"] == "fits"


@pytest.mark.parametrize("cfg,msg", [
    ({"profiles": [{"name": "x", "plugins": {"score": [{"name": "NoSuchPlugin", "weight": 1}]}}]}, "unknown plugin 'NoSuchPlugin'"),
    ({"profiles": [{"name": "x", "plugins": {"filter": ["LeastAllocated"]}}]}, "does not implement the filter extension point"),
    ({"profiles": [{"name": "x", "plugins": {"score": [{"name": "LeastAllocated", "weight": 0}]}}]}, "weight must be a positive integer"),
    ({"profiles": [{"name": "x", "plugins": {"scroe": []}}]}, "unknown extension point"),
    ({"profiles": [{"name": "x", "tieBreak": "coin"}]}, "tieBreak"),
    ({"profiles": []}, "non-empty 'profiles'"),
])
def test_config_errors_are_clear(cfg, msg):
    with pytest.raises(ConfigError) as exc:
        build_profile(cfg)
    assert msg in str(exc.value)


def test_every_policy_profile_builds():
    from gpufleet.policies import policy_names

    names = policy_names()
    assert {"random", "dotprod", "clustering", "packing", "bestfit", "fgd", "default"} <= set(names)
    for n in names:
        assert build_profile(n).scores
    assert "FGDScore" in registry().names()


def test_learning_plugins_see_every_pod_and_post_score_is_never_cached():
    """observe_pod runs for a pod no node fits; post_score runs every cycle on top of cached raw scores."""
    import numpy as np

    from gpufleet.engine.framework import Profile

    class Learner:
        name = "Learner"

        def __init__(self):
            self.seen: list[str] = []
            self.scored = 0
            self.bonus = 0.0

        def observe_pod(self, cycle):
            self.seen.append(cycle.request.name)

        def cache_key(self, cycle):
            return "same"

        def score(self, cycle, state, nodes):
            self.scored += nodes.size
            return np.zeros(nodes.size)

        def normalize(self, raw):
            return raw

        def post_score(self, cycle, state, nodes, raw):
            self.bonus += 1.0
            return raw + np.where(nodes == 1, self.bonus, 0.0)

    learner = Learner()
    prof = build_profile("bestfit")
    prof = Profile(name="t", filters=prof.filters, scores=[(learner, 1)], gpu_selector=prof.gpu_selector)
    s = Scheduler(prof, ClusterState([gpu_node("a", 2), gpu_node("b", 2)]), seed=0)
    assert not s.schedule(parse_pod(pod(gpus=4, name="toobig"))).ok
    assert learner.seen == ["toobig"] and learner.scored == 0  # learned from, never scored
    d1 = s.decide(s.new_cycle(parse_pod(pod(gpus=1, name="x"))))
    d2 = s.decide(s.new_cycle(parse_pod(pod(gpus=1, name="y"))))
    assert d1.assignment.node == d2.assignment.node == "b"
    assert learner.scored == 2  # the second cycle hit the cache for both nodes
    assert learner.bonus == 2.0  # but the per-cycle part ran in both


def test_plugins_that_share_a_learner_have_it_called_once_per_cycle():
    """The default profile's five learning plugins hand each pod to one WorkloadModel (``observes``): the framework
    calls it once per cycle, and it still learns every pod once, also one no node fits."""
    from gpufleet.policies.default import WorkloadModel

    s = Scheduler(build_profile("default"), ClusterState([gpu_node("a", 2), gpu_node("b", 2)]), seed=0)
    assert len(s._observers) == 1 and isinstance(s._observers[0], WorkloadModel)
    model = s._observers[0]
    calls = []
    real = model.observe_pod
    model.observe_pod = lambda cycle: (calls.append(cycle.request.name), real(cycle))[1]  # type: ignore[method-assign]
    before = model._seen
    assert not s.schedule(parse_pod(pod(gpus=4, name="toobig"))).ok
    assert s.schedule(parse_pod(pod(gpus=1, name="x"))).ok
    assert calls.count("toobig") >= 1 and calls.count("x") >= 1
    assert model._seen == before + 2  # each pod learned once, however often it was handed over


def test_a_shared_observer_hands_the_pod_to_the_learner_it_names():
    """``SharedObserver``: ``observes`` is the attribute ``observed_attr`` names, and ``observe_pod`` hands the
    cycle's pod to it (the default's plugins name their ``model``, FGD's descent its ``learner``)."""
    from gpufleet.engine.framework import SharedObserver

    class Learner:
        def __init__(self) -> None:
            self.seen: list[str] = []

        def observe_pod(self, cycle):
            self.seen.append(cycle.request.name)

    class ByModel(SharedObserver):
        def __init__(self) -> None:
            self.model = Learner()

    class ByLearner(SharedObserver):
        observed_attr = "learner"

        def __init__(self) -> None:
            self.learner = Learner()
            self.model = None

    s = Scheduler(build_profile("default"), ClusterState([gpu_node("a", 2)]), seed=0)
    cycle = s.new_cycle(parse_pod(pod(gpus=1, name="p")))
    for plugin in (ByModel(), ByLearner()):
        plugin.observe_pod(cycle)
        assert plugin.observes is getattr(plugin, plugin.observed_attr)
        assert plugin.observes.seen == ["p"]
    learners = {id(p.observes) for p, _ in s.profile.scores if isinstance(p, SharedObserver)}
    assert learners == {id(s._observers[0])}  # the default's learning score plugins share one learner


def test_score_plugin_hooks_follow_the_profile_list():
    """The score plugins' optional hooks are looked up once per list: a plugin appended later is scored too."""
    import numpy as np

    from gpufleet.engine.framework import Profile

    class Bonus:
        name = "Bonus"

        def cache_key(self, cycle):
            return None

        def normalize(self, raw):
            return raw

        def applies(self, cycle, state):
            return True

        def score(self, cycle, state, nodes):
            return np.where(nodes == 0, 1000.0, 0.0)

    base = build_profile("bestfit")
    prof = Profile(name="t", filters=base.filters, scores=list(base.scores), gpu_selector=base.gpu_selector)
    s = Scheduler(prof, ClusterState([gpu_node("a", 2), gpu_node("b", 2)]), seed=0)
    first = s.decide(s.new_cycle(parse_pod(pod(gpus=1, name="x"))))
    prof.scores.append((Bonus(), 1))
    again = s.decide(s.new_cycle(parse_pod(pod(gpus=1, name="y"))))
    assert again.assignment.node == "a" and again.score >= 1000.0
    assert first.score < 1000.0
