"""What a pod asks and what a running pod holds, as kube-scheduler 1.37 counts them.

Pod-level ``spec.resources`` (on by default since 1.34) and in-place resize (GA in 1.35): the
scenarios here are the ones ``tests/kube/test_k137_side_by_side.py`` replays against
kube-scheduler itself.
"""

from __future__ import annotations

import pytest

from gpufleet.engine.errors import InvalidPodSpec
from gpufleet.engine.podspec import counted_requests, effective_requests, parse_pod

from .builders import pod


def with_pod_level(p: dict, requests: dict | None = None, limits: dict | None = None) -> dict:
    res = {}
    if requests is not None:
        res["requests"] = requests
    if limits is not None:
        res["limits"] = limits
    p["spec"]["resources"] = res
    return p


def two_containers(cpu_a: str = "1", cpu_b: str = "1", memory: str | None = "1Gi") -> dict:
    p = pod(cpu=cpu_a, memory=memory)
    p["spec"]["containers"].append({"name": "b", "image": "x", "resources": {"requests": {"cpu": cpu_b}}})
    return p


# --- pod-level resources -----------------------------------------------------------------


def test_pod_level_requests_replace_the_containers_sum_for_what_they_name():
    r = parse_pod(with_pod_level(two_containers(), requests={"cpu": "3"}))
    assert r.cpu_milli == 3000  # not 1 + 1
    assert r.memory_mib == 1024  # memory is not named at pod level: the containers' sum


def test_pod_level_requests_replace_init_and_sidecar_arithmetic_too():
    p = pod(cpu="1", memory="1Gi")
    p["spec"]["initContainers"] = [{"name": "big-init", "resources": {"requests": {"cpu": "6"}}},
                                   {"name": "side", "restartPolicy": "Always", "resources": {"requests": {"cpu": "1"}}}]
    assert effective_requests(p)["cpu"] == 6000
    assert effective_requests(with_pod_level(p, requests={"cpu": "7"}))["cpu"] == 7000


def test_pod_level_limits_default_requests_as_the_apiserver_does():
    # containers ask cpu: the pod's cpu request defaults to their sum, not to the limit;
    # nobody asks memory: the pod's memory request defaults to its limit
    p = with_pod_level(two_containers(memory=None), limits={"cpu": "8", "memory": "4Gi"})
    req = effective_requests(p)
    assert req["cpu"] == 2000 and req["memory"] == 4096


def test_overhead_is_added_after_pod_level_resources_and_gpus_are_untouched():
    p = with_pod_level(pod(cpu="1", memory="1Gi", gpus=2), requests={"cpu": "2", "memory": "2Gi"})
    p["spec"]["overhead"] = {"cpu": "250m", "memory": "64Mi"}
    r = parse_pod(p)
    assert (r.cpu_milli, r.memory_mib, r.gpu_count) == (2250, 2048 + 64, 2)


def test_pod_level_hugepages_are_a_scalar_request():
    p = with_pod_level(pod(cpu="1", memory="1Gi"), limits={"hugepages-2Mi": "64Mi"})
    assert dict(parse_pod(p).scalars)["hugepages-2Mi"] == 64 * 2**20


@pytest.mark.parametrize("requests,limits,field", [
    ({"nvidia.com/gpu": "1"}, None, "spec.resources.requests.nvidia.com/gpu"),
    (None, {"ephemeral-storage": "1Gi"}, "spec.resources.limits.ephemeral-storage"),
    ({"cpu": "1500m"}, None, "spec.resources.requests.cpu"),  # below the containers' 2 CPUs
    ({"cpu": "4"}, {"cpu": "3"}, "spec.resources.requests.cpu"),  # above the limit
    ({"cpu": "many"}, None, "spec.resources.requests.cpu"),
])
def test_bad_pod_level_resources_are_refused_naming_the_field(requests, limits, field):
    p = with_pod_level(two_containers(), requests=requests, limits=limits)
    with pytest.raises(InvalidPodSpec) as exc:
        parse_pod(p)
    assert exc.value.field == field


# --- in-place resize: what a running pod holds ----------------------------------------------


def running(p: dict, statuses: list[dict], conditions: list[dict] | None = None, **pod_status) -> dict:
    p["spec"]["nodeName"] = "n1"
    p["status"] = {"phase": "Running", "containerStatuses": statuses, "conditions": conditions or [], **pod_status}
    return p


def cs(name: str, allocated: dict | None = None, actual: dict | None = None) -> dict:
    out: dict = {"name": name}
    if allocated is not None:
        out["allocatedResources"] = allocated
    if actual is not None:
        out["resources"] = {"requests": actual}
    return out


PENDING = [{"type": "PodResizePending", "status": "True", "reason": "Deferred"}]
INFEASIBLE = [{"type": "PodResizePending", "status": "True", "reason": "Infeasible"}]
IN_PROGRESS = [{"type": "PodResizeInProgress", "status": "True"}]


