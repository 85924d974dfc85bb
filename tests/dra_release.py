"""What the DRA tests expect of a Kubernetes release.

Kubernetes 1.35 serves ``resource.k8s.io/v1`` (whole devices, MIG-style partitions published as devices,
``matchAttribute``, prioritized lists, admin access) but keeps consumable capacity (``DRAConsumableCapacity``),
device taints (``DRADeviceTaints``) and extended resources backed by DRA (``DRAExtendedResource``) behind alpha
gates, off by default; 1.36 turns them on.  The tests check on each release what that release serves, and on 1.35
that gpufleet degrades as docs/dra.md says, rather than skipping.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import yaml

ROOT = Path(__file__).parents[1]
FULL = (1, 36)  # the first release whose default gates serve every DRA feature gpufleet uses
# the shipped DeviceClass files `kubectl apply -k deploy/dra` installs; deploy/overlays/dra-k8s-1.35 leaves out the
# last two (tests/agent/test_dra_deploy.py checks that the overlay renders exactly BASE_CLASSES)
BASE_CLASSES = ["deploy/dra/deviceclasses.yaml"]
FULL_CLASSES = [*BASE_CLASSES, "deploy/dra/shares/deviceclass.yaml", "deploy/dra/extended-resource/deviceclass.yaml"]


def release_of(binary: Path) -> tuple[int, int]:
    """``(major, minor)`` a Kubernetes binary reports (``--version``), (0, 0) when it cannot say."""
    try:
        out = subprocess.run([str(binary), "--version"], capture_output=True, text=True, timeout=60).stdout
    except OSError:
        return (0, 0)
    m = re.search(r"v(\d+)\.(\d+)", out)
    return (int(m.group(1)), int(m.group(2))) if m else (0, 0)


def full_dra(release: tuple[int, int]) -> bool:
    return release >= FULL


def device_class_files(release: tuple[int, int]) -> list[str]:
    return FULL_CLASSES if full_dra(release) else BASE_CLASSES


def device_classes(release: tuple[int, int]) -> list[dict]:
    """The shipped DeviceClasses a user of that release applies (with its default feature gates)."""
    return [d for p in device_class_files(release) for d in yaml.safe_load_all((ROOT / p).read_text()) if d]


def all_device_classes() -> list[dict]:
    return [d for p in FULL_CLASSES for d in yaml.safe_load_all((ROOT / p).read_text()) if d]
