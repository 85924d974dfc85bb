"""Spot capacity: which nodes are spot, which pods may run there, and which nodes are about to go away.

Why in the engine: the scheduler's plugins, the replay's spot model, the node agent's cost labels and
``gpufleet cost`` must all agree on what "a spot node" and "an interruption notice" are, so the rules
live once, here, as pure functions of a node's labels and taints.

A node is spot when one of the labels the providers and Karpenter set says so (names as they publish
them; values compared without case, since EKS writes ``SPOT`` and Karpenter ``spot``):

========================================  =========  =========================================
label                                     value      set by
========================================  =========  =========================================
``karpenter.sh/capacity-type``            ``spot``   Karpenter (any provider)
``eks.amazonaws.com/capacityType``        ``SPOT``   EKS managed node groups
``cloud.google.com/gke-spot``             ``true``   GKE Spot VMs
``cloud.google.com/gke-preemptible``      ``true``   GKE preemptible VMs
``kubernetes.azure.com/scalesetpriority`` ``spot``   AKS spot node pools
========================================  =========  =========================================

or when a label the cluster's own configuration names (``spot_labels``) matches.

A node has an *interruption notice* when it carries one of these taints (any effect): Karpenter's
``karpenter.sh/disrupted`` (it drains a node it is about to terminate, also on a spot interruption
message), the AWS Node Termination Handler's ``aws-node-termination-handler/spot-itn``,
``.../scheduled-maintenance`` and ``.../asg-lifecycle-termination``, GKE's
``cloud.google.com/impending-node-termination``, the cluster autoscaler's
``ToBeDeletedByClusterAutoscaler`` and Kubernetes' ``node.kubernetes.io/out-of-service``; or when the
Node object is being deleted.  NTH's ``rebalance-recommendation`` is a hint, not a notice: it is not
in the default list (``interruption_taints`` adds it).

A pod's spot policy (``gpufleet.io/spot`` annotation, else its PriorityClass):

* ``prefer``: the pod tolerates interruption; it may run on spot and prefers it;
* ``allow``: it may run on spot, with no preference (it prefers on-demand);
* ``never``: it never runs on spot.

Without the annotation a pod whose ``priorityClassName`` is listed in ``interruptible_priority_classes``
is ``prefer``; any other pod gets ``on_demand_pods_on_spot`` (default ``never``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Mapping

from .errors import ConfigError
from .model import Node, PodRequest, Taint

SPOT = "spot"
ON_DEMAND = "on-demand"

PROVIDER_SPOT_LABELS: tuple[tuple[str, str], ...] = (
    ("karpenter.sh/capacity-type", "spot"),
    ("eks.amazonaws.com/capacityType", "spot"),
    ("cloud.google.com/gke-spot", "true"),
    ("cloud.google.com/gke-preemptible", "true"),
    ("kubernetes.azure.com/scalesetpriority", "spot"),
)

INTERRUPTION_TAINTS: tuple[str, ...] = (
    "karpenter.sh/disrupted",
    "aws-node-termination-handler/spot-itn",
    "aws-node-termination-handler/scheduled-maintenance",
    "aws-node-termination-handler/asg-lifecycle-termination",
    "cloud.google.com/impending-node-termination",
    "ToBeDeletedByClusterAutoscaler",
    "node.kubernetes.io/out-of-service",
)

PREFER, ALLOW, NEVER = "prefer", "allow", "never"
POLICIES = (PREFER, ALLOW, NEVER)
INSTANCE_TYPE_LABELS = ("node.kubernetes.io/instance-type", "beta.kubernetes.io/instance-type")


def _selector(raw: Any, where: str) -> tuple[str, str | None]:
    """``key=value`` (value compared without case) or ``key`` (present with any value)."""
    if not isinstance(raw, str) or not raw.strip() or raw.strip().startswith("="):
        raise ConfigError(f"{where}: must be 'label-key=value' or 'label-key', got {raw!r}")
    key, sep, value = raw.strip().partition("=")
    return key.strip(), (value.strip().lower() if sep else None)


@dataclass(frozen=True)
class SpotConfig:
    """How this cluster tells spot nodes, interruption notices and interruptible pods (validated)."""

    spot_labels: tuple[tuple[str, str | None], ...] = PROVIDER_SPOT_LABELS
    interruption_taints: tuple[str, ...] = INTERRUPTION_TAINTS
    interruptible_priority_classes: frozenset[str] = frozenset()
    on_demand_pods_on_spot: str = NEVER  # the policy of a pod that says nothing: never | allow
    mixed_gangs: bool = False  # may one gang span spot and on-demand nodes

    @classmethod
    def from_args(cls, where: str = "spot config", spot_labels: Iterable[str] | None = None, provider_labels: bool = True,
                  interruption_taints: Iterable[str] | None = None, interruptible_priority_classes: Iterable[str] | None = None,
                  on_demand_pods_on_spot: str = NEVER, mixed_gangs: bool = False) -> "SpotConfig":
        """Typed, validated arguments (a plugin's pluginConfig, the agent's and ``gpufleet cost``'s config)."""
        if not isinstance(provider_labels, bool):
            raise ConfigError(f"{where}: provider_labels must be true or false, got {provider_labels!r}")
        if not isinstance(mixed_gangs, bool):
            raise ConfigError(f"{where}: mixed_gangs must be true or false, got {mixed_gangs!r}")
        if on_demand_pods_on_spot not in (NEVER, ALLOW):
            raise ConfigError(f"{where}: on_demand_pods_on_spot must be 'never' or 'allow', got {on_demand_pods_on_spot!r}")
        labels: list[tuple[str, str | None]] = list(PROVIDER_SPOT_LABELS) if provider_labels else []
        for i, s in enumerate(_list(spot_labels, f"{where}: spot_labels")):
            labels.append(_selector(s, f"{where}: spot_labels[{i}]"))
        taints = list(INTERRUPTION_TAINTS)
        for i, t in enumerate(_list(interruption_taints, f"{where}: interruption_taints")):
            if not isinstance(t, str) or not t.strip():
                raise ConfigError(f"{where}: interruption_taints[{i}] must be a taint key, got {t!r}")
            if t.strip() not in taints:
                taints.append(t.strip())
        classes = _list(interruptible_priority_classes, f"{where}: interruptible_priority_classes")
        for i, c in enumerate(classes):
            if not isinstance(c, str) or not c.strip():
                raise ConfigError(f"{where}: interruptible_priority_classes[{i}] must be a PriorityClass name, got {c!r}")
        return cls(tuple(labels), tuple(taints), frozenset(c.strip() for c in classes), on_demand_pods_on_spot, mixed_gangs)

    # --- nodes ------------------------------------------------------------------------------
    def is_spot(self, labels: Mapping[str, str]) -> bool:
        for key, value in self.spot_labels:
            v = labels.get(key)
            if v is not None and (value is None or v.strip().lower() == value):
                return True
        return False

    def capacity_type(self, labels: Mapping[str, str]) -> str:
        return SPOT if self.is_spot(labels) else ON_DEMAND

    def interruption(self, taints: Iterable[Taint], deleting: bool = False) -> str | None:
        """Why the node is going away (a taint key or 'node is being deleted'), or None."""
        for t in taints:
            if t.key in self.interruption_taints:
                return f"taint {t.key}"
        return "node is being deleted" if deleting else None

    # --- pods -------------------------------------------------------------------------------
    def pod_policy(self, r: PodRequest) -> str:
        if r.spot is not None:
            return r.spot
        if r.priority_class and r.priority_class in self.interruptible_priority_classes:
            return PREFER
        return self.on_demand_pods_on_spot


DEFAULT = SpotConfig()


def _list(v: Any, where: str) -> list:
    if v is None:
        return []
    if not isinstance(v, (list, tuple)):
        raise ConfigError(f"{where} must be a list, got {v!r}")
    return list(v)


def instance_type(labels: Mapping[str, str]) -> str:
    return next((labels[k] for k in INSTANCE_TYPE_LABELS if labels.get(k)), "")


def node_is_spot(node: Node, config: SpotConfig = DEFAULT) -> bool:
    return config.is_spot(node.labels)
