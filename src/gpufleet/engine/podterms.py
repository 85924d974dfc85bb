"""Pod JSON -> ``PodTerms``: inter-pod affinity, topology spread, host ports, volumes.

Parsing is strict (a bad value raises ``InvalidPodSpec`` naming the JSON
path); ``matchLabelKeys`` / ``mismatchLabelKeys`` are folded into the label
selector here, with the pod's own label values, as kube-apiserver does from
1.29 on.  ``unsupported_fields`` is the "nothing silent" net: a pod-spec field
the engine does not honour makes the pod fail scheduling with a reason naming
the field, instead of being bound as if the field were absent.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .constraints import (
    HostPort,
    PodAffinityTerm,
    PodTerms,
    SpreadConstraint,
)
from .errors import InvalidPodSpec
from .selector import LabelSelector, parse_label_selector, with_label_keys

# inline volume sources whose placement rules (zone labels, single-writer) the engine does not model
UNSUPPORTED_VOLUME_SOURCES = ("gcePersistentDisk", "awsElasticBlockStore", "azureDisk", "cinder", "rbd", "iscsi",
                              "portworxVolume", "vsphereVolume", "photonPersistentDisk", "scaleIO", "storageos")


class UnsupportedPodField(InvalidPodSpec):
    """The pod uses a scheduling-relevant field gpufleet does not honour (yet)."""


def _obj(pod: str, path: str, v: Any) -> Mapping[str, Any]:
    if v is None:
        return {}
    if not isinstance(v, Mapping):
        raise InvalidPodSpec(pod, path, "must be an object")
    return v


def _lst(pod: str, path: str, v: Any) -> list[Any]:
    if v is None:
        return []
    if not isinstance(v, list):
        raise InvalidPodSpec(pod, path, "must be a list")
    return v


def _str_list(pod: str, path: str, v: Any) -> tuple[str, ...]:
    out = []
    for i, s in enumerate(_lst(pod, path, v)):
        if not isinstance(s, str) or not s:
            raise InvalidPodSpec(pod, f"{path}[{i}]", "must be a non-empty string")
        out.append(s)
    return tuple(out)


def parse_selector(pod: str, path: str, v: Any) -> LabelSelector | None:
    """A ``metav1.LabelSelector`` in a pod's spec; None when absent (matches nothing)."""
    return parse_label_selector(v, path, lambda f, m: InvalidPodSpec(pod, f, m))


def _affinity_term(pod: str, path: str, t: Any, ns: str, labels: Mapping[str, str], weight: int = 0) -> PodAffinityTerm:
    t = _obj(pod, path, t)
    tk = t.get("topologyKey")
    if not isinstance(tk, str) or not tk:
        raise InvalidPodSpec(pod, f"{path}.topologyKey", "must be a non-empty string")
    sel = parse_selector(pod, f"{path}.labelSelector", t.get("labelSelector"))
    match = _str_list(pod, f"{path}.matchLabelKeys", t.get("matchLabelKeys"))
    mismatch = _str_list(pod, f"{path}.mismatchLabelKeys", t.get("mismatchLabelKeys"))
    both = set(match) & set(mismatch)
    if both:
        raise InvalidPodSpec(pod, f"{path}.mismatchLabelKeys", f"key(s) {sorted(both)} also in matchLabelKeys")
    sel = with_label_keys(sel, labels, match, mismatch)
    names = frozenset(_str_list(pod, f"{path}.namespaces", t.get("namespaces")))
    ns_sel = parse_selector(pod, f"{path}.namespaceSelector", t.get("namespaceSelector"))
    if not names and ns_sel is None:
        names = frozenset((ns,))
    return PodAffinityTerm(sel, tk, names, ns_sel, weight)


