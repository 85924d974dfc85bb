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

The package: ``reservations`` (``ExtenderLoop``, the snapshot with filter-time reservations),
``verbs`` (``Extender``: filter, prioritize, bind, and the retry of parked pods), ``server`` (the HTTP
server: the verbs, /metrics, /healthz, /readyz) and ``metrics`` (what /metrics shows).
"""

from __future__ import annotations

from .metrics import ExtenderMetrics
from .reservations import NO_SCHEDULER, RELEASE_REASONS, RETRY_ANNOTATION, ExtenderLoop, Reservation, extender_error
from .server import serve
from .verbs import MAX_EXTENDER_PRIORITY, BadRequest, Extender, waited_s

__all__ = ["BadRequest", "Extender", "ExtenderLoop", "ExtenderMetrics", "MAX_EXTENDER_PRIORITY", "NO_SCHEDULER",
           "RELEASE_REASONS", "RETRY_ANNOTATION", "Reservation", "extender_error", "serve", "waited_s"]
