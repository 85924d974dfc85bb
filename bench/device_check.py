"""The node agent's real NVML path on a real GPU, compared with nvidia-smi (issue 40).

Why: every test tier runs the fake NVML backend, so nothing else shows that
what the agent reads through NVML (discovery, telemetry, per-process
attribution, XID events) is what the driver says. This check does, in one run
of about a minute on a GPU machine (``bash bench/device_check.sh``, which
installs the project first):

1. discovery (``NvmlBackend().gpus()``/``driver()`` and ``gpufleet agent --once``)
   against ``nvidia-smi -q -x``, ``-L``, ``topo -m``, ``--query-gpu=compute_cap``
   and sysfs: UUID, model, memory, minor number, MIG mode and instances,
   compute capability, NVLink peers, NUMA node, driver and CUDA versions;
2. the XID listener: registers, waits its timeout, no error;
3. a known CUDA load on one GPU (PyTorch bf16 matmul loop, or without PyTorch a
   PTX FMA loop through libcuda, which needs no download) while the real
   ``gpufleet agent`` process serves ``/metrics``: GPU utilisation, memory used,
   power, temperature and SM clock against nvidia-smi (medians of interleaved
   samples, tolerances in ``TOL``); the load's process in NVML's per-process
   accounting against nvidia-smi's process list and ``pmon``; what the exporter
   attributes to a pod holding the load's process on a GPU shared with an idle
   pod; what the cgroup resolver would name for that process on this host;
4. what the DRA driver publishes for each whole GPU (uuid, productName,
   architecture, cudaComputeCapability, driver versions, PCI bus id, memory
   capacity: what claims select on) against nvidia-smi;
5. what a container is given for one GPU: the device plugin's ``Allocate``
   answer (kubelet's choice, no pod) and a DRA claim's CDI spec name its UUID,
   every device node they hand the runtime exists here as that character
   device (``/dev/nvidiaN``'s minor against ``/proc/driver/nvidia``; a missing
   ``nvidia-uvm`` would fail every container start), and a CUDA process given
   that environment sees that GPU and no other;
6. a GPU share (half the compute, ``--share-mib`` of memory: the environment
   of a DRA share's CDI spec) under a real MPS control daemon, started and quit
   by the check: the client is an MPS client and cannot allocate past its limit;
7. the scrape time of the agent's ``/metrics``, the agent's health gauge, a
   clean SIGTERM, and that no device setting changed (MIG mode, persistence,
   compute mode, power limit, application clocks, ECC). The check itself never
   runs a command that changes one: nvidia-smi is only queried.

Output: a PASS/FAIL/SKIP table with gpufleet's value and the reference on each
row, and with ``--out`` (default ``$OUT``) ``device_check.json`` plus the raw
nvidia-smi XML and the agent's and the load's logs. Exit status 1 when a row
failed, 2 for bad usage.

``--nvml fake:PROFILE --nvidia-smi FAKE`` runs the same comparisons against the
fake backend and a fake nvidia-smi (``tests/bench/test_device_check.py``).
"""

from __future__ import annotations

import argparse
import ctypes
import importlib
import importlib.util
import json
import os
import platform
import re
import shutil
import select
import signal
import socket
import stat
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import xml.etree.ElementTree as ET
from dataclasses import asdict, dataclass
from typing import Any, Callable

# Tolerances: gpufleet's figure vs nvidia-smi's. Identity fields (UUID, model, MIG, versions, peers) must be equal.
TOL: dict[str, Any] = {
    "memory_total_mib": 1,  # rounding of bytes -> MiB
    "gpu_util_pct": 10,  # medians of interleaved samples; both sample the same NVML counter at different moments
    "fb_used_mib": 64,  # the load holds its memory steady
    "power_w": {"abs": 25.0, "rel": 0.10},  # max of the two; power moves within a second under load
    "temp_c": 3,
    "sm_clock_rel": 0.10,
    "process_memory_mib": 16,
    "process_sm_util_pct": 20,  # NVML's per-process samples vs pmon's, a few seconds apart
    "load_min_util_pct": 80,  # the load must show as a busy GPU
    "scrape_p95_ms": 50.0,  # the exporter's budget (bench/bench_exporter.py, issue 7)
}
# project dependencies this check needs at run time (`gpufleet agent` without API access); the others (kubernetes,
# scipy, ...) only other commands
CHECK_NEEDS = ("nvidia-ml-py", "prometheus-client", "grpcio", "protobuf", "pyyaml", "numpy")  # numpy: the CLI parser loads the engine
INDIRECT_NEEDS = ("typing-extensions",)  # grpcio's own requirement, installed with it from an index, not from a folder of wheels
MIB = 1024 * 1024
ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


# --- results ------------------------------------------------------------------------------------


@dataclass
class Row:
    section: str
    check: str
    status: str  # PASS FAIL SKIP INFO
    gpufleet: str
    reference: str
    note: str = ""


class Report:
    def __init__(self) -> None:
        self.rows: list[Row] = []
        self.data: dict[str, Any] = {}

    def add(self, section: str, check: str, status: str, ours: Any = "", ref: Any = "", note: str = "") -> Row:
        row = Row(section, check, status, _s(ours), _s(ref), note)
        self.rows.append(row)
        return row

    def num(self, section: str, check: str, ours: float | None, ref: float | None, tol: float, unit: str = "",
            note: str = "") -> Row:
        """|ours - ref| <= tol; SKIP when either side has no figure."""
        if ours is None or ref is None:
            missing = "gpufleet" if ours is None else "nvidia-smi"
            return self.add(section, check, "SKIP", _fmt(ours, unit), _fmt(ref, unit), f"{missing} reports no figure. {note}".strip())
        ok = abs(ours - ref) <= tol + 1e-9
        return self.add(section, check, "PASS" if ok else "FAIL", _fmt(ours, unit), _fmt(ref, unit),
                        f"|diff| {abs(ours - ref):.4g} {'<=' if ok else '>'} {tol:g}{unit}. {note}".strip())

    def per_gpu(self, section: str, check: str, items: list[tuple[int, Any, Any, bool | None]], note: str = "") -> Row:
        """One row for a field over every GPU: (gpu index, ours, reference, equal; None = no reference)."""
        known = [it for it in items if it[3] is not None]
        if not known:
            shown = items[0] if items else (0, "", "", None)
            return self.add(section, check, "SKIP", shown[1], shown[2], note or "no reference value")
        bad = [it for it in known if not it[3]]
        shown = bad[0] if bad else known[0]
        label = f"GPU {shown[0]}: " if len(items) > 1 else ""
        if bad:
            more = f" (and {len(bad) - 1} more)" if len(bad) > 1 else ""
            return self.add(section, check, "FAIL", label + _s(shown[1]), label + _s(shown[2]),
                            f"GPU {bad[0][0]}{more} differ of {len(known)}. {note}".strip())
        return self.add(section, check, "PASS", label + _s(shown[1]), label + _s(shown[2]),
                        (f"all {len(known)} GPUs equal. " if len(known) > 1 else "") + note)

    @property
    def failed(self) -> bool:
        return any(r.status == "FAIL" for r in self.rows)

    def counts(self) -> dict[str, int]:
        out = {k: 0 for k in ("PASS", "FAIL", "SKIP", "INFO")}
        for r in self.rows:
            out[r.status] += 1
        return out

    def table(self, width: int = 46) -> str:
        def cut(v: str, n: int) -> str:
            v = v.replace("\n", " ")
            return v if len(v) <= n else v[: n - 1] + "…"

        head = ("status", "check", "gpufleet", "reference (nvidia-smi)", "note")
        body = [(r.status, f"{r.section}: {r.check}", cut(r.gpufleet, width), cut(r.reference, width), cut(r.note, 160))
                for r in self.rows]
        w = [max(len(x[i]) for x in [head, *body]) for i in range(4)]
        lines = [" | ".join(h.ljust(w[i]) if i < 4 else h for i, h in enumerate(head))]
        lines.append("-+-".join("-" * n for n in w) + "-+------")
        lines += [" | ".join(c.ljust(w[i]) if i < 4 else c for i, c in enumerate(row)) for row in body]
        c = self.counts()
        lines.append(f"{c['PASS']} passed, {c['FAIL']} failed, {c['SKIP']} skipped, {c['INFO']} info")
        return "\n".join(lines)


def _s(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.4g}"
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_s(x) for x in v) + "]"
    return str(v)


def _fmt(v: float | None, unit: str) -> str:
    return "-" if v is None else f"{v:.4g}{unit}"


def _median(xs: list[float | None]) -> float | None:
    vals = [x for x in xs if x is not None]
    return statistics.median(vals) if vals else None


# --- nvidia-smi -----------------------------------------------------------------------------------


class SmiError(RuntimeError):
    pass


class Smi:
    """nvidia-smi, queried only: no argument that changes a device setting is ever passed."""

    def __init__(self, cmd: str) -> None:
        self.cmd = cmd

    def run(self, *args: str, timeout_s: float = 60.0) -> str:
        try:
            p = subprocess.run([self.cmd, *args], capture_output=True, text=True, timeout=timeout_s)
        except FileNotFoundError:
            raise SmiError(f"{self.cmd}: not found") from None
        except subprocess.TimeoutExpired:
            raise SmiError(f"{self.cmd} {' '.join(args)}: no answer in {timeout_s:.0f} s") from None
        if p.returncode != 0:
            msg = (p.stderr or p.stdout).strip().splitlines()
            raise SmiError(f"{self.cmd} {' '.join(args)}: exit {p.returncode}: {msg[-1] if msg else ''}")
        return p.stdout

    def query(self) -> tuple[dict[str, Any], str]:
        text = self.run("-q", "-x")
        return parse_query(text), text


