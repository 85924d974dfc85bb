"""What the live loop does with the shared round's decisions (``engine.round.RoundPort``): a placed pod
goes to the binder, a pod that does not fit is told why (a FailedScheduling event, not the same words
twice in a row) and backs off, a gang's placed members are bound, and a gang hold that ends wakes the
waiting pods.  Making room is the ``Preemptor``'s (``kube.preemption``), the round's other port.

Why a module of its own: the round decides (``engine.round``, pure, shared with the replay); this is
the live side's half of the port, the writes, apart from the loop that feeds the round.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

from ..engine.gang import GangResult, GangScheduler
from ..engine.model import PodRequest
from ..engine.round import Attempt
from .binder import Binder
from .events import EventSink, reason_text
from .stats import Stats
from .preemption import Preemptor
from .scheduling_queue import SchedulingQueue

if TYPE_CHECKING:
    from .dra import LiveDra


class LiveEffects:
    """``engine.round.RoundPort`` for the live loop; runs on the loop's thread.

    ``begin(t0)`` before each try: the cycle's start, which the attempt counters and the binder's
    end-to-end latency are measured from."""

    def __init__(self, queue: SchedulingQueue, binder: Binder, events: EventSink, stats: Stats, preemptor: Preemptor,
                 gangs: Callable[[], GangScheduler], count_attempt: Callable[[str, float], None],
                 dra: LiveDra | None = None, report_gang: Callable[[GangResult], object] | None = None) -> None:
        self.queue = queue
        self.binder = binder
        self.events = events
        self.stats = stats
        self.preemptor = preemptor
        self.gangs = gangs  # the round's current gang scheduler (a rebuild makes a new one)
        self.count_attempt = count_attempt
        self.dra = dra  # kube-scheduler's DRA PostFilter: a claim allocated where the pod cannot run is given back
        self.report_gang = report_gang  # a scheduling.k8s.io PodGroup's condition
        self.t0 = 0.0

    def begin(self, t0: float) -> None:
        self.t0 = t0

    def failed_event(self, key: str, pod: dict, message: str) -> None:
        """FailedScheduling, but not the same words again within ``backoff_max_s`` (a pod retried every minute)."""
        if self.queue.should_report(key, message):
            self.events.send(pod, "Warning", "FailedScheduling", message)

    # --- RoundPort ------------------------------------------------------------------------------
    def could_fit(self, request: PodRequest) -> bool:
        return True  # the engine's cycle says why not: the event needs its reasons

    def bind(self, attempt: Attempt) -> None:
        key = attempt.request.key
        assert attempt.decision.assignment is not None
        self.stats.held_room += attempt.held_room
        self.preemptor.forget(key)
        self.binder.start(key, self.queue.pending[key], attempt.decision.assignment, self.t0)

    def wait(self, attempt: Attempt) -> None:
        key = attempt.request.key
        pod = self.queue.pending[key]
        self.count_attempt("unschedulable", self.t0)
        reasons = reason_text(attempt.decision.status)
        self.failed_event(key, pod, f"{attempt.note}; {reasons}" if attempt.note else reasons)
        if attempt.room is None and self.dra is not None and self.dra.deallocate_stale(pod, attempt.request):
            self.queue.defer(key)  # its claim was given back: any change may let it fit
            return
        self.queue.defer(key, attempt.until, rejected=(attempt.request, attempt.decision.rejected_by))

    def gang_result(self, result: GangResult) -> None:
        if self.report_gang is not None:
            self.report_gang(result)

    def gang_placed(self, result: GangResult, held_room: bool) -> None:
        if held_room:
            self.stats.held_room += len(result.placed)
        for d in result.placed:
            pod = self.queue.pending.get(d.pod_key)
            if pod is None or d.assignment is None:  # gone meanwhile: give its reservation back
                self.gangs().remove(d.pod_key)
                continue
            self.binder.start(d.pod_key, pod, d.assignment, self.queue.first_seen(d.pod_key, self.t0))

    def gang_waits(self, result: GangResult, until: float | None) -> None:
        """Every member still pending is told why; held members wait too (not retried in a spin), and are
        looked at again when the hold times out."""
        gang = self.gangs().gangs.get(result.group)
        for k in list(gang.members) if gang else []:
            if k in self.queue.pending:
                self.failed_event(k, self.queue.pending[k], reason_text(result.status))
                self.queue.defer(k, until)

    def hold_ended(self) -> None:
        self.queue.wake_all()  # what the hold kept out may fit now
