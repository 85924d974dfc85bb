"""What the scheduler tells pods: Events sent off the loop's thread (``EventSink``), and the engine's reasons
in kube-scheduler's words.

Why a module of its own: every part of the loop reports to pods (FailedScheduling, Preempting, Scheduled,
Interrupted); events are best effort and must not slow scheduling, so they share one bounded sender.
"""

from __future__ import annotations

import logging
import queue
import threading
import time

from ..engine.podspec import pod_key
from .api import SchedulerApi
from .stats import Stats

log = logging.getLogger("gpufleet.kube.loop")  # the loop's logger


def reason_text(status) -> str:
    """The engine's reasons in kube-scheduler's words ("0/12 nodes are available: ..."), no status-code prefix."""
    return "; ".join(status.reasons) or status.message


def names_any(line: str, pod_keys: set[str]) -> bool:
    """Does an explanation line name one of these pods (as a whole word)?"""
    words = set(line.replace(",", " ").split())
    return any(k in words for k in pod_keys)


class EventSink:
    """Events are best effort and must not slow scheduling: a bounded queue and one sender thread."""

    def __init__(self, api: SchedulerApi, stats: Stats, threaded: bool, max_queue: int = 5000):
        self.api = api
        self.stats = stats
        self.q: queue.Queue | None = queue.Queue(max_queue) if threaded else None
        if self.q is not None:
            threading.Thread(target=self._run, daemon=True, name="events").start()

    def send(self, pod: dict, type_: str, reason: str, message: str) -> None:
        if self.q is None:
            self._one(pod, type_, reason, message)
            return
        try:
            self.q.put_nowait((pod, type_, reason, message))
        except queue.Full:
            self.stats.events_dropped += 1

    def _one(self, pod: dict, type_: str, reason: str, message: str) -> None:
        try:
            self.api.event(pod, type_, reason, message)
        except Exception as exc:  # events are best effort
            log.warning("could not record event for %s: %s", pod_key(pod), exc)

    def _run(self) -> None:
        assert self.q is not None
        while True:
            item = self.q.get()
            if item is None:
                return
            self._one(*item)
            self.q.task_done()

    def flush(self, timeout_s: float = 5.0) -> None:
        if self.q is None:
            return
        end = time.monotonic() + timeout_s
        while self.q.unfinished_tasks and time.monotonic() < end:
            time.sleep(0.01)