def _num(text: str | None) -> float | None:
    """'81559 MiB' -> 81559.0, '97 %' -> 97.0, 'N/A' / '[Not Supported]' -> None."""
    if text is None:
        return None
    m = re.match(r"\s*(-?\d+(?:\.\d+)?)", text)
    return float(m.group(1)) if m else None


def _t(el: ET.Element | None, path: str) -> str | None:
    if el is None:
        return None
    x = el.find(path)
    if x is None or x.text is None:
        return None
    v = x.text.strip()
    return None if v in ("N/A", "[N/A]", "[Not Supported]", "Not Supported", "") else v


def parse_query(text: str) -> dict[str, Any]:
    """``nvidia-smi -q -x`` -> driver, CUDA and per-GPU dicts (absent or N/A values are None)."""
    root = ET.fromstring(text)
    gpus = []
    for g in root.findall("gpu"):
        power_el = "gpu_power_readings" if g.find("gpu_power_readings") is not None else "power_readings"
        power_src, power = None, None
        for tag in ("power_draw", "average_power_draw", "instant_power_draw"):
            v = _num(_t(g, f"{power_el}/{tag}"))
            if v is not None:
                power_src, power = tag, v
                break
        procs = []
        for p in g.findall("processes/process_info"):
            procs.append({"pid": int(_num(_t(p, "pid")) or -1), "type": _t(p, "type"), "name": _t(p, "process_name"),
                          "used_memory_mib": _num(_t(p, "used_memory")), "gpu_instance_id": _t(p, "gpu_instance_id")})
        gpus.append({
            "bus_id": g.get("id") or _t(g, "pci/pci_bus_id") or "",
            "name": _t(g, "product_name"),
            "architecture": _t(g, "product_architecture"),
            "uuid": _t(g, "uuid"),
            "minor_number": None if _num(_t(g, "minor_number")) is None else int(_num(_t(g, "minor_number")) or 0),
            "mig_current": _t(g, "mig_mode/current_mig"),
            "mig_pending": _t(g, "mig_mode/pending_mig"),
            "fb_total_mib": _num(_t(g, "fb_memory_usage/total")),
            "fb_reserved_mib": _num(_t(g, "fb_memory_usage/reserved")),
            "fb_used_mib": _num(_t(g, "fb_memory_usage/used")),
            "fb_free_mib": _num(_t(g, "fb_memory_usage/free")),
            "gpu_util_pct": _num(_t(g, "utilization/gpu_util")),
            "mem_util_pct": _num(_t(g, "utilization/memory_util")),
            "temp_c": _num(_t(g, "temperature/gpu_temp")),
            "power_w": power,
            "power_source": f"{power_el}/{power_src}" if power_src else None,
            "sm_clock_mhz": _num(_t(g, "clocks/sm_clock")),
            "processes": procs,
            "settings": {
                "mig_current": _t(g, "mig_mode/current_mig"), "mig_pending": _t(g, "mig_mode/pending_mig"),
                "persistence_mode": _t(g, "persistence_mode"), "compute_mode": _t(g, "compute_mode"),
                "power_limit": _t(g, f"{power_el}/current_power_limit") or _t(g, f"{power_el}/power_limit"),
                "enforced_power_limit": _t(g, f"{power_el}/enforced_power_limit"),
                "applications_clocks": [_t(g, "applications_clocks/graphics_clock"), _t(g, "applications_clocks/mem_clock")],
                "ecc_current": _t(g, "ecc_mode/current_ecc"), "ecc_pending": _t(g, "ecc_mode/pending_ecc"),
            },
        })
    return {"driver_version": _t(root, "driver_version"), "cuda_version": _t(root, "cuda_version"),
            "attached_gpus": _num(_t(root, "attached_gpus")), "gpus": gpus}


def parse_list(text: str) -> dict[str, list[tuple[str, str]]]:
    """``nvidia-smi -L`` -> GPU UUID -> [(MIG profile, MIG UUID)]."""
    out: dict[str, list[tuple[str, str]]] = {}
    cur = None
    for line in text.splitlines():
        m = re.match(r"\s*GPU \d+: .* \(UUID: (\S+?)\)", line)
        if m:
            cur = m.group(1)
            out[cur] = []
            continue
        m = re.match(r"\s+MIG (\S+)\s+Device\s+\d+: \(UUID: (\S+?)\)", line)
        if m and cur is not None:
            out[cur].append((m.group(1), m.group(2)))
    return out


def parse_topo(text: str) -> dict[int, set[int]]:
    """``nvidia-smi topo -m`` -> GPU -> GPUs it reaches over NVLink (``NV<n>`` in the matrix)."""
    lines = [ANSI.sub("", ln) for ln in text.splitlines()]
    # the header names the GPUs; a matrix row starts with its GPU and holds an X (itself)
    head = next((ln for ln in lines if "GPU0" in ln.split() and "X" not in ln.split()), None)
    if head is None:
        raise ValueError("no GPU header line")
    cols = [int(c[3:]) for c in head.split() if re.fullmatch(r"GPU\d+", c)]
    out: dict[int, set[int]] = {}
    for ln in lines:
        parts = ln.split()
        if parts and re.fullmatch(r"GPU\d+", parts[0]):
            cells = parts[1:1 + len(cols)]
            out[int(parts[0][3:])] = {cols[k] for k, c in enumerate(cells) if c.startswith("NV")}
    return out


def parse_pmon(text: str) -> dict[int, float | None]:
    """``nvidia-smi pmon -c 1 -s u`` -> pid -> SM % (None for '-')."""
    cols: list[str] = []
    out: dict[int, float | None] = {}
    for ln in text.splitlines():
        parts = ln.split()
        if not parts:
            continue
        if parts[0] == "#":
            if not cols and "pid" in parts:
                cols = parts[1:]
            continue
        if not cols or len(parts) < len(cols) - 1:
            continue
        row = dict(zip(cols, parts))
        try:
            pid = int(row["pid"])
        except (KeyError, ValueError):
            continue
        out[pid] = _num(row.get("sm")) if row.get("sm") not in (None, "-") else None
    return out


def pci_key(bus_id: str) -> tuple[int, int, int, int]:
    try:
        dom, bus, rest = bus_id.strip().split(":")
        dev, fn = rest.split(".")
        return int(dom, 16), int(bus, 16), int(dev, 16), int(fn, 16)
    except ValueError:
        return (-1, -1, -1, -1)


def sysfs_numa(root: str, bus_id: str) -> int | None:
    d, b, dev, fn = pci_key(bus_id)
    try:
        with open(os.path.join(root, "bus", "pci", "devices", f"{d:04x}:{b:02x}:{dev:02x}.{fn:x}", "numa_node")) as f:
            return int(f.read().strip())
    except (OSError, ValueError):
        return None


def _char_device(path: str) -> tuple[str, int, int] | None:
    """("char", major, minor) of a character device, ("file", 0, 0) for another kind of file, None when absent."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    if stat.S_ISCHR(st.st_mode):
        return "char", os.major(st.st_rdev), os.minor(st.st_rdev)
    return "file", 0, 0


def _proc_minor(proc_root: str, bus_id: str) -> int | None:
    """The driver's own "Device Minor" of the GPU at ``bus_id`` (/proc/driver/nvidia/gpus/<bus>/information)."""
    base = os.path.join(proc_root, "driver", "nvidia", "gpus")
    try:
        names = os.listdir(base)
    except OSError:
        return None
    want = pci_key(bus_id)
    for n in names:
        try:
            if pci_key(n) != want:
                continue
            with open(os.path.join(base, n, "information")) as f:
                m = re.search(r"^Device Minor:\s*(\d+)", f.read(), re.M)
            return int(m.group(1)) if m else None
        except (OSError, ValueError):
            continue
    return None


def cuda_uuids() -> int:
    """Print the UUIDs of the GPUs CUDA shows this process (CUDA_VISIBLE_DEVICES applies) as a JSON list."""
    cu = ctypes.CDLL("libcuda.so.1")
    if cu.cuInit(0) != 0:
        print("cuInit failed", file=sys.stderr)
        return 1
    n = ctypes.c_int()
    if cu.cuDeviceGetCount(ctypes.byref(n)) != 0:
        print("cuDeviceGetCount failed", file=sys.stderr)
        return 1
    out = []
    for i in range(n.value):
        dev, raw = ctypes.c_int(), (ctypes.c_ubyte * 16)()
        if cu.cuDeviceGet(ctypes.byref(dev), i) != 0 or cu.cuDeviceGetUuid(raw, dev) != 0:
            print(f"cuDeviceGet/cuDeviceGetUuid({i}) failed", file=sys.stderr)
            return 1
        h = bytes(raw).hex()
        out.append(f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}")
    print(json.dumps(out))
    return 0


