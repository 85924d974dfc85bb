"""The claim for a pod's DRA-backed extended resources (``nvidia.com/gpu: 1`` on a DRA node), from the pod's JSON.

kube-scheduler 1.37 (``extendeddynamicresources.go``) builds it the same way; written anew here from its rules:

* every extended resource the pod requests that a DeviceClass maps (``spec.extendedResourceName``, or the implicit
  ``deviceclass.resource.kubernetes.io/<class>``), in name order;
* per container (init containers first, then containers; index across both), one ExactCount request
  ``container-<i>-request-<j>`` for its amount, ``j`` the resource's place among the container's sorted request
  names; a regular container or a sidecar (init container with ``restartPolicy: Always``) always gets its own;
  a plain init container first reuses the requests of the long-lived containers after it, and of all plain init
  containers only the largest request is kept (they run one at a time), the others' mappings renamed to it;
* requests sorted by name; ``status.extendedResourceClaimStatus.requestMappings`` says which container's resource
  each request serves.

The claim gets a name of its own, derived from the pod's UID (kube-scheduler lets the apiserver generate one; any
name serves, kubelet reads it from the pod's status), so the hold taken at Reserve already has the claim's key.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping  # collections.abc: isinstance checks without typing's detour
from typing import Any

from ...engine.dra.extended import ExtendedClaim
from ...engine.dra.objects import EXTENDED_RESOURCE_CLAIM_ANNOTATION, IMPLICIT_EXTENDED_RESOURCE_PREFIX, DeviceClass, parse_claim
from ...engine.errors import InvalidQuantity
from ...engine.quantity import to_int


def claim_name(pod_name: str, pod_uid: str) -> str:
    return f"{pod_name[:200]}-extended-resources-{hashlib.sha256(pod_uid.encode()).hexdigest()[:5]}"


def _amount(c: Mapping[str, Any], name: str) -> int:
    res = c.get("resources") or {}
    raw = (res.get("requests") or {}).get(name, (res.get("limits") or {}).get(name))
    if raw is None:
        return 0
    try:
        return to_int(raw)
    except InvalidQuantity:
        return 0  # parse_pod names the bad field


def _request(i: int, c: Mapping[str, Any], name: str, cls: str, reusable: list[dict | None]) -> tuple[dict | None, list[tuple]]:
    want = _amount(c, name)
    if want <= 0:
        return None, []
    maps = []
    got = 0
    for r in reusable:
        if r is None:
            continue
        got += r["exactly"]["count"]
        maps.append((c.get("name", ""), name, r["name"]))
        if got >= want:
            return None, maps
    res = c.get("resources") or {}
    keys = sorted(set(res.get("requests") or {}) | set(res.get("limits") or {}))
    req = {"name": f"container-{i}-request-{keys.index(name)}",
           "exactly": {"deviceClassName": cls, "allocationMode": "ExactCount", "count": want - got}}
    maps.append((c.get("name", ""), name, req["name"]))
    return req, maps


def requests_and_mappings(pod: Mapping[str, Any], mapped: Mapping[str, DeviceClass]) -> tuple[list[dict], list[tuple], list[tuple[str, int]]]:
    """(device requests, (container, resource, request) mappings, (resource, pod amount)) for the mapped resources."""
    spec = pod.get("spec") or {}
    inits = [c for c in spec.get("initContainers") or [] if isinstance(c, Mapping)]
    containers = inits + [c for c in spec.get("containers") or [] if isinstance(c, Mapping)]
    long_lived = [i for i, c in enumerate(containers) if i >= len(inits) or c.get("restartPolicy") == "Always"]
    short_lived = [i for i in range(len(inits)) if i not in long_lived]
    names = sorted(n for n in mapped if any(_amount(c, n) > 0 for c in containers))
    requests: list[dict] = []
    mappings: list[tuple] = []
    amounts = []
    for name in names:
        cls = mapped[name].name
        longs: list[dict | None] = [None] * len(containers)
        long_maps: list[tuple] = []
        for i in long_lived:
            longs[i], m = _request(i, containers[i], name, cls, [])
            long_maps += m
        biggest: dict | None = None
        short_names: set[str] = set()
        short_maps: list[tuple] = []
        for i in short_lived:
            r, m = _request(i, containers[i], name, cls, longs[i:])
            if r is not None:
                short_names.add(r["name"])
                if biggest is None or biggest["exactly"]["count"] < r["exactly"]["count"]:
                    biggest = r
            short_maps += m
        if biggest is not None and len(short_names) > 1:
            short_names.discard(biggest["name"])
            short_maps = [(c, res, biggest["name"] if req in short_names else req) for c, res, req in short_maps]
        if biggest is not None:
            requests.append(biggest)
        requests += [r for r in longs if r is not None]
        mappings += long_maps + short_maps
        long_total = sum(_amount(containers[i], name) for i in long_lived)
        amounts.append((name, max([long_total] + [_amount(containers[i], name) for i in short_lived])))
    requests.sort(key=lambda r: r["name"])
    return requests, mappings, amounts


def _names_any(pod: Mapping[str, Any], mapped: Mapping[str, DeviceClass]) -> bool:
    """Some container's requests or limits name a mapped resource (most pods: none, and then no claim)."""
    spec = pod.get("spec") or {}
    for c in (spec.get("initContainers") or []) + (spec.get("containers") or []):
        res = c.get("resources") if isinstance(c, Mapping) else None
        if isinstance(res, Mapping):
            for part in (res.get("requests"), res.get("limits")):
                if isinstance(part, Mapping) and any(k in mapped for k in part):
                    return True
    return False


