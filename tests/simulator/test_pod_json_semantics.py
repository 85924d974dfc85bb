"""The replay reads Pod and PodGroup JSON through the live scheduler's parser: 1.3x semantics hold there too.

Trace rows carry no pod-level resources or scheduling groups, but pods written as Kubernetes JSON/YAML do;
``parse_pod`` and ``resolve_scheduling_group`` are what the live loop and ``explain`` use, so the simulator
places the same pods the same way.
"""

from __future__ import annotations

import numpy as np

from gpufleet.engine.gang import PodGroup, resolve_scheduling_group
from gpufleet.engine.model import Gpu, Node, PodRequest
from gpufleet.engine.podspec import parse_pod
from gpufleet.simulator.experiments.replay import run_replay
from gpufleet.simulator.traces.workload import Workload


def nodes(cpu_milli: int = 64000, gpus: int = 4) -> list[Node]:
    return [Node(f"n{i}", cpu_milli, 262144, tuple(Gpu(j, f"n{i}-g{j}", "V100M32", 32768) for j in range(gpus)),
                 labels={"kubernetes.io/hostname": f"n{i}"}, max_pods=100) for i in range(2)]


def pod_json(name: str, gpus: int, group: str | None = None, pod_cpu: str | None = None) -> dict:
    spec: dict = {"containers": [{"name": "c", "resources": {"requests": {"cpu": "1"}, "limits": {"nvidia.com/gpu": str(gpus)}}}]}
    if group:
        spec["schedulingGroup"] = {"podGroupName": group}
    if pod_cpu:
        spec["resources"] = {"requests": {"cpu": pod_cpu}}
    return {"metadata": {"name": name, "namespace": "t"}, "spec": spec}


def group_json(policy: dict) -> dict:
    return {"apiVersion": "scheduling.k8s.io/v1beta1", "kind": "PodGroup", "metadata": {"name": "job", "namespace": "t"},
            "spec": {"schedulingPolicy": policy}}


def parsed(pods: list[dict], groups: list[dict]) -> list[PodRequest]:
    gs = {g.key: g for g in (PodGroup.from_scheduling_json(o) for o in groups)}
    return [resolve_scheduling_group(parse_pod(p), gs) for p in pods]


def test_a_gang_policy_pod_group_waits_for_room_for_all_its_members():
    """A busy GPU until t=100 on one of two 4-GPU nodes; two 4-GPU members of one PodGroup arrive at t=10:
    under the gang policy both start at t=100, under basic one starts at once."""
    pods = [pod_json("busy", 1), pod_json("w0", 4, "job"), pod_json("w1", 4, "job")]

    def replay(policy: dict):
        wl = Workload(parsed(pods, [group_json(policy)]), np.array([0.0, 10.0, 10.0]), np.array([100.0, 50.0, 50.0]),
                      np.full(3, np.nan))
        return run_replay(nodes(), wl, "bestfit", warmup=0.0, frag=False)

    gang = replay({"gang": {"minCount": 2}})
    basic = replay({"basic": {}})
    assert gang.delay_by_class["4"]["p50"] == 90 and gang.delay_by_class["4"]["max"] == 90
    assert basic.delay_by_class["4"]["p50"] == 25 and basic.delay_by_class["4"]["max"] == 50
    assert gang.pods_never_placed == 0


def test_pod_level_cpu_decides_in_the_replay():
    """Nodes of 4 CPUs: a pod whose containers ask 1 CPU but the pod 3 keeps a 2-CPU pod off its node."""
    pods = [pod_json("a", 0, pod_cpu="3"), pod_json("b", 0, pod_cpu="3"), pod_json("c", 0, pod_cpu="2")]
    reqs = parsed(pods, [])
    assert [r.cpu_milli for r in reqs] == [3000, 3000, 2000]
    wl = Workload(reqs, np.array([0.0, 0.0, 10.0]), np.array([100.0, 100.0, 10.0]), np.full(3, np.nan))
    r = run_replay(nodes(cpu_milli=4000, gpus=0), wl, "bestfit", warmup=0.0, frag=False)
    assert r.queue_delay_s["max"] == 90  # c waits until a or b leaves at t=100