def cuda_mem_probe(sizes_mib: list[int]) -> int:
    """Try to allocate each size in turn (kept while the next is tried); print {"alloc": [[MiB, CUDA result]], ...}
    as one JSON line, then hold the context a moment so nvidia-smi can list the process."""
    cu = ctypes.CDLL("libcuda.so.1")
    res = cu.cuInit(0)
    dev, ctx = ctypes.c_int(), ctypes.c_void_p()
    if res == 0:
        res = cu.cuDeviceGet(ctypes.byref(dev), 0) or cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev) or cu.cuCtxSetCurrent(ctx)
    if res != 0:
        print(f"CUDA context: error {res}", file=sys.stderr)
        return 1
    free, total = ctypes.c_size_t(), ctypes.c_size_t()
    cu.cuMemGetInfo_v2(ctypes.byref(free), ctypes.byref(total))
    out, held = [], []
    for mib in sizes_mib:
        ptr = ctypes.c_uint64()
        r = cu.cuMemAlloc_v2(ctypes.byref(ptr), ctypes.c_size_t(mib * MIB))
        out.append([mib, r])
        if r == 0:
            held.append(ptr)
            cu.cuMemsetD8_v2(ptr, ctypes.c_ubyte(1), ctypes.c_size_t(mib * MIB))
    print(json.dumps({"alloc": out, "total_mib": total.value // MIB, "free_mib": free.value // MIB}), flush=True)
    time.sleep(3)
    for ptr in held:
        cu.cuMemFree_v2(ptr)
    return 0


# --- loads (run in a child process: ``device_check.py --run-load KIND``) ------------------------------

PTX = r"""
.version 7.0
.target sm_70
.address_size 64

.visible .entry burn(
    .param .u64 burn_out,
    .param .u32 burn_iters
)
{
    .reg .pred %p<2>;
    .reg .b32 %r<7>;
    .reg .f32 %f<5>;
    .reg .b64 %rd<5>;

    ld.param.u64 %rd1, [burn_out];
    ld.param.u32 %r1, [burn_iters];
    mov.u32 %r2, %ctaid.x;
    mov.u32 %r3, %ntid.x;
    mov.u32 %r4, %tid.x;
    mad.lo.s32 %r5, %r2, %r3, %r4;
    cvt.rn.f32.s32 %f1, %r5;
    mov.f32 %f2, 0f3F800000;
    mov.f32 %f3, 0f3F7FFF58;
    mov.u32 %r6, 0;
$L_loop:
    fma.rn.f32 %f1, %f1, %f3, %f2;
    fma.rn.f32 %f2, %f2, %f3, %f1;
    add.s32 %r6, %r6, 1;
    setp.lt.u32 %p1, %r6, %r1;
    @%p1 bra $L_loop;
    add.f32 %f4, %f1, %f2;
    cvta.to.global.u64 %rd2, %rd1;
    mul.wide.s32 %rd3, %r5, 4;
    add.s64 %rd4, %rd2, %rd3;
    st.global.f32 [%rd4], %f4;
    ret;
}
"""


def _ready(what: str, held_mib: int) -> None:
    print(json.dumps({"ready": True, "pid": os.getpid(), "what": what, "held_mib": held_mib}), flush=True)


def _load_torch(mib: int, seconds: float, stop: threading.Event) -> str:
    torch: Any = importlib.import_module("torch")
    if not torch.cuda.is_available():
        raise RuntimeError(f"torch {torch.__version__} sees no CUDA device")
    dev = torch.device("cuda:0")
    hold = torch.ones(mib * MIB, dtype=torch.uint8, device=dev)
    n = 8192
    a = torch.randn(n, n, device=dev, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=dev, dtype=torch.bfloat16)
    c = a @ b
    torch.cuda.synchronize()
    _ready(f"torch {torch.__version__}: bf16 {n}x{n} matmul loop on {torch.cuda.get_device_name(0)}", mib)
    t0, done = time.monotonic(), 0
    while not stop.is_set() and time.monotonic() - t0 < seconds:
        for _ in range(10):
            c = a @ b
        torch.cuda.synchronize()
        done += 10
    del hold, c
    return f"{done} matmuls, {2 * n**3 * done / (time.monotonic() - t0) / 1e12:.0f} TFLOP/s"


def _load_ptx(mib: int, seconds: float, stop: threading.Event) -> str:
    """An FMA loop in hand-written PTX through the CUDA driver API (libcuda.so.1, part of the driver)."""
    cu = ctypes.CDLL("libcuda.so.1")

    def ck(res: int, what: str) -> None:
        if res != 0:
            s = ctypes.c_char_p()
            cu.cuGetErrorString(res, ctypes.byref(s))
            raise RuntimeError(f"{what}: CUDA error {res} {(s.value or b'').decode()}")

    ck(cu.cuInit(0), "cuInit")
    dev, ctx = ctypes.c_int(), ctypes.c_void_p()
    ck(cu.cuDeviceGet(ctypes.byref(dev), 0), "cuDeviceGet")
    sms = ctypes.c_int()
    ck(cu.cuDeviceGetAttribute(ctypes.byref(sms), 16, dev), "cuDeviceGetAttribute(MULTIPROCESSOR_COUNT)")
    name = ctypes.create_string_buffer(256)
    ck(cu.cuDeviceGetName(name, 256, dev), "cuDeviceGetName")
    ck(cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev), "cuDevicePrimaryCtxRetain")
    ck(cu.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
    hold = ctypes.c_uint64()
    ck(cu.cuMemAlloc_v2(ctypes.byref(hold), ctypes.c_size_t(mib * MIB)), f"cuMemAlloc({mib} MiB)")
    ck(cu.cuMemsetD8_v2(hold, ctypes.c_ubyte(1), ctypes.c_size_t(mib * MIB)), "cuMemsetD8")
    log = ctypes.create_string_buffer(8192)
    opts = (ctypes.c_int * 2)(5, 6)  # CU_JIT_ERROR_LOG_BUFFER, CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES
    vals = (ctypes.c_void_p * 2)(ctypes.cast(log, ctypes.c_void_p), ctypes.c_void_p(8192))
    mod, fn = ctypes.c_void_p(), ctypes.c_void_p()
    res = cu.cuModuleLoadDataEx(ctypes.byref(mod), ctypes.c_char_p(PTX.encode()), 2, opts, vals)
    if res != 0:
        raise RuntimeError(f"PTX JIT failed (CUDA error {res}): {log.value.decode(errors='replace').strip()}")
    ck(cu.cuModuleGetFunction(ctypes.byref(fn), mod, b"burn"), "cuModuleGetFunction")
    blocks, threads = sms.value * 8, 256
    out = ctypes.c_uint64()
    ck(cu.cuMemAlloc_v2(ctypes.byref(out), ctypes.c_size_t(blocks * threads * 4)), "cuMemAlloc(out)")
    iters = ctypes.c_uint32(20_000)

    def launch() -> float:
        params = (ctypes.c_void_p * 2)(ctypes.cast(ctypes.byref(out), ctypes.c_void_p),
                                       ctypes.cast(ctypes.byref(iters), ctypes.c_void_p))
        t = time.perf_counter()
        ck(cu.cuLaunchKernel(fn, blocks, 1, 1, threads, 1, 1, 0, None, params, None), "cuLaunchKernel")
        ck(cu.cuCtxSynchronize(), "cuCtxSynchronize")
        return time.perf_counter() - t

    dt = launch()  # size one launch to about 50 ms, so that stopping is prompt
    iters.value = max(1000, min(2**31 - 1, int(iters.value * 0.05 / max(dt, 1e-6))))
    _ready(f"PTX FMA loop via libcuda on {name.value.decode()}: {blocks}x{threads} threads, {iters.value} iterations/launch", mib)
    t0, done = time.monotonic(), 0
    while not stop.is_set() and time.monotonic() - t0 < seconds:
        launch()
        done += 1
    cu.cuMemFree_v2(out)
    cu.cuMemFree_v2(hold)
    return f"{done} launches"


def _load_fake(mib: int, seconds: float, stop: threading.Event) -> str:
    _ready("fake load (a sleeping process; its GPU use comes from $GPUFLEET_FAKE_PROCESSES)", mib)
    stop.wait(seconds)
    return "slept"


def run_load(kind: str, mib: int, seconds: float) -> int:
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    fn = {"torch": _load_torch, "ptx": _load_ptx, "fake": _load_fake}[kind]
    try:
        summary = fn(mib, seconds, stop)
    except Exception as exc:  # the parent reports it; a traceback helps nobody on a remote machine
        print(json.dumps({"ready": False, "error": f"{type(exc).__name__}: {exc}"}), flush=True)
        return 1
    print(json.dumps({"done": summary}), flush=True)
    return 0


class Load:
    """The load as a child process; ``start`` returns once it holds its memory and computes."""

    def __init__(self, kind: str, target_uuid: str, mib: int, seconds: float, log_path: str) -> None:
        self.kind, self.target_uuid, self.mib, self.seconds, self.log_path = kind, target_uuid, mib, seconds, log_path
        self.proc: subprocess.Popen | None = None
        self.info: dict[str, Any] = {}

    def start(self, timeout_s: float = 180.0) -> None:
        env = dict(os.environ, CUDA_VISIBLE_DEVICES=self.target_uuid, CUDA_DEVICE_ORDER="PCI_BUS_ID", PYTHONUNBUFFERED="1")
        log = open(self.log_path, "a")
        self.proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--run-load", self.kind, "--load-mib", str(self.mib),
                                      "--load-seconds", str(self.seconds)], stdout=subprocess.PIPE, stderr=log, text=True, env=env)
        log.close()
        got: dict[str, Any] = {}

        def read() -> None:
            assert self.proc is not None and self.proc.stdout is not None
            for line in self.proc.stdout:
                try:
                    msg = json.loads(line)
                except ValueError:
                    continue
                if "ready" in msg:
                    got.update(msg)
                    return

        t = threading.Thread(target=read, daemon=True)
        t.start()
        t.join(timeout_s)
        if not got.get("ready"):
            self.stop()
            raise RuntimeError(got.get("error") or f"the {self.kind} load did not start in {timeout_s:.0f} s (log: {self.log_path})")
        self.info = got

    @property
    def pid(self) -> int:
        return int(self.info.get("pid", -1))

    def stop(self) -> str:
        if self.proc is None:
            return ""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            out, _ = self.proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            out, _ = self.proc.communicate()
        for line in (out or "").splitlines():
            try:
                return str(json.loads(line).get("done", ""))
            except ValueError:
                continue
        return ""


def pick_load(requested: str, fake: bool) -> tuple[str | None, str]:
    """(kind, why): the load to run, or None and the reason none can."""
    if fake:
        return "fake", "fake backend: the load is a process the fake backend is told about"
    if requested in ("torch", "ptx"):
        return requested, "asked for"
    if requested == "none":
        return None, "--load none"
    if importlib.util.find_spec("torch") is not None:
        return "torch", "PyTorch is installed"
    try:
        ctypes.CDLL("libcuda.so.1")
        return "ptx", "no PyTorch here: a PTX FMA loop through the driver's libcuda.so.1 (no download)"
    except OSError as exc:
        return None, f"no PyTorch and no libcuda.so.1 ({exc}): no CUDA load can run"


# --- the agent process -----------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def scrape(url: str, timeout_s: float = 10.0) -> tuple[float, dict[tuple[str, tuple[tuple[str, str], ...]], float]]:
    """GET /metrics -> (seconds, {(name, sorted labels): value})."""
    from prometheus_client.parser import text_string_to_metric_families

    t = time.perf_counter()
    with urllib.request.urlopen(url, timeout=timeout_s) as r:
        body = r.read().decode()
    dt = time.perf_counter() - t
    out = {}
    for fam in text_string_to_metric_families(body):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = float(s.value)
    return dt, out


def metric(samples: dict, name: str, **labels: str) -> float | None:
    vals = [v for (n, lab), v in samples.items() if n == name and all(dict(lab).get(k) == x for k, x in labels.items())]
    return vals[0] if len(vals) == 1 else (sum(vals) if vals else None)


class AgentProcess:
    def __init__(self, nvml_spec: str, workdir: str, log_path: str) -> None:
        self.port = _free_port()
        self.log_path = log_path
        self.url = f"http://127.0.0.1:{self.port}/metrics"
        cmd = [sys.executable, "-m", "gpufleet", "agent", "--nvml", nvml_spec, "--metrics-addr", f"127.0.0.1:{self.port}",
               "--device-plugin-dir", os.path.join(workdir, "dp"), "--state-dir", os.path.join(workdir, "state"),
               "--pod-resources-socket", os.path.join(workdir, "no-kubelet.sock"), "--no-labels", "--interval", "1"]
        os.makedirs(os.path.join(workdir, "dp"), exist_ok=True)
        env = {k: v for k, v in os.environ.items() if k != "NODE_NAME"}
        self.log = open(log_path, "w")
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, env=env, start_new_session=True)

    def wait_ready(self, timeout_s: float = 90.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"gpufleet agent exited {self.proc.returncode}: {self.tail()}")
            try:
                scrape(self.url, timeout_s=2)
                return
            except OSError:
                time.sleep(0.2)
        raise RuntimeError(f"gpufleet agent served no /metrics in {timeout_s:.0f} s: {self.tail()}")

    def tail(self, n: int = 3) -> str:
        self.log.flush()
        try:
            with open(self.log_path) as f:
                return " / ".join(ln.strip() for ln in f.read().splitlines()[-n:])
        except OSError:
            return ""

    def stop(self, timeout_s: float = 30.0) -> int | None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                return None
        self.log.close()
        return self.proc.returncode


