"""NodePrepareResources / NodeUnprepareResources: from an allocated claim to a container's devices.

kubelet names the claim (namespace, name, UID) and nothing else, so the plugin
reads the ResourceClaim, takes the ``status.allocation`` results for this
driver, checks each against what this node publishes, and records the result
(checkpoint, CDI spec) before answering.  Both calls are idempotent.

**Coexistence.**  The API has no reservation across allocators: kube-scheduler
and gpufleet's scheduler (or a stale claim) can each allocate one device to a
different claim, and both writes succeed.  This is the last point where that
can be caught, so a claim is refused, with an Event naming both claims, when a
device it was allocated is already held by another prepared claim: any holder
for an exclusive device (a MIG instance, a GPU without shares, a whole-GPU
allocation), or more ``memory`` / ``gpuMilli`` than a shared GPU has left.
``adminAccess`` allocations (monitoring) may overlap anything, as the API
intends.  Nothing doubly allocated reaches a container: kubelet keeps the pod
waiting (``FailedPrepareDynamicResources``) and retries.

**Bad input** (a device that does not exist here, a pool of another node, a
malformed result or quantity, a claim that is not allocated or whose UID
changed, a device that is unhealthy and not tolerated) is refused for that
claim only, with the object and field in the error kubelet shows and in an
Event; every other claim keeps being served.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Callable

from .cdi import CdiWriter, cdi_id
from .devices import GPU_MILLI, Fault, Published, fault_taints, parse_quantity
from .kubeapi import DraApi, NotFound
from .state import Checkpoint, PreparedClaim, PreparedDevice

log = logging.getLogger(__name__)

EVENT_REPEAT_S = 600.0  # the same event for the same object at most this often (kubelet retries every few seconds)


class PrepareError(Exception):
    """This claim cannot be prepared; the message names the object and field."""

    def __init__(self, message: str, reason: str = "PrepareFailed", event: bool = True) -> None:
        super().__init__(message)
        self.message = message
        self.reason = reason
        self.event = event


@dataclass
class _Held:
    memory_bytes: int = 0
    gpu_milli: int = 0
    whole_by: str = ""  # a claim holding the device exclusively
    holders: list[str] = field(default_factory=list)


class EventSink:
    """Posts Events in the background, each (object UID, reason, message) at most every ``EVENT_REPEAT_S``."""

    def __init__(self, api: DraApi | None, clock: Callable[[], float] = time.monotonic) -> None:
        self.api = api
        self.clock = clock
        self._sent: dict[tuple, float] = {}
        self._lock = threading.Lock()
        self.posted: list[tuple[dict, str, str, str]] = []  # (regarding, type, reason, note): for tests and logs

    def post(self, regarding: dict, type_: str, reason: str, note: str, action: str = "PrepareResources") -> None:
        key = (regarding.get("uid") or regarding.get("name"), reason, note)
        now = self.clock()
        with self._lock:
            if now - self._sent.get(key, -1e18) < EVENT_REPEAT_S:
                return
            self._sent[key] = now
            if len(self._sent) > 4096:
                self._sent = {k: t for k, t in self._sent.items() if now - t < EVENT_REPEAT_S}
            self.posted.append((regarding, type_, reason, note))
        if self.api is None:
            return
        api = self.api

        def send() -> None:
            try:
                api.event(regarding, type_, reason, note, action)
            except Exception as exc:  # the error kubelet shows stands without the event
                log.warning("cannot post event %s on %s %s: %s", reason, regarding.get("kind"), regarding.get("name"), exc)

        threading.Thread(target=send, name="dra-event", daemon=True).start()


def tolerates(tolerations: list, taint: dict) -> bool:
    """DeviceToleration semantics: operator Exists (empty key: any) or Equal (key and value); empty effect: any."""
    for t in tolerations or ():
        if not isinstance(t, dict):
            continue
        op = t.get("operator") or "Equal"
        if t.get("effect") and t.get("effect") != taint.get("effect"):
            continue
        if op == "Exists" and (not t.get("key") or t.get("key") == taint.get("key")):
            return True
        if op == "Equal" and t.get("key") == taint.get("key") and (t.get("value") or "") == (taint.get("value") or ""):
            return True
    return False


def base_request(ref: str) -> str:
    """``main/sub`` (a firstAvailable subrequest) -> ``main``: what containers name in resources.claims[].request."""
    return ref.split("/", 1)[0]


class Preparer:
    def __init__(self, api: DraApi | None, checkpoint: Checkpoint, cdi: CdiWriter, node: str, driver: str,
                 inventory: Callable[[], tuple[dict[str, Published], dict[int, Fault]]],
                 events: EventSink | None = None, clock: Callable[[], float] = time.time) -> None:
        self.api = api
        self.state = checkpoint
        self.cdi = cdi
        self.node = node
        self.driver = driver
        self.inventory = inventory
        self.events = events or EventSink(api)
        self.clock = clock
        self.refused = 0  # double-allocation refusals (metrics, tests)

    # --- prepare ------------------------------------------------------------------------
    def prepare(self, namespace: str, uid: str, name: str) -> list[PreparedDevice]:
        if not uid:
            raise PrepareError(f"ResourceClaim {namespace}/{name}: kubelet sent no claim UID", event=False)
        done = self.state.get(uid)
        if done is not None:
            if not self.cdi.exists(uid):  # /var/run is a tmpfs: gone after a reboot, the claim is not
                self.cdi.write(done)
            return done.devices
        claim = self._read(namespace, uid, name)
        ref = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "namespace": namespace, "name": name, "uid": uid}
        try:
            wanted = self._devices(claim, namespace, name)
            with self.state.lock:
                done = self.state.get(uid)
                if done is not None:  # a concurrent call prepared it meanwhile
                    return done.devices
                self._check_free(namespace, name, uid, wanted)
                prepared = PreparedClaim(uid, namespace, name, wanted, round(self.clock(), 3))
                prepared.devices = self._with_cdi(prepared)
                try:
                    self.cdi.write(prepared)
                    self.state.put(prepared)
                except OSError as exc:
                    self.cdi.remove(uid)
                    raise PrepareError(f"ResourceClaim {namespace}/{name}: cannot record the prepared claim: {exc}",
                                       reason="PrepareFailed", event=False) from None
        except PrepareError as exc:
            if exc.event:
                self._report(claim, ref, exc)
            raise
        log.info("prepared ResourceClaim %s/%s (%s): %s", namespace, name, uid,
                 ", ".join(f"{d.request}:{d.device}" + ("" if d.whole else f" ({d.memory_bytes >> 20} MiB, {d.gpu_milli} milli)")
                           for d in prepared.devices) or "no devices of this driver")
        return prepared.devices

    def _read(self, namespace: str, uid: str, name: str) -> dict:
        if self.api is None:
            raise PrepareError(f"ResourceClaim {namespace}/{name}: no API access to read it", event=False)
        try:
            claim = self.api.get_claim(namespace, name)
        except NotFound:
            raise PrepareError(f"ResourceClaim {namespace}/{name} not found", event=False) from None
        except Exception as exc:  # the API away: kubelet retries
            raise PrepareError(f"ResourceClaim {namespace}/{name}: cannot read it: {exc}", event=False) from None
        got = (claim.get("metadata") or {}).get("uid")
        if got != uid:
            raise PrepareError(f"ResourceClaim {namespace}/{name}: metadata.uid is {got}, kubelet asked for {uid} "
                               "(deleted and re-created?)", event=False)
        return claim

    def _devices(self, claim: dict, namespace: str, name: str) -> list[PreparedDevice]:
        where = f"ResourceClaim {namespace}/{name}"
        alloc = (claim.get("status") or {}).get("allocation")
        if not isinstance(alloc, dict):
            raise PrepareError(f"{where}: status.allocation is not set (the claim is not allocated)", reason="NotAllocated")
        results = (alloc.get("devices") or {}).get("results")
        if not isinstance(results, list):
            raise PrepareError(f"{where}: status.allocation.devices.results is missing or not a list", reason="InvalidAllocation")
        for i, c in enumerate((alloc.get("devices") or {}).get("config") or []):
            opaque = c.get("opaque") if isinstance(c, dict) else None
            if isinstance(opaque, dict) and opaque.get("driver") == self.driver:
                src = "its DeviceClass" if c.get("source") == "FromClass" else "the claim"
                raise PrepareError(f"{where}: status.allocation.devices.config[{i}].opaque (from {src}): this driver takes no "
                                   "opaque configuration (a share is asked for with capacity.requests); refusing rather "
                                   "than ignoring it", reason="UnsupportedConfig")
        published, faults = self.inventory()
        out: list[PreparedDevice] = []
        for i, r in enumerate(results):
            f = f"status.allocation.devices.results[{i}]"
            if not isinstance(r, dict):
                raise PrepareError(f"{where}: {f} is not an object", reason="InvalidAllocation")
            if r.get("driver") != self.driver:
                continue
            for key in ("request", "pool", "device"):
                if not isinstance(r.get(key), str) or not r.get(key):
                    raise PrepareError(f"{where}: {f}.{key} must be a non-empty string, got {r.get(key)!r}",
                                       reason="InvalidAllocation")
            if r["pool"] != self.node:
                raise PrepareError(f"{where}: {f}.pool is {r['pool']!r}, but this node's pool is {self.node!r} "
                                   f"(allocated for another node)", reason="InvalidAllocation")
            pub = published.get(r["device"])
            if pub is None:
                raise PrepareError(f"{where}: {f}.device {r['device']!r} does not exist on node {self.node} (its devices: "
                                   f"{', '.join(sorted(published)) or 'none'}); allocated to a device that is gone",
                                   reason="DeviceNotFound")
            admin = r.get("adminAccess") is True
            fault = faults.get(pub.gpu_index)
            if fault is not None and not admin:
                taint = _taint_of(self.driver, fault)
                if not tolerates(r.get("tolerations") or [], taint):
                    raise PrepareError(f"{where}: {f}.device {r['device']} is unhealthy ({fault.reason}; taint "
                                       f"{taint['key']}{'=' + taint['value'] if taint.get('value') else ''}:NoSchedule) "
                                       "and the allocation does not tolerate it", reason="DeviceUnhealthy")
            mem, milli, whole = self._consumed(where, f, r, pub)
            share_id = r.get("shareID") if isinstance(r.get("shareID"), str) else ""
            out.append(PreparedDevice(base_request(r["request"]), r["pool"], r["device"], pub.uuid, pub.gpu_index,
                                      mem, milli, whole, share_id or "", admin))
        return out

    def _consumed(self, where: str, f: str, r: dict, pub: Published) -> tuple[int, int, bool]:
        """(memory bytes, gpu milli, whole) the result takes; no consumedCapacity on a shared GPU = all of it."""
        cc = r.get("consumedCapacity")
        if not pub.shareable or not cc:
            return pub.memory_bytes, GPU_MILLI, True
        if not isinstance(cc, dict):
            raise PrepareError(f"{where}: {f}.consumedCapacity must be a map, got {cc!r}", reason="InvalidAllocation")
        vals = {}
        for key in ("memory", "gpuMilli"):
            raw = cc.get(key, cc.get(f"{self.driver}/{key}"))
            if raw is None:
                continue
            try:
                vals[key] = parse_quantity(raw)
            except ValueError:
                raise PrepareError(f"{where}: {f}.consumedCapacity.{key} is not a quantity: {raw!r}",
                                   reason="InvalidAllocation") from None
            if vals[key] < 0:
                raise PrepareError(f"{where}: {f}.consumedCapacity.{key} is negative: {raw!r}", reason="InvalidAllocation")
        mem = vals.get("memory", pub.memory_bytes)
        milli = vals.get("gpuMilli", 0)
        if mem > pub.memory_bytes or milli > GPU_MILLI:
            raise PrepareError(f"{where}: {f}.consumedCapacity ({mem} bytes, {milli} gpuMilli) exceeds device {pub.name} "
                               f"({pub.memory_bytes} bytes, {GPU_MILLI} gpuMilli)", reason="InvalidAllocation")
        return mem, milli, mem >= pub.memory_bytes

    def _check_free(self, namespace: str, name: str, uid: str, wanted: list[PreparedDevice]) -> None:
        """Refuse what another prepared claim holds (call with the checkpoint's lock held)."""
        held: dict[str, _Held] = {}
        for c in self.state.all():
            if c.uid == uid:
                continue
            for d in c.devices:
                if d.admin:
                    continue
                h = held.setdefault(d.device, _Held())
                h.memory_bytes += d.memory_bytes
                h.gpu_milli += d.gpu_milli
                h.holders.append(f"{c.key} (uid {c.uid})")
                if d.whole:
                    h.whole_by = f"{c.key} (uid {c.uid})"
        published, _ = self.inventory()
        for d in wanted:
            if d.admin:
                continue
            h = held.setdefault(d.device, _Held())
            pub = published.get(d.device)
            cap_mem = pub.memory_bytes if pub else d.memory_bytes
            clash = ""
            if h.holders and (d.whole or h.whole_by or not (pub and pub.shareable)):
                clash = "it holds the device" if not h.whole_by else "it holds the whole device"
            elif h.memory_bytes + d.memory_bytes > cap_mem:
                clash = f"memory: {h.memory_bytes >> 20} MiB held + {d.memory_bytes >> 20} MiB asked > {cap_mem >> 20} MiB"
            elif h.gpu_milli + d.gpu_milli > GPU_MILLI:
                clash = f"gpuMilli: {h.gpu_milli} held + {d.gpu_milli} asked > {GPU_MILLI}"
            if clash:
                self.refused += 1
                others = h.whole_by or ", ".join(h.holders)
                raise PrepareError(
                    f"ResourceClaim {namespace}/{name} (uid {uid}) was allocated device {d.device} (pool {d.pool}), but "
                    f"ResourceClaim {others} is already prepared on it ({clash}); refusing to prepare it twice "
                    "(two allocators chose the same device?)", reason="DeviceAlreadyAllocated")
            h.memory_bytes += d.memory_bytes
            h.gpu_milli += d.gpu_milli
            h.holders.append(f"{namespace}/{name} (uid {uid})")
            if d.whole:
                h.whole_by = f"{namespace}/{name} (uid {uid})"

    def _with_cdi(self, claim: PreparedClaim) -> list[PreparedDevice]:
        """The request's CDI device ID on its first device only: a container using the request gets it once."""
        seen: set[str] = set()
        out = []
        for d in claim.devices:
            ids: tuple[str, ...] = ()
            if d.request not in seen:
                seen.add(d.request)
                ids = (cdi_id(claim.uid, d.request),)
            out.append(PreparedDevice(d.request, d.pool, d.device, d.uuid, d.gpu_index, d.memory_bytes, d.gpu_milli, d.whole,
                                      d.share_id, d.admin, ids))
        return out

    def _report(self, claim: dict, ref: dict, exc: PrepareError) -> None:
        log.warning("%s", exc.message)
        self.events.post(ref, "Warning", exc.reason, exc.message)
        for r in (claim.get("status") or {}).get("reservedFor") or []:
            if isinstance(r, dict) and r.get("resource") == "pods" and r.get("name"):
                self.events.post({"apiVersion": "v1", "kind": "Pod", "namespace": ref["namespace"], "name": r["name"],
                                  "uid": r.get("uid")}, "Warning", exc.reason, exc.message)

    # --- unprepare ----------------------------------------------------------------------
    def unprepare(self, namespace: str, uid: str, name: str) -> None:
        with self.state.lock:
            gone = self.state.remove(uid)
            self.cdi.remove(uid)
        if gone is not None:
            log.info("unprepared ResourceClaim %s/%s (%s)", namespace, name, uid)

    def clean_orphans(self) -> list[str]:
        """CDI specs left by a crash between writing the spec and the checkpoint: removed."""
        with self.state.lock:
            keep = {c.uid for c in self.state.all()}
            orphans = self.cdi.orphans(keep)
            for u in orphans:
                self.cdi.remove(u)
        if orphans:
            log.info("removed %d CDI spec(s) of claims not prepared: %s", len(orphans), ", ".join(orphans))
        return orphans


def _taint_of(driver: str, fault: Fault) -> dict:
    return fault_taints(driver, fault)[0]


__all__ = ["EventSink", "PrepareError", "Preparer", "base_request", "tolerates"]
