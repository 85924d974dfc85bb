# mypy: disable-error-code="misc"
# (methods take ``self: SchedulerLoop``, the class that mixes them in; mypy wants a supertype there)
"""The bind pipeline, as kube-scheduler's binding cycle: an assumed decision's Binding goes out (on
a worker thread when ``bind_workers`` > 0), results come back through ``drain()`` on the loop's
thread, and a failure drops the assumption and sends the pod back to the queue.

Why a module of its own: binding is the one place the loop writes pods to the API server, and
its results must be applied on the loop's thread alone.  A mixin of ``SchedulerLoop`` because
it updates the loop's snapshot and queue on each result.
"""

from __future__ import annotations

import logging
import queue
import time
from typing import TYPE_CHECKING, Any

from ..engine import annotations as ann
from ..engine.inventory import assignment_to_json
from ..engine.model import Assignment
from .api import (
    Conflict,
    NotFound,
    SchedulerApi,
)
from .loop_support import slim_pod

if TYPE_CHECKING:
    from .loop import SchedulerLoop

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




class BinderMixin:
    """Methods of ``SchedulerLoop``; see the module docstring."""

    def _start_bind(self: SchedulerLoop, key: str, pod: dict, a: Assignment, t0: float) -> None:
        gpus = self.state.nodes[self.state.index[a.node]].gpus
        annotations = {ann.ASSIGNMENT: assignment_to_json(a, {g.index: g.uuid for g in gpus})}
        if a.queue and ((pod.get("metadata") or {}).get("annotations") or {}).get(ann.QUEUE) != a.queue:
            annotations[ann.QUEUE] = a.queue  # the queue it was admitted to: a restart counts it there again
        self.queue.remove(key)
        self.binding[key] = (pod, a, t0)
        if self._bind_volumes(key, pod, a, annotations):
            return  # the Binding goes out once its claims are bound (_check_volume_waits)
        self._send_bind(key, pod, a, annotations)

    def _send_bind(self: SchedulerLoop, key: str, pod: dict, a: Assignment, annotations: dict[str, str]) -> None:
        m = pod["metadata"]
        ns, name = m.get("namespace") or "default", m["name"]
        if self._pool is None:
            self._bind_done(key, *bind_job(self.api, ns, name, a.node, annotations), annotations)
        else:
            fut = self._pool.submit(bind_job, self.api, ns, name, a.node, annotations)

            def done(f: Any, key: str = key, annotations: dict = annotations) -> None:
                self._results.put((key, *(f.result() if f.exception() is None else ("failed", str(f.exception()), None)), annotations))

            fut.add_done_callback(done)

    def next_result(self: SchedulerLoop, timeout_s: float) -> tuple | None:
        """Wait for a finished bind without touching the snapshot (call ``apply_result`` with it)."""
        try:
            return self._results.get(timeout=timeout_s)
        except queue.Empty:
            return None

    def apply_result(self: SchedulerLoop, item: tuple) -> None:
        self._bind_done(*item)

    def drain(self: SchedulerLoop, block_s: float = 0.0) -> int:
        """Apply finished binds (async mode); returns how many."""
        n = 0
        try:
            item = self._results.get(timeout=block_s) if block_s > 0 else self._results.get_nowait()
            while True:
                self._bind_done(*item)
                n += 1
                item = self._results.get_nowait()
        except queue.Empty:
            return n

    def _bind_done(self: SchedulerLoop, key: str, outcome: str, detail: str, seen: dict | None, annotations: dict[str, str]) -> None:
        entry = self.binding.pop(key, None)
        if entry is None:
            return  # deleted meanwhile; its reservation is already gone
        pod, a, t0 = entry
        if outcome == "bound":
            if key not in self.bound_pods:
                p = dict(pod)
                p["spec"] = {**(pod.get("spec") or {}), "nodeName": a.node}
                p["metadata"] = {**pod["metadata"], "annotations": {**(pod["metadata"].get("annotations") or {}), **annotations}}
                self.bound_pods[key] = slim_pod(p)
            first = self.queue.scheduled(key, t0)
            self.stats.binds += 1
            self._count("scheduled", t0)
            self.stats.e2e_s.append(self.clock() - first)
            gpus = f" GPUs {list(a.gpu_indices)}" if a.gpu_indices else ""
            share = f" ({a.gpu_milli} milli each)" if a.gpu_indices and a.gpu_milli < 1000 else ""
            mig = f" MIG {a.mig_profile} {list(a.mig)}" if a.mig else ""
            self.events.send(pod, "Normal", "Scheduled", f"Successfully assigned {key} to {a.node}{gpus}{share}{mig}")
            return
        if self.gangs.gangs:
            self.gangs.remove(key)
        self.sched.forget(key)  # our assumption was wrong
        self._count("error", t0)
        if outcome == "taken":
            log.info("pod %s was bound to %s by someone else", key, detail)
            if key not in self.bound_pods and seen is not None:
                self.bound_pods[key] = slim_pod(seen)
            if key in self.bound_pods:
                self._reserve_bound(key, self.bound_pods[key])
            self.queue.forget(key)
        elif outcome == "gone":
            self.queue.forget(key)
        else:
            log.warning("binding %s to %s failed: %s", key, a.node, detail)
            if key not in self.bound_pods:
                self.queue.put_back(key, pod)
                self.queue.defer(key)
                self.events.send(pod, "Warning", "FailedScheduling", f"binding to {a.node} failed: {detail}")

    def close(self: SchedulerLoop, timeout_s: float = 10.0) -> None:
        """Wait for binds in flight and flush events."""
        end = time.monotonic() + timeout_s
        while self.binding and time.monotonic() < end:
            self.drain(block_s=0.1)
        if self._pool is not None:
            self._pool.shutdown(wait=False)
        self.events.flush(max(0.0, end - time.monotonic()))

    def _count(self: SchedulerLoop, result: str, t0: float) -> None:
        self.stats.attempts[result] = self.stats.attempts.get(result, 0) + 1
        if self.on_attempt:
            self.on_attempt(result, self.clock() - t0)
