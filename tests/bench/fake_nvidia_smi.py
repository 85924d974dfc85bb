"""A stand-in for nvidia-smi describing the fake NVML backend's profiles, for bench/device_check.py's tests.

It answers the queries the check makes (``-q -x``, ``-L``, ``topo -m``,
``--query-gpu=pci.bus_id,compute_cap --format=csv,noheader``, ``pmon -c 1 -s u``)
in nvidia-smi's formats, from its own description of the profile
(``$FAKE_NVIDIA_SMI_PROFILE``: a100-mig or t4) -- written out here, not read
from gpufleet, so that the check compares two independent accounts. Device
figures follow the per-process load in ``$GPUFLEET_FAKE_PROCESSES`` the way
the fake backend computes them. ``$FAKE_NVIDIA_SMI_MUTATE`` (comma-separated)
makes it disagree on purpose: ``uuid:N`` (GPU N's UUID), ``power:+W`` (every
power reading), ``peers`` (no NVLink in the topology), ``driver``, and
``settings`` (persistence mode differs from the second ``-q`` on; its call
count lives in ``$FAKE_NVIDIA_SMI_STATE``).
"""

from __future__ import annotations

import json
import os
import sys

PROFILES = {
    # name, memory MiB, driver, CUDA, compute capability, NVLink all-to-all, MIG-capable, GPUs, bus id, NUMA, MIG instances
    "a100-mig": {
        "name": "NVIDIA A100-SXM4-80GB", "arch": "Ampere", "mib": 81920, "driver": "550.54.15", "cuda": "12.4", "cc": "8.0", "nvlink": True,
        "mig_capable": True, "n": 8, "uuid": "GPU-a100-{i:02d}", "bus": lambda i: 0x07 + i * 8, "numa": lambda i: 0 if i < 4 else 1,
        "mig": {0: [("1g.10gb", f"MIG-a100-0-{k}") for k in range(7)],
                1: [("3g.40gb", "MIG-a100-1-0"), ("2g.20gb", "MIG-a100-1-1"), ("2g.20gb", "MIG-a100-1-2")]},
    },
    "t4": {
        "name": "Tesla T4", "arch": "Turing", "mib": 15360, "driver": "535.161.08", "cuda": "12.2", "cc": "7.5", "nvlink": False,
        "mig_capable": False, "n": 4, "uuid": "GPU-t4-{i:02d}", "bus": lambda i: 0x3B + i, "numa": lambda i: 0, "mig": {},
    },
}


def load() -> dict[int, list[dict]]:
    out: dict[int, list[dict]] = {}
    path = os.environ.get("GPUFLEET_FAKE_PROCESSES")
    if path and os.path.exists(path):
        with open(path) as f:
            for d in json.load(f):
                out.setdefault(int(d["gpu"]), []).append(d)
    return out


