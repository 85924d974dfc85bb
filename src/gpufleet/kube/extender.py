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
snapshot comes from our own watches (``SchedulerLoop``), the same one the
secondary scheduler uses.  Without it the full NodeList is sent and a
filtered NodeList is returned.  Bind is where the exact GPUs are chosen and
written onto the pod with the Binding; the devices are taken in the snapshot
at once, so the next filter already sees them used.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import numpy as np

from ..engine import annotations as ann
from ..engine.errors import GpufleetError
from ..engine.inventory import assignment_to_json
from ..engine.podspec import parse_pod
from .loop import SchedulerLoop, bind_job

log = logging.getLogger(__name__)
MAX_EXTENDER_PRIORITY = 10


def _ci(d: Any) -> dict[str, Any]:
    """Keys folded to lower case (Go's decoder matches field names case-insensitively)."""
    return {str(k).lower(): v for k, v in d.items()} if isinstance(d, dict) else {}


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


class Extender:
    def __init__(self, loop: SchedulerLoop, lock: threading.Lock | None = None, ready: threading.Event | None = None) -> None:
        self.loop = loop
        self.ready = ready  # until the first list is in, answer with an error (kube-scheduler retries the pod)
        self.lock = lock or threading.Lock()  # the snapshot is shared with the watch thread
        self.requests = {"filter": 0, "prioritize": 0, "bind": 0}

    def _mask(self, names: list[str]) -> np.ndarray:
        st = self.loop.state
        m = np.zeros(len(st), dtype=bool)
        for n in names:
            i = st.index.get(n)
            if i is not None:
                m[i] = True
        return m

    def filter(self, raw: dict[str, Any]) -> dict[str, Any]:
        self.requests["filter"] += 1
        args = _ci(raw)
        pod = args.get("pod") or {}
        names, items = _names(args)

        def reply(ok: list[str], failed: dict[str, str], unresolvable: dict[str, str], error: str = "") -> dict[str, Any]:
            out: dict[str, Any] = {"NodeNames": ok, "FailedNodes": failed, "FailedAndUnresolvableNodes": unresolvable, "Error": error}
            if items is not None:
                keep = set(ok)
                out["Nodes"] = {"items": [n for n in items if (n.get("metadata") or {}).get("name") in keep]}
                out["NodeNames"] = None
            return out

        try:
            req = parse_pod(pod)
        except GpufleetError as exc:
            return reply([], {}, {}, f"invalid pod spec: {exc}")
        if not req.gpu_count:  # not ours to judge
            return reply(names, {}, {})
        if self.ready is not None and not self.ready.is_set():
            return reply([], {}, {}, "gpufleet has not synced its snapshot yet")
        with self.lock:
            sched = self.loop.sched
            cycle = sched.new_cycle(req)
            cycle.only_nodes = self._mask(names)
            sched.decide(cycle, explain=True)
            ok, failed, unresolvable = [], {}, {}
            st = self.loop.state
            for n in names:
                i = st.index.get(n)
                if i is None:
                    why = self.loop.bad_nodes.get(n)
                    unresolvable[n] = f"gpufleet left the node out: {why}" if why else "node unknown to gpufleet (not in its snapshot yet)"
                elif cycle.feasible is not None and cycle.feasible[i]:
                    ok.append(n)
                else:
                    failed[n] = cycle.fail_reasons[int(cycle.first_fail[i])] if cycle.first_fail is not None and cycle.first_fail[i] >= 0 else "rejected"
            return reply(ok, failed, unresolvable)

    def prioritize(self, raw: dict[str, Any]) -> list[dict[str, Any]]:
        self.requests["prioritize"] += 1
        args = _ci(raw)
        names, _ = _names(args)
        try:
            req = parse_pod(args.get("pod") or {})
        except GpufleetError:
            return [{"Host": n, "Score": 0} for n in names]
        if not req.gpu_count:
            return [{"Host": n, "Score": 0} for n in names]
        with self.lock:
            sched = self.loop.sched
            cycle = sched.new_cycle(req)
            cycle.only_nodes = self._mask(names)
            sched.decide(cycle)
            scores: dict[str, int] = {}
            if cycle.candidates is not None and cycle.scores is not None and cycle.candidates.size:
                s = cycle.scores
                lo, hi = float(s.min()), float(s.max())
                for i, v in zip(cycle.candidates, s):
                    name = self.loop.state.nodes[int(i)].name
                    scores[name] = MAX_EXTENDER_PRIORITY if hi == lo else int(round((v - lo) / (hi - lo) * MAX_EXTENDER_PRIORITY))
            return [{"Host": n, "Score": scores.get(n, 0)} for n in names]

    def bind(self, raw: dict[str, Any]) -> dict[str, Any]:
        self.requests["bind"] += 1
        args = _ci(raw)
        ns, name, node = args.get("podnamespace") or "default", args.get("podname") or "", args.get("node") or ""
        uid = args.get("poduid") or ""
        for field, v in (("PodNamespace", ns), ("PodName", name), ("Node", node), ("PodUID", uid)):
            if not isinstance(v, str):
                raise BadRequest(f"{field}: must be a string, got {type(v).__name__}")
        key = f"{ns}/{name}"
        loop = self.loop
        if self.ready is not None and not self.ready.is_set():
            return {"Error": "gpufleet has not synced its snapshot yet"}
        with self.lock:
            pod = loop.pending.get(key)
            if pod is None:
                pod = loop.api.get_pod(ns, name)
            if pod is None:
                return {"Error": f"pod {key} not found"}
            if uid and (pod.get("metadata") or {}).get("uid") not in (None, uid):
                return {"Error": f"pod {key} has UID {pod['metadata'].get('uid')}, kube-scheduler asked for {uid}"}
            try:
                req = parse_pod(pod)
            except GpufleetError as exc:
                return {"Error": f"invalid pod spec: {exc}"}
            sched = loop.sched
            cycle = sched.new_cycle(req)
            cycle.only_nodes = self._mask([node])
            dec = sched.decide(cycle)
            if not dec.ok:
                return {"Error": f"pod {key} does not fit on {node}: {dec.status.message}"}
            st = sched.reserve(cycle)
            if not st.ok:
                return {"Error": f"pod {key}: {st.message}"}
            a = dec.assignment
            assert a is not None
            uuids = {g.index: g.uuid for g in loop.state.nodes[loop.state.index[node]].gpus}
            annotations = {ann.ASSIGNMENT: assignment_to_json(a, uuids)}
            loop.binding[key] = (pod, a, time.monotonic())
        # the API call runs without the lock: filters for other pods go on meanwhile
        outcome, detail, seen = bind_job(loop.api, ns, name, node, annotations)
        with self.lock:
            if loop.binding.pop(key, None) is None:
                return {"Error": f"pod {key} was deleted while binding"}
            if outcome == "bound":
                p = dict(pod)
                p["spec"] = {**(pod.get("spec") or {}), "nodeName": node}
                p["metadata"] = {**pod["metadata"], "annotations": {**(pod["metadata"].get("annotations") or {}), **annotations}}
                loop.bound_pods.setdefault(key, p)
                loop.pending.pop(key, None)
                loop.stats.binds += 1
                return {"Error": ""}
            loop.sched.forget(key)
            if outcome == "taken" and seen is not None:
                loop.bound_pods.setdefault(key, seen)
            if outcome == "taken" and key in loop.bound_pods:
                loop._reserve_bound(key, loop.bound_pods[key])
            return {"Error": f"binding {key} to {node} failed: {outcome} {detail}".strip()}


