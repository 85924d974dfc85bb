"""The bind pipeline, as kube-scheduler's binding cycle: an assumed decision's Binding goes out (on
a worker thread when ``bind_workers`` > 0), results come back through ``drain()`` on the loop's
thread, and a failure drops the assumption and sends the pod back to the queue.

Why a module of its own: binding is the one place the loop writes pods to the API server, and
its results must be applied on the loop's thread alone.  ``Binder`` owns the binds in flight
(pod -> (pod JSON, assumed assignment, cycle start)), the worker pool and the result queue; on
each result it updates the cache (``ClusterView``: the pod bound, or the assumption dropped) and
the scheduling queue (the pod's timers, or the pod back to wait).  What it needs from the loop
(the PreBind step, the attempt counter, the gang scheduler) comes through ``BinderHooks``.

The scheduler extender sends its Bindings itself when kube-scheduler calls its /bind (on HTTP
threads, under the extender's lock, like all its use of the loop).  It records them here
(``begin_external`` / ``end_external``) rather than writing the map, so they are in flight like
ours: a relist keeps their assumption, a deleted pod drops it, and the result updates the cache as
ours do, less what kube-scheduler does for its own pods (attempts, events, retries).
"""

from __future__ import annotations

import logging
import queue
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Protocol

from ..engine import annotations as ann
from ..engine.inventory import assignment_to_json
from ..engine.model import Assignment
from .api import (
    Conflict,
    NotFound,
    SchedulerApi,
)
from .events import EventSink
from .stats import Stats
from .view import ClusterView
from .scheduling_queue import SchedulingQueue

log = logging.getLogger("gpufleet.kube.loop")  # the loop's logger, as before the split


def bind_job(api: SchedulerApi, namespace: str, name: str, node: str, annotations: dict[str, str]) -> tuple[str, str, dict | None]:
    """Bind one pod; runs on a worker thread.  Returns (outcome, detail, pod as read back or None).

    Outcomes: ``bound`` (ours, on ``node``), ``taken`` (bound by someone
    else; detail is that node), ``gone`` (deleted), ``failed``.
    """
    try:
        api.bind(namespace, name, node, annotations)
        return "bound", "", None
    except NotFound:
        return "gone", "", None
    except Exception as exc:  # Conflict, timeout, reset: find out what happened
        err = f"{type(exc).__name__}: {exc}" if not isinstance(exc, Conflict) else f"conflict: {exc}"
        try:
            p = api.get_pod(namespace, name)
        except Exception as exc2:
            return "failed", f"{err}; and reading the pod back failed: {exc2}", None
        if p is None:
            return "gone", "", None
        bound_to = (p.get("spec") or {}).get("nodeName")
        if not bound_to:
            return "failed", err, p
        mine = ((p.get("metadata") or {}).get("annotations") or {}).get(ann.ASSIGNMENT) == annotations.get(ann.ASSIGNMENT)
        return ("bound", "", p) if bound_to == node and mine else ("taken", bound_to, p)


def bind_after(pre: Callable[[], None] | None, api: SchedulerApi, namespace: str, name: str, node: str,
               annotations: dict[str, str]) -> tuple[str, str, dict | None]:
    """``pre`` (DRA: the pod's claims written, kube/dra) then the Binding; a failure of ``pre`` is the bind's."""
    if pre is not None:
        try:
            pre()
        except Exception as exc:
            return "failed", str(exc), None
    return bind_job(api, namespace, name, node, annotations)


class BinderHooks(Protocol):
    """What the binder asks of the loop."""

    def claim_writes(self, key: str, pod: dict, a: Assignment) -> Callable[[], None] | None:
        """DRA: what to write to the pod's ResourceClaims before its Binding (on the bind worker), or None."""
        ...

    def claims_done(self, key: str, bound: bool) -> None:
        """DRA: the pod's bind ended (or it went); allocations never written are given back."""
        ...

    def prebind(self, key: str, pod: dict, a: Assignment, annotations: dict[str, str]) -> bool:
        """Before the Binding (volume binding): True when the pod must wait (or has failed) instead of being bound now."""
        ...

    def count_attempt(self, result: str, t0: float) -> None:
        """One scheduling attempt ended (``scheduled``, ``error``, ...), started at ``t0`` on the loop's clock."""
        ...

    def unassume(self, key: str) -> None:
        """A bind failed: the gang scheduler gives the pod's room back (the binder then forgets the assumption)."""
        ...


