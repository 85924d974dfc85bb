"""kube/plugin_down on a real kube-apiserver: kubelet's refusal of a pod gpufleet placed (its status written as kubelet
writes it: Failed, UnexpectedAdmissionError, the device manager's message) reaches the scheduler as the live-pods
watch shows it -- DELETED with the last live state -- and is read back; the node is held for GPU pods, the bare pod is
re-created, and the agent's registration annotation ends the hold."""

from __future__ import annotations

import datetime
import json

import pytest

from gpufleet.kube.runner import wait_until

from .test_kube_scheduler import Sched, bound, events, pod_body

pytestmark = pytest.mark.apiserver  # needs KUBEBUILDER_ASSETS (tests/apiserver_support.py)

UNHEALTHY = ("Pod was rejected: Allocate failed due to no healthy devices present; cannot allocate unhealthy devices "
             "nvidia.com/gpu, which is unexpected")


@pytest.fixture
def ns(core):
    import uuid

    from kubernetes import client

    name = f"it-{uuid.uuid4().hex[:6]}"
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
    return name


def _now(offset_s: float = 0.0) -> str:
    t = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(seconds=offset_s)
    return t.strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def test_a_refusal_holds_the_node_recreates_the_bare_pod_and_the_agents_registration_ends_it(control_plane, core, ns, nodes):
    node = nodes(f"{ns}-n", 2, inventory=True)
    s = Sched(str(control_plane.kubeconfig))
    try:
        core.create_namespaced_pod(ns, pod_body("a"))
        assert wait_until(lambda: "a" in bound(core, ns), 20), "a was never bound"
        # kubelet refuses it: the device plugin was down (what kubelet writes, with the start time it stamps)
        core.patch_namespaced_pod_status("a", ns, {"status": {
            "phase": "Failed", "reason": "UnexpectedAdmissionError", "message": UNHEALTHY, "startTime": _now(-1)}})
        assert wait_until(lambda: s.loop.plugin_down.held(node), 10), s.loop.plugin_down.log
        # the bare pod comes back as a copy that names it, unbound while the node is held
        assert wait_until(lambda: any(p.metadata.name == "a-r1" for p in core.list_namespaced_pod(ns).items), 10), \
            [p.metadata.name for p in core.list_namespaced_pod(ns).items]
        copy_ = core.read_namespaced_pod("a-r1", ns)
        moved = json.loads(copy_.metadata.annotations["gpufleet.io/moved-from"])
        assert moved["pod"] == f"{ns}/a" and moved["node"] == node and "no healthy devices" in moved["reason"], moved
        core.create_namespaced_pod(ns, pod_body("b"))
        core.create_namespaced_pod(ns, pod_body("cpu", gpus=0))
        assert wait_until(lambda: "cpu" in bound(core, ns), 20), "a pod without GPUs is not held"

        def said() -> list[str]:
            return [e.message for e in events(core, ns) if e.involved_object.name == "b" and e.reason == "FailedScheduling"]
        assert wait_until(lambda: any("GPU device plugin down" in m for m in said()), 20), said()
        assert not ({"a-r1", "b"} & set(bound(core, ns)))
        recreated = [e for e in events(core, ns) if e.involved_object.name == "a" and e.reason == "Recreated"]
        assert recreated and f"{ns}/a-r1" in recreated[0].message, [(e.reason, e.message) for e in events(core, ns)]
        # the new agent registers and says so: both are placed
        core.patch_node(node, {"metadata": {"annotations": {"gpufleet.io/device-plugin-registered": _now()}}})
        assert wait_until(lambda: {"a-r1", "b"} <= set(bound(core, ns)), 20), s.loop.plugin_down.log
        assert not s.loop.plugin_down.holds and s.loop.stats.plugin_holds == 1 and s.loop.stats.recreated == 1
    finally:
        s.stop()


def test_explain_names_the_hold_and_another_schedulers_pod_is_recreated_once_the_plugin_is_back(control_plane, core, ns, nodes):
    """Kubernetes 1.35's case: kube-scheduler's bare GPU pod (bound by it, no assignment) refused for the dead plugin
    holds the node; ``gpufleet explain`` (a separate process: it reads the hold back from the API) names the hold on
    the node's line and says why and until when; with --recreate-other-schedulers-pods the pod's copy, under its own
    scheduler name, is made only once the agent's registration ends the hold."""
    from gpufleet.kube import explain_cli
    from gpufleet.kube.api import KubernetesApi
    from gpufleet.kube.cli import load_profile

    node = nodes(f"{ns}-n", 2, inventory=True)
    s = Sched(str(control_plane.kubeconfig))
    s.loop.plugin_down.recreate_foreign = True
    try:
        d = pod_body("d", scheduler="default-scheduler")
        d["spec"]["nodeName"] = node  # what kube-scheduler's Binding leaves
        core.create_namespaced_pod(ns, d)
        core.patch_namespaced_pod_status("d", ns, {"status": {
            "phase": "Failed", "reason": "UnexpectedAdmissionError", "message": UNHEALTHY, "startTime": _now(-1)}})
        assert wait_until(lambda: s.loop.plugin_down.held(node), 10), s.loop.plugin_down.log
        core.create_namespaced_pod(ns, pod_body("b"))
        text = ""

        def explained() -> bool:
            nonlocal text
            code, text = explain_cli.explain(KubernetesApi(str(control_plane.kubeconfig)), load_profile("default", None), f"{ns}/b")
            return code == 0 and f"  held: {node}: GPU device plugin down since " in text
        assert wait_until(explained, 20), text
        held = next(ln for ln in text.splitlines() if ln.startswith("  held: "))
        assert f"kubelet refused {ns}/d (" in held and "no healthy devices" in held and "last registered: never" in held, held
        assert "GPU device plugin down" in next(ln for ln in text.splitlines() if ln.strip().startswith(node)), text
        assert "GPU device plugin down" in text.splitlines()[0], text  # the diagnosis, as FailedScheduling says it
        # not re-created while the plugin is down (kube-scheduler would bind the copy by its stale allocatable)
        import time
        time.sleep(2)
        assert "d-r1" not in {p.metadata.name for p in core.list_namespaced_pod(ns).items}
        core.patch_node(node, {"metadata": {"annotations": {"gpufleet.io/device-plugin-registered": _now()}}})
        assert wait_until(lambda: any(p.metadata.name == "d-r1" for p in core.list_namespaced_pod(ns).items), 20), \
            s.loop.plugin_down.log
        c = core.read_namespaced_pod("d-r1", ns)
        assert c.spec.scheduler_name == "default-scheduler" and not c.spec.node_name
        assert json.loads(c.metadata.annotations["gpufleet.io/moved-from"])["pod"] == f"{ns}/d"
        assert wait_until(lambda: "b" in bound(core, ns), 20)
        code, text = explain_cli.explain(KubernetesApi(str(control_plane.kubeconfig)), load_profile("default", None), f"{ns}/b")
        assert "held:" not in text and f"bound to {node}" in text, text
    finally:
        s.stop()