def serve(ext: Extender, addr: str, ready: threading.Event | None = None) -> ThreadingHTTPServer:
    host, port = addr.rsplit(":", 1)

    class H(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive: kube-scheduler reuses connections

        def _reply(self, code: int, out: Any) -> None:
            body = json.dumps(out).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_POST(self):  # noqa: N802
            path = self.path.split("?", 1)[0].rstrip("/").rsplit("/", 1)[-1]
            try:
                n = int(self.headers.get("Content-Length") or 0)
                if not 0 <= n <= 64 << 20:
                    raise ValueError(f"Content-Length {n} out of range")
                args = json.loads(self.rfile.read(n) or b"{}")
                if not isinstance(args, dict):
                    raise ValueError("body must be a JSON object")
            except ValueError as exc:
                self._reply(400, {"Error": f"bad request: {exc}"})
                return
            try:
                if path == "filter":
                    out: Any = ext.filter(args)
                elif path == "prioritize":
                    out = ext.prioritize(args)
                elif path == "bind":
                    out = ext.bind(args)
                else:
                    self._reply(404, {"Error": f"unknown verb {path!r}"})
                    return
            except BadRequest as exc:
                self._reply(400, {"Error": f"bad request: {exc}"})
                return
            except Exception as exc:  # answered, never crashes the server
                log.exception("extender %s failed", path)
                out = [] if path == "prioritize" else {"Error": f"internal error: {exc}"}
            self._reply(200, out)

        def do_GET(self):  # noqa: N802
            path = self.path.split("?", 1)[0]
            if path == "/healthz":
                code = 200
            elif path == "/readyz":
                code = 200 if ready is None or ready.is_set() else 503
            else:
                code = 404
            body = {200: b"ok", 503: b"not synced", 404: b"not found"}[code]
            self.send_response(code)
            self.send_header("Content-Type", "text/plain")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a):
            pass

    srv = ThreadingHTTPServer((host.strip("[]"), int(port)), H)
    srv.daemon_threads = True
    threading.Thread(target=srv.serve_forever, daemon=True, name="extender").start()
    return srv