class Binder:
    """Sends Bindings and applies their results; see the module docstring."""

    def __init__(self, api: SchedulerApi, cache: ClusterView, queue_: SchedulingQueue, events: EventSink, stats: Stats,
                 clock: Callable[[], float], hooks: BinderHooks, workers: int = 0) -> None:
        self.api = api
        self.cache = cache
        self.queue = queue_
        self.events = events
        self.stats = stats
        self.clock = clock
        self.hooks = hooks
        self.binding: dict[str, tuple[dict, Assignment, float]] = {}  # our binds in flight
        self._pool = ThreadPoolExecutor(workers, thread_name_prefix="bind") if workers > 0 else None
        self._results: queue.Queue = queue.Queue()

    def is_in_flight(self, key: str) -> bool:
        """A bind of the pod is out (ours or an external one) and its result not applied yet."""
        return key in self.binding

    def forget(self, key: str) -> bool:
        """The pod is gone: drop its bind in flight (its result will be ignored) and the assumption;
        True if that freed room in the snapshot."""
        if self.binding.pop(key, None) is None:
            return False
        return self.cache.sched.forget(key) is not None

    def start(self, key: str, pod: dict, a: Assignment, t0: float) -> None:
        """An assumed decision: out of the queue, in flight; the Binding goes out now or after PreBind."""
        state = self.cache.state
        gpus = state.nodes[state.index[a.node]].gpus
        annotations = {ann.ASSIGNMENT: assignment_to_json(a, {g.index: g.uuid for g in gpus})}
        if a.queue and ((pod.get("metadata") or {}).get("annotations") or {}).get(ann.QUEUE) != a.queue:
            annotations[ann.QUEUE] = a.queue  # the queue it was admitted to: a restart counts it there again
        self.queue.remove(key)
        self.binding[key] = (pod, a, t0)
        if self.hooks.prebind(key, pod, a, annotations):
            return  # the Binding goes out once its claims are bound (volume binding)
        self.send(key, pod, a, annotations)

    def send(self, key: str, pod: dict, a: Assignment, annotations: dict[str, str]) -> None:
        m = pod["metadata"]
        ns, name = m.get("namespace") or "default", m["name"]
        pre = self.hooks.claim_writes(key, pod, a)
        if self._pool is None:
            self.done(key, *bind_after(pre, self.api, ns, name, a.node, annotations), annotations)
        else:
            fut = self._pool.submit(bind_after, pre, self.api, ns, name, a.node, annotations)

            def done(f: Any, key: str = key, annotations: dict = annotations) -> None:
                self._results.put((key, *(f.result() if f.exception() is None else ("failed", str(f.exception()), None)), annotations))

            fut.add_done_callback(done)

    def next_result(self, timeout_s: float) -> tuple | None:
        """Wait for a finished bind without touching the snapshot (call ``apply_result`` with it)."""
        try:
            return self._results.get(timeout=timeout_s)
        except queue.Empty:
            return None

    def apply_result(self, item: tuple) -> None:
        self.done(*item)

    def drain(self, block_s: float = 0.0) -> int:
        """Apply finished binds (async mode); returns how many."""
        n = 0
        try:
            item = self._results.get(timeout=block_s) if block_s > 0 else self._results.get_nowait()
            while True:
                self.done(*item)
                n += 1
                item = self._results.get_nowait()
        except queue.Empty:
            return n

    def done(self, key: str, outcome: str, detail: str, seen: dict | None, annotations: dict[str, str]) -> None:
        """A bind's result (on the loop's thread)."""
        self.hooks.claims_done(key, outcome == "bound")
        entry = self.binding.pop(key, None)
        if entry is None:
            return  # deleted meanwhile; its reservation is already gone
        pod, a, t0 = entry
        cache = self.cache
        if outcome == "bound":
            self._add_bound(key, pod, a, annotations)
            first = self.queue.scheduled(key, t0)
            self.stats.binds += 1
            self.hooks.count_attempt("scheduled", t0)
            self.stats.e2e_s.append(self.clock() - first)
            gpus = f" GPUs {list(a.gpu_indices)}" if a.gpu_indices else ""
            share = f" ({a.gpu_milli} milli each)" if a.gpu_indices and a.gpu_milli < 1000 else ""
            mig = f" MIG {a.mig_profile} {list(a.mig)}" if a.mig else ""
            self.events.send(pod, "Normal", "Scheduled", f"Successfully assigned {key} to {a.node}{gpus}{share}{mig}")
            return
        self.hooks.unassume(key)
        cache.sched.forget(key)  # our assumption was wrong
        self.hooks.count_attempt("error", t0)
        if outcome == "taken":
            log.info("pod %s was bound to %s by someone else", key, detail)
            self._hold_taken(key, seen)
            self.queue.forget(key)
        elif outcome == "gone":
            self.queue.forget(key)
        else:
            log.warning("binding %s to %s failed: %s", key, a.node, detail)
            if key not in cache.bound_pods:
                self.queue.put_back(key, pod)
                self.queue.defer(key)
                self.events.send(pod, "Warning", "FailedScheduling", f"binding to {a.node} failed: {detail}")

    def _add_bound(self, key: str, pod: dict, a: Assignment, annotations: dict[str, str]) -> None:
        """The Binding went through: the pod held as bound on ``a.node`` with the annotations it wrote
        (unless the watch already showed it bound)."""
        if key in self.cache.bound_pods:
            return
        meta = pod.get("metadata") or {}
        p = dict(pod)
        p["spec"] = {**(pod.get("spec") or {}), "nodeName": a.node}
        p["metadata"] = {**meta, "annotations": {**(meta.get("annotations") or {}), **annotations}}
        self.cache.add_bound(key, p)

    def _hold_taken(self, key: str, seen: dict | None) -> None:
        """Someone else bound the pod: hold it where it is (``seen``: the pod as read back, else as watched)."""
        cache = self.cache
        held = cache.add_bound(key, seen) if seen is not None else cache.bound_pods.get(key)
        if held is not None:
            cache.reserve_bound(key, held)

    # --- binds the scheduler extender sends itself ---------------------------------------
    def begin_external(self, key: str, pod: dict, a: Assignment, t0: float) -> None:
        """The caller sends the pod's Binding itself (``a`` already assumed): in flight until ``end_external``.
        ``t0`` is kept with the entry, never read for an external bind."""
        self.binding[key] = (pod, a, t0)

    def end_external(self, key: str, outcome: str, seen: dict | None, annotations: dict[str, str]) -> bool:
        """Apply an external bind's result (``bind_job``'s outcome and pod read back); False, and nothing
        applied, when the pod was deleted meanwhile (``forget`` dropped the bind).

        Bound: held as bound, out of the queue, counted in ``stats.binds``.  Otherwise the assumption is
        dropped if the snapshot still holds exactly it, and a pod someone else bound is held where it is.
        No attempt count, event, log line or retry: kube-scheduler does those for its pods."""
        entry = self.binding.pop(key, None)
        if entry is None:
            return False
        pod, a, _ = entry
        if outcome == "bound":
            self._add_bound(key, pod, a, annotations)
            self.queue.remove(key)
            self.stats.binds += 1
            return True
        if self.cache.state.assignments.get(key) == a:
            self.cache.sched.forget(key)
        if outcome == "taken":
            self._hold_taken(key, seen)
        return True

    def close(self, timeout_s: float = 10.0) -> None:
        """Wait up to ``timeout_s`` for binds in flight, then stop the workers."""
        end = time.monotonic() + timeout_s
        while self.binding and time.monotonic() < end:
            self.drain(block_s=0.1)
        if self._pool is not None:
            self._pool.shutdown(wait=False)
