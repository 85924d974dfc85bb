"""Draining going nodes: every pod moves, highest priority first, gangs whole, each with its reason."""

from __future__ import annotations

from gpufleet.engine.capacity import SpotConfig
from gpufleet.engine.framework import Scheduler
from gpufleet.engine.interruption import drain_plan, notices
from gpufleet.engine.model import Taint
from gpufleet.policies import build_profile

from tests.builders import make_node, make_pod, state_of

SPOT = {"karpenter.sh/capacity-type": "spot"}


def _placed(*pods, nodes):
    s = Scheduler(build_profile("bestfit"), state_of(*nodes), seed=0)
    for p in pods:
        assert s.schedule(p).ok, p.key
    return s.state


def test_no_notice_no_moves():
    st = _placed(make_pod("a", gpu=1), nodes=[make_node("n1", gpus=2)])
    assert notices(st) == {} and drain_plan(st, {}) == []


def test_pods_move_highest_priority_first_with_their_reason():
    n2 = make_node("n2", gpus=4)
    pods = [make_pod("low", gpu=1, priority=1, nodeSelector={"kubernetes.io/hostname": "n1"}),
            make_pod("high", gpu=1, priority=100, nodeSelector={"kubernetes.io/hostname": "n1"}),
            make_pod("big", gpu=2, priority=1, nodeSelector={"kubernetes.io/hostname": "n1"}),
            make_pod("other", gpu=1, priority=1000, nodeSelector={"kubernetes.io/hostname": "n2"})]
    clean = make_node("n1", gpus=4, labels=SPOT)
    st = _placed(*pods, nodes=[clean, n2])
    st.update_node(make_node("n1", gpus=4, labels=SPOT, taints=[("karpenter.sh/disrupted", "", "NoSchedule")]))  # notice comes later
    assert notices(st) == {"n1": "taint karpenter.sh/disrupted"}
    plan = drain_plan(st, notices(st))
    assert [m.pod_key for m in plan] == ["default/high", "default/big", "default/low"]  # n2's pod stays
    assert plan[0].reason == "node n1 is going away (taint karpenter.sh/disrupted)"
    assert SpotConfig().interruption([Taint("x")], deleting=True) == "node is being deleted"
    assert notices(st, deleting={"n2": True})["n2"] == "node is being deleted"


def test_a_gang_with_a_member_on_a_going_node_moves_whole():
    on = {"kubernetes.io/hostname": "n1"}
    off = {"kubernetes.io/hostname": "n2"}
    g = {"gpufleet.io/pod-group": "job"}
    pods = [make_pod("w0", gpu=1, annotations=g, priority=5, nodeSelector=on),
            make_pod("w1", gpu=1, annotations=g, priority=5, nodeSelector=off),
            make_pod("solo", gpu=1, priority=50, nodeSelector=on),
            make_pod("bystander", gpu=1, priority=1, nodeSelector=off)]
    st = _placed(*pods, nodes=[make_node("n1", gpus=2), make_node("n2", gpus=2)])
    plan = drain_plan(st, {"n1": "taint cloud.google.com/impending-node-termination"})
    assert [m.pod_key for m in plan] == ["default/solo", "default/w0", "default/w1"]
    w1 = plan[2]
    assert w1.node == "n2" and w1.group == "default/job"
    assert w1.reason == ("pod group default/job lost default/w0 on node n1, which is going away "
                         "(taint cloud.google.com/impending-node-termination)")
