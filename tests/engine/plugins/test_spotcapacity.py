"""SpotCapacity: which pods may use spot nodes, which prefer them, gangs on one capacity type, interruption notices."""

from __future__ import annotations

import pytest

from gpufleet.engine.capacity import PROVIDER_SPOT_LABELS, SpotConfig
from gpufleet.engine.errors import ConfigError, InvalidPodSpec
from gpufleet.engine.framework import Scheduler
from gpufleet.engine.gang import place_gang
from gpufleet.engine.model import Taint
from gpufleet.engine.plugins.spotcapacity import R_NOTICE, R_SPOT, SpotCapacity, make
from gpufleet.policies import build_profile, registry

from tests.builders import make_node, make_pod, scores, state_of, verdicts

KARPENTER_SPOT = {"karpenter.sh/capacity-type": "spot"}
KARPENTER_OD = {"karpenter.sh/capacity-type": "on-demand"}


def _cluster():
    return state_of(
        make_node("od", gpus=4, labels=KARPENTER_OD),
        make_node("spot", gpus=4, labels=KARPENTER_SPOT),
        make_node("plain", gpus=4),
    )


def _pod(name="p", spot=None, pclass=None, **kw):
    ann = dict(kw.pop("annotations", {}) or {})
    if spot is not None:
        ann["gpufleet.io/spot"] = spot
    extra = {"priorityClassName": pclass} if pclass else {}
    return make_pod(name, gpu=1, annotations=ann or None, **extra, **kw)


@pytest.mark.parametrize("key, value", PROVIDER_SPOT_LABELS)
def test_every_provider_label_marks_a_node_spot(key, value):
    cfg = SpotConfig()
    assert cfg.is_spot({key: value.upper()}) and cfg.is_spot({key: value})
    assert not cfg.is_spot({key: "on-demand"}) and not cfg.is_spot({})
    assert cfg.capacity_type({key: value}) == "spot" and cfg.capacity_type({}) == "on-demand"


def test_configured_labels_add_to_or_replace_the_providers():
    cfg = SpotConfig.from_args(spot_labels=["node.kubernetes.io/lifecycle=spot", "example.com/preemptible"])
    assert cfg.is_spot({"node.kubernetes.io/lifecycle": "Spot"}) and cfg.is_spot({"example.com/preemptible": ""})
    assert cfg.is_spot(KARPENTER_SPOT)
    only = SpotConfig.from_args(spot_labels=["pool=cheap"], provider_labels=False)
    assert only.is_spot({"pool": "cheap"}) and not only.is_spot(KARPENTER_SPOT)


def test_never_pods_skip_spot_nodes_and_say_why():
    assert verdicts(SpotCapacity(), _pod(), _cluster()) == {"od": None, "spot": R_SPOT, "plain": None}
    assert verdicts(SpotCapacity(), _pod(spot="never"), _cluster())["spot"] == R_SPOT


@pytest.mark.parametrize("pod", [_pod(spot="prefer"), _pod(spot="allow"), _pod(pclass="batch-spot")])
def test_interruptible_or_allowed_pods_may_use_spot(pod):
    plugin = make(interruptible_priority_classes=["batch-spot"])
    assert verdicts(plugin, pod, _cluster()) == {"od": None, "spot": None, "plain": None}


def test_the_cluster_may_allow_every_pod_on_spot():
    plugin = make(on_demand_pods_on_spot="allow")
    assert verdicts(plugin, _pod(), _cluster())["spot"] is None
    assert verdicts(plugin, _pod(spot="never"), _cluster())["spot"] == R_SPOT  # the pod's own word wins


def test_prefer_scores_spot_first_allow_on_demand_first():
    st = _cluster()
    assert scores(SpotCapacity(), _pod(spot="prefer"), st).tolist() == [0.0, 100.0, 0.0]
    assert scores(SpotCapacity(), _pod(spot="allow"), st).tolist() == [100.0, 0.0, 100.0]


def test_no_opinion_without_spot_nodes_or_for_never_pods():
    plugin = SpotCapacity()
    from tests.builders import cycle_for

    plain = state_of(make_node("a", gpus=1), make_node("b", gpus=1))
    assert not plugin.applies(cycle_for(_pod(spot="prefer")), plain)
    assert not plugin.applies(cycle_for(_pod()), _cluster())
    assert plugin.filter(cycle_for(_pod()), plain).passes_all


def test_interruption_notice_keeps_every_pod_off_even_one_that_tolerates_everything():
    st = state_of(
        make_node("ok", gpus=1),
        make_node("going", gpus=1, labels=KARPENTER_SPOT, taints=[("karpenter.sh/disrupted", "", "NoSchedule")]),
        make_node("nth", gpus=1, taints=[("aws-node-termination-handler/spot-itn", "1", "NoSchedule")]),
        make_node("gke", gpus=1, taints=[("cloud.google.com/impending-node-termination", "", "NoSchedule")]),
    )
    pod = _pod(spot="prefer", tolerations=[{"operator": "Exists"}])
    assert verdicts(SpotCapacity(), pod, st) == {"ok": None, "going": R_NOTICE, "nth": R_NOTICE, "gke": R_NOTICE}
    cfg = SpotConfig()
    assert cfg.interruption([Taint("karpenter.sh/disrupted")]) == "taint karpenter.sh/disrupted"
    assert cfg.interruption([], deleting=True) == "node is being deleted"
    assert cfg.interruption([Taint("aws-node-termination-handler/rebalance-recommendation")]) is None
    assert SpotConfig.from_args(interruption_taints=["aws-node-termination-handler/rebalance-recommendation"]).interruption(
        [Taint("aws-node-termination-handler/rebalance-recommendation")]) is not None


