"""What the kubelet plugin has prepared, checkpointed so that no restart loses a prepared claim.

kubelet calls ``NodeUnprepareResources`` with the claim's identity only (namespace,
name, UID), possibly after the claim object is gone, and expects both calls to
be idempotent; after an agent restart it may also call prepare again for a claim
already prepared.  So every prepared claim (its devices, the capacity each one
consumes, its CDI device IDs) goes to one JSON file, replaced atomically
(write, fsync, rename) before kubelet is told the claim is prepared.  The same
record is what the double-allocation check counts against.  An unreadable
checkpoint is moved aside (``.corrupt-<time>``) and reported, never silently
overwritten.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ...files import replace_atomically

log = logging.getLogger(__name__)

CHECKPOINT_VERSION = 1


@dataclass(frozen=True)
class PreparedDevice:
    request: str  # the base request name (before "/" of a firstAvailable subrequest)
    pool: str
    device: str
    uuid: str  # GPU or MIG UUID handed to the container
    gpu_index: int
    memory_bytes: int  # consumed (the whole device's unless a share)
    gpu_milli: int  # consumed compute (1000 = whole)
    whole: bool  # holds the device exclusively
    share_id: str = ""
    admin: bool = False  # adminAccess: may overlap any other claim
    cdi_ids: tuple[str, ...] = ()


@dataclass
class PreparedClaim:
    uid: str
    namespace: str
    name: str
    devices: list[PreparedDevice] = field(default_factory=list)
    prepared_s: float = 0.0

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


def _device(d: dict) -> PreparedDevice:
    return PreparedDevice(str(d["request"]), str(d["pool"]), str(d["device"]), str(d.get("uuid", "")), int(d.get("gpu_index", -1)),
                          int(d.get("memory_bytes", 0)), int(d.get("gpu_milli", 0)), bool(d.get("whole", True)),
                          str(d.get("share_id", "")), bool(d.get("admin", False)), tuple(str(x) for x in d.get("cdi_ids", ())))


class Checkpoint:
    """Prepared claims by UID, persisted to ``path``. Thread-safe."""

    def __init__(self, path: str | os.PathLike, driver: str, node: str) -> None:
        self.path = Path(path)
        self.driver = driver
        self.node = node
        self.lock = threading.RLock()
        self.claims: dict[str, PreparedClaim] = {}
        self.load()

    def load(self) -> None:
        try:
            data = json.loads(self.path.read_text())
        except FileNotFoundError:
            return
        except (OSError, ValueError) as exc:
            self._set_aside(f"unreadable ({exc})")
            return
        try:
            if not isinstance(data, dict) or data.get("version") != CHECKPOINT_VERSION:
                raise ValueError(f"version {data.get('version') if isinstance(data, dict) else None!r}, "
                                 f"this agent reads {CHECKPOINT_VERSION}")
            claims = {}
            for uid, c in (data.get("claims") or {}).items():
                claims[str(uid)] = PreparedClaim(str(uid), str(c["namespace"]), str(c["name"]),
                                                 [_device(d) for d in c.get("devices") or []], float(c.get("prepared_s", 0.0)))
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            self._set_aside(f"malformed ({exc!r})")
            return
        self.claims = claims
        if data.get("node") not in (None, self.node):
            log.warning("DRA checkpoint %s was written on node %s, this is %s: its %d claim(s) are kept as prepared",
                        self.path, data.get("node"), self.node, len(claims))

    def _set_aside(self, why: str) -> None:
        aside = self.path.with_name(f"{self.path.name}.corrupt-{int(time.time())}")
        try:
            os.replace(self.path, aside)
            log.error("DRA checkpoint %s is %s; moved to %s and starting without it: claims it held may be prepared "
                      "again when kubelet asks", self.path, why, aside)
        except OSError as exc:
            log.error("DRA checkpoint %s is %s and cannot be moved aside (%s)", self.path, why, exc)

    def save(self) -> None:
        """Atomic replace; raises OSError so that a claim is never reported prepared without its record."""
        with self.lock:
            data = {"version": CHECKPOINT_VERSION, "driver": self.driver, "node": self.node,
                    "claims": {uid: {"namespace": c.namespace, "name": c.name, "prepared_s": c.prepared_s,
                                     "devices": [asdict(d) for d in c.devices]} for uid, c in sorted(self.claims.items())}}
            self.path.parent.mkdir(parents=True, exist_ok=True)
            replace_atomically(self.path, json.dumps(data, sort_keys=True), fsync=True)

    def get(self, uid: str) -> PreparedClaim | None:
        with self.lock:
            return self.claims.get(uid)

    def put(self, claim: PreparedClaim) -> None:
        with self.lock:
            old = self.claims.get(claim.uid)
            self.claims[claim.uid] = claim
            try:
                self.save()
            except OSError:
                if old is None:
                    del self.claims[claim.uid]
                else:
                    self.claims[claim.uid] = old
                raise

    def remove(self, uid: str) -> PreparedClaim | None:
        with self.lock:
            old = self.claims.pop(uid, None)
            if old is not None:
                try:
                    self.save()
                except OSError:
                    self.claims[uid] = old
                    raise
            return old

    def all(self) -> list[PreparedClaim]:
        with self.lock:
            return list(self.claims.values())


__all__ = ["CHECKPOINT_VERSION", "Checkpoint", "PreparedClaim", "PreparedDevice"]
