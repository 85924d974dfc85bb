"""Where the real-node tier finds its parts: one place, so the tier, the extender harness and the benches agree.

The project carries its own real-node recipe (``tests/e2e/recipe``: control plane, containerd v2 with CDI, kubelet
config for these VMs, teardown) and builds every binary with ``scripts/build-k8s.sh`` into
``~/.cache/gpufleet/k8s/v<release>/bin``; that one folder holds the control plane, kubelet, kube-controller-manager,
kubectl and containerd. The tier runs only when asked (``GPUFLEET_E2E_BIN`` names that folder), never by accident
from the plain test command, because it changes host state.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
RECIPE_DEFAULT = REPO / "tests" / "e2e" / "recipe"
NODE_BINARIES = ("kubelet", "kube-controller-manager", "kubectl", "containerd", "containerd-shim-runc-v2", "ctr")
CONTROL_PLANE_BINARIES = ("kube-apiserver", "etcd", "kube-scheduler")


def locations() -> dict[str, str]:
    """bin (the node's binaries), assets (the control plane's: KUBEBUILDER_ASSETS, default the same folder), recipe."""
    b = os.environ.get("GPUFLEET_E2E_BIN", "")
    assets = os.environ.get("KUBEBUILDER_ASSETS", "") or b
    recipe = os.environ.get("GPUFLEET_E2E_RECIPE", "") or str(RECIPE_DEFAULT)
    return {"bin": b, "assets": assets, "recipe": recipe}


def why_not(loc: dict[str, str] | None = None) -> str:
    """Why the real-node tier cannot run here ('' when it can)."""
    loc = loc or locations()
    b, assets, recipe = loc["bin"], loc["assets"], Path(loc["recipe"])
    if not b:
        return ("GPUFLEET_E2E_BIN not set (the folder scripts/build-k8s.sh prints with --print-dir: kubelet, "
                "kube-controller-manager, kubectl, containerd v2)")
    missing = [f"{d}/{n}" for d, names in ((b, NODE_BINARIES), (assets, CONTROL_PLANE_BINARIES))
               for n in names if not (Path(d) / n).exists()]
    if missing:
        return f"real-node binaries missing: {', '.join(missing)} (run scripts/build-k8s.sh)"
    if not (recipe / "cp-up.sh").is_file() or not (recipe / "node-down.sh").is_file():
        return f"no real-node recipe at {recipe} (cp-up.sh, node-down.sh; set GPUFLEET_E2E_RECIPE)"
    if os.geteuid() != 0:
        return "the real-node tier needs root (kubelet, containerd, device nodes)"
    if shutil.which("runc") is None:
        return "runc not on PATH (apt-get install runc)"
    if not Path("/usr/lib/cni/bridge").exists():
        return "CNI plugins missing (apt-get install containernetworking-plugins)"
    return ""
