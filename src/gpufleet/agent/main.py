"""``gpufleet agent``: discovery, one device plugin per resource, health loop, node labels."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import threading
import time

log = logging.getLogger("gpufleet.agent")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--node-name", default=os.environ.get("NODE_NAME", ""), help="this node (default: $NODE_NAME)")
    p.add_argument("--nvml", default=os.environ.get("GPUFLEET_NVML", "real"),
                   help="'real' (default: the GPUs through NVML) or fake:PROFILE with PROFILE a100-mig, h100-nvlink or t4")
    p.add_argument("--config", help="agent config YAML (migStrategy, replicas, renameShared, recoverAfterSeconds)")
    p.add_argument("--device-plugin-dir", default="/var/lib/kubelet/device-plugins")
    p.add_argument("--mig-strategy", choices=["mixed", "single", "none"], default="mixed")
    p.add_argument("--replicas", type=int, default=1, help="time-slicing: advertise each GPU this many times")
    p.add_argument("--rename-shared", action="store_true", help="with --replicas > 1, advertise nvidia.com/gpu.shared")
    p.add_argument("--recover-after", type=float, default=300.0, help="seconds without a fatal XID before a GPU is healthy again")
    p.add_argument("--kubeconfig", help="for node labels and pod assignments (default: in-cluster)")
    p.add_argument("--no-labels", action="store_true", help="do not label the node")
    p.add_argument("--metrics-addr", default="0.0.0.0:9400", help="Prometheus /metrics (dcgm-exporter names); '' to disable")
    p.add_argument("--pod-resources-socket", default="/var/lib/kubelet/pod-resources/kubelet.sock")
    p.add_argument("--once", action="store_true", help="discover, print what would be advertised and labelled, exit")


def run(args: argparse.Namespace) -> int:
    from .health import HealthTracker
    from .labels import desired_labels, inventory_json
    from .nvml import NoGpuError, open_backend
    from .plugin import DevicePlugin, KubeletWatcher, resources_for

    from ..engine.errors import ConfigError
    from .config import load_agent_config

    if args.config:
        try:
            cfg = load_agent_config(args.config)
        except ConfigError as exc:
            print(f"gpufleet agent: {exc}")
            return 2
        args.mig_strategy, args.replicas, args.rename_shared, args.recover_after = (
            cfg.mig_strategy, cfg.replicas, cfg.rename_shared, cfg.recover_after_s)
    if args.nvml != "real" and not args.nvml.startswith("fake:"):
        print(f"gpufleet agent: --nvml must be 'real' or fake:PROFILE, got {args.nvml!r}")
        return 2
    try:
        backend = open_backend(args.nvml[5:] if args.nvml.startswith("fake:") else None)
    except (NoGpuError, ValueError) as exc:
        print(f"gpufleet agent: {exc}")
        return 1
    gpus = backend.gpus()
    driver = backend.driver()
    strategy = "mixed" if args.mig_strategy == "none" else args.mig_strategy
    resources = resources_for(gpus, strategy, args.replicas, args.rename_shared)
    if args.once:
        print(f"driver {driver.driver_version}, CUDA {driver.cuda_version[0]}.{driver.cuda_version[1]}; {len(gpus)} GPU(s)")
        for g in gpus:
            mig = f" MIG[{', '.join(m.profile for m in g.mig)}]" if g.mig_enabled else ""
            print(f"  {g.index}: {g.name} {g.memory_mib} MiB {g.uuid} numa {g.numa_node}{mig}")
        print("resources: " + ", ".join(resources))
        for k, v in sorted(desired_labels(driver, gpus, strategy, args.replicas).items()):
            print(f"  {k}={v}")
        return 0
    node_api = None
    if args.node_name:
        try:
            from kubernetes import client, config

            config.load_kube_config(args.kubeconfig) if args.kubeconfig else config.load_incluster_config()
            node_api = client.CoreV1Api()
        except Exception as exc:
            print(f"gpufleet agent: no API access ({exc}); serving the device plugin with kubelet's device choice, node labels are off")
    else:
        print("gpufleet agent: no --node-name/NODE_NAME; serving the device plugin only, node labels are off")
    pods = None
    if node_api is not None:
        from .podsource import KubePodSource

        pods = KubePodSource(node_api, args.node_name)
    plugins = [DevicePlugin(r, gpus, args.device_plugin_dir, strategy, args.replicas, pods=pods) for r in resources]
    tracker = HealthTracker(backend, recover_after_s=args.recover_after)
    kubelet = KubeletWatcher(os.path.join(args.device_plugin_dir, "kubelet.sock"))
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    label_api = None if args.no_labels else node_api
    collector = None
    if args.metrics_addr:
        from prometheus_client import CollectorRegistry, start_http_server

        from .exporter import GpuCollector, KubeletPodResources

        reg = CollectorRegistry()
        collector = GpuCollector(backend, args.node_name or os.uname().nodename, KubeletPodResources(args.pod_resources_socket))
        reg.register(collector)
        host, port = args.metrics_addr.rsplit(":", 1)
        start_http_server(int(port), addr=host, registry=reg)
    last_labels = 0.0
    while not stop.is_set():
        if kubelet.changed():  # first start, or kubelet restarted and wiped our sockets
            for p in plugins:
                p.stop()
                p.start()
                try:
                    p.register(kubelet.path)
                    log.info("registered %s with kubelet", p.resource)
                except Exception as exc:
                    log.warning("registering %s failed: %s", p.resource, exc)
                    kubelet._ident = None  # retry next round
        health = tracker.update()
        if collector is not None:
            collector.note_xids([])  # XIDs are consumed by the health tracker; it records them below
            for i, reason in tracker.reasons.items():
                if reason.startswith("XID "):
                    collector.last_xid[i] = int(reason.split()[1])
        for p in plugins:
            p.set_health(health)
        if label_api is not None and time.time() - last_labels > 60:
            from .labels import label_patch

            try:
                node = label_api.read_node(args.node_name)
                patch = label_patch(node.metadata.labels or {}, desired_labels(driver, gpus, strategy, args.replicas),
                                    inventory_json(gpus, health), (node.metadata.annotations or {}).get("gpufleet.io/gpu-inventory"))
                if patch:
                    label_api.patch_node(args.node_name, patch)
                last_labels = time.time()
            except Exception as exc:
                log.warning("labelling node %s failed: %s", args.node_name, exc)
        stop.wait(2.0)
    for p in plugins:
        p.stop()
    return 0
