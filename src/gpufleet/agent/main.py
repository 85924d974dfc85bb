"""``gpufleet agent``: discovery, one device plugin per resource, health loop, node labels, metrics.

The loop (every ``--interval`` seconds; re-registration is checked every
``KUBELET_POLL_S`` in between) re-registers when kubelet.sock is
re-created or a plugin socket vanished (kubelet restart), pushes health
changes to ``ListAndWatch``, keeps the node's labels and inventory current,
forgets served pods that are gone, and reloads the config file when it
changes (a bad new version is reported, the running one keeps serving).
SIGTERM/SIGINT stop it cleanly: plugin sockets are removed, exit status 0.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import signal
import sys
import threading
import time
from typing import Callable

from ..argtypes import float_range, host_port

log = logging.getLogger("gpufleet.agent")
KUBELET_POLL_S = 0.05  # how often the loop looks for a restarted kubelet between its rounds
REGISTER_RETRY_S = 1.0  # between rounds, a refused registration is retried no sooner than this
ENDPOINT_SILENT_S = 30.0  # with --endpoint-dir: how long a resource may stay unregistered before the agent says so


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--node-name", default=os.environ.get("NODE_NAME", ""), help="this node (default: $NODE_NAME)")
    p.add_argument("--nvml", default=None,
                   help="'real' (default: the GPUs through NVML) or fake:PROFILE with PROFILE a100-mig, h100-nvlink or t4 "
                        "(also $GPUFLEET_NVML, or $GPUFLEET_FAKE_NVML=PROFILE)")
    p.add_argument("--config", help="agent config YAML (migStrategy, replicas, renameShared, recoverAfterSeconds, ...); "
                                    "flags given explicitly win over it")
    p.add_argument("--device-plugin-dir", default="/var/lib/kubelet/device-plugins",
                   help="where kubelet.sock lives and the plugin sockets go")
    p.add_argument("--state-dir", default="/var/lib/gpufleet/agent",
                   help="allocation checkpoints (kept out of the device-plugin dir, which kubelet cleans)")
    p.add_argument("--endpoint-dir", default="",
                   help="serve kubelet through `gpufleet agent-endpoint` (its --endpoint-dir): the device-plugin servers "
                        "listen here and plugins.json lists them; the endpoint registers with kubelet and keeps its "
                        "connection while this process restarts (docs/agent.md). Default: register with kubelet itself")
    p.add_argument("--mig-strategy", choices=["mixed", "single", "none"], default=None, help="default: mixed")
    p.add_argument("--replicas", type=int, default=None, help="time-slicing: advertise each GPU this many times (default 1)")
    p.add_argument("--shares-per-gpu", type=int, default=None,
                   help="kubelet devices per GPU for gpufleet-placed pods, so shares never outrun kubelet's count (default 10)")
    p.add_argument("--rename-shared", action="store_true", default=None, help="with --replicas > 1, advertise nvidia.com/gpu.shared")
    p.add_argument("--recover-after", type=float, default=None, help="seconds without a fatal XID before a GPU is healthy again (default 300)")
    p.add_argument("--device-specs", choices=["auto", "all", "existing", "none"], default="auto",
                   help="which /dev/nvidia* device nodes Allocate hands to containers: all (real GPUs), only those that "
                        "exist on this host, or none; auto (default) = all with the real backend, existing with a fake one")
    p.add_argument("--dev-root", default="/dev",
                   help="where the host's nvidia device nodes are (default /dev); containers always see them as /dev/nvidia*")
    p.add_argument("--mps-pipe-dir", default=None, help="for GPU shares: MPS pipe directory to mount into the container")
    p.add_argument("--kubeconfig", help="for node labels and pod assignments (default: in-cluster)")
    p.add_argument("--no-labels", action="store_true", help="do not label the node")
    p.add_argument("--interval", type=float_range(0.05, 3600), default=2.0, help="seconds between health/registration checks (default 2)")
    p.add_argument("--metrics-addr", type=host_port, default="0.0.0.0:9400", help="HOST:PORT for Prometheus /metrics (dcgm-exporter names); '' to disable")
    p.add_argument("--prices", default=os.environ.get("GPUFLEET_PRICES"), metavar="FILE",
                   help="price file for the GPU price series (docs/cost.md; default $GPUFLEET_PRICES, else the built-in "
                        "list prices; re-read when it changes)")
    p.add_argument("--pod-resources-socket", default="/var/lib/kubelet/pod-resources/kubelet.sock",
                   help="kubelet's PodResources socket, to attribute GPU metrics to pods")
    p.add_argument("--api-wait-s", type=float_range(0, 600), default=30.0,
                   help="while kubelet admits a pod and the API server does not answer, wait this long for it before "
                        "letting kubelet's device choice stand (default 30)")
    p.add_argument("--stop-drain-seconds", type=float_range(0, 600), default=5.0,
                   help="on SIGTERM: taint the node NoSchedule (gpufleet.io/agent-restarting), wait this long for pods "
                        "already bound to be admitted, then stop; the taint is removed once the plugins are registered again")
    p.add_argument("--dra", action="store_true",
                   help="serve the GPUs through Dynamic Resource Allocation (resource.k8s.io/v1): publish ResourceSlices and "
                        "serve kubelet's DRA plugin API instead of the device plugin (docs/dra.md)")
    p.add_argument("--dra-driver-name", default="gpu.gpufleet.io", help="with --dra: the DRA driver name (default gpu.gpufleet.io)")
    p.add_argument("--kubelet-plugins-dir", default="/var/lib/kubelet/plugins",
                   help="with --dra: kubelet's plugin directory; the DRA socket is <dir>/<driver>/dra.sock")
    p.add_argument("--kubelet-registry-dir", default="/var/lib/kubelet/plugins_registry",
                   help="with --dra: kubelet's plugin watcher directory (registration socket <driver>-reg.sock)")
    p.add_argument("--cdi-dir", default="/var/run/cdi", help="with --dra: where the claims' CDI specs go (default /var/run/cdi)")
    p.add_argument("--no-dra-shares", action="store_true",
                   help="with --dra: publish whole GPUs as exclusive devices (no consumable-capacity shares)")
    p.add_argument("--dra-nvidia-attributes", action=argparse.BooleanOptionalAction, default=True,
                   help="with --dra: also publish the attributes under gpu.nvidia.com/, so selectors and constraints written "
                        "for NVIDIA's driver match unchanged (default on; --no-dra-nvidia-attributes publishes them under "
                        "the driver's own domain only)")
    p.add_argument("--sysfs-root", default="/sys", help="with --dra: sysfs, for the PCIe root of each GPU (default /sys)")
    p.add_argument("--once", action="store_true", help="discover, print what would be advertised and labelled, exit")
    p.add_argument("--log-level", default=None, help="DEBUG, INFO, WARNING or ERROR (default INFO, DEBUG with gpufleet -v)")


def effective_config(args: argparse.Namespace, file_cfg):
    """Explicit flags win over the file, the file over the defaults."""
    from .config import AgentConfig, validate

    cfg = file_cfg or AgentConfig()
    over = {"mig_strategy": args.mig_strategy, "replicas": args.replicas, "shares_per_gpu": args.shares_per_gpu, "rename_shared": args.rename_shared,
            "recover_after_s": args.recover_after, "mps_pipe_dir": args.mps_pipe_dir}
    cfg = dataclasses.replace(cfg, **{k: v for k, v in over.items() if v is not None})
    return validate(cfg, "flags")


class Agent:
    """The long-running part, separated from argument parsing so tests can drive it step by step."""

    def __init__(self, backend, cfg, device_plugin_dir: str, state_dir: str, pods=None, labeller=None,
                 collector=None, clock: Callable[[], float] = time.time, rediscover_s: float = 60.0,
                 device_specs: str = "all", recorder=None, dev_root: str = "/dev", dra=None, endpoint_dir: str = "") -> None:
        from .health import HealthTracker
        from .plugin import KubeletWatcher

        self.backend = backend
        self.gpus = backend.gpus()
        self.driver = backend.driver()
        self.device_plugin_dir = device_plugin_dir
        self.state_dir = state_dir
        self.pods = pods
        self.labeller = labeller
        self.collector = collector
        self.clock = clock
        self.tracker = HealthTracker(backend, recover_after_s=cfg.recover_after_s, clock=clock,
                                     indices=tuple(g.index for g in self.gpus))
        self.kubelet = KubeletWatcher(os.path.join(device_plugin_dir, "kubelet.sock"))
        self.register_failures = 0  # refused registrations so far: run() retries those at its own pace, not every poll
        self.health: dict[int, bool] = {g.index: True for g in self.gpus}
        self.plugins: list = []
        self.cfg = cfg
        self._last_labels = -1e18
        self._last_prune = clock()
        self._last_discovery = clock()
        self.rediscover_s = rediscover_s
        self.device_specs = device_specs
        self.dev_root = dev_root
        self.recorder = recorder  # reconcile.ForeignPodRecorder: kubelet's GPUs of pods other schedulers bound
        self.untaint: Callable[[], bool | None] | None = None  # removes the restart taint once all plugins registered
        # writes when the plugins registered (labels.announce_registered); ``registered_at``: that time, not yet written
        self.announce: Callable[[str], bool] | None = None
        self.registered_at: str | None = None
        self.dra = dra  # dra.driver.DraDriver: DRA mode, no device plugins
        # with an endpoint (gpufleet agent-endpoint): our servers listen in this directory, the endpoint registers them
        # with kubelet and forwards kubelet's calls, so kubelet's connection outlives this process
        self.endpoint_dir = endpoint_dir
        self._endpoint_seen: str | None = None  # the endpoint's latest registration time already announced
        self._endpoint_missing_since: float | None = None  # since when a resource is served here but not registered
        self._endpoint_said = 0.0
        self._build_plugins()

    def _build_plugins(self) -> None:
        from .plugin import DevicePlugin, resources_for

        c = self.cfg
        if self.dra is not None:
            self.plugins = []
            return
        sockets = self.endpoint_dir or self.device_plugin_dir
        self.plugins = [DevicePlugin(r, self.gpus, sockets, c.mig_strategy, c.replicas, slots=c.slots, pods=self.pods,
                                     state_dir=self.state_dir, mps_pipe_dir=c.mps_pipe_dir or None,
                                     device_specs=self.device_specs, dev_root=self.dev_root)
                        for r in resources_for(self.gpus, c.mig_strategy, c.replicas, c.rename_shared)]
        for p in self.plugins:
            p.set_health(self.health)

    def reconfigure(self, cfg) -> None:
        """A new config: rebuild the plugins (resource names may change) and register them again."""
        if cfg == self.cfg:
            return
        log.info("config changed: %s", cfg)
        self.stop_plugins()
        self.cfg = cfg
        self.tracker.recover_after_s = cfg.recover_after_s
        self._build_plugins()
        self.kubelet.forget()
        self._last_labels = -1e18

    def rediscover(self) -> bool:
        """Read the GPUs again; a changed set (MIG re-partitioned, a GPU gone) rebuilds the plugins."""
        try:
            gpus = self.backend.gpus()
        except Exception as exc:  # NVML hiccup: keep serving what we know
            log.warning("re-discovery failed: %s", exc)
            return False
        if gpus == self.gpus:
            return False
        log.info("GPU set changed (%d -> %d GPUs, MIG %s -> %s): rebuilding the device plugins", len(self.gpus), len(gpus),
                 [m.profile for g in self.gpus for m in g.mig], [m.profile for g in gpus for m in g.mig])
        self.stop_plugins()
        self.gpus = gpus
        self.tracker.indices = tuple(g.index for g in gpus)
        self.health = {g.index: self.health.get(g.index, True) for g in gpus}
        self._build_plugins()
        self.kubelet.forget()
        self._last_labels = -1e18
        if self.collector is not None and hasattr(self.collector, "refresh_inventory"):
            self.collector.refresh_inventory()
        return True

    def step(self) -> None:
        if self.clock() - self._last_discovery >= self.rediscover_s:
            self._last_discovery = self.clock()
            self.rediscover()
        if self.dra is not None:
            self.dra.step()
        self.register()
        self._after_register()

    def register(self) -> None:
        """(Re-)register every plugin whose socket is gone, all of them when kubelet restarted.  Cheap when nothing
        changed (a stat of kubelet.sock and of each plugin socket): ``run`` calls it every ``KUBELET_POLL_S``,
        because kubelet admits the pods bound to it at once after a restart, and a pod admitted before the
        plugin is registered again fails for good ("no healthy devices present"; seen on the real node with a
        1 s loop: the burst bound while kubelet was down, all of it)."""
        if self.endpoint_dir:
            self._serve_endpoint()
            return
        kubelet_new = self.kubelet.changed() if self.dra is None else False
        registered = False
        for p in self.plugins:
            if kubelet_new or not p.serving():
                p.stop(grace_s=0.0)  # the kubelet that called it is gone: nothing in flight worth waiting for
                p.start()
                if not os.path.exists(self.kubelet.path):
                    log.debug("%s: no kubelet socket at %s yet", p.resource, self.kubelet.path)
                    continue  # kubelet not up (yet): registered when its socket appears
                try:
                    p.register(self.kubelet.path)
                    log.info("registered %s with kubelet (%s)", p.resource, p.endpoint)
                    registered = True
                except Exception as exc:
                    log.warning("registering %s failed: %s; retrying", p.resource, exc)
                    self.kubelet.forget()
                    self.register_failures += 1
        if registered and all(p.serving() for p in self.plugins) and not self.kubelet_pending():
            from .endpoint import iso_now

            self.registered_at = iso_now()
            self.publish_registration()  # at once; a failure is retried by step(), not every KUBELET_POLL_S

    def _serve_endpoint(self) -> None:
        """With an endpoint: (re)start every server whose socket is gone, keep plugins.json listing them, and announce
        the endpoint's registration with kubelet once it covers all of them (its ``registered.json``)."""
        from .endpoint import read_manifest, read_stamp, write_manifest

        for p in self.plugins:
            if not p.serving():
                p.stop(grace_s=0.0)
                p.start()
        want = [(p.resource, p.endpoint) for p in self.plugins]
        if read_manifest(self.endpoint_dir) != want:
            try:
                os.makedirs(self.endpoint_dir, exist_ok=True)
                write_manifest(self.endpoint_dir, want)
                log.info("serving %s for the device-plugin endpoint (%s)", ", ".join(r for r, _ in want), self.endpoint_dir)
            except OSError as exc:
                log.error("cannot write the endpoint's plugin list in %s: %s", self.endpoint_dir, exc)
                self.register_failures += 1
                return
        stamp = read_stamp(self.endpoint_dir)
        missing = [r for r, _ in want if r not in stamp]
        now = time.monotonic()
        if not missing:
            self._endpoint_missing_since = None
        elif self._endpoint_missing_since is None:
            self._endpoint_missing_since = self._endpoint_said = now
        elif now - self._endpoint_said >= ENDPOINT_SILENT_S:
            self._endpoint_said = now  # said again every ENDPOINT_SILENT_S while it lasts
            log.error("no device-plugin endpoint has registered %s with kubelet for %.0f s: kubelet offers no such device "
                      "on this node. Is `gpufleet agent-endpoint --endpoint-dir %s` running (deploy/agent: the `endpoint` "
                      "container)?", ", ".join(missing), now - self._endpoint_missing_since, self.endpoint_dir)
        if want and not missing:
            latest = max(stamp[r] for r, _ in want)
            if latest != self._endpoint_seen:
                self._endpoint_seen = latest
                self.registered_at = latest  # the endpoint's clock is this node's: when kubelet took the plugins
                self.publish_registration()

    def endpoint_registered(self) -> bool:
        from .endpoint import read_stamp

        stamp = read_stamp(self.endpoint_dir)
        return bool(self.plugins) and all(p.resource in stamp for p in self.plugins)

    def publish_registration(self) -> None:
        """Say on the Node when the plugins registered (once per registration; retried each round until it is said)."""
        if self.registered_at is not None and self.announce is not None and self.announce(self.registered_at):
            self.registered_at = None

    def _after_register(self) -> None:
        self.publish_registration()
        registered = self.untaint is not None and (self.dra.registered() if self.dra is not None else
                                                   all(p.serving() for p in self.plugins) and
                                                   (self.endpoint_registered() if self.endpoint_dir else not self.kubelet_pending()))
        if registered and self.untaint is not None and self.untaint() is not None:
            self.untaint = None
        self.health = self.tracker.update()
        if self.collector is not None:
            self.collector.note_xids(self.tracker.recent_xids)
        for p in self.plugins:
            p.set_health(self.health)
        if self.dra is not None:
            self.dra.update(self.gpus, self.driver, self.health, self.tracker.reasons)
        now = self.clock()
        if self.labeller is not None and now - self._last_labels >= self.cfg.label_interval_s:
            from .labels import desired_labels, inventory_json
            from .plugin import resources_for

            c = self.cfg
            from .labels import NO_INVENTORY

            self.labeller.sync(desired_labels(self.driver, self.gpus, c.mig_strategy, c.replicas, c.rename_shared),
                               NO_INVENTORY if self.dra is not None else  # DRA: the ResourceSlices are the inventory
                               inventory_json(self.gpus, self.health, gpu_slots=c.slots,
                                              gpu_resource=resources_for(self.gpus, c.mig_strategy, c.replicas, c.rename_shared)[0]))
            self._last_labels = now
        if self.recorder is not None:
            self.recorder.sync(self.gpus)
        if self.pods is not None and hasattr(self.pods, "live_pods") and now - self._last_prune >= 300:
            live = self.pods.live_pods()
            if live is not None:
                for p in self.plugins:
                    p.prune(live)
            self._last_prune = now

    def kubelet_pending(self) -> bool:
        """True while a registration is still to be retried (kubelet away or refusing)."""
        return self.kubelet._ident is None

    def stop_plugins(self) -> None:
        for p in self.plugins:
            p.stop()
            try:
                os.unlink(p.socket_path)
            except FileNotFoundError:
                pass


