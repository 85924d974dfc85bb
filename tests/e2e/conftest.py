"""The real-node tier: a real kubelet + containerd + kube-controller-manager beside a real kube-apiserver + etcd,
with gpufleet's agent (fake NVML backend) as the device plugin and gpufleet's scheduler binding pods.

Runs only when every part is named, as the envtest tier does with ``KUBEBUILDER_ASSETS``:

* ``GPUFLEET_E2E_BIN``: a folder with ``kubelet``, ``kube-controller-manager`` and ``kubectl`` (v1.28);
* ``KUBEBUILDER_ASSETS``: a folder with ``kube-apiserver``, ``etcd`` and ``kube-scheduler``;
* ``GPUFLEET_E2E_RECIPE``: the real-node recipe (``shared/e2e``: cp-up.sh, containerd/CNI/kubelet templates, the
  busybox/pause image, run-e2e.sh for the teardown); default ``../shared/e2e`` beside the checkout when present;
* root, ``containerd``, ``runc``, ``ctr``.

Otherwise every test here is skipped with the reason.  A real node uses fixed ports and host state, so only one may
run on a machine: ``GPUFLEET_E2E_LOCK`` names a lock file to hold (flock) while the node is up.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def e2e_env() -> tuple[dict[str, str], str]:
    """(locations, why not) -- why not is '' when the tier can run."""
    b = os.environ.get("GPUFLEET_E2E_BIN", "")
    assets = os.environ.get("KUBEBUILDER_ASSETS", "")
    recipe = os.environ.get("GPUFLEET_E2E_RECIPE", "") or str(REPO.parent / "shared" / "e2e")
    loc = {"bin": b, "assets": assets, "recipe": recipe}
    if not b:
        return loc, "GPUFLEET_E2E_BIN (kubelet, kube-controller-manager, kubectl) not set"
    missing = [f"{d}/{n}" for d, names in ((b, ("kubelet", "kube-controller-manager", "kubectl")),
                                            (assets, ("kube-apiserver", "etcd", "kube-scheduler")))
               for n in names if not (Path(d) / n).exists()]
    if not assets or missing:
        return loc, f"KUBEBUILDER_ASSETS / GPUFLEET_E2E_BIN incomplete: missing {missing or ['KUBEBUILDER_ASSETS']}"
    if not (Path(recipe) / "cp-up.sh").is_file() or not (Path(recipe) / "run-e2e.sh").is_file():
        return loc, f"no real-node recipe at {recipe} (set GPUFLEET_E2E_RECIPE)"
    if os.geteuid() != 0:
        return loc, "the real-node tier needs root (kubelet, containerd, device nodes)"
    for tool in ("containerd", "runc", "ctr"):
        if shutil.which(tool) is None:
            return loc, f"{tool} not on PATH"
    return loc, ""


def pytest_configure(config):
    config.addinivalue_line("markers", "e2e: needs a real node (GPUFLEET_E2E_BIN, KUBEBUILDER_ASSETS, the recipe, root)")


def pytest_collection_modifyitems(config, items):
    here = Path(__file__).parent
    _, why = e2e_env()
    for item in items:
        if here in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.e2e)
            if why:
                item.add_marker(pytest.mark.skip(reason=why))
