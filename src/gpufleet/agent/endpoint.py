"""``gpufleet agent-endpoint``: the device-plugin endpoint kubelet talks to, kept up across agent restarts.

Why it exists.  kubelet's device manager keeps one gRPC connection per registered resource, and its
``ListAndWatch`` stream is the plugin's lifeline: when the stream ends (the plugin's process died: EOF, Canceled),
kubelet marks every device of the resource unhealthy at once, an ``Allocate`` in flight fails, and every pod it
admits until a new process registers is refused ("no healthy devices present"); kubelet never admits a refused
pod again.  kubelet admits the pods bound to it the moment it can, so an agent crash (a bug, an OOM kill, a
``kill -9``) cost exactly the pods bound to the node just before it (the real-node drill: 6 per crash).

This process is that endpoint and nothing more.  It registers each resource with kubelet, keeps kubelet's
``ListAndWatch`` stream open with the last device list the agent sent, and forwards ``GetPreferredAllocation``,
``Allocate`` and ``PreStartContainer`` to the agent (the "backend": the agent's own device-plugin servers on sockets
in ``--endpoint-dir``, listed in ``plugins.json`` there).  While the agent is away a call waits for it, up to
``--agent-wait-s``; a call the agent died in the middle of is sent again to the new agent, which answers a pod it
served but kubelet has not admitted with the same GPUs (``podsource.pick``: kubelet still lists the pod without
devices).  kubelet sees a slow answer, not a dead plugin: nothing is refused.  It decides nothing about devices, has
no API client and no NVML: only grpc and the device-plugin stubs, so there is little in it to crash.

When this process dies, kubelet sees what it saw when the agent died before: the devices go unhealthy and pods
admitted until it is back (a container restart: about a second) are refused; the scheduler holds GPU pods off the
node meanwhile (``kube/plugin_down``, through the agent's ``gpufleet.io/device-plugin-registered``, written after
this process's ``registered.json`` says it registered again).  If the agent does not come back within
``--agent-wait-s``, the waiting call fails with UNAVAILABLE and kubelet refuses that pod (closed: no device is
handed out without the agent's decision).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from concurrent import futures
from dataclasses import dataclass, field
from typing import Any

import grpc

from ..files import replace_atomically
from .deviceplugin import api_pb2 as pb
from .deviceplugin import api_pb2_grpc as pbg

log = logging.getLogger("gpufleet.agent.endpoint")
API_VERSION = "v1beta1"
MANIFEST = "plugins.json"  # written by the agent: the resources it serves and their backend sockets
STAMP = "registered.json"  # written here: when each resource last registered with kubelet
POLL_S = 0.05  # how often the manifest, kubelet.sock and our sockets are looked at
REGISTER_RETRY_S = 1.0
# the backend channel reconnects within ~0.1-0.5 s of the agent's socket coming back (gRPC's default backoff grows to
# 120 s: a call would then wait minutes for an agent that is already back)
CHANNEL_OPTIONS = [("grpc.initial_reconnect_backoff_ms", 100), ("grpc.min_reconnect_backoff_ms", 100),
                   ("grpc.max_reconnect_backoff_ms", 500)]
OPTIONS = pb.DevicePluginOptions(pre_start_required=False, get_preferred_allocation_available=True)


def iso_now(t: float | None = None) -> str:
    t = time.time() if t is None else t
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t)) + f".{int(t % 1 * 1000):03d}Z"


def write_json(path: str, data: dict) -> None:
    """Atomic replace (the other process never reads half a file)."""
    replace_atomically(path, json.dumps(data, sort_keys=True))


def read_json(path: str) -> dict | None:
    try:
        with open(path) as f:
            data = json.load(f)
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def write_manifest(endpoint_dir: str, plugins: list[tuple[str, str]]) -> None:
    """The agent's side: ``plugins``: (resource, socket file name in ``endpoint_dir``)."""
    write_json(os.path.join(endpoint_dir, MANIFEST),
               {"version": 1, "plugins": [{"resource": r, "socket": s} for r, s in plugins]})


