"""Kubernetes' own gangs (scheduling.k8s.io/v1beta1 PodGroup, beta in 1.37) in the live loop, fake API.

A pod names its PodGroup in ``spec.schedulingGroup.podGroupName`` (what a Workload's podGroupTemplates become);
the group's ``gang`` policy makes it all or nothing exactly like a ``gpufleet.io/pod-group``, ``basic`` places
its pods one by one, and a pod waits while its group is missing, as kube-scheduler 1.37's GangScheduling
does (the same scenarios run against kube-scheduler itself in tests/kube/test_k137_side_by_side.py).
"""

from __future__ import annotations

import pytest

from gpufleet.engine.errors import ConfigError
from gpufleet.engine.gang import PodGroup
from gpufleet.engine.podspec import parse_pod

from tests.kube.test_loop import Clock
from tests.kube.test_teams_live import bound, cluster, make, messages, pod, run


def member(name: str, group: str, gpus: int = 1, ns: str = "ml", **kw) -> dict:
    p = pod(name, ns=ns, gpus=gpus, **kw)
    p["spec"]["schedulingGroup"] = {"podGroupName": group}
    return p


def podgroup(name: str, min_count: int | None = None, ns: str = "ml", **spec) -> dict:
    policy = {"gang": {"minCount": min_count}} if min_count is not None else {"basic": {}}
    return {"apiVersion": "scheduling.k8s.io/v1beta1", "kind": "PodGroup", "metadata": {"name": name, "namespace": ns},
            "spec": {"schedulingPolicy": policy, **spec}}


def test_a_gang_policy_binds_all_members_together_or_none():
    api = cluster(gpus_per_node=2, nodes=2)
    api.put_object("schedpodgroup", podgroup("train", 3))
    clock = Clock()
    loop = make(api, clock)
    api.add_pod(member("w0", "train"))
    api.add_pod(member("w1", "train"))
    run(api, loop, clock, rounds=2)
    assert bound(api) == []  # 2 of 3: nothing binds
    summary, _ = loop.explain(api.pods["ml/w0"])
    assert "pod group ml/train: 2 member(s) waiting, 0 running, minMember 3" in summary
    api.add_pod(member("w2", "train"))
    run(api, loop, clock)
    assert bound(api) == ["ml/w0", "ml/w1", "ml/w2"]


def test_a_gang_that_cannot_fit_binds_nothing_and_explain_says_which_members_fit():
    api = cluster(gpus_per_node=4, nodes=2)
    api.put_object("schedpodgroup", podgroup("big", 3))
    clock = Clock()
    loop = make(api, clock)
    for i in range(3):
        api.add_pod(member(f"w{i}", "big", gpus=4))
    run(api, loop, clock)
    assert bound(api) == []
    assert any("only 2 of the 3 required members fit" in m for m in messages(api, "ml/w0", "FailedScheduling"))
    summary, _ = loop.explain(api.pods["ml/w0"])
    assert "gang (dry run): 2 of the 3 member(s) it needs fit now (all-or-nothing: none is placed)" in summary
    assert "do not fit: ml/w2: 0/2 nodes are available" in summary and "Insufficient nvidia.com/gpu" in summary
    assert loop.cache.state.gpu_free_milli.sum() == 8000  # the dry run left nothing reserved


def test_a_basic_policy_places_members_one_by_one():
    api = cluster(gpus_per_node=4, nodes=2)
    api.put_object("schedpodgroup", podgroup("svc"))
    clock = Clock()
    loop = make(api, clock)
    for i in range(3):
        api.add_pod(member(f"s{i}", "svc", gpus=4))
    run(api, loop, clock)
    assert len(bound(api)) == 2


def test_a_pod_waits_for_its_pod_group_to_appear():
    api = cluster(gpus_per_node=4, nodes=1)
    clock = Clock()
    loop = make(api, clock)
    api.add_pod(member("w0", "late"))
    api.add_pod(member("w1", "late"))
    run(api, loop, clock, rounds=2)
    assert bound(api) == []
    assert any("waiting for the pod's pod group 'late'" in m for m in messages(api, "ml/w0", "FailedScheduling"))
    api.put_object("schedpodgroup", podgroup("late", 2))
    run(api, loop, clock)
    assert bound(api) == ["ml/w0", "ml/w1"]


