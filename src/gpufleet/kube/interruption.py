"""The live scheduler's drain: pods off nodes with an interruption notice, at once, most important first.

Karpenter, the AWS Node Termination Handler, GKE and the cluster autoscaler mark a node that is about to go
(``engine.capacity``: the taints they set, or the Node being deleted).  The SpotCapacity filter already keeps new
pods off it; this part moves the pods already there, as ``engine.interruption.drain_plan`` says: every pod, highest
priority first, a gang whole.  Each is evicted through the Eviction API (so PodDisruptionBudgets hold; a refusal is
tried again a few seconds later, and the node's own drain has the last word when it goes), with an ``Interrupted``
event that says why.  Their controllers create replacements, which the scheduler places like any pod, in priority
order; a replacement is annotated ``gpufleet.io/moved-from`` (the pod it replaces, the node, the reason, when), and
``gpufleet explain`` says why it moved.  A bare pod (no controller) is not re-created, as with ``kubectl drain
--force``.

Nothing stays bound to a node that is gone: a bound pod whose node no longer exists is evicted at once (grace 0), as
the pod garbage collector would do later.  "No longer exists" is asked of the API server, not read from the watch
cache alone: nodes and pods come on separate watches, so a pod bound to a node that has just joined can arrive before
that node does (a loaded apiserver, a slow informer), and evicting it then would delete a healthy pod of any
scheduler; the pod garbage collector checks the API for the same reason.  All of it runs on the loop's thread, at
most every ``interval_s`` unless a node changed (or, at most once a second, the bound pods).
"""

from __future__ import annotations

import json
import logging
import time
from collections import deque
from typing import Any, Callable

from ..engine import annotations as ann
from ..engine.capacity import DEFAULT, SpotConfig
from ..engine.interruption import drain_plan
from ..engine.model import Taint
from .api import EvictionRefused, NotFound, SchedulerApi

log = logging.getLogger(__name__)

RECORD_TTL_S = 3600.0  # a move not claimed by a replacement within an hour is forgotten
BOUND_RECHECK_S = 1.0  # see Drainer.step


def _taints(node: dict) -> list[Taint]:
    out = []
    for t in (node.get("spec") or {}).get("taints") or []:
        if isinstance(t, dict) and t.get("key"):
            out.append(Taint(str(t["key"]), str(t.get("value") or ""), str(t.get("effect") or "NoSchedule")))
    return out


def owner_of(pod: dict) -> tuple[str, str, str] | None:
    """(namespace, kind, name) of the pod's controller, or None for a bare pod."""
    meta = pod.get("metadata") or {}
    refs = [r for r in meta.get("ownerReferences") or [] if isinstance(r, dict) and r.get("controller") and r.get("name")]
    if not refs:
        return None
    return (meta.get("namespace") or "default", str(refs[0].get("kind")), str(refs[0]["name"]))


