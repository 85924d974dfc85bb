"""Extender mode with DRA: kube-scheduler allocates ResourceClaims itself; the extender never contradicts it.

``nvidia.com/gpu`` pods reach the extender (its managed resource); on a DRA node (no device plugin serves the resource,
a DeviceClass maps it) kube-scheduler allocates a claim for it, so the extender passes such nodes, picks no GPU there
(the claim holds the device) and counts the devices kube-scheduler's claims hold, as it counts every claim.
"""

from __future__ import annotations

import json

from gpufleet.kube.extender import Extender, ExtenderLoop
from gpufleet.policies import build_profile

from .dra_fixtures import DRIVER, claim, dra_api, sync
from .test_dra_live import gpu_pod
from .test_loop import node as dp_node


def test_the_extender_passes_dra_nodes_for_nvidia_gpu_and_counts_kube_schedulers_claims():
    api = dra_api(1)
    api.add_node(dp_node("plugin", gpus=1, inventory=True))
    loop = ExtenderLoop(api, build_profile("default"))
    loop.resync()
    assert "DynamicResources" not in {p.name for p in loop.profile.filters}  # kube-scheduler's job
    e = Extender(loop)
    one = gpu_pod("one", scheduler="default-scheduler")
    api.add_pod(one)
    sync(api, loop)
    f = e.filter({"Pod": one, "NodeNames": ["d0", "plugin"]})  # either serves one GPU: the policy picks one
    assert len(f["NodeNames"]) == 1 and f["Error"] == ""
    e.loop.release("ml/one", "test")
    p = gpu_pod("x", 2, scheduler="default-scheduler")  # two GPUs: only the DRA node has them
    api.add_pod(p)
    sync(api, loop)
    f = e.filter({"Pod": p, "NodeNames": ["d0", "plugin"]})
    assert f["NodeNames"] == ["d0"] and f["Error"] == "" and "Insufficient nvidia.com/gpu" in f["FailedNodes"]["plugin"]
    # kube-scheduler chose d0, wrote the pod's claim (gpu-4) and its status in PreBind, then calls the extender's bind
    api.put_object("resourceclaim", claim("x-extended-resources-abcde"))
    api.patch_object("resourceclaim", "ml", "x-extended-resources-abcde", {"status": {
        "allocation": {"devices": {"results": [{"request": "container-0-request-2", "driver": DRIVER, "pool": "d0", "device": d}
                                               for d in ("gpu-4", "gpu-5")]}},
        "reservedFor": [{"resource": "pods", "name": "x", "uid": "uid-x"}]}}, "status")
    api.patch_pod_status("ml", "x", {"status": {"extendedResourceClaimStatus": {"resourceClaimName": "x-extended-resources-abcde",
                                                                                 "requestMappings": []}}})
    sync(api, loop)
    b = e.bind({"PodName": "x", "PodNamespace": "ml", "PodUID": "uid-x", "Node": "d0"})
    assert b["Error"] == ""
    assert json.loads(api.pods["ml/x"]["metadata"]["annotations"]["gpufleet.io/assignment"])["gpus"] == []
    sync(api, loop)
    st = loop.cache.state
    i = st.index["d0"]
    assert int(st.gpu_free_milli[i, 4]) == 0 and int(st.gpu_free_milli[i].sum()) == 4000  # gpu-4 and 5, held by the claim
    assert "ml/x-extended-resources-abcde" in st.claim_holds
    # a restarted extender holds the same, from the claim, and models no device-plugin GPU for the pod
    fresh = ExtenderLoop(api, build_profile("default"))
    fresh.resync()
    assert int(fresh.cache.state.gpu_free_milli[i].sum()) == 4000 and not fresh.cache.state.assignments["ml/x"].gpu_indices
