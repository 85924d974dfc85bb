"""Exporter scrape cost: p50/p99 latency of one /metrics scrape of an 8-GPU node, and the exporter's RSS.

Target (issue 7): p99 <= 50 ms, RSS < 100 MiB.

Set-up, as close to a node as a test box allows: the exporter runs in its own
process (the agent's share of memory is measured alone, via /proc/<pid>/status)
(with the modules of the whole agent loaded, unless --exporter-only) with the fake NVML backend (8x H100) where every GPU is time-sliced by two
pods, so each scrape takes the expensive path: PodResources List over a real
unix socket to a fake kubelet (another process: this one), NVML per-process
accounting, and the cgroup resolver reading /proc-like files for 16 processes.

    python bench/bench_exporter.py [--scrapes 1000]
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from concurrent import futures

import numpy as np

GPUS, SHARERS = 8, 2


def uid(i: int, k: int) -> str:
    return f"{i:08x}-0000-4000-8000-{k:012x}"


def cid(i: int, k: int) -> str:
    return f"{i:032x}{k:032x}"


def serve(socket: str, proc_root: str, port_file: str, agent_imports: bool = True) -> None:
    """The exporter side (child process); with ``agent_imports`` it also loads what the whole agent loads."""
    if agent_imports:
        import kubernetes.client  # noqa: F401  (node labels, pod source)

        from gpufleet.agent import main as _main, plugin as _plugin  # noqa: F401  (device plugin, gRPC stubs)
    from prometheus_client import CollectorRegistry, start_http_server

    from gpufleet.agent.exporter import CgroupResolver, GpuCollector, KubeletPodResources, pod_index_from_json
    from gpufleet.agent.nvml import FakeBackend, ProcessUsage

    be = FakeBackend("h100-nvlink")
    be.set_processes([ProcessUsage(1000 + i * SHARERS + k, i, 20_000, 40) for i in range(GPUS) for k in range(SHARERS)])
    pods = [{"metadata": {"namespace": "ml", "name": f"p{i}-{k}", "uid": uid(i, k)},
             "status": {"containerStatuses": [{"name": "main", "containerID": f"containerd://{cid(i, k)}"}]}}
            for i in range(GPUS) for k in range(SHARERS)]
    resolver = CgroupResolver(lambda: pod_index_from_json(pods), proc_root=proc_root)
    reg = CollectorRegistry()
    reg.register(GpuCollector(be, "bench-node", KubeletPodResources(socket), resolver))
    httpd, _ = start_http_server(0, addr="127.0.0.1", registry=reg)
    with open(port_file + ".tmp", "w") as f:
        f.write(str(httpd.server_address[1]))
    os.rename(port_file + ".tmp", port_file)
    while True:
        time.sleep(3600)


def rss_mib(pid: int) -> tuple[float, float]:
    """(current RSS, peak RSS) of a process in MiB."""
    vals = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            k, _, v = line.partition(":")
            if k in ("VmRSS", "VmHWM"):
                vals[k] = int(v.split()[0]) / 1024
    return vals["VmRSS"], vals["VmHWM"]


def main() -> None:
    from gpufleet.argtypes import int_range
    from gpufleet.cli.main import Parser

    ap = Parser(prog="bench_exporter.py")
    ap.add_argument("--scrapes", type=int_range(1), default=1000)
    ap.add_argument("--exporter-only", action="store_true", help="do not load the rest of the agent's modules in the exporter process")
    ap.add_argument("--serve", nargs=3, metavar=("SOCKET", "PROC_ROOT", "PORT_FILE"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.serve:
        socket, proc_root, port_file = args.serve
        serve(socket, proc_root, port_file, agent_imports=not args.exporter_only)
        return

    import grpc

    from gpufleet.agent.podresources import podresources_pb2 as pb
    from gpufleet.agent.podresources import podresources_pb2_grpc as pbg

    class Lister(pbg.PodResourcesListerServicer):
        def List(self, request, context):  # noqa: N802
            return pb.ListPodResourcesResponse(pod_resources=[
                pb.PodResources(namespace="ml", name=f"p{i}-{k}", containers=[pb.ContainerResources(
                    name="main", devices=[pb.ContainerDevices(resource_name="nvidia.com/gpu", device_ids=[f"GPU-h100-{i:02d}::{k}"])])])
                for i in range(GPUS) for k in range(SHARERS)])

    d = tempfile.mkdtemp(dir="/tmp", prefix="bx")
    sock = os.path.join(d, "kubelet.sock")
    proc_root = os.path.join(d, "proc")
    for i in range(GPUS):
        for k in range(SHARERS):
            p = os.path.join(proc_root, str(1000 + i * SHARERS + k))
            os.makedirs(p)
            with open(os.path.join(p, "cgroup"), "w") as f:
                f.write(f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{uid(i, k).replace('-', '_')}.slice/"
                        f"cri-containerd-{cid(i, k)}.scope\n")
    srv = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    pbg.add_PodResourcesListerServicer_to_server(Lister(), srv)
    srv.add_insecure_port(f"unix://{sock}")
    srv.start()
    port_file = os.path.join(d, "port")
    child = subprocess.Popen([sys.executable, __file__, "--serve", sock, proc_root, port_file]
                             + (["--exporter-only"] if args.exporter_only else []))
    try:
        t_end = time.time() + 60
        while not os.path.exists(port_file):
            if time.time() > t_end or child.poll() is not None:
                raise SystemExit("exporter process did not start")
            time.sleep(0.05)
        url = f"http://127.0.0.1:{open(port_file).read()}/metrics"
        for _ in range(50):
            body = urllib.request.urlopen(url).read()
        assert b'pod="p7-1"' in body and b"DCGM_FI_DEV_XID_ERRORS" in body
        t = []
        for _ in range(args.scrapes):
            t0 = time.perf_counter()
            body = urllib.request.urlopen(url).read()
            t.append((time.perf_counter() - t0) * 1000)
        rss, peak = rss_mib(child.pid)
    finally:
        child.kill()
        child.wait()
        srv.stop(0)
        shutil.rmtree(d, ignore_errors=True)
    a = np.array(t)
    series = sum(1 for line in body.decode().splitlines() if line and not line.startswith("#"))
    print(f"8-GPU node, {GPUS * SHARERS} pods time-slicing (per-process attribution path), {series} series, {len(body)} bytes/scrape")
    print(f"scrapes: {len(a)}; p50 {np.percentile(a, 50):.2f} ms, p99 {np.percentile(a, 99):.2f} ms, max {a.max():.2f} ms "
          f"(target p99 <= 50 ms: {'OK' if np.percentile(a, 99) <= 50 else 'MISSED'})")
    what = "exporter-only process" if args.exporter_only else "exporter process with the agent's modules loaded"
    print(f"{what}: RSS {rss:.1f} MiB, peak {peak:.1f} MiB (target < 100 MiB: {'OK' if peak < 100 else 'MISSED'})")


if __name__ == "__main__":
    from gpufleet.cli.main import run_script

    sys.exit(run_script("bench_exporter.py", main))
