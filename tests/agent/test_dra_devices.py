"""DRA devices: NVIDIA's attribute names and types, consumable-capacity shares, MIG, taints, the API's limits."""

from __future__ import annotations

import os
import re
from dataclasses import replace

import pytest

from gpufleet.agent.dra.devices import (DraOptions, Fault, build_devices, gpu_capacity, parse_quantity, pci_bus_id, pcie_root,
                                        quantity_bytes, semver)
from gpufleet.agent.nvml import PROFILES

DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
C_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# what NVIDIA's gpu-kubelet-plugin publishes for a whole GPU (deviceinfo.go) and a MIG device (mig.go), by type
NVIDIA_GPU = {"type": "string", "uuid": "string", "productName": "string", "brand": "string", "architecture": "string",
              "cudaComputeCapability": "version", "driverVersion": "version", "cudaDriverVersion": "version"}
NVIDIA_MIG = {**NVIDIA_GPU, "parentUUID": "string", "profile": "string"}


def devices(profile: str, **opts):
    drv, gpus = PROFILES[profile]
    return build_devices(gpus, drv, DraOptions(**opts))


def attr(dev: dict, name: str):
    (kind, value), = dev["attributes"][name].items()
    return kind, value


def test_whole_gpu_has_nvidias_names_types_and_formats():
    ds = devices("h100-nvlink")
    assert [d["name"] for d in ds.devices] == [f"gpu-{i}" for i in range(8)]
    d = ds.devices[5]
    for name, kind in NVIDIA_GPU.items():
        assert attr(d, name)[0] == kind, name
    assert attr(d, "type") == ("string", "gpu")
    assert attr(d, "uuid") == ("string", "GPU-h100-05")
    assert attr(d, "productName") == ("string", "NVIDIA H100 80GB HBM3")
    assert attr(d, "architecture") == ("string", "Hopper") and attr(d, "brand") == ("string", "Nvidia")
    assert attr(d, "cudaComputeCapability") == ("version", "9.0.0")
    assert attr(d, "driverVersion") == ("version", "550.90.7")  # strict semver: no leading zero
    assert attr(d, "cudaDriverVersion") == ("version", "12.4.0")
    assert attr(d, "resource.kubernetes.io/pciBusID") == ("string", "0000:68:00.0")
    assert attr(d, "resource.kubernetes.io/numaNode") == ("int", 1)
    assert d["capacity"]["memory"]["value"] == "81559Mi"


def test_mig_instances_replace_their_gpu_and_name_parent_and_profile():
    ds = devices("a100-mig")
    names = [d["name"] for d in ds.devices]
    assert "gpu-0" not in names and "gpu-1" not in names  # GPUs in MIG mode publish their instances only
    assert names[:7] == [f"gpu-0-mig-1g10gb-{k}" for k in range(7)]
    assert names[7:10] == ["gpu-1-mig-3g40gb-0", "gpu-1-mig-2g20gb-1", "gpu-1-mig-2g20gb-2"]
    mig = ds.devices[8]
    for name, kind in NVIDIA_MIG.items():
        assert attr(mig, name)[0] == kind, name
    assert attr(mig, "type") == ("string", "mig")
    assert attr(mig, "parentUUID") == ("string", "GPU-a100-01")
    assert attr(mig, "profile") == ("string", "2g.20gb")
    assert attr(mig, "uuid") == ("string", "MIG-a100-1-1")
    assert mig["capacity"] == {"memory": {"value": "19968Mi"}, "gpu.nvidia.com/memory": {"value": "19968Mi"}}
    assert "allowMultipleAllocations" not in mig  # a MIG instance is exclusive
    p = ds.published["gpu-1-mig-2g20gb-1"]
    assert (p.kind, p.gpu_index, p.uuid, p.parent_uuid, p.shareable) == ("mig", 1, "MIG-a100-1-1", "GPU-a100-01", False)


def test_shares_are_consumable_capacity_whole_gpu_by_default():
    d = devices("t4").devices[0]
    assert d["allowMultipleAllocations"] is True
    mem, milli = d["capacity"]["memory"], d["capacity"]["gpuMilli"]
    assert mem["value"] == "15Gi"
    # no request: all the memory (a claim asking nothing gets the whole GPU); min 1Mi so nothing fits beside it
    assert mem["requestPolicy"] == {"default": "15Gi", "validRange": {"min": "1Mi", "max": "15Gi", "step": "1Mi"}}
    assert milli == {"value": "1000", "requestPolicy": {"default": "0", "validRange": {"min": "0", "max": "1000", "step": "1"}}}


def test_no_shares_means_exclusive_devices():
    d = devices("t4", shares=False, nvidia_attributes=False).devices[0]
    assert "allowMultipleAllocations" not in d
    assert d["capacity"] == {"memory": {"value": "15Gi"}}
    assert not devices("t4", shares=False).published["gpu-0"].shareable


