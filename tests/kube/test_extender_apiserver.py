"""The extender's own API calls against a real kube-apiserver, as its manifest's ServiceAccount (envtest tier)."""

from __future__ import annotations

import threading
import uuid

import pytest

from gpufleet.kube.api import ApiError, Conflict, KubernetesApi
from gpufleet.kube.cli import load_profile
from gpufleet.kube.extender import RETRY_ANNOTATION, Extender, ExtenderLoop
from gpufleet.kube.runner import Runner, wait_until

from .test_kube_scheduler import pod_body, sa_kubeconfig

pytestmark = pytest.mark.apiserver  # needs KUBEBUILDER_ASSETS (tests/apiserver_support.py)


@pytest.fixture
def ns(core):
    from kubernetes import client

    name = f"ext-{uuid.uuid4().hex[:6]}"
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
    return name


def test_a_pod_parked_on_an_extender_error_is_annotated_with_the_manifests_rbac(control_plane, admin, core, ns, nodes):
    nodes(f"{ns}-n", 2, inventory=True)
    core.create_namespaced_pod(ns, pod_body("parked", gpus=1, scheduler="default-scheduler"))
    core.create_namespaced_pod(ns, pod_body("nofit", gpus=1, scheduler="default-scheduler"))
    down = 'Post "http://gpufleet-extender.kube-system.svc:8888/filter": dial tcp 10.0.0.9:8888: connect: connection refused'
    for name, reason, msg in (("parked", "SchedulerError", down), ("nofit", "Unschedulable", "0/3 nodes are available")):
        core.patch_namespaced_pod_status(name, ns, {"status": {"conditions": [
            {"type": "PodScheduled", "status": "False", "reason": reason, "message": msg}]}})
    api = KubernetesApi(sa_kubeconfig(control_plane, admin, "deploy/extender/extender.yaml", "gpufleet-extender", ns))
    # the UID guard: a merge patch naming another UID is refused by the apiserver
    with pytest.raises((Conflict, ApiError)):
        api.annotate_pod(ns, "parked", {"x": "y"}, uid="00000000-0000-0000-0000-000000000000")
    loop = ExtenderLoop(api, load_profile("default", None))
    lock = threading.Lock()
    runner = Runner(api, loop, lock=lock, watch_timeout_s=20)
    stop = threading.Event()
    t = threading.Thread(target=runner.run, args=(stop,), daemon=True)
    t.start()
    try:
        assert runner.ready.wait(20)
        ext = Extender(loop, lock, runner.ready)
        assert wait_until(lambda: f"{ns}/parked" in loop.stuck, 10)
        assert f"{ns}/nofit" not in loop.stuck
        assert ext.sweep() == 0 and ext.metrics.retries._value.get() == 1
        ann = core.read_namespaced_pod("parked", ns).metadata.annotations or {}
        assert RETRY_ANNOTATION in ann
        assert RETRY_ANNOTATION not in (core.read_namespaced_pod("nofit", ns).metadata.annotations or {})
    finally:
        stop.set()
        t.join(10)
