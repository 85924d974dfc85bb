"""The real-node tier: a real kubelet + containerd v2 (CDI) + kube-controller-manager beside a real kube-apiserver +
etcd, with gpufleet's agent (fake NVML backend) as the device plugin and gpufleet's scheduler binding pods.

Runs only when asked, because it changes host state: ``GPUFLEET_E2E_BIN`` names the folder ``scripts/build-k8s.sh``
builds (kubelet, kube-controller-manager, kubectl, containerd v2, and the control plane with an etcd link, which
also serves as ``KUBEBUILDER_ASSETS`` unless that is set); the recipe is the project's own ``tests/e2e/recipe``
(``GPUFLEET_E2E_RECIPE`` overrides it); root, runc and the CNI plugins. Otherwise every test here is skipped with the
reason. A real node uses fixed ports and host state, so only one may run on a machine::

    sudo GPUFLEET_E2E_BIN=$(scripts/build-k8s.sh --print-dir 1.37.2) python3 -m pytest tests/e2e
"""

from __future__ import annotations

from pathlib import Path

import pytest

from .locations import locations, why_not


def e2e_env() -> tuple[dict[str, str], str]:
    """(locations, why not) -- why not is '' when the tier can run."""
    loc = locations()
    return loc, why_not(loc)


def pytest_configure(config):
    config.addinivalue_line("markers", "e2e: needs a real node (GPUFLEET_E2E_BIN, the recipe, root)")


def pytest_collection_modifyitems(config, items):
    here = Path(__file__).parent
    _, why = e2e_env()
    for item in items:
        if here in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.e2e)
            if why:
                item.add_marker(pytest.mark.skip(reason=why))
