"""kube-scheduler extender: the stock scheduler keeps doing everything it does,
gpufleet filters and ranks nodes for GPU pods and binds them to exact GPUs.

Protocol (k8s.io/kube-scheduler/extender/v1), JSON over HTTP POST:

* ``/filter``     ExtenderArgs {Pod, NodeNames} -> ExtenderFilterResult {NodeNames, FailedNodes, Error}
* ``/prioritize`` ExtenderArgs -> HostPriorityList [{Host, Score}] (0..10)
* ``/bind``       ExtenderBindingArgs {PodName, PodNamespace, PodUID, Node} -> ExtenderBindingResult {Error}

With ``nodeCacheCapable: true`` kube-scheduler sends node *names* only; the
snapshot comes from our own watches (``SchedulerLoop``), the same one the
secondary scheduler uses.
"""

from __future__ import annotations

import json
import logging
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import numpy as np

from ..engine import annotations as ann
from ..engine.errors import GpufleetError
from ..engine.inventory import assignment_to_json
from ..engine.podspec import parse_pod, pod_key
from .loop import SchedulerLoop

log = logging.getLogger(__name__)
MAX_EXTENDER_PRIORITY = 10


class Extender:
    def __init__(self, loop: SchedulerLoop) -> None:
        self.loop = loop
        self.lock = threading.Lock()  # the snapshot is shared with the watch thread

    def _mask(self, names: list[str]) -> np.ndarray:
        st = self.loop.state
        m = np.zeros(len(st), dtype=bool)
        for n in names:
            i = st.index.get(n)
            if i is not None:
                m[i] = True
        return m

    def filter(self, args: dict[str, Any]) -> dict[str, Any]:
        pod = args.get("Pod") or args.get("pod") or {}
        names = list(args.get("NodeNames") or args.get("nodenames") or [])
        with self.lock:
            try:
                req = parse_pod(pod)
            except GpufleetError as exc:
                return {"NodeNames": [], "FailedNodes": {}, "Error": f"invalid pod spec: {exc}"}
            if not req.gpu_count:  # not ours to judge
                return {"NodeNames": names, "FailedNodes": {}, "Error": ""}
            sched = self.loop.sched
            cycle = sched.new_cycle(req)
            cycle.only_nodes = self._mask(names)
            sched.decide(cycle, explain=True)
            ok, failed = [], {}
            st = self.loop.state
            for n in names:
                i = st.index.get(n)
                if i is None:
                    failed[n] = "node unknown to gpufleet (no GPU inventory yet)"
                elif cycle.feasible is not None and cycle.feasible[i]:
                    ok.append(n)
                else:
                    failed[n] = cycle.fail_reasons[int(cycle.first_fail[i])] if cycle.first_fail is not None else "rejected"
            return {"NodeNames": ok, "FailedNodes": failed, "Error": ""}

    def prioritize(self, args: dict[str, Any]) -> list[dict[str, Any]]:
        pod = args.get("Pod") or {}
        names = list(args.get("NodeNames") or [])
        with self.lock:
            try:
                req = parse_pod(pod)
            except GpufleetError:
                return [{"Host": n, "Score": 0} for n in names]
            if not req.gpu_count:
                return [{"Host": n, "Score": 0} for n in names]
            sched = self.loop.sched
            cycle = sched.new_cycle(req)
            cycle.only_nodes = self._mask(names)
            sched.decide(cycle)
            scores = {}
            if cycle.candidates is not None and cycle.scores is not None and cycle.candidates.size:
                s = cycle.scores
                lo, hi = float(s.min()), float(s.max())
                for i, v in zip(cycle.candidates, s):
                    scores[self.loop.state.nodes[int(i)].name] = 0 if hi == lo else int(round((v - lo) / (hi - lo) * MAX_EXTENDER_PRIORITY))
                if hi == lo:
                    for i in cycle.candidates:
                        scores[self.loop.state.nodes[int(i)].name] = MAX_EXTENDER_PRIORITY
            return [{"Host": n, "Score": scores.get(n, 0)} for n in names]

    def bind(self, args: dict[str, Any]) -> dict[str, Any]:
        ns, name, node = args.get("PodNamespace", "default"), args.get("PodName", ""), args.get("Node", "")
        key = f"{ns}/{name}"
        with self.lock:
            pod = self.loop.pending.get(key)
            if pod is None:
                pods, _ = self.loop.api.list_pods()
                pod = next((p for p in pods if pod_key(p) == key), None)
            if pod is None:
                return {"Error": f"pod {key} not found"}
            try:
                req = parse_pod(pod)
            except GpufleetError as exc:
                return {"Error": f"invalid pod spec: {exc}"}
            sched = self.loop.sched
            cycle = sched.new_cycle(req)
            cycle.only_nodes = self._mask([node])
            dec = sched.decide(cycle)
            if not dec.ok:
                return {"Error": f"pod {key} does not fit on {node}: {dec.status.message}"}
            sched.reserve(cycle)
            a = dec.assignment
            uuids = {g.index: g.uuid for g in self.loop.state.nodes[self.loop.state.index[node]].gpus}
            try:
                self.loop.api.bind(ns, name, node, {ann.ASSIGNMENT: assignment_to_json(a, uuids)})
            except Exception as exc:
                sched.unreserve(cycle)
                return {"Error": f"binding {key} to {node} failed: {exc}"}
            self.loop.pending.pop(key, None)
            self.loop.bound.add(key)
            return {"Error": ""}


def serve(ext: Extender, addr: str) -> ThreadingHTTPServer:
    host, port = addr.rsplit(":", 1)

    class H(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802
            n = int(self.headers.get("Content-Length") or 0)
            try:
                args = json.loads(self.rfile.read(n) or b"{}")
                path = self.path.rstrip("/").rsplit("/", 1)[-1]
                if path == "filter":
                    out: Any = ext.filter(args)
                elif path == "prioritize":
                    out = ext.prioritize(args)
                elif path == "bind":
                    out = ext.bind(args)
                else:
                    self.send_error(404)
                    return
                code = 200
            except Exception as exc:  # a malformed request is answered, never crashes the server
                log.warning("extender request failed: %s", exc)
                out, code = {"Error": f"bad request: {exc}"}, 400
            body = json.dumps(out).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self):  # noqa: N802
            body = b"ok"
            self.send_response(200 if self.path in ("/healthz", "/readyz") else 404)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a):
            pass

    srv = ThreadingHTTPServer((host, int(port)), H)
    threading.Thread(target=srv.serve_forever, daemon=True, name="extender").start()
    return srv
