"""Pods kubelet refused because a node's GPU device plugin was down: hold that node's GPUs, re-create bare pods.

Why: when gpufleet's agent dies (a crash, an OOM kill, ``kill -9``) kubelet's device manager loses the plugin's
connection, takes every ``nvidia.com/gpu`` device of the node as unhealthy, and fails each GPU pod it admits until the
new agent process registers again: the pod is ``Failed`` (``UnexpectedAdmissionError``: "Allocate failed due to
... EOF", "no healthy devices present"), and kubelet never tries it again.  Node allocatable shows it only at the
next node status update (up to 10 s later, by then often over), so the scheduler went on placing GPU pods there and
kubelet refused every one.  Two answers, both here, on the loop's thread (leader only):

* **Hold.**  The first such refusal tells the scheduler the plugin is down *now*: the node is modelled with
  ``Node.gpu_plugin_down`` and ``GpuFit`` places no GPU pod there (pending reason: "GPU device plugin down ...";
  pods without GPUs are not affected), with a ``GpuPluginDown`` event on the Node.  The hold ends when the agent
  says it registered again after the refusal (the ``gpufleet.io/device-plugin-registered`` node annotation, the
  agent's clock, the clock kubelet stamps the refused pod's ``status.startTime`` with: one node), or kubelet's
  allocatable ``nvidia.com/gpu`` went to 0 and back (an agent that writes no such annotation), or after
  ``hold_max_s`` (then a new refusal holds it again).  Waiting pods are woken when it ends.
* **Re-create.**  A pod with a controller is replaced by its controller (a ReplicaSet, a Job counts it failed
  and makes another).  A bare pod has nobody: gpufleet creates a copy (``<name>-r1``, ``-r2``, ... at most
  ``MAX_GENERATIONS`` times for one original), annotated ``gpufleet.io/moved-from`` (the pod it replaces, the
  node, kubelet's message), with a ``Recreated`` event on the refused pod.  Only pods gpufleet placed (its
  scheduler name and an assignment), refused by the device plugin (not by the node guard: that refusal is a
  verdict, not an outage).  Opt out per pod with ``gpufleet.io/recreate-on-refusal: "false"`` or for the whole
  scheduler with ``--no-recreate-refused-pods``.  Creating pods is a privilege the shipped RBAC does not grant
  (docs/safety.md, least privilege): without it the create is refused (403) and the pod gets a
  ``NotRecreated`` warning saying so; ``deploy/overlays/recreate-refused-pods`` grants it.
* **A lost race.**  Where two schedulers place GPU pods on one node (no routing), kubelet may admit another scheduler's
  pod on a GPU gpufleet has just assigned before gpufleet's snapshot showed that pod's binding; the agent then refuses
  gpufleet's pod rather than share the GPU (its message says ``ann.RACED_REFUSAL``).  No hold (the plugin is fine);
  the bare pod is re-created the same way, and placed on the snapshot that now holds the other pod's GPU.
* **Other schedulers' bare pods** (``recreate_foreign``, ``--recreate-other-schedulers-pods``, off by default).  Where
  nothing routes GPU pods to gpufleet (Kubernetes 1.35 serves no MutatingAdmissionPolicy; a namespace opted out),
  kube-scheduler's bare GPU pods meet the same refusal, and their refusal holds the node just the same.  With the
  option their copy is made once the hold ends (the agent registered again): the copy goes back to its own
  scheduler, which knows nothing of the hold and binds by allocatable, stale while the plugin is down, so an earlier
  copy would be refused again.  Without it the refused pod gets a ``NotRecreated`` warning saying why it stays
  ``Failed`` and what would keep it.

The pod watch only carries live pods (``api.LIVE_PODS``): a pod that fails leaves the selector, and the watch reports
it ``DELETED`` with its last live state.  A bound pod of ours that leaves that way without having started and without
a deletion in progress is read once more (GET) to see whether kubelet refused it.
"""

from __future__ import annotations

import calendar
import copy
import json
import logging
import time
from dataclasses import dataclass
from typing import Any, Callable

from ..engine import annotations as ann
from .api import ApiError, Conflict, NotFound, SchedulerApi
from .interruption import owner_of

log = logging.getLogger(__name__)