def _affinity_block(pod: str, path: str, block: Any, ns: str, labels: Mapping[str, str]) -> tuple[tuple[PodAffinityTerm, ...], tuple[PodAffinityTerm, ...]]:
    b = _obj(pod, path, block)
    rp = f"{path}.requiredDuringSchedulingIgnoredDuringExecution"
    required = tuple(_affinity_term(pod, f"{rp}[{i}]", t, ns, labels)
                     for i, t in enumerate(_lst(pod, rp, b.get("requiredDuringSchedulingIgnoredDuringExecution"))))
    pp = f"{path}.preferredDuringSchedulingIgnoredDuringExecution"
    preferred = []
    for i, w in enumerate(_lst(pod, pp, b.get("preferredDuringSchedulingIgnoredDuringExecution"))):
        w = _obj(pod, f"{pp}[{i}]", w)
        weight = w.get("weight")
        if not isinstance(weight, int) or isinstance(weight, bool) or not 1 <= weight <= 100:
            raise InvalidPodSpec(pod, f"{pp}[{i}].weight", f"must be an integer 1..100, got {weight!r}")
        preferred.append(_affinity_term(pod, f"{pp}[{i}].podAffinityTerm", w.get("podAffinityTerm"), ns, labels, weight))
    return required, tuple(preferred)


def _spread(pod: str, path: str, c: Any, labels: Mapping[str, str]) -> SpreadConstraint:
    c = _obj(pod, path, c)
    skew = c.get("maxSkew")
    if not isinstance(skew, int) or isinstance(skew, bool) or skew < 1:
        raise InvalidPodSpec(pod, f"{path}.maxSkew", f"must be an integer >= 1, got {skew!r}")
    tk = c.get("topologyKey")
    if not isinstance(tk, str) or not tk:
        raise InvalidPodSpec(pod, f"{path}.topologyKey", "must be a non-empty string")
    wu = c.get("whenUnsatisfiable")
    if wu not in ("DoNotSchedule", "ScheduleAnyway"):
        raise InvalidPodSpec(pod, f"{path}.whenUnsatisfiable", f"must be DoNotSchedule or ScheduleAnyway, got {wu!r}")
    md = c.get("minDomains")
    if md is not None:
        if not isinstance(md, int) or isinstance(md, bool) or md < 1:
            raise InvalidPodSpec(pod, f"{path}.minDomains", f"must be an integer >= 1, got {md!r}")
        if wu != "DoNotSchedule":
            raise InvalidPodSpec(pod, f"{path}.minDomains", "may only be set with whenUnsatisfiable DoNotSchedule")
    pol: dict[str, Any] = {}
    for f, default in (("nodeAffinityPolicy", "Honor"), ("nodeTaintsPolicy", "Ignore")):
        v = c.get(f) or default
        if v not in ("Honor", "Ignore"):
            raise InvalidPodSpec(pod, f"{path}.{f}", f"must be Honor or Ignore, got {v!r}")
        pol[f] = v
    sel = parse_selector(pod, f"{path}.labelSelector", c.get("labelSelector"))
    sel = with_label_keys(sel, labels, _str_list(pod, f"{path}.matchLabelKeys", c.get("matchLabelKeys")))
    return SpreadConstraint(skew, tk, wu, sel, md or 1, pol["nodeAffinityPolicy"], pol["nodeTaintsPolicy"])


def _ports(pod: str, spec: Mapping[str, Any]) -> tuple[HostPort, ...]:
    out: list[HostPort] = []
    for kind in ("initContainers", "containers"):
        for i, c in enumerate(_lst(pod, f"spec.{kind}", spec.get(kind))):
            if not isinstance(c, Mapping):
                continue
            if kind == "initContainers" and c.get("restartPolicy") != "Always":
                continue  # an ordinary init container has exited before the pod runs: its ports are not held
            for j, p in enumerate(_lst(pod, f"spec.{kind}[{i}].ports", c.get("ports"))):
                path = f"spec.{kind}[{i}].ports[{j}]"
                p = _obj(pod, path, p)
                hp = p.get("hostPort")
                if not hp and spec.get("hostNetwork"):
                    hp = p.get("containerPort")  # kube-apiserver's defaulting: host network holds the container port
                if hp is None or hp == 0:
                    continue
                if not isinstance(hp, int) or isinstance(hp, bool) or not 1 <= hp <= 65535:
                    raise InvalidPodSpec(pod, f"{path}.hostPort", f"must be a port number 1..65535, got {hp!r}")
                proto = p.get("protocol") or "TCP"
                if proto not in ("TCP", "UDP", "SCTP"):
                    raise InvalidPodSpec(pod, f"{path}.protocol", f"must be TCP, UDP or SCTP, got {proto!r}")
                ip = p.get("hostIP") or "0.0.0.0"
                if not isinstance(ip, str):
                    raise InvalidPodSpec(pod, f"{path}.hostIP", "must be a string")
                hport = HostPort(hp, proto, ip)
                if hport not in out:
                    out.append(hport)
    return tuple(out)


