"""The secondary scheduler's loop: snapshot from list+watch, one engine cycle per pod, bind.

State is rebuilt from the API server alone: every bound pod's exact GPUs come
from its ``gpufleet.io/assignment`` annotation, so a restarted scheduler sees
the same devices taken and never double-books.  A pod that does not fit gets a
``FailedScheduling`` event with the engine's aggregated reasons and waits with
exponential backoff, parked by what kept it out; a change wakes the parked pods it
may let fit (a node added or changed: all; a pod gone: those that could fit where
it was, or that a cluster-wide count kept out) -- ``engine.pending.PendingGroups``,
the replay's waiting pods too (``scheduling_queue``).  A pod whose spec is invalid gets a warning event naming the field.
Nothing one pod does stops the loop.

Like kube-scheduler, a decision is *assumed* at once (its devices reserved in
the snapshot, so the next pod sees them taken) and the Binding may go out on a
worker thread (``bind_workers``); the result comes back through ``drain()`` on
the loop's own thread, which alone touches the snapshot.  A bind whose reply
was lost (timeout, connection reset) is checked with a GET before the
assumption is dropped: the pod may well be bound.

Watch events can arrive after a relist that already contains them; an event
older than the object we hold (by resourceVersion) is ignored.

Teams, gangs and priority (``policy_objects``): namespaces, Queues, PodGroups
and PodDisruptionBudgets are watched too.  Pods get their queue from their own
annotation, their PodGroup, or their namespace; the ``QueueQuota`` plugin
admits by quota; pending pods are tried in weighted-DRF order.  Pods of a pod
group go through ``GangScheduler`` (all or nothing).  A pod that does not fit
first tries to *reclaim* quota its queue lent out (borrowed pods of other
queues), then to *preempt* lower-priority pods (whole gangs, within
PodDisruptionBudgets); victims are evicted through the Eviction API and the pod is
tried first once they are gone.  The queue a pod was admitted to is written
next to its assignment, so a restart counts usage exactly as before.

A victim stays in the snapshot until the watch shows it gone (its room is not
free before), so every plan made meanwhile must not choose it again: evictions
in flight (and pods terminating anyway) are excluded from all candidate sets
until then, or until ``eviction_timeout_s`` (``evictor.Evictions``).  Only an eviction the API admitted is
an eviction (event, counter, nomination); a 404 counts as ``already_gone``.
A gang's hold (see ``engine.gang``) is named in the reason of every pod it
alone keeps out.

What a pending pod goes through -- the engine's cycle, past a gang's hold, held room, reclaim,
preemption, the gang round -- is ``engine.round.SchedulingRound``, written once for this loop and
the trace replay (``simulator/experiments/replay.py``); this loop feeds it (which pods are due, in which
order, how long each waited) and its ports carry the decisions out: ``effects.LiveEffects``
(binds, FailedScheduling events, backoff) and ``preemption.Preemptor`` (deletions, nominations,
planning time).

The loop is cut along kube-scheduler's lines, each part an object in its own module that owns
its state, built here with its dependencies passed in (all run on the loop's thread):

- ``scheduling_queue.SchedulingQueue``: pending pods, backoff, first-seen times, last failure;
- ``cache.SchedulerCache``: objects as listed and watched (nodes, bound pods, policy objects),
  resourceVersions, and the snapshot built from them (``state``, ``sched``, the queue tree);
- ``binder.Binder``: binds in flight, the worker pool and their results;
- ``volume_binding.VolumeBinder``: WaitForFirstConsumer claims before the Binding;
- ``preemption.Preemptor``: carrying out the round's reclaim and preemption plans, nominations,
  planning time;
- ``effects.LiveEffects``: the round's binds and waits;
- ``evictor.Evictions``: victims' DELETEs until the watch shows them gone.

The others read the cache through ``view.ClusterView`` (a relist replaces the snapshot, so
they look it up each time, never keep it); where a part needs the loop or a part built after it,
it asks through a small Protocol the loop implements (``CacheHooks``, ``BinderHooks``).  This class keeps
what feeds the round (``schedule_due``, ``schedule_one``, the gang round's members; a rebuild gives the
round a fresh ``GangScheduler``), ``explain``, and the wiring: when a pod is gone every part forgets it
(``drop_pod``).  The parts' state is read from the part that owns it (``loop.cache.state``,
``loop.queue.pending``, ``loop.binder.binding``, ``loop.round.gangs``): the loop passes nothing on,
except its intake (``resync``, ``handle``, ``replace``: the runner feeds it watch events and relists,
and the extender's loop adds to them).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from dataclasses import replace
from typing import Callable

from ..engine.errors import GpufleetError
from ..engine.framework import Profile
from ..engine.gang import PodGroupNotReady, gang_dry_run, group_key
from ..engine.model import Assignment, PodRequest
from ..engine.podspec import pod_key
from ..engine.preemption import explain_preemption
from ..engine.plugins.queuequota import QueueQuota
from ..engine.round import SchedulingRound
from ..engine.schedqueue import EVERYTHING, Change, QueuedPod, held_room_node, order_pending, requeue_hints
from .api import (
    CONSTRAINT_KINDS,
    POLICY_KINDS,
    SchedulerApi,
)
from .binder import Binder
from .dra import LiveDra, with_dra
from .binder import bind_job as bind_job  # re-exported: kube/extender/verbs.py imports it from here
from .cache import SchedulerCache
from .effects import LiveEffects
from .evictor import Evictions
from .events import EventSink, reason_text
from .plugin_down import PluginDown
from .profile import KUBE_SCHEDULER_HANDLES, without_plugins
from .stats import Stats
from . import podgroup_status
from .pods import slim_pod as slim_pod  # re-exported, as bind_job
from .preemption import Preemptor
from .scheduling_queue import SchedulingQueue
from .volume_binding import VolumeBinder

log = logging.getLogger(__name__)


class SchedulerLoop:
    """The scheduling queue, the cache, the binder, volume binding and preemption, each its own object
    (see the module docstring); this class runs the cycle and wires them together."""

    def __init__(self, api: SchedulerApi, profile: Profile, scheduler_name: str = "gpufleet", seed: int = 0,
                 backoff_initial_s: float = 1.0, backoff_max_s: float = 60.0, clock: Callable[[], float] = time.monotonic,
                 on_attempt: Callable[[str, float], None] | None = None, bind_workers: int = 0, event_thread: bool = False,
                 max_in_flight: int = 512, policy_kinds: bool = True, preemption: bool = True,
                 eviction_grace_s: int | None = None, nominated_timeout_s: float = 120.0, constraint_kinds: bool = True,
                 volume_bind_timeout_s: float = 600.0, eviction_timeout_s: float | None = None, dra: bool = True,
                 drain: bool = True, recreate_refused: bool = True,
                 recreate_foreign: bool = False):
        self.api = api
        if not constraint_kinds:  # extender mode: kube-scheduler already judged these with its own informers
            profile = without_plugins(profile, KUBE_SCHEDULER_HANDLES)
        elif dra:  # gpufleet allocates ResourceClaims itself (in extender mode kube-scheduler does)
            profile = with_dra(profile)
        # queue quotas need the QueueQuota plugin; add it when the profile does not name it
        self.quota = next((p for p in profile.pre_filters if isinstance(p, QueueQuota)), None)
        if self.quota is None and policy_kinds:
            self.quota = QueueQuota()
            profile = replace(profile, pre_filters=[self.quota, *profile.pre_filters], reserves=[self.quota, *profile.reserves])
        self.profile = profile
        kinds = [k for k in POLICY_KINDS] if policy_kinds else list(CONSTRAINT_KINDS) if constraint_kinds else []
        self.preemption = preemption
        self.eviction_grace_s = eviction_grace_s
        self.scheduler_name = scheduler_name
        self.seed: int = seed
        self.clock = clock
        self.on_attempt = on_attempt
        self.max_in_flight = max_in_flight
        self.stats = Stats()
        self.events = EventSink(api, self.stats, event_thread)
        # what may lift each plugin's rejection decides which parked pods a change wakes (engine.pending, as the replay)
        self.queue = SchedulingQueue(clock, backoff_initial_s, backoff_max_s, hints=requeue_hints(profile))
        self.dra = LiveDra(api, self.events.send) if dra else None
        self.cache = SchedulerCache(api, profile, self.queue, self.stats, hooks=self, scheduler_name=scheduler_name, seed=seed,
                                    policy_kinds=kinds, quota=self.quota, dra=self.dra)
        self.binder = Binder(api, self.cache, self.queue, self.events, self.stats, clock, hooks=self, workers=bind_workers)
        self.volume_binder = VolumeBinder(api, self.cache, self.binder, clock, volume_bind_timeout_s)
        self.evictions = Evictions(api, self.events, self.stats, clock, eviction_grace_s, eviction_timeout_s)
        self.preemptor = Preemptor(api, self.cache, self.queue, self.events, self.evictions, clock, nominated_timeout_s,
                                   self.dra)
        self.effects = LiveEffects(self.queue, self.binder, self.events, self.stats, self.preemptor,
                                   lambda: self.round.gangs, self.count_attempt, self.dra,
                                   lambda res: podgroup_status.report(self.api, self.cache.objects, res))
        # the scheduling round, shared with the replay: decisions go to the effects, room-making to the preemptor
        self.round = SchedulingRound(self.cache, self.effects, self.preemptor, preemption)
        self.round.reset_gangs(self._wall_clock)
        from ..engine.plugins.spotcapacity import SpotCapacity
        from .interruption import Drainer

        spot = next((p.config for p in profile.filters if isinstance(p, SpotCapacity)), None)
        self.drainer = Drainer(api, self.cache, self.queue, self.events, self.stats, spot, clock) if drain else None
        self.plugin_down = PluginDown(api, self.cache, self.events, self.stats, scheduler_name, recreate_refused, clock=clock,
                                      recreate_foreign=recreate_foreign)
        self.cache.gpu_plugin_down = self.plugin_down.held  # kubelet refused a pod there: no GPU pod placed (plugin_down.py)

    def _wall_clock(self, t: float, now: float) -> str:
        """A time on the loop's clock as people read it (UTC, to the second)."""
        return time.strftime("%H:%M:%S UTC", time.gmtime(time.time() + (t - now)))

    def resync(self) -> None:
        """Full relist of every kind and a rebuilt snapshot (start-up, becoming leader)."""
        self.cache.resync()

    def rebuild(self) -> None:
        """A fresh snapshot from the cached objects (our binds in flight kept), and a fresh gang scheduler on it."""
        self.cache.rebuild()
        self.round.reset_gangs(self._wall_clock)

    def handle(self, kind: str, type_: str, obj: dict) -> None:
        """A watch event."""
        self.cache.handle(kind, type_, obj)

    def replace(self, kind: str, items: list[dict], resource_version: str) -> None:
        """A relist of one kind (after 410 Gone): apply the differences as events."""
        self.cache.replace(kind, items, resource_version)

    # --- what the cache asks of the loop (CacheHooks) -------------------------------------------
    def in_flight(self) -> Mapping[str, tuple[dict, Assignment, float]]:
        return self.binder.binding

    def drop_pod(self, key: str) -> None:
        """A pod is gone: every part forgets it; waiting pods it may let fit wake if that freed room
        (on its node; every waiting pod when it ended a gang's hold)."""
        a = self.cache.state.assignments.get(key)
        node = self.cache.state.index.get(a.node) if a is not None else None
        had_hold = self.round.gangs.holder is not None
        self.queue.remove(key)
        self.volume_binder.forget(key)
        self.queue.forget(key)
        self.preemptor.forget(key)
        self.evictions.forget(key)
        freed = self.round.forget(key)  # a nomination ended: the room it kept is open again
        if self.round.gangs.gangs:
            freed = self.round.gangs.remove(key) or freed  # a held member's room, or a whole hold, given back
        freed = self.cache.forget_pod(key) or freed
        freed = self.binder.forget(key) or freed
        if freed:  # room on its node; a whole hold given back, or no node known: anything
            hold_ended = had_hold and self.round.gangs.holder is None
            self.queue.changed(EVERYTHING if node is None or hold_ended else Change((node,)), self.cache.state, self.round)

    def assumed_pvs(self) -> dict[str, str]:
        return self.volume_binder.assumed_pvs()

    def volumes_changed(self) -> None:
        self.volume_binder.check_waits()

    def on_pod_listed(self, pod: dict) -> None:
        """Nothing here; the extender tracks pods."""

    def on_pod_event(self, type_: str, pod: dict) -> None:
        """A pod kubelet may have refused (plugin_down.py); the extender also releases reservations."""
        self.plugin_down.seen(type_, pod)

    # --- binding (the binder's; these keep the loop's interface) -------------------------------
    def close(self, timeout_s: float = 10.0) -> None:
        """Wait for binds in flight and flush events."""
        end = time.monotonic() + timeout_s
        self.binder.close(timeout_s)
        self.events.flush(max(0.0, end - time.monotonic()))

    # --- what the binder asks of the loop (BinderHooks) ------------------------------------
    def prebind(self, key: str, pod: dict, a: Assignment, annotations: dict[str, str]) -> bool:
        return self.volume_binder.prebind(key, pod, a, annotations)

    def claim_writes(self, key: str, pod: dict, a: Assignment) -> Callable[[], None] | None:
        return self.dra.plan_job(self.cache.state, key, pod, a) if self.dra is not None else None

    def claims_done(self, key: str, bound: bool) -> None:
        if self.dra is not None and self.dra.finish(self.cache.state, key, bound):
            self.queue.wake_all()

    def count_attempt(self, result: str, t0: float) -> None:
        self.stats.attempts[result] = self.stats.attempts.get(result, 0) + 1
        if self.on_attempt:
            self.on_attempt(result, self.clock() - t0)

    def unassume(self, key: str) -> None:
        if self.round.gangs.gangs:
            self.round.gangs.remove(key)

    def wake_all(self) -> None:
        """The cluster changed: every waiting pod may fit now."""
        self.queue.wake_all()

    # --- scheduling -------------------------------------------------------------------
    def _in_gang(self, pod: dict) -> bool:
        return self.cache.group_of(pod) is not None

    def due(self) -> list[str]:
        """Pods to try now, one by one (gang members go through ``due_gang_members``).

        Pods that had victims deleted for them first; then, with queues, weighted
        DRF order; else higher priority first, then first seen.
        """
        now = self.clock()
        pods = []
        for k, p in self.queue.ready(now):
            if self._in_gang(p):
                continue
            req = None
            if self.cache.tree is not None:
                try:
                    req = self.cache.request(k, p)
                except GpufleetError:
                    pass  # invalid: tried first, schedule_one reports it
            pods.append(QueuedPod(k, int((p.get("spec") or {}).get("priority") or 0), self.queue.arrival(k), req))
        return order_pending(pods, self.cache.tree, self.preemptor.nominated)

    def due_gang_members(self) -> list[str]:
        return [k for k, p in self.queue.ready(self.clock()) if self._in_gang(p)]

    def next_wakeup(self) -> float | None:
        times = self.queue.wakeups() + self.volume_binder.deadlines()
        return min(times) if times else None

    def schedule_due(self, budget_s: float | None = None, should_continue: Callable[[], bool] | None = None) -> int:
        """Run one cycle for each pod that is due; returns how many were tried.

        Gang members go in one gang round, after the single pods -- or before them
        when a gang had victims deleted for it, so the room it made is its own.
        """
        if self.drainer is not None:  # pods off nodes with an interruption notice first (kube/interruption.py)
            self.drainer.step()
        self.plugin_down.step()  # nodes whose GPU device plugin is down held, refused bare pods re-created
        self.volume_binder.check_waits()
        self.learn_waiting()
        n = 0
        gang_keys = self.due_gang_members()
        gangs_first = any(k in self.preemptor.nominated for k in gang_keys)
        if gangs_first:
            n += self._safe_gang_round(gang_keys)
        end = None if budget_s is None else time.monotonic() + budget_s
        for key in self.due():
            if should_continue is not None and not should_continue():
                break
            if end is not None and time.monotonic() > end:
                break
            if len(self.binder.binding) >= self.max_in_flight:
                self.binder.drain(block_s=1.0)
                if len(self.binder.binding) >= self.max_in_flight:
                    break
            pod = self.queue.pending.get(key)
            if pod is not None:
                self.schedule_one(pod)
                n += 1
        if gang_keys and not gangs_first and (should_continue is None or should_continue()):
            n += self._safe_gang_round(gang_keys)
        return n

    def learn_waiting(self) -> None:
        """The pods that joined the queue are shown to the learning plugins before any is tried; one that
        shows ``status.nominatedNodeName`` (a preemptor, seen again after a restart) has its room kept, as
        kube-scheduler's nominator takes nominations from the pods it lists."""
        for k in self.queue.take_new():
            pod = self.queue.pending.get(k)
            if pod is None:
                continue
            try:
                req = self.cache.request(k, pod)
                self.cache.sched.observe(req)
            except GpufleetError:
                continue  # invalid: schedule_one reports it
            except Exception:  # a learning bug must not stop the loop
                log.exception("learning from pod %s failed", k)
                continue
            node = (pod.get("status") or {}).get("nominatedNodeName")
            if node and node in self.cache.state.index and k not in self.round.nominations:
                self.round.nominate(req, node)
                self.preemptor.nominated.setdefault(k, (set(), self.clock() + self.preemptor.nominated_timeout_s))  # tried first

    def _safe_gang_round(self, keys: list[str]) -> int:
        try:
            return self._gang_round(keys)
        except Exception as exc:  # an engine bug must not stop the loop
            log.exception("gang round failed")
            for k in keys:
                if k in self.queue.pending:
                    self.effects.failed_event(k, self.queue.pending[k], f"internal error placing its pod group: {exc}")
                    self.queue.defer(k)
            self.rebuild()  # drop half-done holds: the snapshot again holds only what is bound
            return len(keys)

    def _seed_running(self, groups: set[str]) -> None:
        """Gangs the GangScheduler sees for the first time: their members already bound count as running."""
        if not groups:
            return
        found: dict[str, list[str]] = {}
        for k, p in self.cache.bound_pods.items():
            name = self.cache.group_of(p)
            if name and (g := f"{k.split('/', 1)[0]}/{name}") in groups:
                found.setdefault(g, []).append(k)
        for g, members in found.items():
            self.round.gangs.note_running(g, members)

    def _gang_round(self, keys: list[str]) -> int:
        """Hand arrived gang members to the GangScheduler, step it, bind what it placed."""
        now = self.clock()
        new: set[str] = set()
        for k in keys:
            pod = self.queue.pending.get(k)
            if pod is None:
                continue
            try:
                r = self.cache.request(k, pod)
            except GpufleetError:
                self.schedule_one(pod)  # reports the invalid spec
                continue
            gk = group_key(r) or ""
            if gk not in self.round.gangs.gangs:
                new.add(gk)
            g = self.cache.objects.groups.get(gk)
            if g is not None:
                self.round.gangs.add_group(g, now)
            self.round.gangs.add(r, now)
        self._seed_running(new)
        self.effects.begin(now)
        self.round.gang_round(now)
        return len(keys)

    def schedule_one(self, pod: dict) -> str:
        """One pod through the shared round (``engine.round``): bound, or told why it waits (and room made)."""
        key = pod_key(pod)
        t0 = self.clock()
        try:
            req = self.cache.request(key, pod)
        except PodGroupNotReady as exc:  # its scheduling.k8s.io PodGroup is not there yet: wait for it
            self.count_attempt("unschedulable", t0)
            self.effects.failed_event(key, pod, str(exc))
            self.queue.defer(key)
            return "unschedulable"
        except GpufleetError as exc:
            self.count_attempt("invalid", t0)
            self.effects.failed_event(key, pod, f"invalid pod spec: {exc}")
            self.queue.defer(key)
            return "invalid"
        self.effects.begin(t0)
        try:
            a = self.round.try_pod(req, t0, self.queue.waited_s(key, t0), nominated=key in self.preemptor.nominated)
        except Exception as exc:  # an engine bug must not stop the loop
            log.exception("engine error on %s", key)
            self.count_attempt("error", t0)
            self.events.send(pod, "Warning", "FailedScheduling", f"internal error: {exc}")
            self.queue.defer(key)
            return "error"
        return "binding" if a.ok else "unschedulable"

    def replay_gangs(self) -> None:
        """For a fresh snapshot (``gpufleet explain``): hold and place the pending gang members as the
        scheduler's gang round does, binding nothing, so that a pod only a hold keeps out is told so.
        A hold is taken to have started when its gang's first member was created."""
        now = self.clock()
        first: list[float] = []
        new: set[str] = set()
        for k, p in list(self.queue.pending.items()):
            if not self._in_gang(p):
                continue
            try:
                r = self.cache.request(k, p)
            except GpufleetError:
                continue
            t = self.queue.arrival(k, now)  # its creation time on the loop's clock
            first.append(t)
            gk = group_key(r) or ""
            g = self.cache.objects.groups.get(gk)
            if g is not None:
                self.round.gangs.add_group(g, t)
            self.round.gangs.add(r, t)
            new.add(gk)
        self._seed_running(new)
        if first:
            self.round.gangs.step(min(first))
            self.round.gangs.step(now)

    def explain(self, pod: dict) -> tuple[str, dict[str, str]]:
        """(summary, node -> reason) for ``gpufleet explain``; changes nothing."""
        from .interruption import moved_line

        summary, by_node = self._explain(pod)
        moved = moved_line(pod)
        return (summary + f"\n  {moved}" if moved else summary), by_node

    def _explain(self, pod: dict) -> tuple[str, dict[str, str]]:
        req = self.cache.request(pod_key(pod), pod)
        dec = self.round.explain(req, waited_s=self.queue.waited_s(req.key, self.clock()))  # as its next try would
        by_node = dict(dec.diagnosis.by_node) if dec.diagnosis else {}
        for name, why in self.cache.bad_nodes.items():
            by_node[name] = f"left out: {why}"
        gang = self._gang_line(req)
        why = self.round.gangs.blocked_by_hold(req, self.clock()) if not dec.ok and self.round.gangs.held else ""
        if why:
            gang = why + (f"\n  {gang}" if gang else "")
        if dec.ok:
            fits = f"fits: best node {dec.assignment.node} (score {dec.score:.1f}, {dec.feasible_nodes} feasible)"  # type: ignore[union-attr]
            if gang:  # a gang member is placed with its gang or not at all: the gang lines say which
                fits = "alone it " + fits
            return fits + (f"\n  {gang}" if gang else ""), by_node
        msg = reason_text(dec.status) + (f"\n  {gang}" if gang else "")
        rp = None
        if self.cache.tree is not None:
            rp = self.cache.tree.plan_reclaim(self.cache.sched, req, exclude=self.preemptor.leaving(), victim_args=lambda: dict(
                budgets=self.cache.budgets(), age_rank=self.cache.age_rank()))
        may_preempt = not req.preempt_never and any(a.priority < req.priority for a in self.cache.state.assignments.values())
        if (rp is not None or may_preempt) and (node := held_room_node(self.cache.sched, req)) is not None:
            return msg + (f"\n  held room (dry run): fits on {node} in room held for pods not yet here, and takes it "
                          f"rather than evict anyone"), by_node
        if rp is not None:
            msg += "\n  reclaim (dry run): " + "; ".join(rp.explanation)
        if req.preempt_never:
            msg += "\n  preemption: none (spec.preemptionPolicy: Never)"
        elif may_preempt:
            lines = explain_preemption(self.cache.sched, req, budgets=self.cache.budgets(),
                                       age_rank=self.cache.age_rank(), exclude=self.preemptor.leaving())
            msg += "\n  " + "\n  ".join(lines)
        return msg, by_node

    def _gang_line(self, req: PodRequest) -> str:
        """Where a gang member's pod group stands: members waiting and running against its minimum."""
        k = group_key(req)
        if k is None:
            return ""

        def in_group(p: dict) -> bool:
            m = p.get("metadata") or {}
            return (m.get("namespace") or "default") == req.namespace and self.cache.group_of(p) == req.pod_group
        waiting = {key: p for key, p in self.queue.pending.items() if in_group(p)}
        running = sum(1 for p in self.cache.bound_pods.values() if in_group(p))
        need = max(req.pod_group_min, 1)
        what = "places all-or-nothing" if running < need else "is running; extra members go one by one"
        line = f"pod group {k}: {len(waiting)} member(s) waiting, {running} running, minMember {need} -- the gang {what}"
        return line + "\n  " + self._gang_fit(k, waiting, max(need - running, 1))

    def _gang_fit(self, group: str, waiting: dict[str, dict], need: int) -> str:
        """Which waiting members fit now, placed together (dry run), and which do not and why."""
        # members the gang round already holds or placed in this snapshot (explain replays it) fit where they are
        held = {key: a.node for key in waiting if (a := self.cache.state.assignments.get(key))}
        members = []
        for key, p in waiting.items():
            if key not in held:
                try:
                    members.append(self.cache.request(key, p))
                except GpufleetError:
                    pass  # its own explain names the bad field
        tried = gang_dry_run(self.cache.sched, members)
        fit = [f"{key} on {node} (held)" if key in self.round.gangs.held else f"{key} on {node}" for key, node in sorted(held.items())]
        fit += [f"{key} on {node}" for key, node, _ in tried if node]
        out = [f"{key}: {reason_text(why)}" for key, node, why in tried if not node]
        verdict = "all-or-nothing: it is placed" if len(fit) >= need else "all-or-nothing: none is placed"
        text = f"gang (dry run): {len(fit)} of the {need} member(s) it needs fit now ({verdict})"
        if fit:
            text += "; fit: " + ", ".join(fit)
        if out:
            text += "; do not fit: " + "; ".join(out)
        return text


__all__ = ["SchedulerLoop", "Stats", "bind_job"]