def test_a_group_field_gpufleet_does_not_honour_refuses_its_pods_naming_it():
    api = cluster(gpus_per_node=4, nodes=1)
    api.put_object("schedpodgroup", podgroup("topo", 1, schedulingConstraints={"topology": [{"key": "rack"}]}))
    clock = Clock()
    loop = make(api, clock)
    api.add_pod(member("w0", "topo"))
    run(api, loop, clock, rounds=2)
    assert bound(api) == []
    msg = messages(api, "ml/w0", "FailedScheduling")[-1]
    assert "spec.schedulingGroup.podGroupName" in msg and "field spec.schedulingConstraints" in msg


def test_a_replacement_member_of_a_running_gang_goes_alone_after_a_restart():
    api = cluster(gpus_per_node=4, nodes=1)
    api.put_object("schedpodgroup", podgroup("job", 2))
    for i in range(2):
        api.add_pod(member(f"w{i}", "job", node_name="n0"))  # running before this scheduler started
    api.add_pod(member("w2", "job"))  # a replacement: the minimum already runs
    clock = Clock()
    loop = make(api, clock)
    run(api, loop, clock, rounds=2)
    assert "ml/w2" in bound(api)


def test_the_api_not_serving_pod_groups_is_named():
    api = cluster(gpus_per_node=4, nodes=1)
    api.unserved.add("schedpodgroup")
    clock = Clock()
    loop = make(api, clock)
    assert "schedpodgroup" not in loop.cache.watch_kinds
    api.add_pod(member("w0", "g"))
    run(api, loop, clock, rounds=2)
    assert bound(api) == []
    assert any("does not serve scheduling.k8s.io/v1beta1 PodGroups" in m for m in messages(api, "ml/w0", "FailedScheduling"))


def test_the_extender_leaves_gangs_to_kube_scheduler():
    from gpufleet.kube.extender import ExtenderLoop

    api = cluster(gpus_per_node=4, nodes=1)
    loop = ExtenderLoop(api, make(api, Clock()).profile)
    loop.resync()
    r = loop.cache.request("ml/w0", member("w0", "nowhere"))  # no group objects watched there: a single pod
    assert r.pod_group is None and r.scheduling_group == "nowhere"


@pytest.mark.parametrize("spec,field", [
    ({"schedulingPolicy": {}}, "spec.schedulingPolicy"),
    ({"schedulingPolicy": {"gang": {"minCount": 1}, "basic": {}}}, "spec.schedulingPolicy"),
    ({"schedulingPolicy": {"gang": {"minCount": 0}}}, "spec.schedulingPolicy.gang.minCount"),
    ({"schedulingPolicy": {"gang": {"minCount": 2}}, "priority": "high"}, "spec.priority"),
])
def test_bad_pod_groups_are_named_by_object_and_field(spec, field):
    with pytest.raises(ConfigError) as exc:
        PodGroup.from_scheduling_json({"metadata": {"name": "g", "namespace": "ml"}, "spec": spec})
    assert "PodGroup ml/g" in str(exc.value) and f"field {field}:" in str(exc.value)


def test_pod_group_priority_and_pod_fields():
    g = PodGroup.from_scheduling_json(podgroup("g", 4, priority=1000))
    assert (g.min_member, g.priority, g.gang) == (4, 1000, True)
    p = member("w", "g")
    p["metadata"]["annotations"]["gpufleet.io/pod-group"] = "other"
    from gpufleet.engine.errors import InvalidPodSpec

    with pytest.raises(InvalidPodSpec) as exc:
        parse_pod(p)
    assert exc.value.field == "metadata.annotations[gpufleet.io/pod-group]"
    p = member("w", "")
    with pytest.raises(InvalidPodSpec) as exc:
        parse_pod(p)
    assert exc.value.field == "spec.schedulingGroup.podGroupName"
    from gpufleet.engine.podterms import UnsupportedPodField

    old = pod("w", ns="ml")
    old["spec"]["workloadRef"] = {"name": "wl", "podGroup": "pg"}
    with pytest.raises(UnsupportedPodField) as exc2:
        parse_pod(old)
    assert exc2.value.field == "spec.workloadRef"