def extended_claim(pod: Mapping[str, Any], mapped: Mapping[str, DeviceClass]) -> ExtendedClaim | None:
    """The pod's extended-resource claim, or None when no resource it requests is backed by DRA."""
    if not mapped or not _names_any(pod, mapped):
        return None
    reqs, maps, amounts = requests_and_mappings(pod, mapped)
    if not reqs:
        return None
    m = pod.get("metadata") or {}
    name, uid = str(m.get("name") or ""), str(m.get("uid") or "")
    obj = {"metadata": {"name": claim_name(name, uid), "namespace": m.get("namespace") or "default",
                        "annotations": {EXTENDED_RESOURCE_CLAIM_ANNOTATION: "true"},
                        "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": name, "uid": uid, "controller": True}]},
           "spec": {"devices": {"requests": reqs}}}
    return ExtendedClaim(parse_claim(obj), tuple(amounts), tuple(maps))


def claim_body(ext: ExtendedClaim, pod: Mapping[str, Any], finalizer: str) -> dict:
    """The ResourceClaim object to create (with the finalizer, so no update is needed to add it)."""
    m = pod.get("metadata") or {}
    c = ext.claim
    reqs = []
    for r in c.spec.requests:
        e = r.exactly
        assert e is not None
        reqs.append({"name": r.name, "exactly": {"deviceClassName": e.device_class_name, "allocationMode": "ExactCount",
                                                  "count": e.count}})
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": c.name, "namespace": c.namespace, "finalizers": [finalizer],
                         "annotations": {EXTENDED_RESOURCE_CLAIM_ANNOTATION: "true"},
                         "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": m.get("name"), "uid": m.get("uid"),
                                              "controller": True}]},
            "spec": {"devices": {"requests": reqs}}}


def status_patch(ext: ExtendedClaim) -> dict:
    """pods/status: ``status.extendedResourceClaimStatus``, as kube-scheduler writes it before the bind."""
    return {"status": {"extendedResourceClaimStatus": {
        "requestMappings": [{"containerName": c, "resourceName": r, "requestName": q} for c, r, q in ext.mappings],
        "resourceClaimName": ext.claim.name}}}


def is_extended_name(name: str) -> bool:
    return name.startswith(IMPLICIT_EXTENDED_RESOURCE_PREFIX) or ("/" in name and not name.split("/", 1)[0].endswith("kubernetes.io"))


__all__ = ["claim_body", "claim_name", "extended_claim", "is_extended_name", "requests_and_mappings", "status_patch"]
