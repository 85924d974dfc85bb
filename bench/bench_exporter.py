"""Exporter scrape cost: p50/p99 latency of one /metrics scrape of an 8-GPU node, and the agent's RSS.

Uses the fake NVML backend (8x H100, 16 processes on shared GPUs) and a fake
PodResources server over a real unix socket, so the kubelet round trip is in
the measurement.  Target (issue 7): p99 <= 50 ms, RSS < 100 MiB.

    python bench/bench_exporter.py [--scrapes 500]
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import tempfile
import time
import urllib.request
from concurrent import futures

import grpc
import numpy as np
from prometheus_client import CollectorRegistry, start_http_server

from gpufleet.agent.exporter import ContainerRef, GpuCollector, KubeletPodResources
from gpufleet.agent.nvml import FakeBackend, ProcessUsage
from gpufleet.agent.podresources import podresources_pb2 as pb
from gpufleet.agent.podresources import podresources_pb2_grpc as pbg


class Lister(pbg.PodResourcesListerServicer):
    def List(self, request, context):  # noqa: N802
        pods = []
        for i in range(8):
            for k in range(2):
                pods.append(pb.PodResources(namespace="ml", name=f"p{i}-{k}", containers=[pb.ContainerResources(
                    name="main", devices=[pb.ContainerDevices(resource_name="nvidia.com/gpu", device_ids=[f"GPU-h100-{i:02d}::{k}"])])]))
        return pb.ListPodResourcesResponse(pod_resources=pods)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--scrapes", type=int, default=500)
    args = ap.parse_args()
    d = tempfile.mkdtemp(dir="/tmp", prefix="bx")
    sock = os.path.join(d, "kubelet.sock")
    srv = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    pbg.add_PodResourcesListerServicer_to_server(Lister(), srv)
    srv.add_insecure_port(f"unix://{sock}")
    srv.start()
    be = FakeBackend("h100-nvlink")
    be.set_processes([ProcessUsage(1000 + i * 2 + k, i, 20_000, 40) for i in range(8) for k in range(2)])
    who = {1000 + i * 2 + k: ContainerRef("ml", f"p{i}-{k}", "main") for i in range(8) for k in range(2)}
    reg = CollectorRegistry()
    reg.register(GpuCollector(be, "bench-node", KubeletPodResources(sock), who.get))
    httpd, _ = start_http_server(0, addr="127.0.0.1", registry=reg)
    url = f"http://127.0.0.1:{httpd.server_address[1]}/metrics"
    for _ in range(20):
        urllib.request.urlopen(url).read()
    t = []
    for _ in range(args.scrapes):
        t0 = time.perf_counter()
        body = urllib.request.urlopen(url).read()
        t.append((time.perf_counter() - t0) * 1000)
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    a = np.array(t)
    print(f"scrapes: {len(a)}, body {len(body)} bytes; p50 {np.percentile(a, 50):.2f} ms, p99 {np.percentile(a, 99):.2f} ms, max {a.max():.2f} ms")
    print(f"peak RSS of the process (agent + this benchmark's client): {rss:.1f} MiB")
    httpd.shutdown()
    srv.stop(0)
    shutil.rmtree(d, ignore_errors=True)


if __name__ == "__main__":
    main()
