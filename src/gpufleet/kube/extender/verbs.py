"""The extender's verbs (k8s.io/kube-scheduler/extender/v1): ``filter`` runs the whole engine cycle on the
offered nodes and reserves the choice, ``prioritize`` ranks them, ``bind`` confirms the reservation and writes
it with the Binding; and the retry of GPU pods kube-scheduler parked after failing to reach us.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

import numpy as np

from ...engine import annotations as ann
from ...engine.errors import GpufleetError
from ...engine.inventory import assignment_to_json
from ...engine.model import Assignment
from ...engine.podspec import parse_pod, pod_key
from ..events import reason_text
from ..loop import bind_job
from ..pods import created_s, slim_pod
from .metrics import ExtenderMetrics
from .reservations import RETRY_ANNOTATION, ExtenderLoop, Reservation

log = logging.getLogger("gpufleet.kube.extender")
MAX_EXTENDER_PRIORITY = 10
RETRY_BACKOFF_S = (2.0, 60.0)


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