def read_manifest(endpoint_dir: str) -> list[tuple[str, str]] | None:
    data = read_json(os.path.join(endpoint_dir, MANIFEST))
    if data is None:
        return None
    out = []
    for p in data.get("plugins") or ():
        if isinstance(p, dict) and isinstance(p.get("resource"), str) and isinstance(p.get("socket"), str) \
                and "/" not in p["socket"] and p["socket"]:
            out.append((p["resource"], p["socket"]))
    return out


def read_stamp(endpoint_dir: str) -> dict[str, str]:
    """The agent's side: resource -> when this process last registered it with kubelet (ISO time)."""
    data = read_json(os.path.join(endpoint_dir, STAMP)) or {}
    res = data.get("resources")
    return {str(k): str(v) for k, v in res.items()} if isinstance(res, dict) else {}


class AgentAway(Exception):
    """A forwarded call gave up on an absent agent (``context.abort`` has told kubelet)."""


@dataclass
class KubeletSocket:
    """Notices a kubelet restart: kubelet.sock re-created (new inode or ctime)."""

    path: str
    _ident: tuple | None = field(default=None)

    def changed(self) -> bool:
        try:
            st = os.stat(self.path)
            ident: tuple | None = (st.st_ino, st.st_ctime_ns)
        except FileNotFoundError:
            ident = None
        if ident != self._ident:
            self._ident = ident
            return ident is not None
        return False

    def forget(self) -> None:
        self._ident = None


