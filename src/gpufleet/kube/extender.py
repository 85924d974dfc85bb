"""kube-scheduler extender: the stock scheduler keeps doing everything it does,
gpufleet filters and ranks nodes for GPU pods and binds them to exact GPUs.

Protocol (k8s.io/kube-scheduler/extender/v1), JSON over HTTP POST; the Go
types carry no JSON tags, so keys are the field names and kube-scheduler
decodes replies case-insensitively:

* ``/filter``     ExtenderArgs {Pod, Nodes, NodeNames} ->
                  ExtenderFilterResult {NodeNames, FailedNodes, FailedAndUnresolvableNodes, Error}
* ``/prioritize`` ExtenderArgs -> HostPriorityList [{Host, Score}], scores 0..10
* ``/bind``       ExtenderBindingArgs {PodName, PodNamespace, PodUID, Node} -> ExtenderBindingResult {Error}

With ``nodeCacheCapable: true`` kube-scheduler sends node *names* only; the
snapshot comes from our own watches (``ExtenderLoop``, the secondary
scheduler's loop with scheduling switched off).  Without it the full NodeList
is sent and a filtered NodeList is returned.

**Why the decision is made at filter time.**  kube-scheduler runs the binding
cycle of one pod on a goroutine while it already filters the next: the
extender's ``/bind`` for pod A routinely arrives *after* its ``/filter`` for
pod B.  An extender that only takes devices at bind answers B's filter from a
snapshot that does not yet hold A, lets both through to the last free GPU,
and one bind then fails -- kube-scheduler records a ``SchedulerError``
instead of ``Unschedulable`` and parks the pod.  So, as kube-scheduler itself
*assumes* a pod in its cache before binding it (and as HAMi's extender picks
one node and records the devices in its filter), filter here runs the whole
engine cycle on the offered nodes, **reserves** the chosen node and GPUs in
the snapshot under the pod's key, and returns only that node.  Bind confirms
the reservation (same pod UID and node) and writes it with the Binding.  A
reservation no bind ever claims is released when the pod is filtered again
(kube-scheduler retries it), deleted, bound by someone else, or after
``reservation_ttl_s``.  A bind with no reservation (the extender restarted
between filter and bind, or it expired) falls back to deciding on the named
node at bind time, so a restart costs at most a retry, never a double booking.

**Pods kube-scheduler parked because it could not reach us.**  When a call to
the extender fails (restart, timeout, not synced yet) kube-scheduler marks the
pod ``PodScheduled=False, reason SchedulerError`` and, unless some cluster
event happens meanwhile, leaves it in its unschedulable pool for up to five
minutes.  The extender watches pods anyway: once ready, it annotates each such
GPU pod (``gpufleet.io/extender-retry``), a pod update that makes
kube-scheduler retry it at once (per pod at most every 2 s, backing off to 60 s).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import numpy as np

from ..engine import annotations as ann
from ..engine.errors import GpufleetError
from ..engine.framework import Profile
from ..engine.inventory import assignment_to_json
from ..engine.model import Assignment
from ..engine.podspec import parse_pod, pod_key
from .api import SchedulerApi
from .convert import is_terminal
from .loop import SchedulerLoop, bind_job, reason_text, slim_pod
from .pods import created_s

log = logging.getLogger(__name__)
MAX_EXTENDER_PRIORITY = 10
NO_SCHEDULER = "\x00gpufleet-extender-none"  # the loop queues no pod of its own: kube-scheduler drives it
LATENCY_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.5, 1, 5)
RETRY_ANNOTATION = ann.EXTENDER_RETRY
RETRY_BACKOFF_S = (2.0, 60.0)
RELEASE_REASONS = ("expired", "deleted", "bound_elsewhere", "refiltered", "other_node", "bind_failed", "lost")


def _ci(d: Any) -> dict[str, Any]:
    """Keys folded to lower case (Go's decoder matches field names case-insensitively)."""
    return {str(k).lower(): v for k, v in d.items()} if isinstance(d, dict) else {}


def waited_s(pod: dict[str, Any], since_first_filter_s: float) -> float:
    """How long the pod has waited: since its creationTimestamp, or since its first filter here if that is longer.

    Policies step aside for a pod that waited long enough (the default's reserves, after 10 minutes), so the
    extender tells them, as the loop does; kube-scheduler calls filter again on each of its retries."""
    created = created_s(pod)
    return max(0.0, since_first_filter_s, time.time() - created if created is not None else 0.0)


class BadRequest(GpufleetError):
    """An extender call whose JSON is not shaped like kube-scheduler's ExtenderArgs / ExtenderBindingArgs."""


def _names(args: dict[str, Any]) -> tuple[list[str], list[dict] | None]:
    if args.get("nodenames") is not None:
        if not isinstance(args["nodenames"], list) or not all(isinstance(n, str) for n in args["nodenames"]):
            raise BadRequest("NodeNames: must be a list of node names")
        return list(args["nodenames"]), None
    nodes = args.get("nodes") or {}
    items = nodes.get("items") or [] if isinstance(nodes, dict) else None
    if not isinstance(items, list) or not all(isinstance(n, dict) and isinstance(n.get("metadata") or {}, dict) for n in items):
        raise BadRequest("Nodes: must be a NodeList object ({items: [Node, ...]})")
    names = [(n.get("metadata") or {}).get("name", "") for n in items]
    if not all(isinstance(n, str) for n in names):
        raise BadRequest("Nodes.items[*].metadata.name: must be a string")
    return names, list(items)


def describe(a: Assignment) -> str:
    """`GPUs [0, 3]`, `GPUs [2] (500 milli each)`, `MIG 1g.10gb [(0, 3)]`: for log lines."""
    gpus = f"GPUs {list(a.gpu_indices)}" if a.gpu_indices else "no GPU"
    share = f" ({a.gpu_milli} milli each)" if a.gpu_indices and 0 < a.gpu_milli < 1000 else ""
    mig = f" MIG {a.mig_profile} {list(a.mig)}" if a.mig else ""
    return gpus + share + mig


@dataclass
class Reservation:
    """A node and devices chosen at filter and held in the snapshot until the pod's bind."""

    key: str
    uid: str | None
    pod: dict  # slim copy of the pod as kube-scheduler sent it
    assignment: Assignment
    made: float  # monotonic time of the filter that made it


class ExtenderLoop(SchedulerLoop):
    """The secondary scheduler's snapshot (list+watch, restart-safe), with filter-time reservations.

    Pods are never queued here (kube-scheduler does that); watch events release
    reservations whose pod was deleted or bound by someone else.  The HTTP
    threads and the watch thread share it under the extender's lock.
    """

    def __init__(self, api: SchedulerApi, profile: Profile, reservation_ttl_s: float = 30.0, **kw: Any) -> None:
        kw.setdefault("scheduler_name", NO_SCHEDULER)
        kw.setdefault("policy_kinds", False)
        kw.setdefault("preemption", False)
        kw.setdefault("constraint_kinds", False)  # kube-scheduler already judged pod-to-pod constraints and volumes
        super().__init__(api, profile, **kw)
        self.reservation_ttl_s = reservation_ttl_s
        self.reservations: dict[str, Reservation] = {}
        self.released: dict[str, int] = dict.fromkeys(RELEASE_REASONS, 0)
        self.on_release: Callable[[str, Reservation], None] | None = None
        self.first_filter: dict[str, float] = {}  # pod key -> monotonic time of its first filter (e2e latency)
        self.stuck: dict[str, tuple[str | None, str]] = {}  # GPU pods kube-scheduler parked on an error reaching us: uid, message
        self.retried: dict[str, tuple[float, float]] = {}  # pod key -> (next retry allowed at, backoff)
        self.last_heard = time.monotonic()  # last list or watch event applied (snapshot age)

    # --- reservations -----------------------------------------------------------------
    def hold(self, r: Reservation) -> None:
        self.reservations[r.key] = r

    def release(self, key: str, reason: str) -> Reservation | None:
        """Drop a reservation and give its devices back (only if the snapshot still holds exactly it)."""
        r = self.reservations.pop(key, None)
        if r is None:
            return None
        if self.cache.state.assignments.get(key) == r.assignment:
            self.cache.sched.forget(key)
            self.wake_all()
        self.released[reason] = self.released.get(reason, 0) + 1
        if self.on_release is not None:
            self.on_release(reason, r)
        return r

    def expire(self, now: float | None = None) -> int:
        """Release reservations no bind claimed within ``reservation_ttl_s``; returns how many."""
        now = time.monotonic() if now is None else now
        old = [k for k, r in self.reservations.items() if now - r.made > self.reservation_ttl_s]
        for k in old:
            self.release(k, "expired")
        return len(old)

    def close(self, timeout_s: float = 10.0) -> None:
        """Flush events only: binds in flight belong to HTTP threads that need the lock the caller holds."""
        self.events.flush(timeout_s)

    # --- snapshot hooks ---------------------------------------------------------------
    def handle(self, kind: str, type_: str, obj: dict) -> None:
        self.last_heard = time.monotonic()
        super().handle(kind, type_, obj)

    def resync(self) -> None:
        super().resync()
        self.last_heard = time.monotonic()
        gpus = sum(len(n.gpus) for n in self.cache.state.nodes)
        log.info("snapshot synced: %d node(s) with %d GPU(s), %d bound pod(s)%s", len(self.cache.state), gpus, len(self.cache.bound_pods),
                 f"; left out: {', '.join(sorted(self.cache.bad_nodes))}" if self.cache.bad_nodes else "")

    def rebuild(self) -> None:
        super().rebuild()
        for k, r in list(self.reservations.items()):  # a fresh snapshot keeps what filters chose
            a = r.assignment
            if k in self.cache.state.assignments or a.node not in self.cache.state.index or self.cache.state.check(a):
                self.reservations.pop(k)
                self.released["lost"] += 1
                if self.on_release is not None:
                    self.on_release("lost", r)
            else:
                self.cache.state.reserve(a)

    def _note_stuck(self, type_: str, pod: dict) -> None:
        """Track pending GPU pods whose last scheduling attempt failed on a call to this extender."""
        key = pod_key(pod)
        spec = pod.get("spec") or {}
        cond = next((c for c in (pod.get("status") or {}).get("conditions") or [] if c.get("type") == "PodScheduled"), None)
        msg = str((cond or {}).get("message") or "")
        if (type_ == "DELETED" or is_terminal(pod) or spec.get("nodeName") or cond is None or cond.get("status") != "False"
                or cond.get("reason") != "SchedulerError" or not extender_error(msg)):
            if self.stuck.pop(key, None) is not None:
                self.retried.pop(key, None)
            return
        try:
            gpus = parse_pod(pod).gpu_count
        except GpufleetError:
            gpus = 0
        if gpus:
            self.stuck[key] = ((pod.get("metadata") or {}).get("uid"), msg)

    def on_pod_listed(self, pod: dict) -> None:
        self._note_stuck("ADDED", pod)

    def on_pod_event(self, type_: str, pod: dict) -> None:
        self._note_stuck(type_, pod)
        key = pod_key(pod)
        meta = pod.get("metadata") or {}
        r = self.reservations.get(key)
        if r is not None:
            uid = meta.get("uid")
            if r.uid and uid and uid != r.uid:
                if type_ != "DELETED":  # a new pod of that name exists: ours is gone
                    self.release(key, "deleted")
            elif type_ == "DELETED" or is_terminal(pod):
                self.release(key, "deleted")
            elif (pod.get("spec") or {}).get("nodeName") and not self.binder.is_in_flight(key):
                self.release(key, "bound_elsewhere")  # then the loop takes the placement it has
        done = type_ == "DELETED" or is_terminal(pod) or (pod.get("spec") or {}).get("nodeName")
        if done and not self.binder.is_in_flight(key):
            self.first_filter.pop(key, None)


def extender_error(message: str) -> bool:
    """kube-scheduler's message for a failed call to this extender (transport error naming a verb, or not synced)."""
    return any(v in message for v in ('/filter"', '/prioritize"', '/bind"', "gpufleet has not synced"))


class ExtenderMetrics:
    """/metrics of the extender: the scheduler's names where they mean the same (binds, e2e), the rest
    under ``gpufleet_extender_``."""

    def __init__(self, loop: ExtenderLoop, heard: Callable[[], float] | None = None) -> None:
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

        self.registry = r = CollectorRegistry()
        self.requests = Counter("gpufleet_extender_requests_total", "Extender calls by verb and result", ["verb", "result"], registry=r)
        self.latency = Histogram("gpufleet_extender_request_duration_seconds", "Time to answer one extender call, by verb",
                                 ["verb"], buckets=LATENCY_BUCKETS, registry=r)
        self.binds = Counter("gpufleet_binds_total", "Pods bound (rate() gives binds/s)", registry=r)
        self.refusals = Counter("gpufleet_extender_refusals_total",
                                "Pods turned away: filter found no node (unschedulable, invalid, not_synced) or bind failed",
                                ["verb", "reason"], registry=r)
        self.e2e = Histogram("gpufleet_pod_scheduling_duration_seconds", "End to end: the pod's first filter to bound",
                             buckets=(0.01, 0.05, 0.1, 0.5, 1, 5, 15, 60, 300, 1800), registry=r)
        self.bind_call = Histogram("gpufleet_extender_bind_api_duration_seconds", "The Binding API call alone",
                                   buckets=LATENCY_BUCKETS, registry=r)
        self.held = Gauge("gpufleet_extender_reservations", "Reservations held: chosen at filter, not bound yet", registry=r)
        self.held.set_function(lambda: len(loop.reservations))
        self.made = Counter("gpufleet_extender_reservations_made_total", "Reservations made at filter", registry=r)
        self.retries = Counter("gpufleet_extender_retries_requested_total",
                               "Pods kube-scheduler parked after failing to reach the extender, annotated so it retries them",
                               registry=r)
        self.released = Counter("gpufleet_extender_reservations_released_total",
                                "Reservations dropped without a bind, by reason", ["reason"], registry=r)
        self.age = Gauge("gpufleet_snapshot_age_seconds",
                         "Seconds since the snapshot last heard from the API server (list, watch event or bookmark)", registry=r)
        last = heard or (lambda: loop.last_heard)
        self.age.set_function(lambda: max(0.0, time.monotonic() - last()))
        for verb, results in (("filter", ("fit", "unschedulable", "passthrough", "invalid", "not_synced", "error")),
                              ("prioritize", ("ok", "error")), ("bind", ("bound", "refused", "error"))):
            for res in results:
                self.requests.labels(verb, res)
            self.latency.labels(verb)
        for reason in RELEASE_REASONS:
            self.released.labels(reason)
        self.refusals.labels("filter", "unschedulable")
        self.refusals.labels("bind", "failed")

    def observe(self, verb: str, result: str, t0: float) -> float:
        dt = time.perf_counter() - t0
        self.requests.labels(verb, result).inc()
        self.latency.labels(verb).observe(dt)
        return dt


def _ms(s: float) -> str:
    return f"{s * 1000:.1f} ms"


class Extender:
    def __init__(self, loop: ExtenderLoop, lock: threading.Lock | None = None, ready: threading.Event | None = None,
                 metrics: ExtenderMetrics | None = None) -> None:
        if not isinstance(loop, ExtenderLoop):
            raise TypeError("Extender needs an ExtenderLoop (filter-time reservations)")
        self.loop = loop
        self.ready = ready  # until the first list is in, answer with an error (kube-scheduler retries the pod)
        self.lock = lock or threading.Lock()  # the snapshot is shared with the watch thread
        self.metrics = metrics or ExtenderMetrics(loop)
        self.requests = {"filter": 0, "prioritize": 0, "bind": 0}
        loop.on_release = self._released

    def _released(self, reason: str, r: Reservation) -> None:
        self.metrics.released.labels(reason).inc()
        age = time.monotonic() - r.made
        if reason in ("expired", "lost", "bound_elsewhere"):
            log.info("released reservation of %s on %s (%s) after %.1f s: %s", r.key, r.assignment.node,
                     describe(r.assignment), age, reason.replace("_", " "))
        else:
            log.debug("released reservation of %s on %s after %.1f s: %s", r.key, r.assignment.node, age, reason)

    def _synced(self) -> bool:
        return self.ready is None or self.ready.is_set()

    def _mask(self, names: list[str]) -> np.ndarray:
        st = self.loop.cache.state
        m = np.zeros(len(st), dtype=bool)
        for n in names:
            i = st.index.get(n)
            if i is not None:
                m[i] = True
        return m

    def sweep(self) -> int:
        with self.lock:
            n = self.loop.expire()
        if self._synced():
            self.retry_stuck()
        return n

    def retry_stuck(self, now: float | None = None) -> int:
        """Annotate pods kube-scheduler parked after failing to reach us, so it retries them now."""
        now = time.monotonic() if now is None else now
        loop = self.loop
        with self.lock:
            due = [(k, uid, msg) for k, (uid, msg) in loop.stuck.items() if loop.retried.get(k, (0.0, 0.0))[0] <= now]
            for k, _, _ in due:
                back = min(RETRY_BACKOFF_S[1], max(RETRY_BACKOFF_S[0], loop.retried.get(k, (0.0, 0.0))[1] * 2))
                loop.retried[k] = (now + back, back)
        n = 0
        for k, uid, msg in due:
            ns, name = k.split("/", 1)
            try:
                loop.api.annotate_pod(ns, name, {RETRY_ANNOTATION: time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}, uid=uid)
            except Exception as exc:  # noqa: BLE001 -- best effort: tried again after the backoff
                log.info("could not ask kube-scheduler to retry %s: %s", k, exc)
                continue
            n += 1
            self.metrics.retries.inc()
            log.info("asked kube-scheduler to retry %s: its last attempt failed reaching the extender (%s)", k, msg[:200])
        return n

    # --- verbs ------------------------------------------------------------------------
    def filter(self, raw: dict[str, Any]) -> dict[str, Any]:
        t0 = time.perf_counter()
        self.requests["filter"] += 1
        args = _ci(raw)
        pod = args.get("pod") or {}
        if not isinstance(pod, dict) or not isinstance(pod.get("metadata") or {}, dict):
            raise BadRequest("Pod: must be a Pod object with object metadata")
        names, items = _names(args)
        key = pod_key(pod)

        def reply(ok: list[str], failed: dict[str, str], unresolvable: dict[str, str], error: str = "") -> dict[str, Any]:
            out: dict[str, Any] = {"NodeNames": ok, "FailedNodes": failed, "FailedAndUnresolvableNodes": unresolvable, "Error": error}
            if items is not None:
                keep = set(ok)
                out["Nodes"] = {"items": [n for n in items if (n.get("metadata") or {}).get("name") in keep]}
                out["NodeNames"] = None
            return out

        def refused(result: str, why: str) -> None:
            dt = self.metrics.observe("filter", result, t0)
            self.metrics.refusals.labels("filter", result).inc()
            log.info("refused %s: %s (%d node(s) offered, %s)", key, why, len(names), _ms(dt))

        try:
            req = parse_pod(pod)
        except GpufleetError as exc:
            refused("invalid", f"invalid pod spec: {exc}")
            return reply([], {}, {}, f"invalid pod spec: {exc}")
        if not req.gpu_count:  # not ours to judge
            dt = self.metrics.observe("filter", "passthrough", t0)
            log.debug("filter %s: no GPU requested, %d node(s) passed through (%s)", key, len(names), _ms(dt))
            return reply(names, {}, {})
        if not self._synced():
            refused("not_synced", "gpufleet has not synced its snapshot yet")
            return reply([], {}, {}, "gpufleet has not synced its snapshot yet")
        loop = self.loop
        with self.lock:
            loop.expire()
            loop.first_filter.setdefault(key, time.monotonic())
            loop.release(key, "refiltered")  # kube-scheduler is placing it again: what it was offered last is stale
            if loop.binder.is_in_flight(key) or key in loop.cache.state.assignments:
                where = loop.cache.state.assignments[key].node if key in loop.cache.state.assignments else "a node"
                dt = self.metrics.observe("filter", "error", t0)
                log.info("filter %s: the pod is already bound or being bound to %s (%s)", key, where, _ms(dt))
                return reply([], {}, {}, f"pod {key} is already bound or being bound to {where}")
            sched = loop.cache.sched
            if loop.dra is not None:  # DRA: nvidia.com/gpu backed by a DeviceClass on nodes without a device plugin
                req = loop.dra.resolve(pod, req, loop.cache.state)
            cycle = sched.new_cycle(req, waited_s=waited_s(pod, time.monotonic() - loop.first_filter[key]))
            cycle.only_nodes = self._mask(names)
            dec = sched.decide(cycle, explain=True)
            chosen: Assignment | None = None
            if dec.ok:
                st = sched.reserve(cycle)
                if st.ok:
                    chosen = dec.assignment
                    assert chosen is not None
                    uid = (pod.get("metadata") or {}).get("uid")
                    loop.hold(Reservation(key, uid, slim_pod(pod), chosen, time.monotonic()))
                    self.metrics.made.inc()
                else:
                    dec = type(dec)(req.key, st)
            ok: list[str] = []
            failed: dict[str, str] = {}
            unresolvable: dict[str, str] = {}
            st_ = loop.cache.state
            for n in names:
                i = st_.index.get(n)
                if i is None:
                    why = loop.cache.bad_nodes.get(n)
                    unresolvable[n] = f"gpufleet left the node out: {why}" if why else "node unknown to gpufleet (not in its snapshot yet)"
                elif chosen is not None and n == chosen.node:
                    ok.append(n)
                elif chosen is not None and cycle.feasible is not None and cycle.feasible[i]:
                    failed[n] = f"gpufleet placed the pod on {chosen.node} and holds its GPUs there"
                else:
                    ff = cycle.first_fail
                    failed[n] = cycle.fail_reasons[int(ff[i])] if ff is not None and ff[i] >= 0 else (
                        dec.status.message if not dec.ok else "rejected")
        if chosen is None:
            refused("unschedulable", reason_text(dec.status))
        else:
            dt = self.metrics.observe("filter", "fit", t0)
            log.debug("filter %s: reserved %s %s (%d feasible of %d offered, %s)", key, chosen.node, describe(chosen),
                      dec.feasible_nodes, len(names), _ms(dt))
        return reply(ok, failed, unresolvable)

    def prioritize(self, raw: dict[str, Any]) -> list[dict[str, Any]]:
        t0 = time.perf_counter()
        self.requests["prioritize"] += 1
        args = _ci(raw)
        names, _ = _names(args)
        pod = args.get("pod") or {}
        if not isinstance(pod, dict) or not isinstance(pod.get("metadata") or {}, dict):
            raise BadRequest("Pod: must be a Pod object with object metadata")
        key = pod_key(pod)
        try:
            req = parse_pod(pod)
        except GpufleetError:
            self.metrics.observe("prioritize", "error", t0)
            return [{"Host": n, "Score": 0} for n in names]
        if not req.gpu_count:
            self.metrics.observe("prioritize", "ok", t0)
            return [{"Host": n, "Score": 0} for n in names]
        with self.lock:
            r = self.loop.reservations.get(key)
            scores: dict[str, int] = {}
            if r is not None:  # filter already chose: rank its node first
                scores[r.assignment.node] = MAX_EXTENDER_PRIORITY
            else:
                sched = self.loop.cache.sched
                cycle = sched.new_cycle(req)
                cycle.only_nodes = self._mask(names)
                sched.decide(cycle)
                if cycle.candidates is not None and cycle.scores is not None and cycle.candidates.size:
                    s = cycle.scores
                    lo, hi = float(s.min()), float(s.max())
                    for i, v in zip(cycle.candidates, s):
                        name = self.loop.cache.state.nodes[int(i)].name
                        scores[name] = MAX_EXTENDER_PRIORITY if hi == lo else round((v - lo) / (hi - lo) * MAX_EXTENDER_PRIORITY)
        dt = self.metrics.observe("prioritize", "ok", t0)
        log.debug("prioritize %s: %s (%s)", key, scores, _ms(dt))
        return [{"Host": n, "Score": scores.get(n, 0)} for n in names]

    def bind(self, raw: dict[str, Any]) -> dict[str, Any]:
        t0 = time.perf_counter()
        self.requests["bind"] += 1
        args = _ci(raw)
        ns, name, node = args.get("podnamespace") or "default", args.get("podname") or "", args.get("node") or ""
        uid = args.get("poduid") or ""
        for field, v in (("PodNamespace", ns), ("PodName", name), ("Node", node), ("PodUID", uid)):
            if not isinstance(v, str):
                raise BadRequest(f"{field}: must be a string, got {type(v).__name__}")
        key = f"{ns}/{name}"
        loop = self.loop

        def refuse(msg: str, result: str = "refused") -> dict[str, Any]:
            dt = self.metrics.observe("bind", result, t0)
            self.metrics.refusals.labels("bind", "failed").inc()
            log.info("refused bind of %s to %s: %s (%s)", key, node or "?", msg, _ms(dt))
            return {"Error": msg}

        if not self._synced():
            return refuse("gpufleet has not synced its snapshot yet")
        a: Assignment | None = None
        pod: dict | None = None
        first: float | None = None
        with self.lock:
            loop.expire()
            r = loop.reservations.get(key)
            if r is not None:
                if uid and r.uid and uid != r.uid:
                    loop.release(key, "deleted")  # made for an earlier pod of that name
                elif r.assignment.node != node:
                    loop.release(key, "other_node")
                elif loop.cache.state.assignments.get(key) != r.assignment:
                    loop.reservations.pop(key)  # a node update took it away: decide again below
                    loop.released["lost"] += 1
                    self.metrics.released.labels("lost").inc()
                else:
                    loop.reservations.pop(key)
                    a, pod = r.assignment, r.pod
                    loop.binder.begin_external(key, pod, a, t0)
        how = "reserved at filter"
        if a is None:  # no reservation: the extender restarted after filter, or it expired; decide on that node now
            how = "decided at bind (no reservation)"
            try:
                pod = loop.api.get_pod(ns, name)
            except Exception as exc:  # noqa: BLE001 -- answered to kube-scheduler, which retries
                return refuse(f"reading pod {key} failed: {exc}", "error")
            if pod is None:
                return refuse(f"pod {key} not found")
            if uid and (pod.get("metadata") or {}).get("uid") not in (None, uid):
                return refuse(f"pod {key} has UID {pod['metadata'].get('uid')}, kube-scheduler asked for {uid}")
            try:
                req = parse_pod(pod)
            except GpufleetError as exc:
                return refuse(f"invalid pod spec: {exc}")
            with self.lock:
                if loop.binder.is_in_flight(key) or key in loop.cache.state.assignments:
                    return refuse(f"pod {key} is already bound or being bound")
                sched = loop.cache.sched
                cycle = sched.new_cycle(req)
                cycle.only_nodes = self._mask([node])
                dec = sched.decide(cycle)
                if not dec.ok:
                    return refuse(f"pod {key} does not fit on {node}: {dec.status.message}")
                st = sched.reserve(cycle)
                if not st.ok:
                    return refuse(f"pod {key}: {st.message}")
                a = dec.assignment
                assert a is not None
                pod = slim_pod(pod)
                loop.binder.begin_external(key, pod, a, t0)
        assert a is not None and pod is not None
        with self.lock:
            uuids = {g.index: g.uuid for g in loop.cache.state.nodes[loop.cache.state.index[node]].gpus} if node in loop.cache.state.index else {}
        annotations = {ann.ASSIGNMENT: assignment_to_json(a, uuids)}
        # the API call runs without the lock: filters for other pods go on meanwhile
        tb = time.perf_counter()
        outcome, detail, seen = bind_job(loop.api, ns, name, node, annotations)
        self.metrics.bind_call.observe(time.perf_counter() - tb)
        with self.lock:
            if not loop.binder.end_external(key, outcome, seen, annotations):
                return refuse(f"pod {key} was deleted while binding")
            if outcome == "bound":
                first = loop.first_filter.pop(key, None)
        if outcome != "bound":
            return refuse(f"binding {key} to {node} failed: {outcome} {detail}".strip(), "error")
        dt = self.metrics.observe("bind", "bound", t0)
        self.metrics.binds.inc()
        since = ""
        if first is not None:
            e2e = time.monotonic() - first
            self.metrics.e2e.observe(e2e)
            since = f", {_ms(e2e)} since its first filter"
        log.info("bound %s to %s %s in %s (%s%s)", key, node, describe(a), _ms(dt), how, since)
        return {"Error": ""}


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    stopped: threading.Event

    def shutdown(self) -> None:
        self.stopped.set()
        super().shutdown()


def serve(ext: Extender, addr: str, ready: threading.Event | None = None, sweep_s: float = 1.0) -> ThreadingHTTPServer:
    """Serve the verbs (POST) and /metrics, /healthz, /readyz (GET) on a thread; a second thread
    releases expired reservations every ``sweep_s``."""
    from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

    host, port = addr.rsplit(":", 1)

    class H(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive: kube-scheduler reuses connections

        def _send(self, code: int, body: bytes, ctype: str) -> None:
            try:
                self.send_response(code)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
            except (BrokenPipeError, ConnectionResetError) as exc:  # the caller gave up (its httpTimeout)
                self.close_connection = True
                log.info("%s %s: the caller was gone before the reply (%s)", self.command, self.path, exc)

        def _reply(self, code: int, out: Any) -> None:
            self._send(code, json.dumps(out).encode(), "application/json")

        def do_POST(self):  # noqa: N802
            path = self.path.split("?", 1)[0].rstrip("/").rsplit("/", 1)[-1]
            try:
                n = int(self.headers.get("Content-Length") or 0)
                if not 0 <= n <= 64 << 20:
                    raise ValueError(f"Content-Length {n} out of range")
                args = json.loads(self.rfile.read(n) or b"{}")
                if not isinstance(args, dict):
                    raise TypeError("body must be a JSON object")
            except (ValueError, TypeError) as exc:
                ext.metrics.requests.labels(path if path in ("filter", "prioritize", "bind") else "unknown", "bad_request").inc()
                log.info("bad %s request: %s", path, exc)
                self._reply(400, {"Error": f"bad request: {exc}"})
                return
            try:
                if path == "filter":
                    out: Any = ext.filter(args)
                elif path == "prioritize":
                    out = ext.prioritize(args)
                elif path == "bind":
                    out = ext.bind(args)
                else:
                    self._reply(404, {"Error": f"unknown verb {path!r}"})
                    return
            except BadRequest as exc:
                self._reply(400, {"Error": f"bad request: {exc}"})
                return
            except Exception as exc:  # answered, never crashes the server
                log.exception("extender %s failed", path)
                ext.metrics.requests.labels(path, "error").inc()
                out = [] if path == "prioritize" else {"Error": f"internal error: {exc}"}
            self._reply(200, out)

        def do_GET(self):
            path = self.path.split("?", 1)[0]
            if path == "/metrics":
                self._send(200, generate_latest(ext.metrics.registry), CONTENT_TYPE_LATEST)
                return
            if path == "/healthz":
                code = 200
            elif path == "/readyz":
                code = 200 if ready is None or ready.is_set() else 503
            else:
                code = 404
            self._send(code, {200: b"ok", 503: b"not synced", 404: b"not found"}[code], "text/plain")

        def log_message(self, *a):
            pass

    srv = _Server((host.strip("[]"), int(port)), H)
    srv.stopped = stopped = threading.Event()
    threading.Thread(target=srv.serve_forever, daemon=True, name="extender").start()

    def sweep() -> None:
        while not stopped.wait(sweep_s):
            try:
                ext.sweep()
            except Exception:  # never stops the sweeper
                log.exception("releasing expired reservations failed")

    threading.Thread(target=sweep, daemon=True, name="extender-sweep").start()
    return srv