def test_nvidia_mirror_attributes_and_a_capacity_shares_never_consume():
    d = devices("t4").devices[0]  # on by default: a claim written for NVIDIA's driver changes only its class name
    assert attr(d, "gpu.nvidia.com/productName") == ("string", "Tesla T4")
    assert attr(d, "gpu.nvidia.com/type") == ("string", "gpu")
    assert "gpu.nvidia.com/index" not in d["attributes"]  # only NVIDIA's own names are mirrored
    assert d["capacity"]["gpu.nvidia.com/memory"]["requestPolicy"]["default"] == "0"
    plain = devices("t4", nvidia_attributes=False).devices[0]
    assert not any(k.startswith("gpu.nvidia.com/") for k in plain["attributes"])


@pytest.mark.parametrize("profile", sorted(PROFILES))
@pytest.mark.parametrize("mirror", [False, True])
def test_every_device_is_within_the_apis_limits(profile, mirror):
    ds = devices(profile, nvidia_attributes=mirror)
    assert len(ds.devices) == len({d["name"] for d in ds.devices})
    for d in ds.devices:
        assert DNS_LABEL.match(d["name"]) and len(d["name"]) <= 63
        assert len(d["attributes"]) + len(d["capacity"]) <= 32  # ResourceSliceMaxAttributesAndCapacitiesPerDevice
        for q in list(d["attributes"]) + list(d["capacity"]):
            ident = q.rsplit("/", 1)[-1]
            assert C_IDENT.match(ident), q
        for a in d["attributes"].values():
            assert len(a) == 1
            if "string" in a:
                assert len(a["string"]) <= 64
            if "version" in a:
                assert re.match(r"^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)$", a["version"])


def test_a_fatal_xid_taints_the_gpu_and_its_mig_instances_recovery_removes_it():
    drv, gpus = PROFILES["a100-mig"]
    faults = {1: Fault("XID 79", "2026-11-26T10:00:00Z"), 3: Fault("NVML cannot query the device", "2026-11-26T10:01:00Z")}
    ds = build_devices(gpus, drv, DraOptions(), faults)
    by = {d["name"]: d for d in ds.devices}
    xid = [{"key": "gpu.gpufleet.io/xid", "value": "79", "effect": "NoSchedule", "timeAdded": "2026-11-26T10:00:00Z"}]
    assert by["gpu-1-mig-3g40gb-0"]["taints"] == xid and by["gpu-1-mig-2g20gb-2"]["taints"] == xid
    assert by["gpu-3"]["taints"] == [{"key": "gpu.gpufleet.io/gpu-lost", "effect": "NoSchedule",
                                      "timeAdded": "2026-11-26T10:01:00Z"}]
    assert all("taints" not in d for n, d in by.items() if not n.startswith(("gpu-1-", "gpu-3")))
    assert all("taints" not in d for d in build_devices(gpus, drv, DraOptions(), {}).devices)


def test_pcie_root_comes_from_sysfs(tmp_path):
    sysfs = tmp_path / "sys"
    dev = sysfs / "devices" / "pci0000:17" / "0000:17:01.0" / "0000:18:00.0"
    dev.mkdir(parents=True)
    (sysfs / "bus" / "pci" / "devices").mkdir(parents=True)
    os.symlink("../../../devices/pci0000:17/0000:17:01.0/0000:18:00.0", sysfs / "bus" / "pci" / "devices" / "0000:18:00.0")
    assert pcie_root("0000:18:00.0", str(sysfs)) == "pci0000:17"
    assert pcie_root("0000:19:00.0", str(sysfs)) is None  # no such device: no attribute, not an error
    drv, gpus = PROFILES["h100-nvlink"]
    ds = build_devices(gpus, drv, DraOptions(sysfs_root=str(sysfs)))
    assert attr(ds.devices[0], "resource.kubernetes.io/pcieRoot") == ("string", "pci0000:17")
    assert "resource.kubernetes.io/pcieRoot" not in ds.devices[1]["attributes"]


def test_no_numa_affinity_no_numa_attribute_and_bad_bus_id_no_pci_attributes():
    drv, gpus = PROFILES["t4"]
    g = replace(gpus[0], numa_node=-1, pci_bus_id="garbage")
    d = build_devices([g], drv).devices[0]
    assert not any(k.startswith("resource.kubernetes.io/") for k in d["attributes"])


def test_helpers():
    assert [quantity_bytes(b) for b in (0, 80 << 30, 81559 << 20, 1000, 1536)] == ["0", "80Gi", "81559Mi", "1000", "1536"]
    assert [parse_quantity(q) for q in ("20Gi", "1k", "21474836480", "1.5e3", "500m", 7)] == [20 << 30, 1000, 20 << 30, 1500, 1, 7]
    for bad in ("20 Gi", "Gi", "", None, True, "1.2.3"):
        with pytest.raises(ValueError):
            parse_quantity(bad)
    assert [semver(v) for v in ("535.161.08", "8.0", "12", "x.1", "1.2.3.4")] == ["535.161.8", "8.0.0", "12.0.0", None, None]
    assert [pci_bus_id(b) for b in ("00000000:3B:00.0", "0000:07:00.0", "07:00.0")] == ["0000:3b:00.0", "0000:07:00.0", None]
    assert gpu_capacity(1 << 30, False) == {"memory": {"value": "1Gi"}}
