"""deploy/admission on a real kube-apiserver: pods that ask for nvidia.com/gpu and would go to kube-scheduler are
created with ``spec.schedulerName: gpufleet``; every other pod is left exactly as it was asked for.

The policy is applied from the manifest as shipped; each case is a pod as a user or a controller writes it.
"""

from __future__ import annotations

import copy
import uuid
from pathlib import Path

import pytest
import yaml

from gpufleet.kube.runner import wait_until

ROOT = Path(__file__).parents[2]
POLICY = ROOT / "deploy/admission/route-gpu-pods.yaml"
# MutatingAdmissionPolicy (admissionregistration.k8s.io/v1) is GA and served from 1.36; 1.35 has it beta and off, so
# the routing does not exist there (docs/safety.md: the node guard is what holds on 1.35)
pytestmark = [pytest.mark.apiserver, pytest.mark.min_release(
    1, 36, reason="MutatingAdmissionPolicy (admissionregistration.k8s.io/v1) is served from 1.36; beta and off in 1.35")]


def _pod(name: str, **spec) -> dict:
    c = {"name": "c", "image": "busybox"}
    res = spec.pop("resources", None)
    if res is not None:
        c["resources"] = res
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": {"containers": [c], **spec}}


GPU = {"limits": {"nvidia.com/gpu": "1"}}
CASES = {  # name -> (pod, routed to gpufleet?)
    "gpu-limit": (_pod("gpu-limit", resources=GPU), True),
    "gpu-requests-and-limits": (_pod("gpu-requests-and-limits", resources={"requests": {"nvidia.com/gpu": "2"},
                                                                           "limits": {"nvidia.com/gpu": "2"}}), True),
    "explicit-default": (_pod("explicit-default", resources=GPU, schedulerName="default-scheduler"), True),
    "gpu-share": (_pod("gpu-share", resources=GPU), True),  # (annotated below) a share also needs gpufleet
    "init-gpu": ({**_pod("init-gpu"), "spec": {"containers": [{"name": "c", "image": "busybox"}],
                                                "initContainers": [{"name": "i", "image": "busybox", "resources": GPU}]}}, True),
    "cpu-only": (_pod("cpu-only", resources={"requests": {"cpu": "1"}}), False),
    "no-resources": (_pod("no-resources"), False),
    "mig-only": (_pod("mig-only", resources={"limits": {"nvidia.com/mig-1g.10gb": "1"}}), False),
    "other-scheduler": (_pod("other-scheduler", resources=GPU, schedulerName="volcano"), False),
    "already-gpufleet": (_pod("already-gpufleet", resources=GPU, schedulerName="gpufleet"), True),
    "created-bound": (_pod("created-bound", resources=GPU, nodeName="some-node"), False),
}


@pytest.fixture(scope="module")
def policy(admin):
    from kubernetes import client, utils

    docs = [d for d in yaml.safe_load_all(POLICY.read_text()) if d]
    for d in docs:
        utils.create_from_dict(admin, d)
    yield docs
    api = client.AdmissionregistrationV1Api(admin)
    for d in docs:
        name = d["metadata"]["name"]
        if d["kind"] == "MutatingAdmissionPolicy":
            api.delete_mutating_admission_policy(name)
        else:
            api.delete_mutating_admission_policy_binding(name)


def _ns(core, labels=None) -> str:
    name = f"adm-{uuid.uuid4().hex[:6]}"
    core.create_namespace({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": labels or {}}})
    return name


def _active(core, ns: str) -> bool:
    """The policy is in force once a probe pod comes back routed (kube-apiserver loads policies asynchronously)."""
    name = f"probe-{uuid.uuid4().hex[:4]}"
    p = core.create_namespaced_pod(ns, _pod(name, resources=GPU))
    core.delete_namespaced_pod(name, ns, grace_period_seconds=0)
    return p.spec.scheduler_name == "gpufleet"


def test_gpu_pods_are_routed_to_gpufleet_and_nothing_else_changes(control_plane, admin, core, policy):
    ns = _ns(core)
    assert wait_until(lambda: _active(core, ns), 30, 0.5), "the MutatingAdmissionPolicy never took effect"
    got = {}
    for name, (body, routed) in CASES.items():
        b = copy.deepcopy(body)
        if name == "gpu-share":
            b["metadata"]["annotations"] = {"gpufleet.io/gpu-milli": "300"}
        p = core.create_namespaced_pod(ns, b)
        want = "gpufleet" if routed else (body["spec"].get("schedulerName") or "default-scheduler")
        got[name] = (p.spec.scheduler_name, want)
        ann = (p.metadata.annotations or {}).get("gpufleet.io/routed-by")
        if routed and body["spec"].get("schedulerName") != "gpufleet":
            assert ann == "MutatingAdmissionPolicy gpufleet-route-gpu-pods", name
        else:
            assert ann is None, name
        assert p.spec.containers[0].image == "busybox"  # the rest of the pod is untouched
    assert all(g == w for g, w in got.values()), {k: v for k, v in got.items() if v[0] != v[1]}
    for name in CASES:
        core.delete_namespaced_pod(name, ns, grace_period_seconds=0)


def test_a_namespace_can_opt_out(control_plane, admin, core, policy):
    on, off = _ns(core), _ns(core, {"gpufleet.io/scheduler-routing": "off"})
    assert wait_until(lambda: _active(core, on), 30, 0.5)
    p = core.create_namespaced_pod(off, _pod("kept", resources=GPU))
    assert p.spec.scheduler_name == "default-scheduler"
    core.delete_namespaced_pod("kept", off, grace_period_seconds=0)
