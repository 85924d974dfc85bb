"""The scheduler process without its CLI: watches, leader election, the loop, metrics.

Threads: one reflector per kind (list once, then watch from the last
resourceVersion; reconnect with backoff; on ``410 Gone`` it relists that kind
itself and hands the loop a ``replace``), the lease elector, bind workers and
the event sender.  Only the thread that calls ``Runner.run`` touches the
snapshot: it applies watch events, finished binds, and -- while it holds the
lease -- schedules due pods in short slices so events are never far behind.

On becoming leader the snapshot is rebuilt from a fresh list, so binds the
previous leader made just before handing over are seen before anything is
placed.  Tests run ``Runner.run`` on a thread with their own stop event.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
import time
from typing import Any

from .api import Gone, SchedulerApi
from .leader import LeaseElector
from .loop import SchedulerLoop
from .queue_metrics import QueueGauges, pending_by_queue

log = logging.getLogger("gpufleet.scheduler")


class Runner:
    def __init__(self, api: SchedulerApi, loop: SchedulerLoop, elector: LeaseElector | None = None, metrics: Any = None,
                 watch_timeout_s: int = 60, slice_s: float = 0.2, lock: Any = None, queue_metrics_every_s: float = 1.0):
        self.api = api
        self.loop = loop
        self.elector = elector
        self.metrics = metrics
        self.watch_timeout_s = watch_timeout_s
        self.slice_s = slice_s
        self.queue_metrics_every_s = queue_metrics_every_s  # per-queue pending gauges: a pass over the pending pods
        self.q: queue.Queue = queue.Queue()
        self.ready = threading.Event()
        self.relists = {"node": 0, "pod": 0}
        self.last_heard = time.monotonic()  # any watch event, bookmark or cleanly ended watch: the snapshot's age
        self._term = 0
        self._threads: list[threading.Thread] = []
        self.lock = lock if lock is not None else contextlib.nullcontext()  # the extender's HTTP threads share the loop

    # --- reflectors ---------------------------------------------------------------------
    def _reflect(self, kind: str, rv: str, stop: threading.Event) -> None:
        delay = 0.5
        while not stop.is_set():
            try:
                for type_, obj in self.api.watch(kind, rv, self.watch_timeout_s):
                    self.last_heard = time.monotonic()
                    new = (obj.get("metadata") or {}).get("resourceVersion")
                    if new:
                        rv = new
                    if type_ != "BOOKMARK":
                        self.q.put((kind, type_, obj))
                    if stop.is_set():
                        return
                self.last_heard = time.monotonic()
                delay = 0.5
            except Gone:
                log.info("%s watch expired (410 Gone): relisting", kind)
                try:
                    items, rv = self.loop.cache.list_kind(kind)
                    self.relists[kind] = self.relists.get(kind, 0) + 1
                    self.q.put(("replace", kind, (items, rv)))
                except Exception as exc:
                    log.warning("%s relist failed: %s; retrying in %.1fs", kind, exc, delay)
                    stop.wait(delay)
                    delay = min(delay * 2, 30.0)
            except Exception as exc:  # lost connection, apiserver restart: back off and reconnect
                if stop.is_set():  # shutting down: a watch cut under it is no news
                    return
                log.warning("%s watch failed: %s; reconnecting in %.1fs", kind, exc, delay)
                stop.wait(delay)
                delay = min(delay * 2, 30.0)

    # --- main loop ----------------------------------------------------------------------
    def leading(self) -> bool:
        return self.elector is None or self.elector.leading_now()

    def _apply_events(self, first_wait_s: float) -> int:
        try:
            item = self.q.get(timeout=first_wait_s) if first_wait_s > 0 else self.q.get_nowait()
        except queue.Empty:
            return 0
        with self.lock:
            return self._apply_from(item)

    def _apply_from(self, item: tuple) -> int:
        n = 0
        try:
            while True:
                kind, type_, obj = item
                try:
                    if kind == "replace":
                        self.loop.replace(type_, *obj)
                    else:
                        self.loop.handle(kind, type_, obj)
                except Exception:  # one odd object must not stop the loop
                    log.exception("applying %s %s failed", kind, type_)
                n += 1
                item = self.q.get_nowait()
        except queue.Empty:
            return n

    def _start_resync(self, stop: threading.Event) -> None:
        delay = 0.5
        while not stop.is_set():
            try:
                with self.lock:
                    self.loop.resync()
                return
            except Exception as exc:
                log.warning("initial list failed: %s; retrying in %.1fs", exc, delay)
                stop.wait(delay)
                delay = min(delay * 2, 30.0)

    def run(self, stop: threading.Event) -> None:
        loop = self.loop
        self._start_resync(stop)
        if stop.is_set():
            return
        self.ready.set()
        for kind in loop.cache.watch_kinds:
            t = threading.Thread(target=self._reflect, args=(kind, loop.cache.rv[kind], stop), daemon=True, name=f"watch-{kind}")
            t.start()
            self._threads.append(t)
        if self.elector is not None:
            t = threading.Thread(target=self.elector.run, args=(stop,), daemon=True, name="lease")
            t.start()
            self._threads.append(t)
        binds_seen = held_seen = 0
        queues_at = -1e18
        queue_gauges = None
        if self.metrics is not None and hasattr(self.metrics, "queue_pending_gpus"):
            queue_gauges = QueueGauges(self.metrics.queue_pending_pods, self.metrics.queue_pending_gpus)
        evictions_seen = {"preempted": 0, "reclaimed": 0, "already_gone": 0, "eviction_refused": 0}
        while not stop.is_set():
            leading = self.leading()
            busy = leading and loop.queue.has_due()
            self._apply_events(0.0 if busy or loop.binder.binding else 0.05)
            done = None
            if loop.binder.binding and not busy:  # binds in flight, nothing else to do: wait for one, not spin (shared GIL)
                done = loop.binder.next_result(0.005)
            with self.lock:
                if done is not None:
                    loop.binder.apply_result(done)
                loop.binder.drain()
                if leading and self.elector is not None and self.elector.term != self._term:
                    try:
                        loop.resync()  # see everything the last leader bound
                        self._term = self.elector.term
                    except Exception as exc:
                        log.warning("relist on becoming leader failed: %s", exc)
                        continue
                if leading:
                    loop.schedule_due(budget_s=self.slice_s, should_continue=self.leading)
            if self.metrics is not None:
                m = self.metrics
                m.pending.set(len(loop.queue.pending))
                m.leader.set(1 if leading else 0)
                for reason, seen in evictions_seen.items():
                    n_ev = getattr(loop.stats, reason)
                    if n_ev > seen:
                        m.evictions.labels(reason).inc(n_ev - seen)
                        evictions_seen[reason] = n_ev
                if loop.stats.held_room > held_seen:
                    m.held_room.inc(loop.stats.held_room - held_seen)
                    held_seen = loop.stats.held_room
                if loop.stats.binds > binds_seen:
                    m.binds.inc(loop.stats.binds - binds_seen)
                    binds_seen = loop.stats.binds
                for s in loop.stats.e2e_s:
                    m.e2e.observe(s)
                if queue_gauges is not None and time.monotonic() - queues_at >= self.queue_metrics_every_s:
                    queues_at = time.monotonic()
                    with self.lock:
                        by_queue = pending_by_queue(loop.queue.pending, loop.cache.request, (q.name for q in loop.cache.objects.queues))
                    queue_gauges.update(by_queue)
            loop.stats.e2e_s.clear()
        with self.lock:
            loop.close()
        if self.elector is not None:
            self.elector.release()


def wait_until(pred, timeout_s: float, step_s: float = 0.02) -> bool:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if pred():
            return True
        time.sleep(step_s)
    return bool(pred())
