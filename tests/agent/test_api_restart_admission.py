"""A kube-apiserver restart while kubelet admits a GPU share (issue 35, the real-node drill "kube-apiserver restart").

kubelet records the devices ``GetPreferredAllocation`` steered it to; ``Allocate`` right after hands the container
the GPUs of the pod's assignment.  On the real node the API server was away for longer than ``--api-wait-s``: the
preference gave up and offered a topology pick (GPU 6), the API was back 5 s into ``Allocate``'s own wait, and
the container got the assignment's GPU 5 while kubelet (PodResources, what the node guard reads) held a device of
GPU 6 for it.  These tests drive the real ``KubePodSource`` with a fake clock through that timeline."""

from __future__ import annotations

import json

import pytest

from gpufleet.agent.nvml import FakeBackend
from gpufleet.agent.plugin import AssignmentRefused, DevicePlugin, GpuUse
from gpufleet.agent.podsource import KubePodSource

H100 = FakeBackend("h100-nvlink").gpus()  # 8 GPUs, GPU-h100-00 .. 07
NODE = "n"


class _Refused(Exception):
    """What the kubernetes client raises with no API server to answer (urllib3's MaxRetryError has no status)."""


class RestartingCore:
    """``list_pod_for_all_namespaces`` refuses until the fake clock reaches ``back_at_s``, then lists ``pods``."""

    def __init__(self, now: list[float], back_at_s: float, pods: list[dict]) -> None:
        self.now, self.back_at_s, self.pods, self.events = now, back_at_s, pods, []
        self.api_client = type("C", (), {"sanitize_for_serialization": staticmethod(lambda x: x)})()

    def list_pod_for_all_namespaces(self, field_selector):
        self.now[0] += 0.01  # each call takes a moment
        if self.now[0] < self.back_at_s:
            raise _Refused("connection refused")
        return type("L", (), {"items": self.pods})()

    def create_namespaced_event(self, ns, body):
        self.events.append(body)