def run(args: argparse.Namespace) -> int:
    from ..engine.errors import ConfigError
    from .config import load_agent_config
    from .labels import desired_labels
    from .nvml import NoGpuError, backend_spec, open_backend
    from .plugin import resources_for

    if not logging.getLogger().handlers:  # run() called directly (tests); cli.main configures it otherwise
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        file_cfg = load_agent_config(args.config) if args.config else None
        cfg = effective_config(args, file_cfg)
        fake = backend_spec(args.nvml, os.environ)
    except (ConfigError, ValueError) as exc:
        print(f"gpufleet agent: {exc}", file=sys.stderr, flush=True)
        return 2
    try:
        backend = open_backend(fake)
    except NoGpuError as exc:
        print(f"gpufleet agent: {exc}", file=sys.stderr, flush=True)
        return 1
    if fake:
        print(f"gpufleet agent: using the FAKE NVML backend (profile {fake}); no real GPU is read", flush=True,
              file=sys.stderr if args.once and args.dra else sys.stdout)  # --dra --once prints JSON only
    gpus, driver = backend.gpus(), backend.driver()
    if args.dra and args.endpoint_dir:
        print("gpufleet agent: --endpoint-dir is for the device plugin; with --dra kubelet's DRA API is served directly",
              file=sys.stderr, flush=True)
        return 2
    if args.dra and not args.once and not args.node_name:
        print("gpufleet agent: --dra needs --node-name (or $NODE_NAME): the ResourceSlices are the node's", file=sys.stderr, flush=True)
        return 2
    dra_opts = None
    if args.dra:
        from .dra.devices import DraOptions

        dra_opts = DraOptions(driver=args.dra_driver_name, shares=not args.no_dra_shares,
                              nvidia_attributes=args.dra_nvidia_attributes, sysfs_root=args.sysfs_root)
    if args.once and dra_opts is not None:
        import json

        from .dra.devices import build_devices

        print(json.dumps({"driver": dra_opts.driver, "devices": build_devices(gpus, driver, dra_opts).devices}, indent=1))
        return 0
    if args.once:
        print(f"driver {driver.driver_version}, CUDA {driver.cuda_version[0]}.{driver.cuda_version[1]}; {len(gpus)} GPU(s)")
        for g in gpus:
            mig = f" MIG[{', '.join(m.profile for m in g.mig)}]" if g.mig_enabled else ""
            link = f" nvlink{list(g.nvlink_peers)}" if g.nvlink_peers else ""
            print(f"  {g.index}: {g.name} {g.memory_mib} MiB {g.uuid} {g.pci_bus_id} numa {g.numa_node} "
                  f"cc {g.compute_capability[0]}.{g.compute_capability[1]} {g.family}{mig}{link}")
        print("resources: " + ", ".join(resources_for(gpus, cfg.mig_strategy, cfg.replicas, cfg.rename_shared))
              + f" ({cfg.slots} kubelet devices per GPU)")
        for k, v in sorted(desired_labels(driver, gpus, cfg.mig_strategy, cfg.replicas, cfg.rename_shared).items()):
            print(f"  {k}={v}")
        return 0

    device_specs = args.device_specs if args.device_specs != "auto" else ("existing" if fake else "all")
    early = deferred = None
    if args.node_name and not args.dra:
        # the device plugin first: kubelet refuses every GPU pod it admits while no plugin is registered (after an
        # agent crash: until this process registers), and the API client's import and set-up took seconds on a loaded
        # node; an Allocate that needs the API meanwhile waits for it (podsource.DeferredPods), it is not refused
        from .podsource import DeferredPods

        for d in (args.state_dir, args.endpoint_dir):
            try:
                if d:
                    os.makedirs(d, exist_ok=True)
            except OSError:
                pass  # the state dir: said below; the endpoint dir: the plugin list cannot be written (logged)
        deferred = DeferredPods(args.api_wait_s)
        early = Agent(backend, cfg, args.device_plugin_dir, args.state_dir, deferred, device_specs=device_specs,
                      dev_root=args.dev_root, endpoint_dir=args.endpoint_dir)
        try:
            early.register()
        except Exception:
            log.exception("registering with kubelet failed")
    core = None
    if args.node_name:
        try:
            from kubernetes import client, config

            config.load_kube_config(args.kubeconfig) if args.kubeconfig else config.load_incluster_config()
            core = client.CoreV1Api()
        except Exception as exc:
            if args.dra:
                print(f"gpufleet agent: --dra needs API access (ResourceSlices, ResourceClaims): {exc}", file=sys.stderr, flush=True)
                return 1
            print(f"gpufleet agent: no API access ({exc}); serving the device plugin with kubelet's device choice, "
                  "node labels are off", flush=True)
    else:
        print("gpufleet agent: no --node-name/NODE_NAME; serving the device plugin only, node labels are off", flush=True)
    pods = labeller = None
    if core is not None and not args.dra:
        from .podsource import KubePodSource, NodePodCache

        # its own watch of the pods bound here: what kubelet admits, the agent has seen too, also when the API server
        # cannot be read at that moment (docs/agent.md, Allocation)
        cache = NodePodCache(core, args.node_name)
        cache.start()
        pods = KubePodSource(core, args.node_name, args.pod_resources_socket or None, api_wait_s=args.api_wait_s,
                             cache=cache)
    if deferred is not None:
        deferred.provide(pods)
    if early is not None and core is not None and not args.no_labels:
        from .labels import announce_registered

        node_name = args.node_name
        early.announce = lambda when: announce_registered(core, node_name, when)
        early.publish_registration()  # the scheduler holds GPU pods off this node until it reads this (kube/plugin_down)
    if core is not None:
        from .labels import NodeLabeller

        labeller = None if args.no_labels else NodeLabeller(core, args.node_name)
    try:
        os.makedirs(args.state_dir, exist_ok=True)
    except OSError as exc:
        print(f"gpufleet agent: state dir {args.state_dir}: {exc}; allocations will not survive a restart", flush=True)

    agent_holder: list[Agent] = []
    collector = None
    if args.metrics_addr:
        from prometheus_client import CollectorRegistry, start_http_server

        from .exporter import build_collector

        collector = build_collector(backend, args.node_name or os.uname().nodename, args.pod_resources_socket, core,
                                    args.node_name, health=lambda: agent_holder[0].health if agent_holder else {},
                                    dra_uuid=lambda drv, pool, dev: agent_holder[0].dra.uuid_of(drv, pool, dev)
                                    if agent_holder and agent_holder[0].dra is not None else None,
                                    prices_path=args.prices)
        reg = CollectorRegistry()
        reg.register(collector)
        host, port = args.metrics_addr.rsplit(":", 1)
        start_http_server(int(port), addr=host, registry=reg)
    if device_specs != "all":
        missing = [p for p in [f"nvidia{g.dev_minor}" for g in gpus] + ["nvidiactl", "nvidia-uvm", "nvidia-uvm-tools"]
                   if not os.path.exists(os.path.join(args.dev_root, p))]
        log.info("device specs: %s%s", device_specs,
                 f" (not handed to containers, absent here: {', '.join(missing)})" if device_specs == "existing" and missing else "")
    recorder = None
    if core is not None and args.pod_resources_socket and not args.dra:
        from .exporter import KubeletPodResources
        from .reconcile import ForeignPodRecorder

        recorder = ForeignPodRecorder(core, args.node_name, KubeletPodResources(args.pod_resources_socket))
    dra = None
    if dra_opts is not None:
        from kubernetes import client as kclient

        from .dra.cdi import CdiWriter
        from .dra.driver import DraDriver
        from .dra.kubeapi import KubeDraApi

        minor = {g.index: g.dev_minor for g in gpus}
        dra = DraDriver(KubeDraApi(kclient.ApiClient(), instance=args.node_name), args.node_name, dra_opts, args.state_dir,
                        CdiWriter(args.cdi_dir, args.dev_root, device_specs, cfg.mps_pipe_dir, lambda i: minor.get(i, i)),
                        args.kubelet_plugins_dir, args.kubelet_registry_dir)
    if early is not None:
        agent = early
        agent.labeller, agent.collector, agent.recorder = labeller, collector, recorder
    else:
        agent = Agent(backend, cfg, args.device_plugin_dir, args.state_dir, pods, labeller, collector, device_specs=device_specs,
                      recorder=recorder, dev_root=args.dev_root, dra=dra, endpoint_dir="" if dra is not None else args.endpoint_dir)
    if dra is not None:
        dra.update(agent.gpus, agent.driver, agent.health, {})
        dra.start()
    agent_holder.append(agent)
    if core is not None and not args.no_labels:
        from .labels import set_restart_taint

        node = args.node_name
        agent.untaint = lambda: set_restart_taint(core, node, False)  # a previous stop's taint, if any
        if dra is None:
            from .labels import announce_registered

            agent.announce = lambda when: announce_registered(core, node, when)

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    cfg_mtime = _mtime(args.config)
    if dra is not None:
        log.info("serving DRA driver %s for node %s (plugin %s)", dra.opts.driver, args.node_name, dra.plugin.socket)
    else:
        log.info("serving %s from %s", ", ".join(p.resource for p in agent.plugins), args.device_plugin_dir)
    next_step = 0.0
    failures, failed_at = 0, -1e18
    while not stop.is_set():
        if time.monotonic() >= next_step:
            m = _mtime(args.config)
            if m != cfg_mtime:
                cfg_mtime = m
                try:
                    agent.reconfigure(effective_config(args, load_agent_config(args.config)))
                except ConfigError as exc:
                    log.error("%s; keeping the running configuration", exc)
            try:
                agent.step()
            except Exception:  # one bad round must not take the node's GPUs away
                log.exception("agent loop step failed")
            next_step = time.monotonic() + args.interval
        elif dra is None and time.monotonic() - failed_at >= REGISTER_RETRY_S:
            try:
                agent.register()  # a restarted kubelet gets our plugins within KUBELET_POLL_S, not the loop's interval
            except Exception:
                log.exception("registering with kubelet failed")
        if agent.register_failures != failures:  # a refused registration is retried after REGISTER_RETRY_S, not 20 times a second
            failures, failed_at = agent.register_failures, time.monotonic()
        stop.wait(min(KUBELET_POLL_S, max(0.0, next_step - time.monotonic())))
    if core is not None and not args.no_labels and args.stop_drain_seconds > 0:
        from .labels import set_restart_taint

        if set_restart_taint(core, args.node_name, True):
            log.info("waiting %.0f s for pods already bound here to be admitted", args.stop_drain_seconds)
            time.sleep(args.stop_drain_seconds)
    agent.stop_plugins()
    if dra is not None:
        dra.stop()
    log.info("stopped")
    return 0


def _mtime(path: str | None) -> float | None:
    if not path:
        return None
    try:
        return os.stat(path).st_mtime_ns
    except OSError:
        return None