# --- the check -------------------------------------------------------------------------------------


class Check:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.rep = Report()
        self.smi = Smi(args.nvidia_smi)
        self.fake = args.nvml.startswith("fake:")
        self.tmp = tempfile.mkdtemp(prefix="gpufleet-device-check-")
        self.out = args.out or None
        self.logdir = self.out or self.tmp
        if self.out:
            os.makedirs(self.out, exist_ok=True)
        self.tol = dict(TOL, scrape_p95_ms=args.scrape_p95_ms)
        self.be: Any = None
        self.smi0: dict[str, Any] = {}

    def save(self, name: str, text: str) -> None:
        with open(os.path.join(self.logdir, name), "w") as f:
            f.write(text)

    # --- steps
    def environment(self) -> bool:
        import gpufleet

        from gpufleet.agent.nvml import FakeBackend, NoGpuError, NvmlBackend

        try:
            import pynvml  # noqa: F401

            from importlib.metadata import version

            nvml_py = version("nvidia-ml-py")
        except Exception as exc:
            nvml_py = f"missing ({exc})"
        needed = missing_deps(check_only=True)
        others = [r for r in missing_deps(check_only=False) if r not in needed]
        self.rep.data["environment"] = {"python": sys.version.split()[0], "gpufleet": getattr(gpufleet, "__version__", "?"),
                                        "gpufleet_path": os.path.dirname(gpufleet.__file__), "nvidia_ml_py": nvml_py,
                                        "nvidia_smi": self.smi.cmd, "host": platform.node(), "missing_deps": needed + others}
        self.rep.add("env", "python / gpufleet / nvidia-ml-py", "INFO",
                     f"{sys.version.split()[0]} / {getattr(gpufleet, '__version__', '?')} / {nvml_py}", "",
                     ("not installed, and not needed here: " + ", ".join(others)) if others else "every dependency installed")
        if needed:
            self.rep.add("env", "dependencies this check needs", "FAIL", "missing: " + ", ".join(needed), "installed",
                         "bench/device_check.sh installs them (from DEVICE_CHECK_WHEELS without an index)")
        try:
            if self.fake:
                self.be = FakeBackend(self.args.nvml[5:])
            else:
                self.be = NvmlBackend()
        except (NoGpuError, ValueError) as exc:
            self.rep.add("discovery", "NVML", "FAIL", type(exc).__name__, "", str(exc))
            return False
        try:
            self.smi0, xml = self.smi.query()
            self.save("nvidia-smi-q.xml", xml)
        except (SmiError, ET.ParseError) as exc:
            self.rep.add("discovery", "nvidia-smi -q -x", "FAIL", "", str(exc), "nothing to compare with")
            return False
        return True

    def discovery(self) -> None:
        be, smi, S = self.be, self.smi0, "discovery"
        drv = be.driver()
        ours = be.gpus()
        self.rep.data["gpus"] = [asdict(g) for g in ours]
        self.rep.data["driver"] = asdict(drv)
        ref_n = len(smi["gpus"])
        self.rep.add(S, "GPU count", "PASS" if len(ours) == ref_n else "FAIL", len(ours), ref_n)
        self.rep.add(S, "driver version", "PASS" if drv.driver_version == smi["driver_version"] else "FAIL",
                     drv.driver_version, smi["driver_version"])
        cuda = f"{drv.cuda_version[0]}.{drv.cuda_version[1]}"
        self.rep.add(S, "CUDA version (driver)", "PASS" if cuda == smi["cuda_version"] else "FAIL", cuda, smi["cuda_version"])
        by_bus = {pci_key(g["bus_id"]): g for g in smi["gpus"]}
        pairs = [(g, by_bus.get(pci_key(g.pci_bus_id))) for g in ours]
        self.rep.per_gpu(S, "PCI bus id found by nvidia-smi", [(g.index, g.pci_bus_id, r["bus_id"] if r else None,
                                                                 True if r else False) for g, r in pairs])

        def field(check: str, f_ours: Callable, f_ref: Callable, eq: Callable = lambda a, b: a == b, note: str = "") -> None:
            items = []
            for g, r in pairs:
                a = f_ours(g)
                b = f_ref(g, r) if r is not None else None
                items.append((g.index, a, b, None if b is None else bool(eq(a, b))))
            self.rep.per_gpu(S, check, items, note)

        field("UUID", lambda g: g.uuid, lambda g, r: r["uuid"])
        field("model", lambda g: g.name, lambda g, r: r["name"])
        tol = self.tol["memory_total_mib"]
        field("memory total (MiB)", lambda g: g.memory_mib, lambda g, r: None if r["fb_total_mib"] is None else int(r["fb_total_mib"]),
              lambda a, b: abs(a - b) <= tol, f"tolerance {tol} MiB")
        field("device minor number (/dev/nvidiaN)", lambda g: g.dev_minor, lambda g, r: r["minor_number"])

        def mig_ref(g, r) -> str:
            cur = (r["mig_current"] or "").lower()
            return "not capable" if not cur else cur

        field("MIG mode", lambda g: "not capable" if not g.mig_capable else ("enabled" if g.mig_enabled else "disabled"), mig_ref)
        try:
            listed = parse_list(self.smi.run("-L"))
            if any(g.mig or listed.get(g.uuid) for g in ours):
                field("MIG instances (profile, UUID)", lambda g: sorted(f"{m.profile} {m.uuid}" for m in g.mig),
                      lambda g, r: sorted(f"{p} {u}" for p, u in listed.get(g.uuid, [])), note="from nvidia-smi -L")
            else:
                self.rep.add(S, "MIG instances (profile, UUID)", "SKIP", "none", "none (nvidia-smi -L)", "no GPU in MIG mode here")
        except SmiError as exc:
            self.rep.add(S, "MIG instances (profile, UUID)", "SKIP", "", "", str(exc))
        try:
            caps = {}
            for line in self.smi.run("--query-gpu=pci.bus_id,compute_cap", "--format=csv,noheader").splitlines():
                if "," in line:
                    bus, cap = (x.strip() for x in line.split(",", 1))
                    caps[pci_key(bus)] = cap
            field("compute capability", lambda g: f"{g.compute_capability[0]}.{g.compute_capability[1]}",
                  lambda g, r: caps.get(pci_key(g.pci_bus_id)), note="nvidia-smi --query-gpu=compute_cap")
        except SmiError as exc:
            self.rep.add(S, "compute capability", "SKIP", "", "", str(exc))
        try:
            topo = parse_topo(self.smi.run("topo", "-m"))
            field("NVLink peers", lambda g: sorted(g.nvlink_peers), lambda g, r: sorted(topo[g.index]) if g.index in topo else None,
                  note="NV# cells of nvidia-smi topo -m")
        except (SmiError, ValueError) as exc:
            self.rep.add(S, "NVLink peers", "SKIP", "", "", f"nvidia-smi topo -m: {exc}")
        field("NUMA node", lambda g: g.numa_node, lambda g, r: sysfs_numa(self.args.sysfs_root, g.pci_bus_id),
              lambda a, b: a == b or (b == -1 and a in (-1, 0)), "sysfs numa_node (-1: none)")

    def agent_once(self) -> None:
        cmd = [sys.executable, "-m", "gpufleet", "agent", "--once", "--nvml", self.args.nvml]
        try:
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        except subprocess.TimeoutExpired:
            self.rep.add("discovery", "gpufleet agent --once", "FAIL", "no answer in 120 s", "")
            return
        self.rep.data["agent_once"] = {"exit": p.returncode, "stdout": p.stdout, "stderr": p.stderr[-2000:]}
        uuids = [g.uuid for g in self.be.gpus()]
        listed = sum(u in p.stdout for u in uuids)
        drv = self.smi0.get("driver_version") or ""
        ok = p.returncode == 0 and listed == len(uuids) and f"driver {drv}," in p.stdout
        first = next((ln for ln in p.stdout.splitlines() if ln.startswith("driver ")), (p.stderr.strip().splitlines() or [""])[-1])
        self.rep.add("discovery", "gpufleet agent --once", "PASS" if ok else "FAIL", f"exit {p.returncode}; {first}",
                     f"driver {drv}; {len(uuids)} GPU UUIDs", f"{listed}/{len(uuids)} UUIDs listed")

    def xid(self) -> None:
        wait_s = self.args.xid_wait_s
        t0 = time.monotonic()
        try:
            evs = self.be.poll_xids(timeout_ms=int(wait_s * 1000))
        except Exception as exc:
            self.rep.add("xid", "XID listener waits without error", "FAIL", f"{type(exc).__name__}: {exc}", f"timeout {wait_s:g} s")
            return
        dt = time.monotonic() - t0
        watch = getattr(self.be, "xid_watch", None)
        note = ""
        ok = bool(evs) or dt >= 0.9 * wait_s
        if watch is not None:
            watched = sum(v == "watched" for v in watch.values())
            note = f"XIDs watched on {watched}/{len(watch)} GPUs" + ("" if watched == len(watch) else
                                                                    "; " + "; ".join(f"GPU {i}: {v}" for i, v in watch.items() if v != "watched"))
            ok = ok and watched > 0
        if evs:
            note += "; events: " + ", ".join(f"GPU {e.gpu_index} XID {e.xid}" for e in evs)
        self.rep.add("xid", "XID listener waits without error", "PASS" if ok else "FAIL", f"waited {dt:.2f} s, {len(evs)} event(s)",
                     f"timeout {wait_s:g} s", note)

    def container(self, when: str) -> None:
        """What a container gets for one GPU, from the device plugin and from a DRA claim's CDI spec; ``when``: the
        device nodes are looked at before the load (a node's first container) and after it (CUDA loaded nvidia-uvm)."""
        S = "container"
        from gpufleet.agent.dra.cdi import CdiWriter
        from gpufleet.agent.dra.state import PreparedClaim, PreparedDevice
        from gpufleet.agent.plugin import DevicePlugin

        gpus = [g for g in self.be.gpus() if not g.mig_enabled]
        if not gpus:
            self.rep.add(S, "device nodes", "SKIP", "", "", "every GPU is in MIG mode")
            return
        dev_root = self.args.dev_root
        plugin = DevicePlugin("nvidia.com/gpu", gpus, self.tmp, slots=1, state_dir=self.tmp, device_specs="all", dev_root=dev_root)
        cdi = CdiWriter(os.path.join(self.tmp, "cdi"), dev_root, "all", minor_of=lambda i: next(g.dev_minor for g in gpus if g.index == i))

        def cdi_edits(g) -> dict:  # the container edits of a DRA claim of the whole GPU
            d = PreparedDevice("gpu", "device-check", f"gpu-{g.index}", g.uuid, g.index, g.memory_mib * MIB, 1000, True)
            return cdi.edits(PreparedClaim("device-check", "device-check", "gpu", [d]), [d])

        paths: set[str] = set()
        for g in gpus:
            paths |= {spec.host_path for spec in plugin.device_spec_list([g.index])}
            paths |= {n["hostPath"] for n in cdi_edits(g).get("deviceNodes", [])}
        status = {p: _char_device(p) for p in sorted(paths)}
        self.rep.data.setdefault("device_nodes", {})[when] = status
        missing = [p for p, v in status.items() if v is None]
        strict = not self.fake  # the fake backend's /dev/nvidia* are plain files (no mknod in a test)
        ok = not missing and (not strict or all(v and v[0] == "char" for v in status.values()))
        self.rep.add(S, f"device nodes handed to containers exist ({when} the load)", "PASS" if ok else "FAIL",
                     ", ".join(os.path.basename(p) for p in status), "missing: " + ", ".join(missing) if missing else "all present",
                     "Allocate DeviceSpecs and CDI deviceNodes (device_specs all); containerd fails a container whose device is absent")
        if when != "after":
            return
        items = []
        for g in gpus:
            ref = _proc_minor(self.args.proc_root, g.pci_bus_id)
            st = status.get(os.path.join(dev_root, f"nvidia{g.dev_minor}"))
            node_minor = st[2] if st and st[0] == "char" else None
            same = None if ref is None else (g.dev_minor == ref and (node_minor is None and self.fake or node_minor == ref))
            items.append((g.index, f"/dev/nvidia{g.dev_minor}" + (f" (195:{node_minor})" if node_minor is not None else ""),
                          None if ref is None else f"Device Minor {ref}", same))
        self.rep.per_gpu(S, "each GPU's /dev/nvidiaN", items, "/proc/driver/nvidia/gpus/<bus>/information; the node's major:minor")
        target = next((g for g in gpus if self.args.gpu is None or g.index == self.args.gpu), gpus[0])
        dev = next(d for d in plugin.devices if d.gpu_index == target.index)
        try:
            resp = plugin.allocate_one([dev.id])
        except Exception as exc:  # noqa: BLE001 - reported as the row
            self.rep.add(S, "Allocate names the GPU (NVIDIA_VISIBLE_DEVICES)", "FAIL", f"{type(exc).__name__}: {exc}", target.uuid)
            return
        visible = dict(resp.envs).get("NVIDIA_VISIBLE_DEVICES", "")
        self.rep.add(S, "Allocate names the GPU (NVIDIA_VISIBLE_DEVICES)", "PASS" if visible == target.uuid else "FAIL", visible,
                     target.uuid, f"device {dev.id}, kubelet's choice (no pod)")
        cdi_visible = next((e.split("=", 1)[1] for e in cdi_edits(target)["env"] if e.startswith("NVIDIA_VISIBLE_DEVICES=")), "")
        self.rep.add(S, "CDI spec names the GPU (NVIDIA_VISIBLE_DEVICES)", "PASS" if cdi_visible == target.uuid else "FAIL",
                     cdi_visible, target.uuid, "a DRA claim of the whole GPU")
        if self.fake:
            self.rep.add(S, "a CUDA process given it sees that GPU alone", "SKIP", "", "", "fake backend: no CUDA")
            return
        env = dict(os.environ, CUDA_VISIBLE_DEVICES=visible)  # what the NVIDIA runtime does with it in a container
        try:
            p = subprocess.run([sys.executable, os.path.abspath(__file__), "--cuda-uuids"], capture_output=True, text=True,
                               timeout=120, env=env)
            seen = json.loads(p.stdout.strip().splitlines()[-1]) if p.returncode == 0 and p.stdout.strip() else None
            err = "" if seen is not None else (p.stderr.strip().splitlines() or ["no output"])[-1]
        except (subprocess.TimeoutExpired, ValueError) as exc:
            seen, err = None, str(exc)
        self.rep.add(S, "a CUDA process given it sees that GPU alone", "PASS" if seen == [target.uuid] else "FAIL",
                     _s(seen) if seen is not None else err, _s([target.uuid]), "cuDeviceGetCount/cuDeviceGetUuid via libcuda")

    def dra(self) -> None:
        """What the DRA driver would publish in its ResourceSlice for each whole GPU, against nvidia-smi: the attributes
        and capacity claims select on (NVIDIA's names, so claims written for NVIDIA's driver match)."""
        S = "dra"
        from gpufleet.agent.dra.devices import DraOptions, build_devices, parse_quantity, pci_bus_id, semver

        gpus = self.be.gpus()
        devs = {d["name"]: d for d in build_devices(gpus, self.be.driver(), DraOptions(sysfs_root=self.args.sysfs_root)).devices}
        by_bus = {pci_key(r["bus_id"]): r for r in self.smi0["gpus"]}
        caps: dict[tuple[int, int, int, int], str] = {}
        try:
            for line in self.smi.run("--query-gpu=pci.bus_id,compute_cap", "--format=csv,noheader").splitlines():
                if "," in line:
                    bus, cap = (x.strip() for x in line.split(",", 1))
                    caps[pci_key(bus)] = cap
        except SmiError:
            pass
        whole = [(g, devs.get(f"gpu-{g.index}"), by_bus.get(pci_key(g.pci_bus_id))) for g in gpus if not g.mig_enabled]
        if not whole:
            self.rep.add(S, "ResourceSlice devices", "SKIP", "", "", "every GPU is in MIG mode")
            return
        self.rep.data["dra_devices"] = list(devs.values())
        driver, cuda = self.smi0.get("driver_version") or "", self.smi0.get("cuda_version") or ""

        def attr(d: dict | None, key: str) -> Any:
            v = ((d or {}).get("attributes") or {}).get(key)
            return None if v is None else next(iter(v.values()))

        def row(check: str, ours: Callable[[dict | None], Any], ref: Callable[[Any, dict], Any], note: str = "") -> None:
            items = []
            for g, d, r in whole:
                b = ref(g, r) if r is not None else None
                a = ours(d)
                items.append((g.index, a, b, None if b is None else a == b))
            self.rep.per_gpu(S, check, items, note)

        row("device gpu-N published", lambda d: d is not None and d["name"], lambda g, r: f"gpu-{g.index}")
        row("uuid", lambda d: attr(d, "uuid"), lambda g, r: r["uuid"])
        row("productName", lambda d: attr(d, "productName"), lambda g, r: r["name"])
        row("architecture", lambda d: attr(d, "architecture"), lambda g, r: r.get("architecture"), "nvidia-smi product_architecture")
        row("cudaComputeCapability", lambda d: attr(d, "cudaComputeCapability"),
            lambda g, r: semver(caps[pci_key(g.pci_bus_id)]) if pci_key(g.pci_bus_id) in caps else None)
        row("driverVersion", lambda d: attr(d, "driverVersion"), lambda g, r: semver(driver) if driver else None)
        row("cudaDriverVersion", lambda d: attr(d, "cudaDriverVersion"), lambda g, r: semver(cuda) if cuda else None)
        row("gpu.nvidia.com/ attributes mirror them", lambda d: all(attr(d, f"gpu.nvidia.com/{k}") == attr(d, k) for k in (
            "uuid", "productName", "cudaComputeCapability", "driverVersion")), lambda g, r: True)
        row("resource.kubernetes.io/pciBusID", lambda d: attr(d, "resource.kubernetes.io/pciBusID"),
            lambda g, r: pci_bus_id(r["bus_id"]))
        tol = self.tol["memory_total_mib"] * MIB

        def mem(d: dict | None) -> int | None:
            raw = (((d or {}).get("capacity") or {}).get("memory") or {}).get("value")
            return None if raw is None else parse_quantity(raw)

        items = []
        for g, d, r in whole:
            a = mem(d)
            b = None if r is None or r["fb_total_mib"] is None else int(r["fb_total_mib"]) * MIB
            items.append((g.index, a, b, None if b is None or a is None else abs(a - b) <= tol))
        self.rep.per_gpu(S, "capacity memory (bytes)", items, f"nvidia-smi fb_memory_usage/total; tolerance {tol // MIB} MiB")

    def mps(self) -> None:
        """A GPU share as gpufleet hands it out (a DRA claim of half the GPU's compute and 4 GiB: the CDI spec's
        environment) under a real MPS control daemon: the client runs as an MPS client and cannot allocate past its
        memory limit.  The daemon is started here and quit afterwards; no device setting is changed (the GPU stays
        in its compute mode)."""
        S = "shares"
        if self.fake:
            self.rep.add(S, "MPS enforces a share's memory limit", "SKIP", "", "", "fake backend: no CUDA")
            return
        ctl = shutil.which("nvidia-cuda-mps-control") or next(
            (p for p in ("/usr/local/nvidia/bin/nvidia-cuda-mps-control", "/usr/bin/nvidia-cuda-mps-control") if os.path.exists(p)), None)
        if ctl is None:
            self.rep.add(S, "MPS enforces a share's memory limit", "SKIP", "", "", "no nvidia-cuda-mps-control on this machine")
            return
        from gpufleet.agent.dra.cdi import CdiWriter
        from gpufleet.agent.dra.state import PreparedClaim, PreparedDevice

        target = next((g for g in self.be.gpus() if not g.mig_enabled and (self.args.gpu is None or g.index == self.args.gpu)), None)
        if target is None:
            self.rep.add(S, "MPS enforces a share's memory limit", "SKIP", "", "", "no GPU outside MIG mode")
            return
        limit_mib = self.args.share_mib
        pipe, logs = os.path.join(self.tmp, "mps-pipe"), os.path.join(self.logdir, "mps-log")
        os.makedirs(pipe, exist_ok=True)
        os.makedirs(logs, exist_ok=True)
        d = PreparedDevice("gpu", "device-check", f"gpu-{target.index}", target.uuid, target.index, limit_mib * MIB, 500, False, "s0")
        edits = CdiWriter(os.path.join(self.tmp, "cdi"), "/dev", "all", mps_pipe_dir=pipe).edits(
            PreparedClaim("share", "device-check", "share"), [d])
        share_env = dict(e.split("=", 1) for e in edits["env"])
        self.rep.data["share_env"] = share_env
        daemon_env = dict(os.environ, CUDA_MPS_PIPE_DIRECTORY=pipe, CUDA_MPS_LOG_DIRECTORY=logs, CUDA_VISIBLE_DEVICES=target.uuid)
        try:
            p = subprocess.run([ctl, "-d"], env=daemon_env, capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired) as exc:
            self.rep.add(S, "MPS enforces a share's memory limit", "SKIP", "", "", f"the MPS daemon did not start: {exc}")
            return
        if p.returncode != 0:
            self.rep.add(S, "MPS enforces a share's memory limit", "SKIP", "", "",
                         f"nvidia-cuda-mps-control -d exited {p.returncode}: {(p.stderr or p.stdout).strip()[:200]}")
            return
        try:
            env = dict(os.environ, CUDA_VISIBLE_DEVICES=share_env["NVIDIA_VISIBLE_DEVICES"], **share_env)
            below, above = limit_mib // 2, limit_mib + limit_mib // 2
            client = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--cuda-mem-probe", f"{below},{above}"],
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
            assert client.stdout is not None
            ready, _, _ = select.select([client.stdout], [], [], 90)  # never hang on a client MPS does not serve
            first = client.stdout.readline() if ready else ""
            kind = None
            try:
                r, _ = self.smi.query()
                rg: dict[str, Any] = next((x for x in r["gpus"] if pci_key(x["bus_id"]) == pci_key(target.pci_bus_id)), {"processes": []})
                kind = next((x["type"] for x in rg["processes"] if x["pid"] == client.pid), None)
            except (SmiError, ET.ParseError):
                pass
            try:
                _out, err = client.communicate(timeout=60 if first else 1)
            except subprocess.TimeoutExpired:
                client.kill()
                _out, err = client.communicate()
            try:
                probe = json.loads(first)
            except ValueError:
                probe = None
            self.rep.data["share_probe"] = {"probe": probe, "nvidia_smi_type": kind, "stderr": err[-2000:]}
            if probe is None:
                self.rep.add(S, "MPS enforces a share's memory limit", "FAIL", (err.strip().splitlines() or ["no output"])[-1], "")
                return
            got = {int(m): rc for m, rc in probe["alloc"]}
            ok = got.get(below) == 0 and got.get(above) not in (0, None)
            self.rep.add(S, "MPS enforces a share's memory limit", "PASS" if ok else "FAIL",
                         f"{below} MiB: {'ok' if got.get(below) == 0 else 'error ' + str(got.get(below))}; "
                         f"{above} MiB: {'ok' if got.get(above) == 0 else 'refused (CUDA error ' + str(got.get(above)) + ')'}",
                         f"{below} MiB ok, {above} MiB refused", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=" + share_env.get(
                             "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", "?") + f"; cuMemGetInfo total {probe.get('total_mib')} MiB")
            self.rep.add(S, "the share runs as an MPS client", "PASS" if kind == "M+C" else ("SKIP" if kind is None else "FAIL"),
                         kind or "", "M+C", "nvidia-smi's process type for the share's pid"
                         + ("" if kind is not None else ": nvidia-smi did not list it"))
        finally:
            try:
                subprocess.run([ctl], input="quit\n", env=daemon_env, capture_output=True, text=True, timeout=30)
            except (OSError, subprocess.TimeoutExpired) as exc:
                self.rep.add(S, "MPS daemon quits", "FAIL", str(exc), "")

    def load_phase(self) -> None:
        S = "load"
        gpus = self.be.gpus()
        target = None
        if self.args.gpu is not None:
            if not 0 <= self.args.gpu < len(gpus):
                self.rep.add(S, "load GPU", "FAIL", f"--gpu {self.args.gpu}", f"{len(gpus)} GPUs")
                return
            target = gpus[self.args.gpu]
        else:
            target = next((g for g in gpus if not g.mig_enabled), gpus[0])
        cuda_uuid = target.uuid if not target.mig_enabled or not target.mig else target.mig[0].uuid
        kind, why = pick_load(self.args.load, self.fake)
        self.rep.data["load"] = {"kind": kind, "why": why, "gpu": target.index, "cuda_visible_devices": cuda_uuid}
        if kind is None:
            self.rep.add(S, "CUDA load", "SKIP", "", "", why + ": utilisation, power and per-process checks skipped")
            return
        fake_file = None
        if self.fake:
            fake_file = os.path.join(self.tmp, "fake-processes.json")
            os.environ["GPUFLEET_FAKE_PROCESSES"] = fake_file  # the agent process and a fake nvidia-smi read it too
        load = Load(kind, cuda_uuid, self.args.load_mib, self.args.load_seconds, os.path.join(self.logdir, "load.log"))
        agent = None
        try:
            try:
                load.start()
            except RuntimeError as exc:
                if kind != "torch" or self.args.load == "torch":
                    raise
                self.rep.add(S, "CUDA load (torch)", "INFO", str(exc), "", "falling back to the PTX load")
                kind = "ptx"
                load = Load(kind, cuda_uuid, self.args.load_mib, self.args.load_seconds, os.path.join(self.logdir, "load.log"))
                load.start()
            if fake_file:
                with open(fake_file, "w") as f:
                    json.dump([{"pid": load.pid, "gpu": target.index, "used_memory_mib": self.args.load_mib, "sm_util_pct": 97}], f)
            self.rep.add(S, "CUDA load", "INFO", f"pid {load.pid} on GPU {target.index}: {load.info.get('what')}",
                         f"CUDA_VISIBLE_DEVICES={cuda_uuid}", f"{why}; holds {load.info.get('held_mib')} MiB")
            agent = AgentProcess(self.args.nvml, self.tmp, os.path.join(self.logdir, "agent.log"))
            agent.wait_ready()
            time.sleep(self.args.warmup_s)
            self._sample(agent, load, target)
            self._processes(load, target)
            self._scrapes(agent)
        except (RuntimeError, OSError, SmiError) as exc:
            self.rep.add(S, "load phase", "FAIL", f"{type(exc).__name__}: {exc}", "")
        finally:
            if agent is not None:
                rc = agent.stop()
                log = open(agent.log_path).read() if os.path.exists(agent.log_path) else ""
                bad = next((ln for ln in log.splitlines() if "Traceback" in ln or "loop step failed" in ln or " ERROR " in ln), None)
                self.rep.add("agent", "stops cleanly on SIGTERM, no error logged", "PASS" if rc == 0 and bad is None else "FAIL",
                             f"exit {rc}" + (f"; {bad.strip()}" if bad else ""), "exit 0, no ERROR/Traceback", "log: agent.log")
            done = load.stop()
            if done:
                self.rep.data.setdefault("load", {})["done"] = done
            if fake_file:
                os.environ.pop("GPUFLEET_FAKE_PROCESSES", None)

    def _sample(self, agent: AgentProcess, load: Load, g) -> None:
        S = "metrics"
        idx = str(g.index)
        rows: list[dict[str, Any]] = []
        for k in range(self.args.samples):
            _, m = scrape(agent.url)
            r, _xml = self.smi.query()
            rg = next((x for x in r["gpus"] if pci_key(x["bus_id"]) == pci_key(g.pci_bus_id)), None)
            if rg is None:
                raise SmiError(f"nvidia-smi lists no GPU at {g.pci_bus_id}")
            rows.append({
                "ours": {k2: metric(m, name, gpu=idx) for k2, name in (
                    ("gpu_util_pct", "DCGM_FI_DEV_GPU_UTIL"), ("fb_used_mib", "DCGM_FI_DEV_FB_USED"),
                    ("power_w", "DCGM_FI_DEV_POWER_USAGE"), ("temp_c", "DCGM_FI_DEV_GPU_TEMP"),
                    ("sm_clock_mhz", "DCGM_FI_DEV_SM_CLOCK"), ("healthy", "gpufleet_gpu_healthy"))},
                "ref": {k2: rg[k2] for k2 in ("gpu_util_pct", "fb_used_mib", "power_w", "temp_c", "sm_clock_mhz")},
                "power_source": rg["power_source"],
            })
            if k + 1 < self.args.samples:
                time.sleep(self.args.sample_interval_s)
        self.rep.data["samples"] = rows

        def med(side: str, key: str) -> float | None:
            return _median([x[side][key] for x in rows])

        n = f"median of {len(rows)} samples"
        util_ref = med("ref", "gpu_util_pct")
        lo = self.tol["load_min_util_pct"]
        self.rep.add(S, "the load keeps the GPU busy", "PASS" if util_ref is not None and util_ref >= lo else
                     ("SKIP" if util_ref is None else "FAIL"), _fmt(med("ours", "gpu_util_pct"), "%"), _fmt(util_ref, "%"),
                     f"nvidia-smi's utilisation >= {lo}% ({n})" if util_ref is not None else "nvidia-smi reports no utilisation (MIG mode?)")
        self.rep.num(S, "GPU utilisation (DCGM_FI_DEV_GPU_UTIL)", med("ours", "gpu_util_pct"), util_ref, self.tol["gpu_util_pct"], "%", n)
        fb_ours, fb_ref = med("ours", "fb_used_mib"), med("ref", "fb_used_mib")
        self.rep.num(S, "memory used (DCGM_FI_DEV_FB_USED)", fb_ours, fb_ref, self.tol["fb_used_mib"], " MiB",
                     f"{n}; the load holds {load.info.get('held_mib')} MiB")
        pw_ref = med("ref", "power_w")
        ptol = max(self.tol["power_w"]["abs"], self.tol["power_w"]["rel"] * (pw_ref or 0))
        self.rep.num(S, "power (DCGM_FI_DEV_POWER_USAGE)", med("ours", "power_w"), pw_ref, ptol, " W",
                     f"{n}; nvidia-smi {rows[0]['power_source']}")
        self.rep.num(S, "temperature (DCGM_FI_DEV_GPU_TEMP)", med("ours", "temp_c"), med("ref", "temp_c"), self.tol["temp_c"], " C", n)
        clk_ref = med("ref", "sm_clock_mhz")
        self.rep.num(S, "SM clock (DCGM_FI_DEV_SM_CLOCK)", med("ours", "sm_clock_mhz"), clk_ref,
                     self.tol["sm_clock_rel"] * (clk_ref or 0), " MHz", n)
        healthy = [x["ours"]["healthy"] for x in rows]
        self.rep.add("agent", "health gauge (gpufleet_gpu_healthy)", "PASS" if healthy and all(h == 1.0 for h in healthy) else "FAIL",
                     _s(sorted(set(healthy))), "1", f"GPU {g.index}, every sample; the agent polls XIDs each second")

    def _processes(self, load: Load, g) -> None:
        S = "processes"
        from prometheus_client import CollectorRegistry, generate_latest
        from prometheus_client.parser import text_string_to_metric_families

        from gpufleet.agent.exporter import ContainerRef, GpuCollector, parse_cgroup

        procs = [p for p in self.be.processes() if p.gpu_index == g.index]
        r, _ = self.smi.query()
        rg: dict[str, Any] = next((x for x in r["gpus"] if pci_key(x["bus_id"]) == pci_key(g.pci_bus_id)), {"processes": []})
        try:
            pmon: dict[int, float | None] | None = parse_pmon(self.smi.run("pmon", "-c", "1", "-s", "u", "-i", str(g.index)))
            pmon_err = ""
        except SmiError as exc:
            pmon, pmon_err = None, str(exc)
        ours = next((p for p in procs if p.pid == load.pid), None)
        ref = next((p for p in rg["processes"] if p["pid"] == load.pid), None)
        self.rep.data["processes"] = {"nvml": [asdict(p) for p in procs], "nvidia_smi": rg["processes"], "pmon": pmon}
        self.rep.add(S, "load's pid in NVML's process list", "PASS" if ours else "FAIL",
                     _s(sorted(p.pid for p in procs)), _s(sorted(p["pid"] for p in rg["processes"])),
                     f"load pid {load.pid}" + ("" if ref else "; nvidia-smi does not list it either (another PID namespace?)"))
        held = float(load.info.get("held_mib") or 0)
        if ours is None:
            return
        self.rep.num(S, "load's memory (per process)", ours.used_memory_mib, ref["used_memory_mib"] if ref else None,
                     self.tol["process_memory_mib"], " MiB", f"nvidia-smi process_info; the load holds {held:.0f} MiB")
        if ours.used_memory_mib < held:
            self.rep.add(S, "load's memory covers what it holds", "FAIL", f"{ours.used_memory_mib} MiB", f">= {held:.0f} MiB")
        sm_ref = (pmon or {}).get(load.pid)
        self.rep.num(S, "load's SM utilisation (per process)", ours.sm_util_pct, sm_ref, self.tol["process_sm_util_pct"], "%",
                     "nvidia-smi pmon" + (f": {pmon_err}" if pmon_err else "" if sm_ref is not None else ": no sample for the pid"))

        # pod attribution: the load's pod shares its GPU with an idle pod, so the exporter takes the per-process path
        load_ref, idle_ref = ContainerRef("device-check", "load", "main"), ContainerRef("device-check", "idle", "main")

        class Holders:
            def devices(self) -> dict[str, list[ContainerRef]]:
                return {g.uuid: [load_ref, idle_ref]}

        col = GpuCollector(self.be, "device-check", Holders(), lambda pid: load_ref if pid == load.pid else None)
        reg = CollectorRegistry()
        reg.register(col)
        vals: dict[tuple[str, str], float] = {}
        for fam in text_string_to_metric_families(generate_latest(reg).decode()):
            for s in fam.samples:
                if s.labels.get("gpu") == str(g.index):
                    vals[(s.name, s.labels.get("pod", ""))] = float(s.value)
        self.rep.data["attribution"] = {f"{n}{{pod={p!r}}}": v for (n, p), v in vals.items()}
        S = "pods"
        self.rep.num(S, "load pod's memory (FB_USED{pod=load})", vals.get(("DCGM_FI_DEV_FB_USED", "load")),
                     ref["used_memory_mib"] if ref else None, self.tol["process_memory_mib"], " MiB", "vs nvidia-smi's process memory")
        self.rep.num(S, "load pod's utilisation (GPU_UTIL{pod=load})", vals.get(("DCGM_FI_DEV_GPU_UTIL", "load")), sm_ref,
                     self.tol["process_sm_util_pct"], "%", "vs nvidia-smi pmon")
        idle = (vals.get(("DCGM_FI_DEV_FB_USED", "idle")), vals.get(("DCGM_FI_DEV_GPU_UTIL", "idle")))
        self.rep.add(S, "idle pod on the same GPU gets nothing", "PASS" if idle == (0.0, 0.0) else "FAIL",
                     f"FB_USED {_s(idle[0])}, GPU_UTIL {_s(idle[1])}", "0, 0")
        total = sum(v for (n, _p), v in vals.items() if n == "DCGM_FI_DEV_FB_USED")
        self.rep.num(S, "pods + unattributed memory = the GPU's", total if vals else None, rg.get("fb_used_mib"), self.tol["fb_used_mib"],
                     " MiB", "sum of FB_USED series of the GPU vs nvidia-smi's used")
        try:
            with open(f"/proc/{load.pid}/cgroup") as f:
                cg = f.read()
            found = parse_cgroup(cg)
            first = cg.strip().splitlines()[0] if cg.strip() else ""
            self.rep.add(S, "what the cgroup resolver names for the load", "INFO",
                         f"pod UID {found[0]}, container {found[1][:12]}" if found else "no pod (not in a Kubernetes pod's cgroup)",
                         f"/proc/{load.pid}/cgroup: {first}", "in a cluster the pod index turns this into namespace/pod/container")
        except OSError as exc:
            self.rep.add(S, "what the cgroup resolver names for the load", "INFO", "", str(exc))

    def _scrapes(self, agent: AgentProcess) -> None:
        times: list[float] = []
        last: dict = {}
        for _ in range(self.args.scrapes):
            dt, last = scrape(agent.url)
            times.append(dt * 1000)
        times.sort()
        p95 = times[min(len(times) - 1, int(round(0.95 * (len(times) - 1))))]
        coll = metric(last, "gpufleet_exporter_collect_seconds")
        lim = self.tol["scrape_p95_ms"]
        self.rep.data["scrape_ms"] = times
        self.rep.add("agent", "/metrics scrape time", "PASS" if p95 <= lim else "FAIL",
                     f"p50 {statistics.median(times):.1f} ms, p95 {p95:.1f} ms, max {times[-1]:.1f} ms",
                     f"p95 <= {lim:g} ms", f"{len(times)} scrapes over HTTP; collector's own {coll * 1000:.1f} ms" if coll is not None else "")

    def settings(self) -> None:
        try:
            after, _xml = self.smi.query()
        except (SmiError, ET.ParseError) as exc:
            self.rep.add("safety", "device settings unchanged", "SKIP", "", str(exc))
            return
        before = {g["bus_id"]: g["settings"] for g in self.smi0["gpus"]}
        now = {g["bus_id"]: g["settings"] for g in after["gpus"]}
        changed = [f"{bus} {k}: {before[bus].get(k)} -> {v}" for bus, s in now.items() for k, v in s.items()
                   if bus in before and before[bus].get(k) != v]
        g0: dict[str, Any] = next(iter(now.values()), {})
        summary = f"MIG {g0.get('mig_current')}, persistence {g0.get('persistence_mode')}, power limit {g0.get('power_limit')}"
        self.rep.add("safety", "device settings unchanged", "FAIL" if changed else "PASS", summary if not changed else changed[0],
                     "as before the check", "MIG mode, persistence, compute mode, power limits, application clocks, ECC"
                     + (f"; {len(changed)} changed" if changed else ""))

    def run(self) -> int:
        t0 = time.monotonic()
        try:
            if self.environment():
                self.discovery()
                self.agent_once()
                self.xid()
                self.dra()
                self.container("before")
                self.load_phase()
                self.container("after")
                self.mps()
                self.settings()
        finally:
            self.rep.data["elapsed_s"] = round(time.monotonic() - t0, 1)
            table = self.rep.table()
            print(f"gpufleet device check ({'FAKE backend ' + self.args.nvml[5:] if self.fake else 'real NVML'}), "
                  f"{self.rep.data['elapsed_s']} s", flush=True)
            print(table, flush=True)
            if self.out:
                doc = {"check": "gpufleet device check (issue 40)", "nvml": self.args.nvml, "tolerances": self.tol,
                       "summary": self.rep.counts(), "rows": [asdict(r) for r in self.rep.rows], **self.rep.data}
                with open(os.path.join(self.out, "device_check.json"), "w") as f:
                    json.dump(doc, f, indent=1, default=str)
                self.save("device_check.txt", table + "\n")
                print(f"written: {os.path.join(self.out, 'device_check.json')}", flush=True)
        return 1 if self.rep.failed else 0