def share(name: str, gpu: int, rv: int) -> dict:
    a = {"node": NODE, "gpus": [{"index": gpu, "uuid": f"GPU-h100-{gpu:02d}"}], "gpu_milli": 250}
    return {"metadata": {"name": name, "namespace": "default", "uid": f"u-{name}", "resourceVersion": str(rv),
                         "annotations": {"gpufleet.io/assignment": json.dumps(a)}},
            "spec": {"nodeName": NODE, "containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]},
            "status": {"phase": "Pending"}}


def setup(sockdir, back_at_s: float, api_wait_s: float = 30.0):
    now = [0.0]
    core = RestartingCore(now, back_at_s, [share("apir0-s0", 5, 100)])
    src = KubePodSource(core, NODE, api_wait_s=api_wait_s, sleep=lambda s: now.__setitem__(0, now[0] + s),
                        clock=lambda: now[0])
    p = DevicePlugin("nvidia.com/gpu", H100, sockdir, slots=4, pods=src, state_dir=sockdir)
    every = [d.id for d in p.devices]
    return now, core, p, every


def test_the_preference_outlasts_an_api_server_restart_longer_than_the_wait(sockdir):
    # the API away for 35 s with --api-wait-s 30 (the real node: ~35 s): the preference must not give up at 30 s
    now, core, p, every = setup(sockdir, back_at_s=35.0)
    chosen = p.prefer(every, [], 1)
    assert [p.by_id[i].gpu_index for i in chosen] == [5], chosen
    r = p.allocate_one(chosen)
    assert r.envs["NVIDIA_VISIBLE_DEVICES"] == "GPU-h100-05" and r.envs["GPUFLEET_POD"] == "default/apir0-s0"
    entry = p.allocated["default/apir0-s0#u-apir0-s0"]
    assert entry["devices"] == chosen and "kubelet_uuids" not in entry and not core.events
    assert 35.0 <= now[0] < 40.0  # it waited for the API, not for the whole budget


def test_the_preference_still_gives_up_after_two_waits(sockdir):
    # away for good: the preference gives up after two waits (kubelet's Allocate has no deadline, but admissions
    # on the node wait meanwhile); Allocate then cannot tell either, and the node guard (several devices per GPU)
    # refuses rather than start a pod of unknown assignment where another may run
    now, core, p, every = setup(sockdir, back_at_s=1e9)
    chosen = p.prefer(every, [], 1)
    assert len(chosen) == 1 and 60.0 <= now[0] < 61.0
    with pytest.raises(AssignmentRefused) as e:
        p.allocate_one(chosen)
    assert e.value.reason == "GpuInUse" and "cannot tell" in e.value.message
    # without the guard (one device per GPU) kubelet's choice stands
    now, core, p, every = setup(sockdir, back_at_s=1e9)
    p1 = DevicePlugin("nvidia.com/gpu", H100, sockdir, pods=p.pods, state_dir=sockdir + "/one")
    chosen = p1.prefer([d.id for d in p1.devices], [], 1)
    r = p1.allocate_one(chosen)
    assert r.envs["NVIDIA_VISIBLE_DEVICES"] == p1.by_id[chosen[0]].gpu_uuid and "GPUFLEET_POD" not in r.envs


def test_an_assignment_found_only_by_allocate_is_served_recorded_and_counted_by_the_guard(sockdir):
    # the API back after the preference gave up (65 s), during Allocate's own wait: kubelet already holds a device
    # of another GPU (its record cannot be changed); the container still gets the scheduler's GPU (the one the
    # scheduler counts), the agent records kubelet's GPU beside it, says so on the pod, and the node guard counts
    # the assigned GPU as held by that pod even while the API server cannot be read
    now, core, p, every = setup(sockdir, back_at_s=65.0)
    chosen = p.prefer(every, [], 1)
    kubelet_gpu = p.by_id[chosen[0]].gpu_index
    assert kubelet_gpu != 5  # the blind preference (topology)
    r = p.allocate_one(chosen)
    assert r.envs["NVIDIA_VISIBLE_DEVICES"] == "GPU-h100-05" and r.envs["GPUFLEET_POD"] == "default/apir0-s0"
    entry = p.allocated["default/apir0-s0#u-apir0-s0"]
    assert entry["uuids"] == ["GPU-h100-05"] and entry["kubelet_uuids"] == [f"GPU-h100-{kubelet_gpu:02d}"]
    (ev,) = core.events
    assert ev["reason"] == "GpuAccountingMismatch" and ev["involvedObject"]["name"] == "apir0-s0"
    assert "GPU 5" in ev["message"] and f"GPU {kubelet_gpu}" in ev["message"]

    # another scheduler's whole-GPU pod admitted with the API away again: kubelet shows GPU 5's devices free, the
    # checkpoint says apir0-s0 runs there
    class KubeletOnly:
        def pending_assignment(self, resource, count, exclude):
            return None

        def gpu_use(self, resource, count):
            return GpuUse({chosen[0]: "default/apir0-s0"}, {}, ("default/other", "u-o"))

    p.pods = KubeletOnly()
    with pytest.raises(AssignmentRefused) as e:
        p.allocate_one(["GPU-h100-05::0"])
    assert e.value.reason == "GpuInUse" and "GPU 5 (GPU-h100-05) is used by default/apir0-s0" in e.value.message
    # a GPU nobody holds is still given
    free = next(g for g in range(8) if g not in (5, kubelet_gpu))
    assert p.allocate_one([f"GPU-h100-{free:02d}::0"]).envs["NVIDIA_VISIBLE_DEVICES"] == f"GPU-h100-{free:02d}"


# --- the agent's own watch of its node's pods (podsource.NodePodCache) ------------------------------------------------
def watched(sockdir, back_at_s: float, monkeypatch, kubelet_names: set | None):
    """As ``setup``, with the agent's watch having delivered the pod before the API server went (kubelet got the same
    binding from the same server); ``kubelet_names``: the pods kubelet's PodResources lists without devices (None:
    PodResources not readable)."""
    from gpufleet.agent import podsource

    now, core, p, every = setup(sockdir, back_at_s)
    cache = podsource.NodePodCache(core, NODE)
    cache.replace([share("apir0-s0", 5, 100)], "100")
    p.pods.cache = cache
    if kubelet_names is not None:
        p.pods.pod_resources_socket = "kubelet.sock"
        monkeypatch.setattr(podsource, "kubelet_waiting", lambda sock, resource: set(kubelet_names))
        monkeypatch.setattr(podsource, "kubelet_devices", lambda sock: {n: {} for n in kubelet_names})
    return now, core, p, every


@pytest.mark.parametrize("kubelet_names, waited_s", [({("default", "apir0-s0")}, (0.0, 1.0)), (None, (30.0, 31.0))])
def test_an_api_server_away_longer_than_both_waits_no_longer_splits_kubelets_record(sockdir, monkeypatch, kubelet_names,
                                                                                    waited_s):
    # the old code's gap: the API away 65 s (> 2 x --api-wait-s) while kubelet admits the share: the preference steered
    # kubelet blind, kubelet held a device of another GPU than the container got (GpuAccountingMismatch).  With the
    # agent's watch the pod is known: kubelet is steered to GPU 5 -- at once when PodResources names the pod being
    # admitted, after one wait when it cannot be read -- and Allocate serves GPU 5: one record, no mismatch
    now, core, p, every = watched(sockdir, 65.0, monkeypatch, kubelet_names)
    chosen = p.prefer(every, [], 1)
    assert [p.by_id[i].gpu_index for i in chosen] == [5], chosen
    assert waited_s[0] <= now[0] < waited_s[1]
    r = p.allocate_one(chosen)
    assert r.envs["NVIDIA_VISIBLE_DEVICES"] == "GPU-h100-05" and r.envs["GPUFLEET_POD"] == "default/apir0-s0"
    entry = p.allocated["default/apir0-s0#u-apir0-s0"]
    assert entry["devices"] == chosen and "kubelet_uuids" not in entry and not core.events
    assert now[0] < 65.0  # never waited for the API server to come back


def test_the_watched_copy_is_not_asked_about_a_pod_kubelet_is_not_admitting(sockdir, monkeypatch):
    # PodResources names another pod (say, kube-scheduler's): the copy has no assignment for it, so the lookup waits
    # for the API server as before (here: back at 10 s) and the answer comes from the API, not from the copy
    now, core, p, every = watched(sockdir, 10.0, monkeypatch, {("default", "other")})
    core.pods = [share("apir0-s0", 5, 100)]
    assert p.pods.pending_assignment("nvidia.com/gpu", 1, set()) is None
    assert 10.0 <= now[0] < 15.0


def test_the_node_guard_counts_the_watched_assignments_while_the_api_server_is_away(sockdir, monkeypatch):
    # kube-scheduler's pod admitted during the outage: kubelet sees every device of GPU 5 free, but gpufleet gave GPU 5
    # to apir0-s0 (bound, not admitted yet); the copy says so at once, and the guard refuses the pod there
    now, core, p, every = watched(sockdir, 1e9, monkeypatch, {("default", "other")})
    use = p.pods.gpu_use("nvidia.com/gpu", 1)
    assert use is not None and use.by_gpu == {5: {"default/apir0-s0"}} and now[0] < 1.0
    with pytest.raises(AssignmentRefused) as e:
        p._exclusive_or_refuse(["GPU-h100-05::0"])
    assert "GPU 5 (GPU-h100-05) is used by default/apir0-s0" in e.value.message


class _Resp:
    def __init__(self, lines: list[str]) -> None:
        self.lines, self.closed = lines, False

    def stream(self, amt=None, decode_content=False):
        for ln in self.lines:
            yield (ln + "\n").encode()

    def close(self):
        self.closed = True

    def release_conn(self):
        pass


class WatchingCore:
    """list_pod_for_all_namespaces as a list, or as a watch (``watch=True``) that replays queued responses."""

    def __init__(self, pods: list[dict], rv: str, watches: list) -> None:
        self.pods, self.rv, self.watches, self.calls = pods, rv, watches, []
        self.api_client = type("C", (), {"sanitize_for_serialization": staticmethod(lambda x: x)})()

    def list_pod_for_all_namespaces(self, field_selector, watch=False, resource_version=None, **kw):
        self.calls.append(("watch" if watch else "list", resource_version))
        if not watch:
            return type("L", (), {"items": self.pods, "metadata": type("M", (), {"resource_version": self.rv})()})()
        if not self.watches:
            raise _Refused("connection refused")
        w = self.watches.pop(0)
        if isinstance(w, Exception):
            raise w
        return _Resp(w)


def test_node_pod_cache_lists_watches_resumes_and_lists_again_on_410():
    from gpufleet.agent.podsource import NodePodCache

    a, b = share("a", 1, 101), share("b", 2, 102)
    b_done = json.loads(json.dumps(b))
    b_done["status"]["phase"] = "Running"
    b_done["metadata"]["resourceVersion"] = "104"
    ev = lambda kind, pod: json.dumps({"type": kind, "object": pod})  # noqa: E731
    core = WatchingCore([a], "101", [
        [ev("ADDED", b), "", ev("MODIFIED", b_done)],  # the server ends the watch: resumed from 104
        _Refused("connection refused"),  # the API server away: the copy stays, the watch resumes from 104
        [ev("DELETED", a), json.dumps({"type": "ERROR", "object": {"code": 410, "message": "too old"}})],
    ])
    cache = NodePodCache(core, NODE)
    seen: list = []

    class Stop:  # the backoff wait records the copy; stops once every queued watch was served and listed after
        done = False

        def is_set(self):
            return self.done

        def wait(self, s):
            seen.append(cache.pods())
            self.done = not core.watches and ("list", None) in core.calls

    stop = Stop()
    core.pods = []  # what the fresh list after 410 returns
    cache._pods = {"u-a": a}  # the first list already done
    cache.rv = "101"
    cache.follow(stop)
    assert core.calls[:3] == [("watch", "101"), ("watch", "104"), ("watch", "104")]
    assert sorted(p["metadata"]["name"] for p in seen[0]) == ["a", "b"]  # after the break: a and b, b Running
    assert next(p for p in seen[0] if p["metadata"]["name"] == "b")["status"]["phase"] == "Running"
    assert ("list", None) in core.calls[3:]  # 410: listed afresh