def main(argv: list[str]) -> int:
    p = PROFILES[os.environ.get("FAKE_NVIDIA_SMI_PROFILE", "a100-mig")]
    mutate = dict((m.split(":", 1) + [""])[:2] for m in os.environ.get("FAKE_NVIDIA_SMI_MUTATE", "").split(",") if m)
    n = p["n"]
    uuid = [p["uuid"].format(i=i) for i in range(n)]
    if "uuid" in mutate:
        uuid[int(mutate["uuid"])] = "GPU-somebody-else"
    bus = [f"00000000:{p['bus'](i):02X}:00.0" for i in range(n)]
    procs = load()
    if argv[:2] == ["-q", "-x"]:
        calls = 0
        state = os.environ.get("FAKE_NVIDIA_SMI_STATE")
        if state:
            calls = int(open(state).read() or 0) if os.path.exists(state) else 0
            with open(state, "w") as f:
                f.write(str(calls + 1))
        persistence = "Disabled" if "settings" in mutate and calls >= 1 else "Enabled"
        out = ['<?xml version="1.0" ?>', "<!DOCTYPE nvidia_smi_log SYSTEM \"nvsmi_device_v12.dtd\">", "<nvidia_smi_log>",
               "<timestamp>Thu Nov 26 12:00:00 2026</timestamp>",
               f"<driver_version>{'999.0.0' if 'driver' in mutate else p['driver']}</driver_version>",
               f"<cuda_version>{p['cuda']}</cuda_version>", f"<attached_gpus>{n}</attached_gpus>"]
        for i in range(n):
            ps = procs.get(i, [])
            util = min(100, sum(int(x.get("sm_util_pct", 0)) for x in ps))
            used = sum(int(x.get("used_memory_mib", 0)) for x in ps)
            power = 60.0 + 3.0 * util + float(mutate.get("power", 0) or 0)
            mig = "N/A" if not p["mig_capable"] else ("Enabled" if i in p["mig"] else "Disabled")
            out += [f'<gpu id="{bus[i]}">', f"<product_name>{p['name']}</product_name>",
                    f"<product_architecture>{p['arch']}</product_architecture>",
                    f"<persistence_mode>{persistence}</persistence_mode>",
                    f"<mig_mode><current_mig>{mig}</current_mig><pending_mig>{mig}</pending_mig></mig_mode>",
                    f"<uuid>{uuid[i]}</uuid>", f"<minor_number>{i}</minor_number>",
                    f"<pci><pci_bus>{p['bus'](i):02X}</pci_bus><pci_bus_id>{bus[i]}</pci_bus_id></pci>",
                    "<compute_mode>Default</compute_mode>",
                    f"<fb_memory_usage><total>{p['mib']} MiB</total><reserved>0 MiB</reserved><used>{used} MiB</used>"
                    f"<free>{p['mib'] - used} MiB</free></fb_memory_usage>",
                    f"<utilization><gpu_util>{util} %</gpu_util><memory_util>{util // 2} %</memory_util></utilization>",
                    "<ecc_mode><current_ecc>Enabled</current_ecc><pending_ecc>Enabled</pending_ecc></ecc_mode>",
                    f"<temperature><gpu_temp>{35 + util // 3} C</gpu_temp></temperature>",
                    f"<gpu_power_readings><power_state>P0</power_state><power_draw>{power:.2f} W</power_draw>"
                    "<current_power_limit>400.00 W</current_power_limit></gpu_power_readings>",
                    f"<clocks><graphics_clock>{1410 if util else 210} MHz</graphics_clock><sm_clock>{1410 if util else 210} MHz</sm_clock></clocks>",
                    "<applications_clocks><graphics_clock>1410 MHz</graphics_clock><mem_clock>1593 MHz</mem_clock></applications_clocks>",
                    "<processes>"]
            for x in ps:
                out.append(f"<process_info><gpu_instance_id>N/A</gpu_instance_id><compute_instance_id>N/A</compute_instance_id>"
                           f"<pid>{x['pid']}</pid><type>C</type><process_name>python3</process_name>"
                           f"<used_memory>{x.get('used_memory_mib', 0)} MiB</used_memory></process_info>")
            out += ["</processes>", "</gpu>"]
        out.append("</nvidia_smi_log>")
        print("\n".join(out))
        return 0
    if argv == ["-L"]:
        for i in range(n):
            print(f"GPU {i}: {p['name']} (UUID: {uuid[i]})")
            for k, (prof, mu) in enumerate(p["mig"].get(i, [])):
                print(f"  MIG {prof:<11} Device {k:>2}: (UUID: {mu})")
        return 0
    if argv[:1] == ["topo"]:
        print("\x1b[4m\t" + "\t".join(f"GPU{j}" for j in range(n)) + "\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\x1b[0m")
        for i in range(n):
            cells = ["X" if i == j else ("NV12" if p["nvlink"] and "peers" not in mutate else "SYS") for j in range(n)]
            print(f"GPU{i}\t " + "\t".join(cells) + f"\t0-63\t{p['numa'](i)}\t\tN/A")
        print("\nLegend:\n\n  X    = Self\n  NV#  = Connection traversing a bonded set of # NVLinks")
        return 0
    if argv[:1] and argv[0].startswith("--query-gpu="):
        for i in range(n):
            print(f"{bus[i]}, {p['cc']}")
        return 0
    if argv[:1] == ["pmon"]:
        gpu = int(argv[argv.index("-i") + 1]) if "-i" in argv else None
        print("# gpu         pid   type     sm    mem    enc    dec    jpg    ofa    command ")
        print("# Idx           #    C/G      %      %      %      %      %      %    name ")
        for i, ps in sorted(procs.items()):
            if gpu is None or gpu == i:
                for x in ps:
                    print(f"    {i}    {x['pid']:>8}     C     {x.get('sm_util_pct', 0):>2}     {x.get('sm_util_pct', 0) // 2:>2}"
                          "      -      -      -      -    python3")
        return 0
    print(f"fake nvidia-smi: unsupported arguments {argv}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