GPU_RESOURCE = "nvidia.com/gpu"
MAX_GENERATIONS = 5  # replacements of one original pod, refused one after another
SUSPECT_TTL_S = 600.0  # a suspect not looked at (a standby never does) is forgotten
# kubelet's messages when the plugin is gone, not when it answered: the connection broke in the call, the devices
# are unhealthy (disconnected), the resource is not registered
_DOWN = ("code = Unavailable", "code = Canceled", "error reading from server", "client connection is closing",
         "no healthy devices present", "unregistered device", "transport is closing")


def refusal(pod: dict) -> str | None:
    """kubelet's message when it refused ``pod`` at admission because the GPU device plugin was down, else None."""
    st = pod.get("status") or {}
    if st.get("phase") != "Failed" or st.get("reason") != "UnexpectedAdmissionError":
        return None
    msg = str(st.get("message") or "")
    if "Allocate failed" not in msg or not any(s in msg for s in _DOWN):
        return None
    return msg.removeprefix("Pod was rejected: ")


def raced(pod: dict) -> str | None:
    """kubelet's message when it refused ``pod`` at admission because the agent found its GPU in use by a pod of the
    other scheduler: gpufleet's pod, whose assigned GPU kubelet gave another scheduler's pod first (two schedulers
    raced for it: ``ann.RACED_REFUSAL``), or another scheduler's pod that kubelet gave a GPU another pod uses (the
    node guard: ``ann.GUARD_REFUSAL``); else None.  Not an outage: no hold.  gpufleet's bare pod that lost the race is
    re-created, as for a dead plugin; another scheduler's bare pod the guard refused only with ``recreate_foreign`` (its
    copy goes back to that scheduler; the guard's refusal of gpufleet's own pod stays a verdict)."""
    st = pod.get("status") or {}
    msg = str(st.get("message") or "")
    if st.get("phase") != "Failed" or st.get("reason") != "UnexpectedAdmissionError" or not (
            ann.RACED_REFUSAL in msg or ann.GUARD_REFUSAL in msg):
        return None
    return msg.removeprefix("Pod was rejected: ")


def _epoch(text: str | None) -> float | None:
    """RFC 3339 (``2026-11-27T05:10:00Z``, fractions allowed) as seconds since the epoch; None if unreadable."""
    if not text or not isinstance(text, str):
        return None
    head, _, frac = text.rstrip("Z").partition(".")
    try:
        t = float(calendar.timegm(time.strptime(head, "%Y-%m-%dT%H:%M:%S")))
        return t + (float("0." + frac) if frac.isdigit() else 0.0)
    except ValueError:
        return None


def _utc(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))


def registered_at(node: dict) -> float | None:
    """When the node's agent last registered its device plugins with kubelet (its annotation), or None."""
    return _epoch(((node.get("metadata") or {}).get("annotations") or {}).get(ann.PLUGIN_REGISTERED))


def _allocatable(node: dict) -> str | None:
    return ((node.get("status") or {}).get("allocatable") or {}).get(GPU_RESOURCE)


@dataclass
class Hold:
    since: float  # the refusal, on the node's clock (the refused pod's status.startTime)
    started: float  # on the loop's clock
    pod: str
    why: str
    saw_zero: bool = False  # kubelet's allocatable nvidia.com/gpu was 0 during the hold


