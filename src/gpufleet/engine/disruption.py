"""PodDisruptionBudgets (``policy/v1``) as typed values, and the rules Kubernetes applies to them.

Why one module: preemption, queue reclaim, gangs and the idle-GPU reclaim tool
all decide whether evicting some pods keeps every budget, and two models of a
budget (one of them blind to ``matchExpressions``) used to give two answers.
Here a budget is parsed once at the edge (``PodDisruptionBudget.from_json``)
and asked the same questions everywhere:

* which pods it covers (its label selector, in its namespace; a null selector
  covers none, ``{}`` covers every pod of the namespace);
* how many disruptions it allows now (``status.disruptionsAllowed``, or 0 while
  the status is stale: the eviction API refuses then too);
* whether evicting a given pod spends one of them, as the eviction subresource
  decides it (``eviction_cost``): pods not running yet, finished or already
  terminating spend none; a pod that is not Ready spends none under
  ``unhealthyPodEvictionPolicy: AlwaysAllow``, nor under ``IfHealthyBudget``
  while the budget has all the healthy pods it wants; a pod covered by two
  budgets cannot be evicted through the API at all.

``compute_status`` is the disruption controller's arithmetic (kube-controller-
manager's ``pkg/controller/disruption``) for callers that must work the status
out themselves: the apiserver-tier tests, which run no controller manager, and
the fake API.  ``minAvailable`` / ``maxUnavailable`` may be integers or
percentages; percentages are of the pods' controllers' scale and round up
(``intstr.GetScaledValueFromIntOrPercent(..., roundUp=true)``), so
``maxUnavailable: 30%`` of 4 pods allows 2 and ``minAvailable: 30%`` of 4 wants 2.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from .errors import ConfigError
from .selector import LabelSelector, parse_label_selector, selects

UnhealthyPodEvictionPolicy = Literal["IfHealthyBudget", "AlwaysAllow"]
# how the eviction API treats a pod: it counts against budgets only while it runs
PodPhase = Literal["Pending", "Running", "Succeeded", "Failed", "Unknown"]


@dataclass(frozen=True)
class IntOrPercent:
    """An ``intstr.IntOrString`` that is a count (``3``) or a percentage (``"30%"``)."""

    value: int
    percent: bool = False

    def scaled(self, total: int, round_up: bool = True) -> int:
        """``GetScaledValueFromIntOrPercent``: the count, or ``value``% of ``total`` rounded up (down)."""
        if not self.percent:
            return self.value
        q, r = divmod(self.value * total, 100)
        return q + (1 if round_up and r else 0)

    @classmethod
    def parse(cls, raw: Any, path: str, error: Callable[[str, str], Exception]) -> IntOrPercent:
        if isinstance(raw, bool) or not isinstance(raw, (int, str)):
            raise error(path, f"must be an integer or a percentage such as '50%', got {raw!r}")
        if isinstance(raw, int):
            if raw < 0:
                raise error(path, f"must be >= 0, got {raw}")
            return cls(raw)
        s = raw.strip()
        if not s.endswith("%") or not s[:-1].isdigit():
            raise error(path, f"a string must be a percentage such as '50%', got {raw!r}")
        v = int(s[:-1])
        if v > 100:
            raise error(path, f"must be a percentage 0..100, got {raw!r}")
        return cls(v, True)

    def __str__(self) -> str:
        return f"{self.value}%" if self.percent else str(self.value)


@dataclass(frozen=True)
class PdbStatus:
    """``status`` as the disruption controller (and the eviction subresource) writes it."""

    observed_generation: int = 0
    disruptions_allowed: int = 0
    current_healthy: int = 0
    desired_healthy: int = 0
    expected_pods: int = 0
    disrupted_pods: Mapping[str, str] = field(default_factory=dict)  # pod name -> when the eviction was admitted


@dataclass(frozen=True)
class PodFacts:
    """What a budget needs to know of one pod: where, its labels, its controller, and how healthy it is."""

    namespace: str
    name: str
    labels: Mapping[str, str] = field(default_factory=dict)
    phase: PodPhase = "Running"
    ready: bool = True
    terminating: bool = False
    owner_uid: str = ""  # the controlling ownerReference; "" for a bare pod

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def exempt(self) -> bool:
        """The eviction API deletes it without asking any budget: not running yet, finished, or terminating."""
        return self.phase in ("Pending", "Succeeded", "Failed") or self.terminating

    @classmethod
    def from_pod(cls, pod: Mapping[str, Any]) -> PodFacts:
        """From Pod JSON; lenient (a pod already in the API was validated there)."""
        meta = pod.get("metadata") or {}
        status = pod.get("status") or {}
        raw = meta.get("labels")
        labels = {str(k): str(v) for k, v in raw.items()} if isinstance(raw, Mapping) else {}
        conds = status.get("conditions") if isinstance(status, Mapping) else None
        ready = any(isinstance(c, Mapping) and c.get("type") == "Ready" and c.get("status") == "True"
                    for c in conds or ())
        phase = status.get("phase") if isinstance(status, Mapping) else None
        owner = ""
        for o in meta.get("ownerReferences") or ():
            if isinstance(o, Mapping) and o.get("controller"):
                owner = str(o.get("uid") or "")
        return cls(meta.get("namespace") or "default", str(meta.get("name") or ""), labels,
                   phase if phase in ("Pending", "Running", "Succeeded", "Failed", "Unknown") else "Pending",
                   ready, bool(meta.get("deletionTimestamp")), owner)


@dataclass(frozen=True)
class PodDisruptionBudget:
    """A ``policy/v1`` PodDisruptionBudget: which pods it covers, what it wants, and its status."""

    name: str
    namespace: str = "default"
    selector: LabelSelector | None = field(default_factory=LabelSelector)  # None: a null selector, covers nothing
    min_available: IntOrPercent | None = None
    max_unavailable: IntOrPercent | None = None
    unhealthy_pod_eviction_policy: UnhealthyPodEvictionPolicy = "IfHealthyBudget"
    generation: int = 0  # metadata.generation (0: not from an API server)
    status: PdbStatus | None = None  # None: the disruption controller has not written one yet
    unreadable: str = ""  # why the object could not be read (``fail_closed``): it then protects its whole namespace

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    def covers(self, namespace: str, labels: Mapping[str, str]) -> bool:
        return namespace == self.namespace and selects(self.selector, labels)

    def covers_pod(self, pod: PodFacts) -> bool:
        return self.covers(pod.namespace, pod.labels)

    @property
    def status_current(self) -> bool:
        """Whether the status describes this generation of the spec (else the eviction API refuses, 429)."""
        return self.status is not None and self.status.observed_generation >= self.generation

    @property
    def allowed_now(self) -> int:
        """Disruptions the budget allows now: ``status.disruptionsAllowed``, 0 while the status is stale."""
        if self.unreadable or self.status is None or not self.status_current:
            return 0
        return max(0, self.status.disruptions_allowed)

    def eviction_cost(self, pod: PodFacts) -> int:
        """1 when evicting this covered pod spends one of the allowed disruptions, else 0 (the eviction API's rule)."""
        if pod.exempt:
            return 0
        if not pod.ready:
            if self.unhealthy_pod_eviction_policy == "AlwaysAllow":
                return 0
            st = self.status
            if st is not None and st.desired_healthy > 0 and st.current_healthy >= st.desired_healthy:
                return 0
        return 1

    @classmethod
    def fail_closed(cls, obj: Any, why: str) -> PodDisruptionBudget:
        """A budget that could not be read (``from_json`` refused it): it covers every pod of its namespace
        and allows no disruption, so a budget we misread never leaves the pods it protects unprotected."""
        meta = obj.get("metadata") if isinstance(obj, Mapping) else None
        meta = meta if isinstance(meta, Mapping) else {}
        return cls(str(meta.get("name") or "<unnamed>"), str(meta.get("namespace") or "default"), LabelSelector(),
                   unreadable=why)

    def describe(self) -> str:
        want = (f"minAvailable {self.min_available}" if self.min_available is not None
                else f"maxUnavailable {self.max_unavailable}" if self.max_unavailable is not None else "no minimum")
        return f"PodDisruptionBudget {self.key} ({want}, allows {self.allowed_now} disruption(s) now)"

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> PodDisruptionBudget:
        """A ``policy/v1`` PodDisruptionBudget object (status optional); ConfigError names the object and field."""
        meta = obj.get("metadata") if isinstance(obj, Mapping) else None
        name = meta.get("name") if isinstance(meta, Mapping) else None
        if not name or not isinstance(name, str):
            raise ConfigError("PodDisruptionBudget: field metadata.name is required")
        assert isinstance(meta, Mapping)
        ns = meta.get("namespace") or "default"
        where = f"PodDisruptionBudget {ns}/{name}"

        def err(f: str, m: str) -> ConfigError:
            return ConfigError(f"{where}: field {f}: {m}")

        spec = obj.get("spec")
        if spec is None:
            spec = {}
        if not isinstance(spec, Mapping):
            raise err("spec", "must be an object")
        sel = parse_label_selector(spec.get("selector"), "spec.selector", err)
        mina = spec.get("minAvailable")
        maxu = spec.get("maxUnavailable")
        if mina is not None and maxu is not None:
            raise err("spec.maxUnavailable", "minAvailable and maxUnavailable cannot both be set")
        raw_pol = spec.get("unhealthyPodEvictionPolicy") or "IfHealthyBudget"
        if raw_pol not in ("IfHealthyBudget", "AlwaysAllow"):
            raise err("spec.unhealthyPodEvictionPolicy", f"must be IfHealthyBudget or AlwaysAllow, got {raw_pol!r}")
        pol: UnhealthyPodEvictionPolicy = "AlwaysAllow" if raw_pol == "AlwaysAllow" else "IfHealthyBudget"
        gen = _int(meta.get("generation", 0), "metadata.generation", err)  # absent: not from an API server
        return cls(
            name, ns, sel,
            IntOrPercent.parse(mina, "spec.minAvailable", err) if mina is not None else None,
            IntOrPercent.parse(maxu, "spec.maxUnavailable", err) if maxu is not None else None,
            pol, gen, _status(obj.get("status"), err))


def _int(v: Any, path: str, err: Callable[[str, str], Exception]) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise err(path, f"must be an integer, got {v!r}")
    return v


def _status(raw: Any, err: Callable[[str, str], Exception]) -> PdbStatus | None:
    if not raw:
        return None  # never written: the eviction API refuses covered pods until the controller writes it
    if not isinstance(raw, Mapping):
        raise err("status", "must be an object")
    dp = raw.get("disruptedPods") or {}
    if not isinstance(dp, Mapping):
        raise err("status.disruptedPods", "must be an object")
    vals = {}
    for k in ("observedGeneration", "disruptionsAllowed", "currentHealthy", "desiredHealthy", "expectedPods"):
        vals[k] = _int(raw.get(k, 0), f"status.{k}", err)
    if vals["disruptionsAllowed"] < 0:
        raise err("status.disruptionsAllowed", f"must be a non-negative integer, got {vals['disruptionsAllowed']}")
    return PdbStatus(vals["observedGeneration"], vals["disruptionsAllowed"], vals["currentHealthy"],
                     vals["desiredHealthy"], vals["expectedPods"], {str(k): str(v) for k, v in dp.items()})


# --- what the disruption controller computes --------------------------------------------------------


class UnknownScale(Exception):
    """A percentage or maxUnavailable budget covers a pod whose controller's scale is unknown."""


def compute_status(pdb: PodDisruptionBudget, pods: Iterable[PodFacts],
                   scale_of: Callable[[str], int | None] | None = None,
                   disrupted: Collection[str] = ()) -> PdbStatus:
    """The status the disruption controller would write for ``pdb`` over ``pods`` (all pods of the cluster).

    ``scale_of(owner_uid)``: the desired replicas of a pod's controller, needed for percentages and
    ``maxUnavailable``; pods without a controller are left out of that count, as the controller does.
    A controller whose scale is unknown makes the whole status fail safe (0 disruptions allowed), as
    the controller's ``failSafe`` does.  ``disrupted``: names of pods whose eviction was admitted but
    not yet seen terminating; they are not counted healthy.
    """
    covered = [p for p in pods if pdb.covers_pod(p)]
    try:
        expected, desired = _expected(pdb, covered, scale_of)
    except UnknownScale:
        base = pdb.status or PdbStatus()
        return PdbStatus(base.observed_generation, 0, base.current_healthy, base.desired_healthy,
                         base.expected_pods, base.disrupted_pods)
    gone = set(disrupted)
    healthy = sum(1 for p in covered if not p.terminating and p.name not in gone and p.ready and p.phase == "Running")
    allowed = healthy - desired
    if expected <= 0 or allowed <= 0:
        allowed = 0
    still = {n: t for n, t in (pdb.status.disrupted_pods if pdb.status else {}).items()
             if n in gone and any(p.name == n and not p.terminating for p in covered)}
    return PdbStatus(pdb.generation, allowed, healthy, desired, expected, still)


def _expected(pdb: PodDisruptionBudget, covered: Sequence[PodFacts],
              scale_of: Callable[[str], int | None] | None) -> tuple[int, int]:
    """(expected pods, desired healthy), as ``getExpectedPodCount``."""
    if pdb.max_unavailable is not None:
        expected = _scale(covered, scale_of)
        return expected, max(0, expected - pdb.max_unavailable.scaled(expected))
    if pdb.min_available is not None:
        if not pdb.min_available.percent:
            return len(covered), pdb.min_available.value
        expected = _scale(covered, scale_of)
        return expected, pdb.min_available.scaled(expected)
    return 0, 0


def _scale(covered: Sequence[PodFacts], scale_of: Callable[[str], int | None] | None) -> int:
    scales: dict[str, int] = {}
    for p in covered:
        if not p.owner_uid or p.owner_uid in scales:
            continue  # unmanaged pods are left out (the controller warns with an UnmanagedPods event)
        s = scale_of(p.owner_uid) if scale_of is not None else None
        if s is None:
            raise UnknownScale(p.key)
        scales[p.owner_uid] = s
    return sum(scales.values())


# --- the budgets a set of evictions must keep ----------------------------------------------------------


@dataclass(frozen=True)
class Budgets:
    """Every budget of the cluster with the facts about the pods they may cover: the one check that
    preemption, queue reclaim, gangs and the reclaim tool make before they evict anything.

    Pods without facts count as Running and Ready (the safe assumption: evicting them spends a disruption)."""

    pdbs: Sequence[PodDisruptionBudget] = ()
    pods: Mapping[str, PodFacts] = field(default_factory=dict)  # pod key -> facts

    def facts(self, key: str) -> PodFacts:
        f = self.pods.get(key)
        if f is None:
            ns, _, name = key.partition("/")
            f = PodFacts(ns, name)
        return f

    def covering(self, key: str) -> list[PodDisruptionBudget]:
        f = self.facts(key)
        return [b for b in self.pdbs if b.covers_pod(f)]

    def blocked(self, key: str) -> str | None:
        """Why this pod can never be evicted through the API, or None: covered by two or more budgets
        (the eviction subresource refuses such pods), unless it is exempt (not running)."""
        f = self.facts(key)
        cov = [b for b in self.pdbs if b.covers_pod(f)]
        if len(cov) > 1 and not f.exempt:
            return (f"{key} is covered by {len(cov)} PodDisruptionBudgets ({', '.join(b.key for b in cov)}); "
                    "the eviction API refuses such pods")
        return None

    def check(self, victims: Iterable[str]) -> str | None:
        """The first budget that evicting all ``victims`` (pod keys) would break, as a phrase, or None."""
        if not self.pdbs:
            return None
        spent: dict[str, int] = {}
        for k in victims:
            why = self.blocked(k)
            if why:
                return why
            f = self.facts(k)
            for b in self.pdbs:
                if b.covers_pod(f):
                    spent[b.key] = spent.get(b.key, 0) + b.eviction_cost(f)
        for b in self.pdbs:
            n = spent.get(b.key, 0)
            if n > b.allowed_now:
                stale = ("" if b.status_current else " (its status is not yet written for this spec)") if not b.unreadable \
                    else f" (it could not be read, so it protects its whole namespace: {b.unreadable})"
                return f"PodDisruptionBudget {b.key} allows {b.allowed_now} disruption(s){stale}, {n} needed"
        return None

    def __bool__(self) -> bool:
        return bool(self.pdbs)


NO_BUDGETS = Budgets()


def budgets_from(pdbs: Sequence[PodDisruptionBudget], pod_labels: Mapping[str, Mapping[str, str]] | None = None,
                 pods: Mapping[str, PodFacts] | None = None) -> Budgets:
    """A ``Budgets`` from facts, or from labels alone (each pod then Running and Ready)."""
    if pods is None:
        pods = {}
        for k, labels in (pod_labels or {}).items():
            ns, _, name = k.partition("/")
            pods[k] = PodFacts(ns, name, labels)
    return Budgets(tuple(pdbs), pods)


__all__ = ["NO_BUDGETS", "Budgets", "IntOrPercent", "PdbStatus", "PodDisruptionBudget", "PodFacts", "budgets_from",
           "compute_status"]