# --- dependencies (for device_check.sh) --------------------------------------------------------------


def _requirements() -> list[str]:
    import tomllib

    with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "pyproject.toml"), "rb") as f:
        return list(tomllib.load(f)["project"]["dependencies"])


def _req_name(spec: str) -> str:
    return re.split(r"[\s<>=!~;\[]", spec.strip(), maxsplit=1)[0].lower()


def missing_deps(check_only: bool = True) -> list[str]:
    """The project's requirements that this Python lacks (or has too old); with check_only, only those the check needs."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        specifiers = importlib.import_module("packaging.specifiers")
    except ImportError:  # pip vendors it
        specifiers = importlib.import_module("pip._vendor.packaging.specifiers")
    out = []
    for spec in _requirements() + list(INDIRECT_NEEDS if check_only else ()):
        name = _req_name(spec)
        if check_only and name not in CHECK_NEEDS + INDIRECT_NEEDS:
            continue
        try:
            have = version(name)
        except PackageNotFoundError:
            out.append(spec)
            continue
        wanted = specifiers.SpecifierSet(spec[len(name):].split(";")[0].strip())
        if not wanted.contains(have, prereleases=True):
            out.append(spec)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nvml", default="real", help="real (default) or fake:PROFILE")
    ap.add_argument("--nvidia-smi", default="nvidia-smi", help="the nvidia-smi to compare with (default: on PATH)")
    ap.add_argument("--sysfs-root", default="/sys", help="where PCI devices' numa_node files are (default /sys)")
    ap.add_argument("--dev-root", default="/dev", help="where the /dev/nvidia* device nodes are (default /dev)")
    ap.add_argument("--proc-root", default="/proc", help="where driver/nvidia/gpus/*/information is (default /proc)")
    ap.add_argument("--gpu", type=int, default=None, help="NVML index of the GPU to load (default: the first not in MIG mode)")
    ap.add_argument("--load", choices=["auto", "torch", "ptx", "none"], default="auto",
                    help="the CUDA load: torch matmul loop, ptx FMA loop through libcuda, or none (default auto: torch if installed)")
    ap.add_argument("--load-mib", type=int, default=4096, help="memory the load holds (default 4096 MiB)")
    ap.add_argument("--load-seconds", type=float, default=300.0, help="the load stops by itself after this long (default 300)")
    ap.add_argument("--warmup-s", type=float, default=3.0, help="seconds between the load starting and the first sample")
    ap.add_argument("--samples", type=int, default=5, help="interleaved /metrics + nvidia-smi samples (default 5)")
    ap.add_argument("--sample-interval-s", type=float, default=1.0)
    ap.add_argument("--scrapes", type=int, default=20, help="timed scrapes of /metrics (default 20)")
    ap.add_argument("--scrape-p95-ms", type=float, default=TOL["scrape_p95_ms"])
    ap.add_argument("--xid-wait-s", type=float, default=3.0, help="how long the XID listener waits (default 3)")
    ap.add_argument("--out", default=os.environ.get("OUT", ""), help="folder for device_check.json and logs (default $OUT)")
    ap.add_argument("--print-missing-deps", action="store_true", help="print the check's unmet requirements, one a line, and exit")
    ap.add_argument("--print-check-deps", action="store_true", help="print the requirements the check needs, one a line, and exit")
    ap.add_argument("--run-load", choices=["torch", "ptx", "fake"], help=argparse.SUPPRESS)
    ap.add_argument("--cuda-uuids", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--cuda-mem-probe", help=argparse.SUPPRESS)
    ap.add_argument("--share-mib", type=int, default=4096, help="the memory limit of the MPS share checked (default 4096 MiB)")
    args = ap.parse_args(argv)
    if args.print_missing_deps:
        print("\n".join(missing_deps()))
        return 0
    if args.print_check_deps:
        print("\n".join([s for s in _requirements() if _req_name(s) in CHECK_NEEDS] + list(INDIRECT_NEEDS)))
        return 0
    if args.cuda_uuids:
        return cuda_uuids()
    if args.cuda_mem_probe:
        return cuda_mem_probe([int(x) for x in args.cuda_mem_probe.split(",")])
    if args.run_load:
        return run_load(args.run_load, args.load_mib, args.load_seconds)
    if args.nvml != "real" and not args.nvml.startswith("fake:"):
        print(f"device_check: --nvml must be 'real' or fake:PROFILE, got {args.nvml!r}", file=sys.stderr)
        return 2
    for name in ("samples", "scrapes"):
        if getattr(args, name) < 1:
            print(f"device_check: --{name} must be at least 1", file=sys.stderr)
            return 2
    return Check(args).run()


if __name__ == "__main__":
    try:
        from gpufleet.cli.main import run_script
    except ImportError as exc:
        print(f"device_check.py: gpufleet is not importable ({exc}); bench/device_check.sh installs it", file=sys.stderr)
        sys.exit(1)
    sys.exit(run_script("device_check.py", main))