class PluginDown:
    def __init__(self, api: SchedulerApi, cache: Any, events: Any, stats: Any, scheduler_name: str = "gpufleet",
                 recreate: bool = True, hold_max_s: float = 300.0, clock: Callable[[], float] = time.monotonic,
                 wall: Callable[[], float] = time.time, recreate_foreign: bool = False) -> None:
        self.api, self.cache, self.events, self.stats = api, cache, events, stats
        self.scheduler_name, self.recreate, self.hold_max_s = scheduler_name, recreate, hold_max_s
        self.recreate_foreign = recreate_foreign
        self.deferred: dict[str, list[tuple[dict, str]]] = {}  # node -> other schedulers' refused pods, copied when it is back
        self.clock, self.wall = clock, wall
        self.holds: dict[str, Hold] = {}
        self.suspects: dict[str, tuple[float, dict]] = {}  # pod key -> (seen, its last live state)
        self.done: set[str] = set()  # UIDs of refused pods already handled
        self.log: list[dict] = []  # holds and re-creations, for tests

    # --- intake (every replica; the leader acts in step) ------------------------------------------
    def seen(self, type_: str, pod: dict) -> None:
        """A pod watch event: a bound pod of ours that failed, or left the live selector before it started."""
        meta = pod.get("metadata") or {}
        spec = pod.get("spec") or {}
        if not spec.get("nodeName") or meta.get("uid") in self.done:
            return
        key = f"{meta.get('namespace') or 'default'}/{meta.get('name')}"
        if type_ != "DELETED":
            if refusal(pod) or raced(pod):
                self.suspects[key] = (self.clock(), pod)
            return
        st = pod.get("status") or {}
        if meta.get("deletionTimestamp") or st.get("containerStatuses") or st.get("phase") not in (None, "Pending"):
            return  # deleted, or it had started: not an admission refusal
        if ann.ASSIGNMENT not in (meta.get("annotations") or {}) and not asks_gpu(pod):
            return  # no GPU asked of the device plugin: its refusal is not the plugin's
        now = self.clock()
        if len(self.suspects) >= 1000:  # a standby never looks: keep what a take-over would still look at
            self.suspects = {k: v for k, v in self.suspects.items() if now - v[0] <= SUSPECT_TTL_S}
        self.suspects[key] = (now, pod)

    # --- the leader's pass -------------------------------------------------------------------------
    def held(self, node: str) -> bool:
        return node in self.holds

    def restore(self, failed: list[dict]) -> list[str]:
        """The holds in force by the API's record, for a process that did not see the refusals (``gpufleet explain``):
        a refusal on a node whose agent has not registered since, younger than ``hold_max_s``.  (kubelet's
        allocatable going to 0 and back cannot be read back: such a hold is shown until the agent's annotation or
        the time ends it.)  Nothing is re-created.  Returns the nodes held."""
        now, wall = self.clock(), self.wall()
        for pod in failed:
            why = refusal(pod)
            node = str((pod.get("spec") or {}).get("nodeName") or "")
            since = _epoch((pod.get("status") or {}).get("startTime"))
            if why is None or not node or since is None or wall - since >= self.hold_max_s:
                continue
            obj = self.cache.node_objs.get(node)
            reg = registered_at(obj or {})
            if obj is None or (reg is not None and reg >= since):
                continue
            meta = pod.get("metadata") or {}
            h = self.holds.get(node)
            if h is None or since > h.since:
                self.holds[node] = Hold(since, now - max(0.0, wall - since), f"{meta.get('namespace') or 'default'}/"
                                        f"{meta.get('name')}", why)
        for node in self.holds:
            self.cache.refresh_node(node)
        return sorted(self.holds)

    def describe(self, node: str) -> str:
        """One line on a node's hold for people: since when, which refusal, what ends it."""
        h = self.holds.get(node)
        if h is None:
            return ""
        reg = registered_at(self.cache.node_objs.get(node) or {})
        last = _utc(reg) if reg is not None else "never (no gpufleet.io/device-plugin-registered annotation)"
        ends = _utc(self.wall() + max(0.0, self.hold_max_s - (self.clock() - h.started)))
        return (f"{node}: GPU device plugin down since {_utc(h.since)}: kubelet refused {h.pod} ({h.why}); GPU pods wait "
                f"until its agent registers again (last registered: {last}), at the latest until {ends}")

    def step(self) -> None:
        if self.suspects:
            self._look()
        if self.holds:
            self._release()
        if self.deferred:
            for node in [n for n in self.deferred if n not in self.holds]:
                for pod, why in self.deferred.pop(node):
                    self._create_copy(pod, why)

    def _look(self) -> None:
        now = self.clock()
        for key, (at, last) in list(self.suspects.items()):
            if now - at > SUSPECT_TTL_S:
                del self.suspects[key]
                continue
            ns, name = key.split("/", 1)
            if refusal(last) or raced(last):
                pod: dict | None = last
            else:
                try:
                    pod = self.api.get_pod(ns, name)
                except Exception as exc:  # noqa: BLE001 -- the API failed: the next pass asks again
                    log.warning("is %s refused by kubelet? the API did not say: %s", key, exc)
                    return
            del self.suspects[key]
            uid = str((last.get("metadata") or {}).get("uid") or "")
            if pod is None or (pod.get("metadata") or {}).get("uid") != uid:
                continue  # deleted (or a new pod of the same name)
            why = refusal(pod)
            lost_race = raced(pod) if why is None else None
            if (why is None and lost_race is None) or uid in self.done:
                continue
            self.done.add(uid)
            if why is None:  # a lost race: the plugin is fine, no hold; the pod is placed again
                ours = (pod.get("spec") or {}).get("schedulerName") == self.scheduler_name
                if lost_race is not None and (ann.RACED_REFUSAL in lost_race if ours else self.recreate_foreign):
                    self._recreate(pod, lost_race)
                continue
            self._hold(pod, why)
            self._recreate(pod, why)

    def _hold(self, pod: dict, why: str) -> None:
        node = pod["spec"]["nodeName"]
        since = _epoch((pod.get("status") or {}).get("startTime")) or self.wall() - 1.0
        obj = self.cache.node_objs.get(node) or {}
        reg = registered_at(obj)
        key = f"{pod['metadata'].get('namespace') or 'default'}/{pod['metadata'].get('name')}"
        if reg is not None and reg >= since:
            log.info("kubelet refused %s on %s (%s); its agent registered again since: no hold", key, node, why)
            return
        h = self.holds.get(node)
        if h is not None:
            h.since = max(h.since, since)
            return
        self.holds[node] = Hold(since, self.clock(), key, why)
        self.stats.plugin_holds += 1
        self.log.append({"hold": node, "pod": key, "why": why})
        log.warning("node %s: kubelet refused %s (%s): no GPU pod goes there until its agent registers again", node, key, why)
        self._node_event(node, "Warning", "GpuPluginDown",
                         f"kubelet refused pod {key}: {why}; gpufleet places no GPU pod on this node until its agent "
                         "registers the device plugin again")
        self.cache.refresh_node(node)

    def _release(self) -> None:
        now = self.clock()
        for node, h in list(self.holds.items()):
            obj = self.cache.node_objs.get(node)
            why = ""
            if obj is None:
                why = "the node is gone"
            else:
                reg = registered_at(obj)
                alloc = _allocatable(obj)
                if alloc in ("0", 0):
                    h.saw_zero = True
                if reg is not None and reg >= h.since:
                    why = "its agent registered the device plugin again"
                elif h.saw_zero and alloc not in (None, "0", 0):
                    why = f"kubelet reports {alloc} allocatable {GPU_RESOURCE} again"
                elif now - h.started >= self.hold_max_s:
                    why = f"held {self.hold_max_s:.0f} s without word of the plugin: trying the node again"
            if not why:
                continue
            del self.holds[node]
            self.log.append({"release": node, "why": why, "held_s": round(now - h.started, 3)})
            log.info("node %s: GPU pods placed again (%s; held %.1f s)", node, why, now - h.started)
            if obj is not None:
                self._node_event(node, "Normal", "GpuPluginBack", f"GPU pods are placed here again: {why}")
                self.cache.refresh_node(node)

    # --- re-creating bare pods ---------------------------------------------------------------------
    def _recreate(self, pod: dict, why: str) -> None:
        meta = pod.get("metadata") or {}
        spec = pod.get("spec") or {}
        a = meta.get("annotations") or {}
        if not self.recreate or owner_of(pod) is not None or a.get(ann.RECREATE_ON_REFUSAL, "").lower() == "false":
            return
        if spec.get("schedulerName") == self.scheduler_name and ann.ASSIGNMENT in a:
            self._create_copy(pod, why)
            return
        if spec.get("schedulerName") == self.scheduler_name:
            return  # ours, never placed by us (bound by hand): nothing of ours to redo
        other = spec.get("schedulerName") or "default-scheduler"
        if not self.recreate_foreign:
            self.events.send(pod, "Warning", "NotRecreated",
                             f"kubelet refused it ({why}) while the node's GPU device plugin was down; it has no controller "
                             f"and {other} placed it, so gpufleet does not re-create it (--recreate-other-schedulers-pods "
                             "would, once the plugin is back; or route GPU pods to gpufleet: deploy/admission, "
                             "Kubernetes 1.36+)")
            return
        node = str(spec.get("nodeName") or "")
        if node in self.holds:  # its scheduler binds by allocatable, stale while the plugin is down: wait for it
            self.deferred.setdefault(node, []).append((pod, why))
            return
        self._create_copy(pod, why)

    def _create_copy(self, pod: dict, why: str) -> None:
        meta = pod.get("metadata") or {}
        spec = pod.get("spec") or {}
        a = meta.get("annotations") or {}
        key = f"{meta.get('namespace') or 'default'}/{meta.get('name')}"
        try:
            prev = json.loads(a.get(ann.MOVED_FROM) or "{}")
        except ValueError:
            prev = {}
        if not isinstance(prev, dict):
            prev = {}
        root = str(prev.get("original") or meta.get("name"))
        gen = int(prev.get("generation") or 0) + 1 if str(prev.get("generation") or 0).isdigit() else 1
        if gen > MAX_GENERATIONS:
            self.events.send(pod, "Warning", "NotRecreated", f"kubelet refused it ({why}); {MAX_GENERATIONS} copies of "
                             f"{root} were refused already: not re-created again")
            return
        name = f"{root[:240]}-r{gen}"
        rec = {"pod": key, "node": spec.get("nodeName"), "reason": f"kubelet refused it: {why}", "original": root,
               "generation": gen, "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.wall()))}
        body = replacement(pod, name, rec)
        ns = meta.get("namespace") or "default"
        try:
            self.api.create_pod(ns, body)
        except Conflict:
            log.info("%s: its replacement %s/%s exists already", key, ns, name)
            return
        except NotFound as exc:  # the namespace is going
            log.info("%s not re-created: %s", key, exc)
            return
        except ApiError as exc:
            self.events.send(pod, "Warning", "NotRecreated",
                             f"kubelet refused it ({why}) and it has no controller; gpufleet could not create a copy "
                             f"({exc}): grant it pods create (deploy/overlays/recreate-refused-pods) or run it under a "
                             "controller")
            log.warning("%s not re-created: %s", key, exc)
            return
        except Exception as exc:  # noqa: BLE001 -- the API failed: look again next pass
            log.warning("%s not re-created yet: %s", key, exc)
            self.done.discard(meta.get("uid"))
            self.suspects[key] = (self.clock(), pod)
            return
        self.stats.recreated += 1
        self.log.append({"recreated": key, "as": f"{ns}/{name}"})
        log.info("re-created %s as %s/%s: kubelet refused it (%s)", key, ns, name, why)
        self.events.send(pod, "Normal", "Recreated", f"kubelet refused it ({why}); gpufleet created {ns}/{name} in its place")

    def _node_event(self, node: str, type_: str, reason: str, message: str) -> None:
        meta = (self.cache.node_objs.get(node) or {}).get("metadata") or {}
        self.events.send({"kind": "Node", "apiVersion": "v1", "metadata": {"name": node, "uid": meta.get("uid")}},
                         type_, reason, message)


# what the API server or gpufleet wrote on the refused pod, not the pod's owner: not copied
_DROP_META = ("uid", "resourceVersion", "creationTimestamp", "deletionTimestamp", "deletionGracePeriodSeconds",
              "managedFields", "generation", "selfLink", "ownerReferences", "generateName")
_DROP_ANN = (ann.ASSIGNMENT, ann.MOVED_FROM, ann.IDLE_WARNING, ann.EXTENDER_RETRY)


def asks_gpu(pod: dict) -> bool:
    """Whether any container of ``pod`` (init containers too) asks for ``nvidia.com/gpu``."""
    spec = pod.get("spec") or {}
    for c in (spec.get("containers") or []) + (spec.get("initContainers") or []):
        r = (c or {}).get("resources") or {}
        if GPU_RESOURCE in (r.get("limits") or {}) or GPU_RESOURCE in (r.get("requests") or {}):
            return True
    return False


def replacement(pod: dict, name: str, record: dict) -> dict:
    """The copy of a refused bare pod to create: its spec unbound, its metadata less what the server wrote."""
    meta = {k: copy.deepcopy(v) for k, v in (pod.get("metadata") or {}).items() if k not in _DROP_META}
    meta["name"] = name
    meta["annotations"] = {k: v for k, v in (meta.get("annotations") or {}).items() if k not in _DROP_ANN}
    meta["annotations"][ann.MOVED_FROM] = json.dumps(record, sort_keys=True)
    spec = copy.deepcopy(pod.get("spec") or {})
    for k in ("nodeName", "ephemeralContainers"):
        spec.pop(k, None)
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}