def _claims(pod: str, name: str, spec: Mapping[str, Any]) -> tuple[str, ...]:
    out: list[str] = []
    for i, v in enumerate(_lst(pod, "spec.volumes", spec.get("volumes"))):
        path = f"spec.volumes[{i}]"
        v = _obj(pod, path, v)
        for src in UNSUPPORTED_VOLUME_SOURCES:
            if src in v:
                raise UnsupportedPodField(pod, f"{path}.{src}", "inline volume of this type is not supported by gpufleet "
                                          "(its placement rules are not modelled); use a PersistentVolumeClaim")
        pvc = v.get("persistentVolumeClaim")
        if pvc is not None:
            cn = _obj(pod, f"{path}.persistentVolumeClaim", pvc).get("claimName")
            if not isinstance(cn, str) or not cn:
                raise InvalidPodSpec(pod, f"{path}.persistentVolumeClaim.claimName", "must be a non-empty string")
            out.append(cn)
        elif v.get("ephemeral") is not None:
            out.append(f"{name}-{v.get('name')}")  # the PVC the ephemeral-volume controller creates
    return tuple(dict.fromkeys(out))


def owner_uid(meta: Mapping[str, Any]) -> str:
    for o in meta.get("ownerReferences") or []:
        if isinstance(o, Mapping) and o.get("controller"):
            return str(o.get("uid") or "")
    return ""


def unsupported_fields(pod: str, spec: Mapping[str, Any]) -> None:
    """Raise ``UnsupportedPodField`` for a scheduling field the engine does not honour.  (``spec.resourceClaims``
    is honoured: the adapter resolves the claims into ``PodRequest.dra``, kube/dra.)"""
    if spec.get("workloadRef"):
        raise UnsupportedPodField(pod, "spec.workloadRef", "the Kubernetes 1.35 alpha Workload API is not supported by gpufleet; "
                                  "1.37's spec.schedulingGroup (scheduling.k8s.io/v1beta1 PodGroup) is")


def parse_terms(pod: str, meta: Mapping[str, Any], spec: Mapping[str, Any]) -> PodTerms:
    """The pod's labels and its pod-to-pod, port and volume constraints; raises InvalidPodSpec."""
    unsupported_fields(pod, spec)
    ns = meta.get("namespace") or "default"
    labels = meta.get("labels") or {}
    if not isinstance(labels, Mapping):
        raise InvalidPodSpec(pod, "metadata.labels", "must be an object")
    labels = {str(k): str(v) for k, v in labels.items()}
    aff = _obj(pod, "spec.affinity", spec.get("affinity"))
    req_a, pref_a = _affinity_block(pod, "spec.affinity.podAffinity", aff.get("podAffinity"), ns, labels)
    req_aa, pref_aa = _affinity_block(pod, "spec.affinity.podAntiAffinity", aff.get("podAntiAffinity"), ns, labels)
    spread = tuple(_spread(pod, f"spec.topologySpreadConstraints[{i}]", c, labels)
                   for i, c in enumerate(_lst(pod, "spec.topologySpreadConstraints", spec.get("topologySpreadConstraints"))))
    return PodTerms(
        namespace=ns, labels=labels, owner_uid=owner_uid(meta),
        affinity=req_a, anti_affinity=req_aa, preferred_affinity=pref_a, preferred_anti_affinity=pref_aa,
        spread=spread, host_ports=_ports(pod, spec), claims=_claims(pod, str(meta.get("name") or ""), spec),
    )


def lenient_terms(pod: Mapping[str, Any]) -> PodTerms:
    """Terms of a pod that is already bound: a bad field costs that field, never the pod's labels."""
    meta = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    key = f"{meta.get('namespace') or 'default'}/{meta.get('name')}"
    try:
        return parse_terms(key, meta, {k: v for k, v in spec.items() if k not in ("resourceClaims", "workloadRef")})
    except InvalidPodSpec:
        raw = meta.get("labels")
        labels: Mapping[str, Any] = raw if isinstance(raw, Mapping) else {}
        return PodTerms(namespace=meta.get("namespace") or "default", labels={str(k): str(v) for k, v in labels.items()},
                        owner_uid=owner_uid(meta))