class Relay(pbg.DevicePluginServicer):
    """One resource: kubelet's side on ``<device-plugin-dir>/<socket>``, the agent's on ``<endpoint-dir>/<socket>``."""

    def __init__(self, resource: str, socket: str, device_plugin_dir: str, endpoint_dir: str, agent_wait_s: float,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.resource, self.socket = resource, socket
        self.kubelet_path = os.path.join(device_plugin_dir, socket)
        self.backend_path = os.path.join(endpoint_dir, socket)
        self.agent_wait_s, self.clock = agent_wait_s, clock
        self.channel = grpc.insecure_channel(f"unix://{self.backend_path}", options=CHANNEL_OPTIONS)
        self.stub = pbg.DevicePluginStub(self.channel)
        self._cond = threading.Condition()
        self._listing: pb.ListAndWatchResponse | None = None
        self._version = 0
        self._stop = threading.Event()
        self._server: grpc.Server | None = None
        self.registered = False
        self._watch = threading.Thread(target=self._follow_agent, name=f"ep-watch-{resource}", daemon=True)
        self._watch.start()

    # --- the agent's device list -----------------------------------------------------------------
    def _follow_agent(self) -> None:
        """Keep the agent's last ``ListAndWatch`` message; when its stream ends (the agent died or restarted), keep
        the last one and reconnect to the next agent."""
        away_since: float | None = None
        while not self._stop.is_set():
            try:
                for msg in self.stub.ListAndWatch(pb.Empty(), wait_for_ready=True):
                    if away_since is not None:
                        log.info("%s: the agent is back after %.1f s", self.resource, self.clock() - away_since)
                        away_since = None
                    with self._cond:
                        self._listing = msg
                        self._version += 1
                        self._cond.notify_all()
            except grpc.RpcError as exc:
                if self._stop.is_set():
                    return
                if away_since is None:
                    away_since = self.clock()
                    log.warning("%s: the agent's stream ended (%s); keeping kubelet's connection with its last "
                                "device list until it is back", self.resource, exc.code() if hasattr(exc, "code") else exc)
            self._stop.wait(0.05)

    def has_listing(self) -> bool:
        with self._cond:
            return self._listing is not None

    # --- kubelet's side ---------------------------------------------------------------------------
    def GetDevicePluginOptions(self, request, context):  # noqa: N802
        return OPTIONS

    def ListAndWatch(self, request, context):  # noqa: N802
        seen = -1
        while not self._stop.is_set() and context.is_active():
            with self._cond:
                self._cond.wait_for(lambda: (self._version != seen and self._listing is not None)  # noqa: B023
                                    or self._stop.is_set(), timeout=1.0)
                if self._stop.is_set() or self._version == seen or self._listing is None:
                    continue
                seen, msg = self._version, self._listing
            yield msg

    def GetPreferredAllocation(self, request, context):  # noqa: N802
        return self._forward("GetPreferredAllocation", request, context)

    def Allocate(self, request, context):  # noqa: N802
        return self._forward("Allocate", request, context)

    def PreStartContainer(self, request, context):  # noqa: N802
        return self._forward("PreStartContainer", request, context)

    def _forward(self, method: str, request: Any, context: Any) -> Any:
        """Send the call to the agent; wait for an absent agent (up to ``agent_wait_s`` from when it was found
        absent); send it again when the agent died in the middle of it.  The agent's own refusals pass through."""
        call = getattr(self.stub, method)
        deadline = self.clock() + self.agent_wait_s
        tries = 0
        while True:
            left = deadline - self.clock()
            if context is not None and not context.is_active():
                return None  # kubelet gave up on it (a kubelet restart): nothing to answer
            if left <= 0:
                msg = (f"{self.resource}: the gpufleet agent has not served {method} for {self.agent_wait_s:.0f} s (its "
                       f"socket {self.backend_path}); refusing rather than hand out a device it did not choose")
                log.error("%s", msg)
                if context is not None:
                    context.abort(grpc.StatusCode.UNAVAILABLE, msg)
                raise AgentAway(msg)
            ready = grpc.channel_ready_future(self.channel)
            try:
                ready.result(timeout=min(left, 1.0))
            except grpc.FutureTimeoutError:
                ready.cancel()
                continue
            tries += 1
            try:
                out = call(request)
            except grpc.RpcError as exc:
                code = exc.code() if hasattr(exc, "code") else grpc.StatusCode.UNKNOWN
                if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED):
                    # the agent went away under the call: wait for the next one, the whole budget again
                    log.warning("%s: %s got %s from the agent (try %d); sending it again when the agent is back",
                                self.resource, method, code.name, tries)
                    deadline = self.clock() + self.agent_wait_s
                    self._stop.wait(0.05)
                    continue
                if context is not None:
                    context.abort(code, exc.details() or str(exc))
                raise
            if tries > 1:
                log.info("%s: %s answered by the agent after %d tries", self.resource, method, tries)
            return out

    # --- lifecycle --------------------------------------------------------------------------------
    def serving(self) -> bool:
        return self._server is not None and os.path.exists(self.kubelet_path)

    def start(self) -> None:
        self.stop_server()
        if os.path.exists(self.kubelet_path):
            os.unlink(self.kubelet_path)
        srv = grpc.server(futures.ThreadPoolExecutor(max_workers=8, thread_name_prefix=f"ep-{self.resource}"))
        pbg.add_DevicePluginServicer_to_server(self, srv)
        srv.add_insecure_port(f"unix://{self.kubelet_path}")
        srv.start()
        self._server = srv
        self.registered = False

    def register(self, kubelet_socket: str, timeout_s: float = 5.0) -> None:
        with grpc.insecure_channel(f"unix://{kubelet_socket}") as ch:
            grpc.channel_ready_future(ch).result(timeout=timeout_s)
            pbg.RegistrationStub(ch).Register(pb.RegisterRequest(
                version=API_VERSION, endpoint=self.socket, resource_name=self.resource, options=OPTIONS),
                timeout=timeout_s)
        self.registered = True

    def stop_server(self) -> None:
        if self._server is not None:
            self._server.stop(grace=0).wait()
            self._server = None

    def close(self) -> None:
        self._stop.set()
        with self._cond:
            self._cond.notify_all()
        self.stop_server()
        self.channel.close()
        try:
            os.unlink(self.kubelet_path)
        except FileNotFoundError:
            pass


