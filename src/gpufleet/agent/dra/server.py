"""The kubelet plugin: registration through the plugin watcher, the DRA and health gRPC services.

kubelet's plugin watcher notices a socket appearing in
``/var/lib/kubelet/plugins_registry`` (``<driver>-reg.sock``), calls
``Registration.GetInfo`` on it (type ``DRAPlugin``, the driver name, the DRA
socket ``/var/lib/kubelet/plugins/<driver>/dra.sock`` and the gRPC services
served there), connects to that endpoint and reports the outcome through
``NotifyRegistrationStatus``.  A kubelet restart re-reads the registry
directory, so the sockets stay where they are; an agent restart re-creates
them, which the watcher sees as a new plugin.  Both paths must be the same
inside the agent's container and on the host.

Services on the DRA socket: ``v1.DRAPlugin`` (NodePrepareResources /
NodeUnprepareResources, answered per claim: one claim's failure is its own
``error`` entry, never the call's) and, optionally, ``v1.DRAResourceHealth``
(every device's health, streamed on change and every ``HEALTH_RESEND_S`` so
kubelet does not time it out to Unknown; kubelet shows it in the pod's
``containerStatuses[].allocatedResourcesStatus``).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from concurrent import futures
from typing import Callable, Iterator

import grpc

from . import dra_health_v1_pb2 as hpb
from . import dra_health_v1_pb2_grpc as hpbg
from . import dra_v1_pb2 as pb
from . import dra_v1_pb2_grpc as pbg
from . import pluginregistration_v1_pb2 as rpb
from . import pluginregistration_v1_pb2_grpc as rpbg
from ..pause import pause
from .prepare import PrepareError, Preparer

log = logging.getLogger(__name__)

DRA_SERVICE = "v1.DRAPlugin"
HEALTH_SERVICE = "v1.DRAResourceHealth"
HEALTH_RESEND_S = 10.0
HEALTH_TIMEOUT_S = 60


class DraService(pbg.DRAPluginServicer):
    def __init__(self, preparer: Preparer) -> None:
        self.preparer = preparer
        self.calls = {"prepare": 0, "unprepare": 0}

    def NodePrepareResources(self, request, context):  # noqa: N802
        self.calls["prepare"] += 1
        out = pb.NodePrepareResourcesResponse()
        for c in request.claims:
            try:
                devs = self.preparer.prepare(c.namespace, c.uid, c.name)
                resp = out.claims[c.uid]
                for d in devs:
                    dev = resp.devices.add(request_names=[d.request], pool_name=d.pool, device_name=d.device,
                                           cdi_device_ids=list(d.cdi_ids))
                    if d.share_id:
                        dev.share_id = d.share_id
                pause("prepare", f"{c.namespace}/{c.name} ({c.uid})")
            except PrepareError as exc:
                out.claims[c.uid].error = exc.message
            except Exception as exc:  # a bug or an I/O failure for one claim must not fail the others
                log.exception("preparing ResourceClaim %s/%s failed", c.namespace, c.name)
                out.claims[c.uid].error = f"ResourceClaim {c.namespace}/{c.name}: internal error: {exc}"
        return out

    def NodeUnprepareResources(self, request, context):  # noqa: N802
        self.calls["unprepare"] += 1
        out = pb.NodeUnprepareResourcesResponse()
        for c in request.claims:
            try:
                self.preparer.unprepare(c.namespace, c.uid, c.name)
                out.claims[c.uid].CopyFrom(pb.NodeUnprepareResourceResponse())
            except Exception as exc:
                log.exception("unpreparing ResourceClaim %s/%s failed", c.namespace, c.name)
                out.claims[c.uid].error = f"ResourceClaim {c.namespace}/{c.name}: {exc}"
        return out


class RegistrationService(rpbg.RegistrationServicer):
    def __init__(self, driver: str, endpoint: str, services: list[str]) -> None:
        self.driver = driver
        self.endpoint = endpoint
        self.services = services
        self.status: tuple[bool, str] | None = None  # kubelet's last answer
        self.status_changed = threading.Event()

    def GetInfo(self, request, context):  # noqa: N802
        return rpb.PluginInfo(type="DRAPlugin", name=self.driver, endpoint=self.endpoint, supported_versions=self.services)

    def NotifyRegistrationStatus(self, request, context):  # noqa: N802
        self.status = (request.plugin_registered, request.error)
        if request.plugin_registered:
            log.info("kubelet registered DRA driver %s (%s)", self.driver, self.endpoint)
        else:
            log.error("kubelet refused DRA driver %s: %s", self.driver, request.error)
        self.status_changed.set()
        return rpb.RegistrationStatusResponse()


class HealthService(hpbg.DRAResourceHealthServicer):
    """Streams every device's health: on each change, and every ``resend_s`` (kubelet's staleness timeout)."""

    def __init__(self, pool: str, resend_s: float = HEALTH_RESEND_S) -> None:
        self.pool = pool
        self.resend_s = resend_s
        self._devices: dict[str, tuple[bool, str]] = {}
        self._cond = threading.Condition()
        self._version = 0
        self._stop = threading.Event()

    def update(self, devices: dict[str, tuple[bool, str]]) -> None:
        with self._cond:
            if devices != self._devices:
                self._devices = dict(devices)
                self._version += 1
                self._cond.notify_all()

    def stop(self) -> None:
        self._stop.set()
        with self._cond:
            self._cond.notify_all()

    def reset(self) -> None:
        self._stop.clear()

    def _message(self) -> hpb.NodeWatchResourcesResponse:
        now = int(time.time())
        return hpb.NodeWatchResourcesResponse(devices=[
            hpb.DeviceHealth(device=hpb.DeviceIdentifier(pool_name=self.pool, device_name=name),
                             health=hpb.HEALTHY if ok else hpb.UNHEALTHY, last_updated_time=now,
                             health_check_timeout_seconds=HEALTH_TIMEOUT_S, message=msg[:1024])
            for name, (ok, msg) in sorted(self._devices.items())])

    def NodeWatchResources(self, request, context) -> Iterator[hpb.NodeWatchResourcesResponse]:  # noqa: N802
        with self._cond:
            seen = self._version
            first = self._message()
        yield first
        while not self._stop.is_set() and context.is_active():
            with self._cond:
                self._cond.wait_for(lambda: self._version != seen or self._stop.is_set(), timeout=self.resend_s)  # noqa: B023
                if self._stop.is_set():
                    return
                seen = self._version
                msg = self._message()
            yield msg


class KubeletPlugin:
    """The two sockets and the gRPC server behind them."""

    def __init__(self, driver: str, preparer: Preparer, plugins_dir: str = "/var/lib/kubelet/plugins",
                 registry_dir: str = "/var/lib/kubelet/plugins_registry", health: HealthService | None = None,
                 endpoint: str | None = None, max_workers: int = 8) -> None:
        self.driver = driver
        self.socket = os.path.join(plugins_dir, driver, "dra.sock")
        self.reg_socket = os.path.join(registry_dir, f"{driver}-reg.sock")
        self.dra = DraService(preparer)
        self.health = health
        services = [DRA_SERVICE] + ([HEALTH_SERVICE] if health is not None else [])
        self.registration = RegistrationService(driver, endpoint or self.socket, services)
        self.max_workers = max_workers
        self._server: grpc.Server | None = None
        self._idents: tuple | None = None

    def _ident(self) -> tuple | None:
        try:
            a, b = os.stat(self.socket), os.stat(self.reg_socket)
            return (a.st_ino, b.st_ino)
        except OSError:
            return None

    def start(self) -> None:
        for p in (self.socket, self.reg_socket):
            os.makedirs(os.path.dirname(p), exist_ok=True)
            if os.path.lexists(p):
                os.unlink(p)
        if self.health is not None:
            self.health.reset()
        srv = grpc.server(futures.ThreadPoolExecutor(max_workers=self.max_workers, thread_name_prefix="dra"))
        pbg.add_DRAPluginServicer_to_server(self.dra, srv)
        rpbg.add_RegistrationServicer_to_server(self.registration, srv)
        if self.health is not None:
            hpbg.add_DRAResourceHealthServicer_to_server(self.health, srv)
        srv.add_insecure_port(f"unix://{self.socket}")
        srv.add_insecure_port(f"unix://{self.reg_socket}")  # last: its appearance is what kubelet's watcher acts on
        srv.start()
        self._server = srv
        self._idents = self._ident()
        log.info("DRA kubelet plugin %s serving on %s, registration socket %s", self.driver, self.socket, self.reg_socket)

    def stop(self, remove_sockets: bool = True) -> None:
        if self.health is not None:
            self.health.stop()
        if self._server is not None:
            self._server.stop(grace=1.0).wait()
            self._server = None
        if remove_sockets:
            for p in (self.reg_socket, self.socket):  # registration first: kubelet deregisters the plugin
                try:
                    os.unlink(p)
                except FileNotFoundError:
                    pass

    @property
    def started(self) -> bool:
        return self._server is not None

    def serving(self) -> bool:
        """Server up and both sockets still the ones it made (someone may have wiped the directories)."""
        return self._server is not None and self._ident() == self._idents and self._idents is not None


__all__ = ["DRA_SERVICE", "DraService", "HEALTH_SERVICE", "HealthService", "KubeletPlugin", "RegistrationService"]


def wait_registered(plugin: KubeletPlugin, timeout_s: float, sleep: Callable[[float], None] = time.sleep) -> bool:
    """True once kubelet reported the plugin registered (tests, start-up logs)."""
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        st = plugin.registration.status
        if st is not None and st[0]:
            return True
        sleep(0.05)
    return False
