"""Which of the DRA fields the agent publishes the API server actually keeps.

kube-apiserver drops a field whose feature gate is off when it stores an
object, without an error.  Two of the fields the agent writes are behind gates
that are alpha (off) in Kubernetes 1.35 and beta (on) since 1.36:

- ``devices[].allowMultipleAllocations`` and capacity ``requestPolicy``
  (``DRAConsumableCapacity``): GPU shares.  Without them every device is
  exclusive to one claim, whatever the agent meant;
- ``devices[].taints`` (``DRADeviceTaints``): how an unhealthy GPU is kept
  from new claims.  Without them an allocator would hand out a GPU that
  fell off the bus.

So the agent asks, with a dry-run create of a one-device slice that uses both
(nothing is stored), and checks every slice it writes for the same loss.
What is not served is not published: GPUs become exclusive whole devices (no
``gpuMilli``, no share class can match them) and an unhealthy GPU is left out
of the slice instead of being tainted, so no allocator, kube-scheduler's or
gpufleet's, is ever shown something it cannot honour.  Each missing feature is
said once, in the log and as a Node Event naming the gate that turns it on.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Feature:
    name: str  # what the operator reads: "consumable capacity"
    gate: str
    field: str  # the ResourceSlice field the API server drops without the gate
    without: str  # what the agent does while it is not served
    components: str  # where the gate must be on


CONSUMABLE_CAPACITY = Feature(
    "consumable capacity", "DRAConsumableCapacity", "spec.devices[].allowMultipleAllocations",
    "GPU shares are off: every GPU is published as one exclusive device",
    "kube-apiserver and kube-scheduler")
DEVICE_TAINTS = Feature(
    "device taints", "DRADeviceTaints", "spec.devices[].taints",
    "an unhealthy GPU is left out of the ResourceSlices instead of being tainted",
    "kube-apiserver and kube-scheduler")
FEATURES = (CONSUMABLE_CAPACITY, DEVICE_TAINTS)


@dataclass(frozen=True)
class Served:
    """What the API server keeps; both True until it says otherwise."""

    consumable_capacity: bool = True
    device_taints: bool = True

    def has(self, f: Feature) -> bool:
        return self.consumable_capacity if f is CONSUMABLE_CAPACITY else self.device_taints

    def without(self, f: Feature) -> Served:
        return Served(self.consumable_capacity and f is not CONSUMABLE_CAPACITY, self.device_taints and f is not DEVICE_TAINTS)


def not_served_message(f: Feature) -> str:
    return (f"kube-apiserver does not serve DRA {f.name} (it drops ResourceSlice {f.field}; feature gate {f.gate}, "
            f"alpha and off in Kubernetes 1.35, beta and on since 1.36): {f.without}. To turn it on: "
            f"--feature-gates={f.gate}=true on {f.components}")


def served_again_message(f: Feature) -> str:
    return f"kube-apiserver now serves DRA {f.name} ({f.gate}): published again"


def probe_slice(node: str, driver: str) -> dict:
    """A one-device slice using every gated field the agent writes, for a dry-run create (never stored)."""
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
            "metadata": {"generateName": "gpufleet-probe-"},
            "spec": {"driver": driver, "nodeName": node, "pool": {"name": node, "generation": 0, "resourceSliceCount": 1},
                     "devices": [{"name": "probe", "allowMultipleAllocations": True,
                                  "capacity": {"memory": {"value": "1Gi", "requestPolicy": {
                                      "default": "1Gi", "validRange": {"min": "1Mi", "max": "1Gi", "step": "1Mi"}}}},
                                  "taints": [{"key": f"{driver}/probe", "effect": "NoSchedule"}]}]}}


def lost(sent: list[dict], got: list[dict]) -> list[Feature]:
    """The features whose fields ``sent`` devices carried and the stored ``got`` devices (same names) lack."""
    by_name = {d.get("name"): d for d in got if isinstance(d, dict)}
    out: list[Feature] = []
    for d in sent:
        g = by_name.get(d.get("name"))
        if g is None:
            continue
        if d.get("allowMultipleAllocations") and not g.get("allowMultipleAllocations") and CONSUMABLE_CAPACITY not in out:
            out.append(CONSUMABLE_CAPACITY)
        if d.get("taints") and not g.get("taints") and DEVICE_TAINTS not in out:
            out.append(DEVICE_TAINTS)
    return out


def served_by_probe(sent: dict, got: dict) -> Served:
    """What a dry-run create of ``probe_slice`` returned says is served."""
    missing = lost((sent.get("spec") or {}).get("devices") or [], (got.get("spec") or {}).get("devices") or [])
    if not ((got.get("spec") or {}).get("devices")):
        raise ValueError("the dry-run create returned no devices")
    return Served(CONSUMABLE_CAPACITY not in missing, DEVICE_TAINTS not in missing)


__all__ = ["CONSUMABLE_CAPACITY", "DEVICE_TAINTS", "FEATURES", "Feature", "Served", "lost", "not_served_message",
           "probe_slice", "served_again_message", "served_by_probe"]