def test_a_pod_without_status_holds_what_it_asks():
    p = pod(cpu="2", memory="1Gi")
    assert counted_requests(p) == effective_requests(p)


def test_a_resize_up_not_yet_allocated_holds_the_desired_size():
    p = running(pod(cpu="4", memory="1Gi"), [cs("main", {"cpu": "1", "memory": "1Gi"}, {"cpu": "1", "memory": "1Gi"})], PENDING)
    assert counted_requests(p)["cpu"] == 4000


def test_a_resize_down_in_progress_holds_the_old_size_until_kubelet_actuated_it():
    p = running(pod(cpu="1", memory="1Gi"), [cs("main", {"cpu": "1", "memory": "1Gi"}, {"cpu": "3", "memory": "1Gi"})], IN_PROGRESS)
    assert counted_requests(p)["cpu"] == 3000
    done = running(pod(cpu="1", memory="1Gi"), [cs("main", {"cpu": "1", "memory": "1Gi"}, {"cpu": "1", "memory": "1Gi"})])
    assert counted_requests(done)["cpu"] == 1000


def test_an_infeasible_resize_leaves_the_desired_size_out():
    p = running(pod(cpu="64", memory="1Gi"), [cs("main", {"cpu": "2", "memory": "1Gi"}, {"cpu": "2", "memory": "1Gi"})], INFEASIBLE)
    assert counted_requests(p)["cpu"] == 2000
    # the same desired size while the resize is only deferred: held in full
    p["status"]["conditions"] = PENDING
    assert counted_requests(p)["cpu"] == 64000


def test_the_pod_holds_the_larger_total_not_the_sum_of_each_containers_larger_size():
    # a moves 2 -> 1 CPU, b moves 1 -> 2 CPU: desired 3, allocated 3; the sum of per-container maxima would be 4
    p = two_containers(cpu_a="1", cpu_b="2")
    p = running(p, [cs("main", {"cpu": "2"}), cs("b", {"cpu": "1"})], PENDING)
    assert counted_requests(p)["cpu"] == 3000


def test_pod_level_resize_holds_the_larger_of_desired_and_allocated():
    p = with_pod_level(pod(cpu="1", memory="1Gi"), requests={"cpu": "4", "memory": "2Gi"})
    p = running(p, [cs("main", {"cpu": "1", "memory": "1Gi"})], PENDING,
                allocatedResources={"cpu": "2", "memory": "3Gi"}, resources={"requests": {"cpu": "2", "memory": "3Gi"}})
    got = counted_requests(p)
    assert (got["cpu"], got["memory"]) == (4000, 3072)
    p["status"]["conditions"] = INFEASIBLE
    got = counted_requests(p)
    assert (got["cpu"], got["memory"]) == (2000, 3072)


def test_a_bad_status_value_names_the_status_field():
    p = running(pod(cpu="1", memory="1Gi"), [cs("main", {"cpu": "lots"})])
    with pytest.raises(InvalidPodSpec) as exc:
        counted_requests(p)
    assert exc.value.field == "status.containerStatuses[0].allocatedResources.cpu"


# --- the snapshot: a running pod counted past the node's free amount ---------------------------


def test_state_counts_a_resized_pod_past_free_and_gives_it_back():
    from gpufleet.engine.model import Assignment
    from gpufleet.engine.state import ClusterState

    from .builders import gpu_node

    st = ClusterState([gpu_node("n1", cpu_milli=4000)])
    st.reserve(Assignment("ml/a", "n1", 3000, 100))
    assert st.check(Assignment("ml/b", "n1", 2000, 100)) is not None
    st.reserve(Assignment("ml/b", "n1", 2000, 100), overcommit=True)  # kubelet runs it: counted anyway
    assert int(st.cpu_free[0]) == -1000
    assert st.resize("ml/a", 1000, 100, ())  # a resize down is done
    assert int(st.cpu_free[0]) == 1000 and st.assignments["ml/a"].cpu_milli == 1000
    assert not st.resize("ml/gone", 1, 1, ())
    st.resize("ml/a", 3000, 100, ())
    # the node set or a node changes: what was held stays held, over-committed or not
    st.add_node(gpu_node("n2"))
    st.update_node(gpu_node("n1", cpu_milli=4000, labels={"zone": "a"}))
    assert set(st.assignments) == {"ml/a", "ml/b"} and int(st.cpu_free[st.index["n1"]]) == -1000
    with st.transaction() as tx:
        tx.evict("ml/a")
    assert "ml/a" in st.assignments  # rolled back
    st.unreserve("ml/a")
    st.unreserve("ml/b")
    assert int(st.cpu_free[st.index["n1"]]) == 4000