@pytest.mark.parametrize("args, word", [
    ({"on_demand_pods_on_spot": "maybe"}, "on_demand_pods_on_spot"),
    ({"mixed_gangs": "yes"}, "mixed_gangs"),
    ({"spot_labels": "pool=spot"}, "spot_labels"),
    ({"spot_labels": ["=spot"]}, "spot_labels[0]"),
    ({"interruption_taints": [""]}, "interruption_taints[0]"),
    ({"interruptible_priority_classes": [3]}, "interruptible_priority_classes[0]"),
    ({"provider_labels": 1}, "provider_labels"),
])
def test_bad_arguments_name_the_field(args, word):
    with pytest.raises(ConfigError, match=word.replace("[", r"\[").replace("]", r"\]")):
        make(**args)


def test_unknown_argument_is_a_config_error_through_the_registry():
    with pytest.raises(ConfigError, match="SpotCapacity"):
        registry().create("SpotCapacity", {"spot_label": ["x"]})


def test_bad_annotation_names_the_field():
    with pytest.raises(InvalidPodSpec, match=r"gpufleet.io/spot"):
        _pod(spot="sometimes")


def _sched(*nodes, **args):
    prof = build_profile({"profiles": [{"name": "t", "plugins": {
        "filter": ["NodeUnschedulable", "TaintToleration", "NodeResourcesFit", "GpuFit", "SpotCapacity"],
        "score": [{"name": "SpotCapacity", "weight": 5}, "MostAllocated"]},
        "pluginConfig": {"SpotCapacity": args} if args else {}}]})
    return Scheduler(prof, state_of(*nodes), seed=0)


def _gang(n, spot=None, gpus=1):
    ann = {"gpufleet.io/pod-group": "job", **({"gpufleet.io/spot": spot} if spot else {})}
    return [make_pod(f"w{i}", gpu=gpus, annotations=ann) for i in range(n)]


def test_profile_places_prefer_pods_on_spot_and_others_on_demand():
    s = _sched(make_node("od", gpus=2, labels=KARPENTER_OD), make_node("spot", gpus=2, labels=KARPENTER_SPOT))
    assert s.schedule(_pod("a", spot="prefer")).assignment.node == "spot"
    assert s.schedule(_pod("b")).assignment.node == "od"
    assert s.schedule(_pod("c", spot="allow")).assignment.node == "od"
    assert s.schedule(_pod("d")).assignment is None  # od full; spot refused
    d = s.schedule(_pod("e", spot="prefer"))
    assert d.assignment.node == "spot"


def test_a_gang_that_does_not_fit_on_spot_goes_to_on_demand_whole():
    """3 spot GPUs + 4 on-demand GPUs: a 4-pod gang preferring spot must not take 3 spot + 1 on-demand."""
    s = _sched(make_node("od", gpus=4, labels=KARPENTER_OD), make_node("spot", gpus=3, labels=KARPENTER_SPOT))
    res = place_gang(s, "default/job", _gang(4, spot="prefer"))
    assert res.ok
    assert {d.assignment.node for d in res.placed} == {"od"}


def test_a_gang_preferring_spot_lands_there_whole_and_late_members_follow():
    s = _sched(make_node("od", gpus=4, labels=KARPENTER_OD), make_node("spot1", gpus=2, labels=KARPENTER_SPOT),
               make_node("spot2", gpus=2, labels=KARPENTER_SPOT))
    res = place_gang(s, "default/job", _gang(3, spot="prefer"))
    assert res.ok and {d.assignment.node for d in res.placed} <= {"spot1", "spot2"}
    late = make_pod("w9", gpu=1, annotations={"gpufleet.io/pod-group": "job", "gpufleet.io/spot": "prefer"})
    assert s.schedule(late).assignment.node in {"spot1", "spot2"}
    late2 = make_pod("w10", gpu=1, annotations={"gpufleet.io/pod-group": "job", "gpufleet.io/spot": "prefer"})
    d = s.schedule(late2)  # spot is full now: on-demand would split the gang
    assert d.assignment is None and "never spans both" in d.status.message


def test_mixed_gangs_may_span_when_allowed_and_not_otherwise():
    nodes = (make_node("od", gpus=2, labels=KARPENTER_OD), make_node("spot", gpus=3, labels=KARPENTER_SPOT))
    res = place_gang(_sched(*nodes, mixed_gangs=True), "default/job", _gang(4, spot="prefer"))
    assert res.ok and {d.assignment.node for d in res.placed} == {"od", "spot"}
    res = place_gang(_sched(*nodes), "default/job", _gang(4, spot="prefer"))
    assert not res.ok and "only 3 of the 4" in res.status.message


def test_a_gang_with_one_never_member_stays_on_demand():
    s = _sched(make_node("od", gpus=4, labels=KARPENTER_OD), make_node("spot", gpus=4, labels=KARPENTER_SPOT))
    members = _gang(2, spot="prefer") + [make_pod("w5", gpu=1, annotations={"gpufleet.io/pod-group": "job"})]
    res = place_gang(s, "default/job", members)
    assert res.ok and {d.assignment.node for d in res.placed} == {"od"}


def test_partitions_follow_policy():
    st = _cluster()
    p = SpotCapacity()
    spot = p.spot_mask(st)
    assert [m.tolist() for m in p.gang_partitions(_gang(2, spot="prefer"), st)] == [spot.tolist(), (~spot).tolist()]
    assert [m.tolist() for m in p.gang_partitions(_gang(2, spot="allow"), st)] == [(~spot).tolist(), spot.tolist()]
    assert [m.tolist() for m in p.gang_partitions(_gang(2), st)] == [(~spot).tolist()]
    assert make(mixed_gangs=True).gang_partitions(_gang(2, spot="prefer"), st) is None