def test_preempting_a_member_takes_its_whole_gang():
    api = cluster(gpus_per_node=4, nodes=2)
    api.put_object("schedpodgroup", podgroup("job", 2))
    api.add_pod(member("w0", "job", gpus=4, node_name="n0"))
    api.add_pod(member("w1", "job", gpus=4, node_name="n1"))
    api.add_pod(pod("urgent", ns="ml", gpus=4, priority=100))
    clock = Clock()
    loop = make(api, clock)
    run(api, loop, clock, rounds=3)
    assert sorted(k for k, _ in api.evicted) == ["ml/w0", "ml/w1"]  # never half a gang


def test_explain_names_a_missing_pod_group_and_scheduling_gates():
    from gpufleet.kube import explain_cli
    from gpufleet.policies import build_profile

    api = cluster(gpus_per_node=4, nodes=1)
    api.add_pod(member("w0", "nowhere"))
    gated = pod("gated", ns="ml")
    gated["spec"]["schedulingGates"] = [{"name": "example.com/quota"}]
    api.add_pod(gated)
    code, text = explain_cli.explain(api, build_profile("bestfit"), "ml/w0")
    assert code == 0 and "waiting for the pod's pod group 'nowhere'" in text
    code, text = explain_cli.explain(api, build_profile("bestfit"), "ml/gated")
    assert code == 0 and text.startswith("ml/gated: waiting for its scheduling gates to be removed (example.com/quota); once they are: fits")


def test_members_must_share_their_pod_groups_priority():
    api = cluster(gpus_per_node=4, nodes=1)
    api.put_object("schedpodgroup", podgroup("hi", 1, priority=1000))
    clock = Clock()
    loop = make(api, clock)
    api.add_pod(member("low", "hi"))  # priority 0
    api.add_pod(member("high", "hi", priority=1000))
    run(api, loop, clock, rounds=2)
    assert bound(api) == ["ml/high"]
    msg = messages(api, "ml/low", "FailedScheduling")[-1]
    assert "spec.priority" in msg and "must equal the priority of its PodGroup ml/hi (1000)" in msg


def condition(api, key: str) -> tuple[str, str] | None:
    for c in (api.objects["schedpodgroup"][key].get("status") or {}).get("conditions") or []:
        if c["type"] == "PodGroupInitiallyScheduled":
            return c["status"], c["reason"]
    return None


def test_the_pod_group_says_whether_its_gang_was_placed_as_kube_scheduler_writes_it():
    from tests.kube.test_loop import node

    api = cluster(gpus_per_node=4, nodes=2)
    api.put_object("schedpodgroup", podgroup("big", 3))
    clock = Clock()
    loop = make(api, clock)
    for i in range(3):
        api.add_pod(member(f"w{i}", "big", gpus=4))
    run(api, loop, clock, rounds=2)
    assert condition(api, "ml/big") == ("False", "Unschedulable")
    api.add_node(node("n2", gpus=4, cpu="64"))
    run(api, loop, clock)
    assert len(bound(api)) == 3 and condition(api, "ml/big") == ("True", "Scheduled")
    assert len(api.objects["schedpodgroup"]["ml/big"]["status"]["conditions"]) == 1


def test_a_gang_waiting_for_its_members_writes_no_condition():
    api = cluster(gpus_per_node=4, nodes=1)
    api.put_object("schedpodgroup", podgroup("incomplete", 2))
    clock = Clock()
    loop = make(api, clock)
    api.add_pod(member("lone", "incomplete"))
    run(api, loop, clock, rounds=2)
    assert bound(api) == [] and condition(api, "ml/incomplete") is None