class Drainer:
    def __init__(self, api: SchedulerApi, cache: Any, queue: Any, events: Any, stats: Any, config: SpotConfig | None = None,
                 clock: Callable[[], float] = time.monotonic, wall: Callable[[], float] = time.time,
                 interval_s: float = 5.0) -> None:
        self.api, self.cache, self.queue, self.events, self.stats = api, cache, queue, events, stats
        self.config = config or DEFAULT
        self.clock, self.wall, self.interval_s = clock, wall, interval_s
        self._stamp: tuple = ()
        self._at = -1e18
        self._bound = -1  # bound pods counted at the last pass
        self._bound_at = -1e18
        self.evicting: dict[str, float] = {}  # pod key -> when its eviction was accepted
        self.forced: dict[str, float] = {}  # pod key -> when it was evicted with grace 0 (its node is gone)
        self.moves: dict[tuple[str, str, str], deque] = {}  # owner -> records of its pods moved, oldest first
        self.log: list[dict] = []  # every move, for tests and metrics

    # --- what is going --------------------------------------------------------------------------
    def going(self) -> dict[str, str]:
        out = {}
        for name, node in self.cache.node_objs.items():
            why = self.config.interruption(_taints(node), bool((node.get("metadata") or {}).get("deletionTimestamp")))
            if why is not None:
                out[name] = why
        return out

    def step(self) -> int:
        """One pass: drain going nodes, clear gone ones, tag replacements.  Returns the evictions made.

        A pass reads every node and every bound pod, so it runs when a node changed, every ``interval_s``, and
        when only the bound pods changed (every bind does) at most every ``BOUND_RECHECK_S``: while pods are
        bound by the hundred a second, a pass per scheduling slice was a tenth of the loop's time."""
        now = self.clock()
        stamp = (self.cache.rv.get("node"), len(self.cache.node_objs))
        bound = len(self.cache.bound_pods)
        if stamp == self._stamp and now - self._at < self.interval_s and (
                bound == self._bound or now - self._bound_at < BOUND_RECHECK_S):
            self._tag_replacements()
            return 0
        self._stamp, self._at, self._bound, self._bound_at = stamp, now, bound, now
        n = self._drain(self.going()) + self._gone()
        self._tag_replacements()
        for d in (self.evicting, self.forced):
            for k in [k for k, t in d.items() if now - t > RECORD_TTL_S]:
                del d[k]
        return n

    def _drain(self, going: dict[str, str]) -> int:
        if not going:
            return 0
        done = 0
        bound = self.cache.bound_pods
        for m in drain_plan(self.cache.state, going):
            if m.pod_key in self.evicting or m.pod_key not in bound:
                continue
            if self._evict(bound[m.pod_key], m.node, m.reason, grace_s=None):
                done += 1
        return done

    def _gone(self) -> int:
        nodes = self.cache.node_objs
        done = 0
        confirmed: dict[str, bool] = {}  # node -> gone, asked of the API once per pass
        for key, pod in list(self.cache.bound_pods.items()):
            node = (pod.get("spec") or {}).get("nodeName")
            if node and node not in nodes and key not in self.forced:  # also one still terminating from the drain
                if node not in confirmed:
                    confirmed[node] = self._really_gone(node)
                if not confirmed[node]:
                    continue
                if self._evict(pod, node, f"node {node} is gone", grace_s=0):
                    done += 1
                    self.forced[key] = self.clock()
        return done  # a node the API has and the cache not yet: its watch event reruns this pass

    def _really_gone(self, node: str) -> bool:
        """The cache has no such node: gone only if the API server has none either (else the node watch lags)."""
        try:
            return not self.api.node_exists(node)
        except Exception as exc:  # noqa: BLE001 -- cannot tell: evict nothing, ask again next pass
            log.warning("is node %s gone? the API did not say: %s", node, exc)
            return False

    def _evict(self, pod: dict, node: str, reason: str, grace_s: int | None) -> bool:
        meta = pod.get("metadata") or {}
        ns, name = meta.get("namespace") or "default", meta.get("name") or ""
        key = f"{ns}/{name}"
        try:
            self.api.evict_pod(ns, name, uid=meta.get("uid"), grace_period_s=grace_s)
        except EvictionRefused as exc:
            log.info("moving %s off %s: eviction refused (%s); trying again", key, node, exc)
            self.stats.eviction_refused += 1
            self._at = -1e18  # soon, not at the next node change
            return False
        except NotFound:
            self.evicting[key] = self.clock()
            self.forced[key] = self.clock()
            return False
        except Exception as exc:  # noqa: BLE001 -- the API failed: the next pass tries again
            log.warning("moving %s off %s failed: %s", key, node, exc)
            return False
        again = key in self.evicting
        self.evicting[key] = self.clock()
        if again:  # its node went before it finished terminating: deleted now, counted once
            return True
        self.stats.interrupted += 1
        self.events.send(pod, "Normal", "Interrupted", f"moved: {reason}")
        rec = {"pod": key, "node": node, "reason": reason,
               "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.wall()))}
        self.log.append(rec)
        owner = owner_of(pod)
        if owner is not None:
            self.moves.setdefault(owner, deque()).append((self.clock(), rec))
        log.info("moved %s off %s (%s)", key, node, reason)
        return True

    def _tag_replacements(self) -> None:
        """Annotate each new pending pod of an owner that lost a pod to a drain with the move it replaces."""
        if not self.moves:
            return
        now = self.clock()
        for owner in list(self.moves):
            q = self.moves[owner]
            while q and now - q[0][0] > RECORD_TTL_S:
                q.popleft()
            if not q:
                del self.moves[owner]
        for key, pod in list(self.queue.pending.items()):
            meta = pod.get("metadata") or {}
            if ann.MOVED_FROM in (meta.get("annotations") or {}):
                continue
            who = owner_of(pod)
            pending = self.moves.get(who) if who is not None else None
            if not pending:
                continue
            _, rec = pending.popleft()
            try:
                self.api.annotate_pod(meta.get("namespace") or "default", meta.get("name") or "",
                                      {ann.MOVED_FROM: json.dumps(rec, sort_keys=True)}, uid=meta.get("uid"))
            except Exception as exc:  # noqa: BLE001 -- the move is still in the event of the pod it replaces
                log.warning("could not annotate %s with its move: %s", key, exc)
                pending.appendleft((now, rec))
                return
            meta.setdefault("annotations", {})[ann.MOVED_FROM] = json.dumps(rec, sort_keys=True)


def moved_line(pod: dict) -> str:
    """``gpufleet explain``'s line for a pod that replaces one moved off a going node, else ''."""
    raw = ((pod.get("metadata") or {}).get("annotations") or {}).get(ann.MOVED_FROM)
    if not raw:
        return ""
    try:
        rec = json.loads(raw)
        return f"moved: replaces {rec['pod']}, evicted at {rec['at']}: {rec['reason']}"
    except (ValueError, KeyError, TypeError):
        return f"moved: {raw}"