class Endpoint:
    """Mirrors the agent's manifest: a relay per resource, registered with kubelet once the agent's device list is
    known, again when kubelet restarts or our socket vanished."""

    def __init__(self, device_plugin_dir: str, endpoint_dir: str, agent_wait_s: float = 60.0) -> None:
        self.device_plugin_dir, self.endpoint_dir, self.agent_wait_s = device_plugin_dir, endpoint_dir, agent_wait_s
        self.kubelet = KubeletSocket(os.path.join(device_plugin_dir, "kubelet.sock"))
        self.relays: dict[str, Relay] = {}
        self.stamps: dict[str, str] = {}
        self._retry_at = 0.0

    def step(self) -> None:
        plugins = read_manifest(self.endpoint_dir)
        if plugins is not None:
            want = dict(plugins)
            for r in [r for r in self.relays if r not in want or self.relays[r].socket != want[r]]:
                log.info("%s: no longer in the agent's manifest; not serving it", r)
                self.stamps.pop(r, None)
                self._write_stamp()  # first: nobody reads it as registered once kubelet has lost it
                self.relays.pop(r).close()
            for r, s in plugins:
                if r not in self.relays:
                    self.relays[r] = Relay(r, s, self.device_plugin_dir, self.endpoint_dir, self.agent_wait_s)
        kubelet_new = self.kubelet.changed()
        if time.monotonic() < self._retry_at and not kubelet_new:
            return
        for r, relay in self.relays.items():
            if not relay.has_listing():
                continue  # nothing to tell kubelet yet: registered once the agent sent its devices
            if relay.registered and relay.serving() and not kubelet_new:
                continue
            if not relay.serving() or kubelet_new:
                relay.start()
            if not os.path.exists(self.kubelet.path):
                continue
            try:
                relay.register(self.kubelet.path)
            except Exception as exc:  # noqa: BLE001 - kubelet away or refusing: retried
                log.warning("registering %s failed: %s; retrying", r, exc)
                self.kubelet.forget()
                self._retry_at = time.monotonic() + REGISTER_RETRY_S
                continue
            self.stamps[r] = iso_now()
            log.info("registered %s with kubelet (%s)", r, relay.socket)
            self._write_stamp()

    def _write_stamp(self) -> None:
        try:
            write_json(os.path.join(self.endpoint_dir, STAMP), {"pid": os.getpid(), "resources": self.stamps})
        except OSError as exc:
            log.error("cannot write %s: %s", os.path.join(self.endpoint_dir, STAMP), exc)

    def close(self) -> None:
        for relay in self.relays.values():
            relay.close()
        self.relays.clear()
        self.stamps.clear()
        self._write_stamp()


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--device-plugin-dir", default="/var/lib/kubelet/device-plugins",
                   help="where kubelet.sock lives and the sockets kubelet dials go")
    p.add_argument("--endpoint-dir", default="/var/lib/gpufleet/agent/endpoint",
                   help="shared with the agent (its --endpoint-dir): its plugins.json and backend sockets")
    p.add_argument("--agent-wait-s", type=float, default=60.0,
                   help="how long a kubelet call waits for an absent agent before it fails (default 60)")
    p.add_argument("--stop-grace-s", type=float, default=20.0,
                   help="on SIGTERM, keep serving kubelet while the agent still serves (its own stop drains the pods "
                        "already bound to the node), at most this long (default 20)")
    p.add_argument("--log-level", default=None, help="DEBUG, INFO, WARNING or ERROR (default INFO)")


def run(args: argparse.Namespace) -> int:
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.agent_wait_s <= 0:
        print(f"gpufleet agent-endpoint: --agent-wait-s must be > 0, got {args.agent_wait_s}", file=sys.stderr, flush=True)
        return 2
    try:
        os.makedirs(args.endpoint_dir, exist_ok=True)  # kubelet's directory is kubelet's to create
    except OSError as exc:
        print(f"gpufleet agent-endpoint: --endpoint-dir {args.endpoint_dir}: {exc}", file=sys.stderr, flush=True)
        return 1
    ep = Endpoint(args.device_plugin_dir, args.endpoint_dir, args.agent_wait_s)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    log.info("device-plugin endpoint: kubelet at %s, the agent's sockets in %s", args.device_plugin_dir, args.endpoint_dir)
    while not stop.is_set():
        try:
            ep.step()
        except Exception:  # one bad round must not take the node's GPUs away
            log.exception("endpoint step failed")
        stop.wait(POLL_S)
    # a pod's deletion (a DaemonSet update) stops both containers at once: the agent drains first (it taints its node
    # and lets kubelet admit the pods already bound), which needs kubelet's connection, so it stays until the agent's
    # sockets are gone
    end = time.monotonic() + args.stop_grace_s
    while time.monotonic() < end and any(os.path.exists(r.backend_path) for r in ep.relays.values()):
        try:
            ep.step()
        except Exception:  # noqa: BLE001 - stopping anyway
            log.exception("endpoint step failed")
        time.sleep(POLL_S)
    ep.close()
    log.info("stopped")
    return 0
