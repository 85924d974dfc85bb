"""bench/device_check.py end to end against the fake NVML backend and a fake nvidia-smi (tests/bench/fake_nvidia_smi.py).

The GPU run itself needs a GPU machine (docs/agent.md, "Checking the real NVML path on a GPU"); here the
same comparisons run with both sides faked independently, so that the check must find them equal when they
agree, and report FAIL with both values when the fake nvidia-smi is told to disagree.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))
import device_check as dc  # noqa: E402

FAST = ["--samples", "3", "--sample-interval-s", "0.1", "--scrapes", "5", "--xid-wait-s", "0.3", "--warmup-s", "0.2",
        "--scrape-p95-ms", "5000"]  # a shared 2-core test box: the latency budget is the GPU machine's to meet
NUMA = {"a100-mig": [(0x07 + i * 8, 0 if i < 4 else 1) for i in range(8)], "t4": [(0x3B + i, 0) for i in range(4)]}


def fake_dev_and_proc(tmp_path: Path, profile: str, leave_out: tuple[str, ...] = (), minors: dict[int, int] | None = None) -> None:
    """/dev/nvidia* (plain files: a test cannot mknod) and /proc/driver/nvidia/gpus/*/information for the profile."""
    dev = tmp_path / "dev"
    dev.mkdir(exist_ok=True)
    for k, (bus, _node) in enumerate(NUMA[profile]):
        info = tmp_path / "proc/driver/nvidia/gpus" / f"0000:{bus:02x}:00.0"
        info.mkdir(parents=True, exist_ok=True)
        (info / "information").write_text(f"Model: \t\t fake\nIRQ:   \t\t 42\nDevice Minor: \t {(minors or {}).get(k, k)}\n")
        (dev / f"nvidia{k}").touch()
    for name in ("nvidiactl", "nvidia-uvm", "nvidia-uvm-tools"):
        (dev / name).touch()
    for name in leave_out:
        (dev / name).unlink()


def run_check(tmp_path: Path, profile: str, mutate: str = "", extra: list[str] | None = None,
              leave_out: tuple[str, ...] = (), minors: dict[int, int] | None = None) -> tuple[int, str, dict]:
    fake_dev_and_proc(tmp_path, profile, leave_out, minors)
    smi = tmp_path / "nvidia-smi"
    smi.write_text(f"#!/bin/sh\nexec {sys.executable} {ROOT / 'tests/bench/fake_nvidia_smi.py'} \"$@\"\n")
    smi.chmod(0o755)
    for bus, node in NUMA[profile]:
        d = tmp_path / "sys/bus/pci/devices" / f"0000:{bus:02x}:00.0"
        d.mkdir(parents=True, exist_ok=True)
        (d / "numa_node").write_text(f"{node}\n")
    out = tmp_path / "out"
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"), FAKE_NVIDIA_SMI_PROFILE=profile, FAKE_NVIDIA_SMI_MUTATE=mutate,
               FAKE_NVIDIA_SMI_STATE=str(tmp_path / "smi-calls"))
    env.pop("GPUFLEET_FAKE_PROCESSES", None)
    p = subprocess.run([sys.executable, str(ROOT / "bench/device_check.py"), "--nvml", f"fake:{profile}", "--nvidia-smi", str(smi),
                        "--sysfs-root", str(tmp_path / "sys"), "--dev-root", str(tmp_path / "dev"), "--proc-root", str(tmp_path / "proc"),
                        "--out", str(out), *FAST, *(extra or [])],
                       capture_output=True, text=True, timeout=300, env=env)
    doc = json.loads((out / "device_check.json").read_text()) if (out / "device_check.json").exists() else {}
    return p.returncode, p.stdout + p.stderr, doc


def rows(doc: dict) -> dict[str, dict]:
    return {f"{r['section']}: {r['check']}": r for r in doc["rows"]}


@pytest.mark.parametrize("profile", ["a100-mig", "t4"])
def test_check_passes_when_gpufleet_and_nvidia_smi_agree(tmp_path, profile):
    rc, out, doc = run_check(tmp_path, profile)
    assert rc == 0, out
    r = rows(doc)
    assert not [k for k, v in r.items() if v["status"] == "FAIL"], out
    for key in ("discovery: UUID", "discovery: model", "discovery: memory total (MiB)", "discovery: MIG mode",
                "discovery: compute capability", "discovery: NVLink peers", "discovery: NUMA node", "discovery: gpufleet agent --once",
                "xid: XID listener waits without error", "metrics: GPU utilisation (DCGM_FI_DEV_GPU_UTIL)",
                "metrics: memory used (DCGM_FI_DEV_FB_USED)", "metrics: power (DCGM_FI_DEV_POWER_USAGE)",
                "processes: load's pid in NVML's process list", "processes: load's memory (per process)",
                "processes: load's SM utilisation (per process)", "pods: load pod's memory (FB_USED{pod=load})",
                "pods: idle pod on the same GPU gets nothing", "agent: /metrics scrape time",
                "agent: stops cleanly on SIGTERM, no error logged", "safety: device settings unchanged",
                "container: device nodes handed to containers exist (before the load)",
                "container: device nodes handed to containers exist (after the load)", "container: each GPU's /dev/nvidiaN",
                "container: Allocate names the GPU (NVIDIA_VISIBLE_DEVICES)", "container: CDI spec names the GPU (NVIDIA_VISIBLE_DEVICES)",
                "dra: device gpu-N published", "dra: uuid", "dra: productName", "dra: architecture", "dra: cudaComputeCapability",
                "dra: driverVersion", "dra: cudaDriverVersion", "dra: gpu.nvidia.com/ attributes mirror them",
                "dra: resource.kubernetes.io/pciBusID", "dra: capacity memory (bytes)"):
        assert r[key]["status"] == "PASS", (key, r[key])
    mig = r["discovery: MIG instances (profile, UUID)"]
    if profile == "a100-mig":  # GPUs 0-1 in MIG mode: the load goes to GPU 2, the MIG instances match nvidia-smi -L
        assert mig["status"] == "PASS" and "1g.10gb MIG-a100-0-0" in mig["gpufleet"]
        assert doc["load"]["gpu"] == 2 and r["discovery: NVLink peers"]["gpufleet"] == "GPU 0: [1, 2, 3, 4, 5, 6, 7]"
    else:
        assert mig["status"] == "SKIP" and r["discovery: MIG mode"]["reference"] == "GPU 0: not capable"
    # the load's figures are on both sides of the table, and the JSON carries the samples and tolerances
    assert r["metrics: GPU utilisation (DCGM_FI_DEV_GPU_UTIL)"]["gpufleet"] == "97%" == r["metrics: GPU utilisation (DCGM_FI_DEV_GPU_UTIL)"]["reference"]
    assert r["pods: load pod's memory (FB_USED{pod=load})"]["gpufleet"] == "4096 MiB"
    assert len(doc["samples"]) == 3 and doc["tolerances"]["gpu_util_pct"] == 10 and doc["summary"]["FAIL"] == 0
    assert "passed, 0 failed" in out and "|" in out
    assert r["container: a CUDA process given it sees that GPU alone"]["status"] == "SKIP"  # no CUDA with the fake backend
    assert r["shares: MPS enforces a share's memory limit"]["status"] == "SKIP"
    loaded = doc["load"]["gpu"]
    assert r["container: Allocate names the GPU (NVIDIA_VISIBLE_DEVICES)"]["gpufleet"] == f"GPU-{profile.split('-')[0]}-{loaded:02d}"


def test_a_device_node_containers_are_given_but_the_node_lacks_fails(tmp_path):
    """nvidia-uvm absent (the module not loaded): every container given it would fail to start, so the check says so;
    and a GPU whose /dev/nvidiaN is not the driver's own minor number is a FAIL too."""
    rc, out, doc = run_check(tmp_path, "t4", leave_out=("nvidia-uvm",), minors={1: 7})
    assert rc == 1, out
    r = rows(doc)
    for when in ("before", "after"):
        row = r[f"container: device nodes handed to containers exist ({when} the load)"]
        assert row["status"] == "FAIL" and row["reference"] == f"missing: {tmp_path / 'dev' / 'nvidia-uvm'}", row
    minor = r["container: each GPU's /dev/nvidiaN"]
    assert minor["status"] == "FAIL" and (minor["gpufleet"], minor["reference"]) == ("GPU 1: /dev/nvidia1", "GPU 1: Device Minor 7"), minor
    assert r["container: Allocate names the GPU (NVIDIA_VISIBLE_DEVICES)"]["status"] == "PASS"
    assert doc["summary"]["FAIL"] == 3


def test_check_reports_every_difference_as_fail_with_both_values(tmp_path):
    rc, out, doc = run_check(tmp_path, "a100-mig", mutate="uuid:3,power:+80,peers,settings")
    assert rc == 1, out
    r = rows(doc)
    uuid = r["discovery: UUID"]
    assert uuid["status"] == "FAIL" and uuid["gpufleet"] == "GPU 3: GPU-a100-03" and uuid["reference"] == "GPU 3: GPU-somebody-else"
    power = r["metrics: power (DCGM_FI_DEV_POWER_USAGE)"]
    assert power["status"] == "FAIL" and (power["gpufleet"], power["reference"]) == ("351 W", "431 W"), power
    assert r["discovery: NVLink peers"]["status"] == "FAIL" and r["discovery: NVLink peers"]["reference"] == "GPU 0: []"
    settings = r["safety: device settings unchanged"]
    assert settings["status"] == "FAIL" and "persistence_mode: Enabled -> Disabled" in settings["gpufleet"]
    # what agrees still passes
    assert r["discovery: model"]["status"] == "PASS" and r["metrics: GPU utilisation (DCGM_FI_DEV_GPU_UTIL)"]["status"] == "PASS"
    dra_uuid = r["dra: uuid"]  # what the ResourceSlice would say differs from nvidia-smi on the same GPU
    assert dra_uuid["status"] == "FAIL" and dra_uuid["reference"] == "GPU 3: GPU-somebody-else", dra_uuid
    assert doc["summary"]["FAIL"] == 5 and "5 failed" in out


def test_real_backend_without_a_gpu_fails_with_nvml_s_reason(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    p = subprocess.run([sys.executable, str(ROOT / "bench/device_check.py"), "--out", str(tmp_path), "--nvidia-smi", "/nonexistent/nvidia-smi"],
                       capture_output=True, text=True, timeout=120, env=env)
    doc = json.loads((tmp_path / "device_check.json").read_text())
    try:
        import pynvml

        pynvml.nvmlInit()
        pytest.skip("this machine has an NVIDIA driver: the check would run for real")
    except Exception:
        pass
    assert p.returncode == 1 and doc["rows"][-1]["check"] == "NVML" and doc["rows"][-1]["status"] == "FAIL"
    assert "no NVIDIA GPU/driver found" in doc["rows"][-1]["note"] and "Traceback" not in p.stdout + p.stderr


def test_bad_usage_exits_2(tmp_path):
    p = subprocess.run([sys.executable, str(ROOT / "bench/device_check.py"), "--nvml", "fake-t4"], capture_output=True, text=True,
                       timeout=60, env=dict(os.environ, PYTHONPATH=str(ROOT / "src")))
    assert p.returncode == 2 and "--nvml must be 'real' or fake:PROFILE" in p.stderr and "Traceback" not in p.stderr


# --- the parsers, on nvidia-smi output shapes the fake does not produce ------------------------------


def test_parse_query_reads_older_and_newer_power_readings_and_na():
    old = ("<nvidia_smi_log><driver_version>470.1</driver_version><cuda_version>11.4</cuda_version><gpu id=\"00000000:01:00.0\">"
           "<uuid>GPU-x</uuid><mig_mode><current_mig>N/A</current_mig></mig_mode><power_readings><power_draw>70.50 W</power_draw>"
           "<power_limit>250.00 W</power_limit></power_readings><utilization><gpu_util>N/A</gpu_util></utilization></gpu></nvidia_smi_log>")
    g = dc.parse_query(old)["gpus"][0]
    assert (g["power_w"], g["power_source"], g["gpu_util_pct"], g["mig_current"]) == (70.5, "power_readings/power_draw", None, None)
    assert g["settings"]["power_limit"] == "250.00 W"
    new = ("<nvidia_smi_log><gpu id=\"00000000:18:00.0\"><gpu_power_readings><power_draw>[N/A]</power_draw>"
           "<average_power_draw>120.00 W</average_power_draw><instant_power_draw>131.00 W</instant_power_draw>"
           "<current_power_limit>700.00 W</current_power_limit></gpu_power_readings></gpu></nvidia_smi_log>")
    g = dc.parse_query(new)["gpus"][0]
    assert (g["power_w"], g["power_source"], g["settings"]["power_limit"]) == (120.0, "gpu_power_readings/average_power_draw", "700.00 W")


def test_parse_topo_one_gpu_and_nvswitch_matrix():
    one = "\x1b[4m\tGPU0\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\x1b[0m\nGPU0\t X \t0-31\t0\t\tN/A\n\nLegend:\n  X    = Self\n"
    assert dc.parse_topo(one) == {0: set()}
    two = ("\tGPU0\tGPU1\tNIC0\tCPU Affinity\tNUMA Affinity\nGPU0\t X \tNV18\tSYS\t0-55\t0\nGPU1\tNV18\t X \tSYS\t56-111\t1\n"
           "NIC0\tSYS\tSYS\t X\n")
    assert dc.parse_topo(two) == {0: {1}, 1: {0}}
    with pytest.raises(ValueError):
        dc.parse_topo("no topology here\n")


def test_parse_pmon_and_list():
    pmon = ("# gpu         pid   type     sm    mem    enc    dec    command\n# Idx           #    C/G      %      %      %      %    name\n"
            "    0      4242     C     98     40      -      -    python3\n    0      4243     C      -      -      -      -    idle\n")
    assert dc.parse_pmon(pmon) == {4242: 98.0, 4243: None}
    listed = ("GPU 0: NVIDIA A100-SXM4-40GB (UUID: GPU-aaaa)\n  MIG 3g.20gb     Device  0: (UUID: MIG-bbbb)\n"
              "  MIG 1c.3g.20gb  Device  1: (UUID: MIG-cccc)\nGPU 1: NVIDIA A100-SXM4-40GB (UUID: GPU-dddd)\n")
    assert dc.parse_list(listed) == {"GPU-aaaa": [("3g.20gb", "MIG-bbbb"), ("1c.3g.20gb", "MIG-cccc")], "GPU-dddd": []}


def test_ptx_load_is_valid_ptx_where_ptxas_is_available(tmp_path):
    """The PTX the GPU run JITs: assembled for Volta and Hopper when a ptxas is around (pip's nvidia-cuda-nvcc has one)."""
    import shutil

    ptxas = shutil.which("ptxas") or next((str(p) for p in Path.home().glob(".cache/gpufleet/ptxas/**/bin/ptxas")), None)
    if ptxas is None:
        pytest.skip("no ptxas here")
    src = tmp_path / "burn.ptx"
    src.write_text(dc.PTX)
    for arch in ("sm_70", "sm_90"):
        p = subprocess.run([ptxas, f"-arch={arch}", str(src), "-o", str(tmp_path / f"{arch}.cubin")], capture_output=True, text=True)
        assert p.returncode == 0, p.stderr
