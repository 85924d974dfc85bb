"""The extender's HTTP server: the verbs as POST, /metrics, /healthz and /readyz as GET, on a thread, and a
second thread that releases expired reservations."""

from __future__ import annotations

import json
import logging
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from .verbs import BadRequest, Extender

log = logging.getLogger("gpufleet.kube.extender")


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    stopped: threading.Event

    def shutdown(self) -> None:
        self.stopped.set()
        super().shutdown()


def serve(ext: Extender, addr: str, ready: threading.Event | None = None, sweep_s: float = 1.0) -> ThreadingHTTPServer:
    """Serve the verbs (POST) and /metrics, /healthz, /readyz (GET) on a thread; a second thread
    releases expired reservations every ``sweep_s``."""
    from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

    host, port = addr.rsplit(":", 1)

    class H(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive: kube-scheduler reuses connections

        def _send(self, code: int, body: bytes, ctype: str) -> None:
            try:
                self.send_response(code)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
            except (BrokenPipeError, ConnectionResetError) as exc:  # the caller gave up (its httpTimeout)
                self.close_connection = True
                log.info("%s %s: the caller was gone before the reply (%s)", self.command, self.path, exc)

        def _reply(self, code: int, out: Any) -> None:
            self._send(code, json.dumps(out).encode(), "application/json")

        def do_POST(self):  # noqa: N802
            path = self.path.split("?", 1)[0].rstrip("/").rsplit("/", 1)[-1]
            try:
                n = int(self.headers.get("Content-Length") or 0)
                if not 0 <= n <= 64 << 20:
                    raise ValueError(f"Content-Length {n} out of range")
                args = json.loads(self.rfile.read(n) or b"{}")
                if not isinstance(args, dict):
                    raise TypeError("body must be a JSON object")
            except (ValueError, TypeError) as exc:
                ext.metrics.requests.labels(path if path in ("filter", "prioritize", "bind") else "unknown", "bad_request").inc()
                log.info("bad %s request: %s", path, exc)
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
                ext.metrics.requests.labels(path, "error").inc()
                out = [] if path == "prioritize" else {"Error": f"internal error: {exc}"}
            self._reply(200, out)

        def do_GET(self):
            path = self.path.split("?", 1)[0]
            if path == "/metrics":
                self._send(200, generate_latest(ext.metrics.registry), CONTENT_TYPE_LATEST)
                return
            if path == "/healthz":
                code = 200
            elif path == "/readyz":
                code = 200 if ready is None or ready.is_set() else 503
            else:
                code = 404
            self._send(code, {200: b"ok", 503: b"not synced", 404: b"not found"}[code], "text/plain")

        def log_message(self, *a):
            pass

    srv = _Server((host.strip("[]"), int(port)), H)
    srv.stopped = stopped = threading.Event()
    threading.Thread(target=srv.serve_forever, daemon=True, name="extender").start()

    def sweep() -> None:
        while not stopped.wait(sweep_s):
            try:
                ext.sweep()
            except Exception:  # never stops the sweeper
                log.exception("releasing expired reservations failed")

    threading.Thread(target=sweep, daemon=True, name="extender-sweep").start()
    return srv
