"""Drive a real node for the e2e tier: bring-up and teardown through the recipe, processes by PID, pods by kubectl.

Every process the tier starts is recorded in the recipe's ``node-pids`` file ("name pid exe"), so the recipe's
``node-down.sh`` stops it by PID (after checking /proc/PID/exe) and undoes the node's host changes, also
after an interrupted run.  Restarts (kubelet, kube-apiserver, agent, scheduler) stop a process by its recorded PID
and start the same command line again.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from .conftest import e2e_env

REPO = Path(__file__).resolve().parents[2]
NODE = "k8s-e2e-node"
KUBELET_ROOT = Path("/var/lib/kubelet")


class RealNode:
    def __init__(self, loc: dict[str, str], data: Path, logs: Path) -> None:
        self.loc = loc
        self.data, self.logs = data, logs
        self.kubeconfig = data / "kubeconfig"
        self.env = dict(os.environ, E2E_DATA=str(data), E2E_LOGS=str(logs), E2E_KUBECONFIG=str(self.kubeconfig),
                        E2E_BIN=loc["bin"], K8S_BIN=loc["assets"], GPUFLEET_E2E_BIN=loc["bin"],
                        KUBEBUILDER_ASSETS=loc["assets"], GPUFLEET_E2E_RECIPE=loc["recipe"], GPUFLEET_SRC=str(REPO),
                        PYTHONPATH=str(REPO / "src"), PYTHONDONTWRITEBYTECODE="1")
        # the fake NVML's per-process load ($GPUFLEET_FAKE_PROCESSES): a test writes it, no file is no load
        self.env["GPUFLEET_FAKE_PROCESSES"] = str(data / "fake-processes.json")
        self.npids = data / "node-pids"
        self.argv: dict[str, list[str]] = {}
        self.up_s = 0.0

    # --- bring-up / teardown --------------------------------------------------------------
    def up(self) -> float:
        t = time.monotonic()
        r = subprocess.run(["bash", str(REPO / "tests" / "e2e" / "node_up.sh")], env=self.env, capture_output=True, check=False,
                           text=True, timeout=300)
        if r.returncode != 0:
            raise RuntimeError(f"node_up.sh failed ({r.returncode}): {r.stdout[-2000:]} {r.stderr[-2000:]}")
        return time.monotonic() - t

    def down(self) -> str:
        r = subprocess.run(["bash", str(Path(self.loc["recipe"]) / "node-down.sh")], env=self.env,
                           capture_output=True, text=True, timeout=300, check=False)
        return r.stdout[-3000:] + r.stderr[-1000:]

    # --- processes ------------------------------------------------------------------------
    def _records(self) -> list[tuple[str, int, str]]:
        out = []
        if self.npids.exists():
            for line in self.npids.read_text().splitlines():
                parts = line.split(" ", 2)
                if len(parts) == 3:
                    out.append((parts[0], int(parts[1]), parts[2]))
        return out

    def pid_of(self, name: str) -> int | None:
        for n, pid, exe in reversed(self._records()):
            if n == name and _exe(pid) == exe:
                return pid
        return None

    def start(self, name: str, argv: list[str]) -> int:
        with open(self.logs / f"{name}.log", "a") as log:
            p = subprocess.Popen(argv, env=self.env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                 start_new_session=True)
        for _ in range(50):
            exe = _exe(p.pid)
            if exe:
                break
            time.sleep(0.1)
        if not exe:
            raise RuntimeError(f"{name} did not start: {(self.logs / f'{name}.log').read_text()[-1500:]}")
        with open(self.npids, "a") as f:
            f.write(f"{name} {p.pid} {exe}\n")
        self.argv[name] = argv
        return p.pid

    def stop(self, name: str, grace_s: float = 15.0) -> list[str]:
        """SIGTERM the recorded process, SIGKILL after the grace; returns its command line."""
        pid = self.pid_of(name)
        if pid is None:
            raise RuntimeError(f"{name} is not running")
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().rstrip(b"\0").split(b"\0")
        exe = _exe(pid)
        os.kill(pid, 15)
        t = time.monotonic()
        while _exe(pid) == exe and time.monotonic() - t < grace_s:
            time.sleep(0.1)
        if _exe(pid) == exe:
            os.kill(pid, 9)
            time.sleep(0.5)
        lines = [ln for ln in self.npids.read_text().splitlines() if not ln.startswith(f"{name} {pid} ")]
        self.npids.write_text("".join(ln + "\n" for ln in lines))
        try:  # reap it if it is our child
            os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            pass  # started by node_up.sh, not by us
        return [a.decode() for a in argv]

    def restart(self, name: str, pause_s: float = 0.0, argv: list[str] | None = None) -> None:
        old = self.stop(name)
        time.sleep(pause_s)
        self.start(name, argv or old)

    def restart_apiserver(self) -> float:
        """kube-apiserver from the recipe's cp-up.sh ($E2E_DATA/pids, "name pid"): stop, start the same command line,
        update the record; returns seconds until /readyz answers again."""
        pids = self.data / "pids"
        rec = [ln.split() for ln in pids.read_text().splitlines() if ln.strip()]
        pid = next(int(p) for n, p in rec if n == "kube-apiserver")
        argv = [a.decode() for a in Path(f"/proc/{pid}/cmdline").read_bytes().rstrip(b"\0").split(b"\0")]
        exe = _exe(pid)
        os.kill(pid, 15)
        t = time.monotonic()
        while _exe(pid) == exe and time.monotonic() - t < 20:
            time.sleep(0.1)
        with open(self.logs / "kube-apiserver.log", "a") as log:
            p = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        pids.write_text("".join(f"{n} {p.pid if n == 'kube-apiserver' else q}\n" for n, q in rec))
        t0 = time.monotonic()
        while time.monotonic() - t0 < 120:
            r = self.kubectl("get", "--raw", "/readyz", check=False, timeout=10)
            if r.strip() == "ok":
                return time.monotonic() - t0
            time.sleep(0.5)
        raise RuntimeError("kube-apiserver not ready after restart")

    def gpufleet(self, name: str, args: list[str]) -> int:
        return self.start(name, [sys.executable, "-m", "gpufleet.cli.main", *args])

    def fakedev(self, gpus: int) -> Path:
        """Fake device nodes /dev/nvidia0..gpus-1 and nvidiactl in a private dir (not /dev): the agent's --dev-root,
        from which it hands containers their /dev/nvidiaN (nvidia-uvm left out: the agent skips it)."""
        d = self.data / "fakedev"
        d.mkdir(exist_ok=True)
        for name, minor in [(f"nvidia{i}", i) for i in range(gpus)] + [("nvidiactl", 255)]:
            if not (d / name).exists():
                os.mknod(d / name, 0o666 | 0o020000, os.makedev(195, minor))
        return d

    # --- API ------------------------------------------------------------------------------
    def kubectl(self, *args: str, input: str | None = None, check: bool = True, timeout: float = 60) -> str:
        r = subprocess.run([str(Path(self.loc["bin"]) / "kubectl"), "--kubeconfig", str(self.kubeconfig), *args],
                           input=input, capture_output=True, text=True, timeout=timeout, check=False)
        if check and r.returncode != 0:
            raise RuntimeError(f"kubectl {' '.join(args)}: {r.stderr.strip()[-1000:]}")
        return r.stdout

    def get_json(self, *args: str) -> Any:
        for attempt in range(60):  # the apiserver may be restarting
            try:
                return json.loads(self.kubectl("get", *args, "-o", "json", timeout=20))
            except (RuntimeError, subprocess.TimeoutExpired, ValueError):
                if attempt == 59:
                    raise
                time.sleep(1)

    def pods(self) -> list[dict]:
        return self.get_json("pods", "-A")["items"]

    def node(self) -> dict:
        return self.get_json("node", NODE)

    def pod_logs(self, ns: str, name: str) -> str:
        return self.kubectl("logs", "-n", ns, name, check=False, timeout=20)

    def pod_resources(self) -> dict[tuple[str, str], list[str]]:
        """(namespace, pod) -> kubelet's device IDs for GPU resources (PodResources List)."""
        import grpc

        from gpufleet.agent.podresources import podresources_pb2 as pb
        from gpufleet.agent.podresources import podresources_pb2_grpc as pbg

        with grpc.insecure_channel(f"unix://{KUBELET_ROOT}/pod-resources/kubelet.sock") as ch:
            resp = pbg.PodResourcesListerStub(ch).List(pb.ListPodResourcesRequest(), timeout=10)
        out: dict[tuple[str, str], list[str]] = {}
        for p in resp.pod_resources:
            for c in p.containers:
                for d in c.devices:
                    if d.resource_name.startswith(("nvidia.com/gpu", "nvidia.com/mig-")):
                        out.setdefault((p.namespace, p.name), []).extend(d.device_ids)
        return out

    def kubelet_log_has(self, text: str, since_bytes: int = 0) -> bool:
        p = self.logs / "kubelet.log"
        if not p.exists():
            return False
        with open(p, "rb") as f:
            f.seek(since_bytes)
            return text.encode() in f.read()

    def log_size(self, name: str) -> int:
        p = self.logs / f"{name}.log"
        return p.stat().st_size if p.exists() else 0


def _exe(pid: int) -> str:
    try:
        return os.readlink(f"/proc/{pid}/exe").removesuffix(" (deleted)")
    except OSError:
        return ""


def wait(cond, timeout_s: float, every_s: float = 0.5) -> bool:
    t = time.monotonic()
    while time.monotonic() - t < timeout_s:
        try:
            if cond():
                return True
        except Exception:  # noqa: BLE001, S110 - a component restarting: try again
            pass
        time.sleep(every_s)
    return False


@contextlib.contextmanager
def module_node(prefix: str, *, env: dict[str, str] | None = None, logs_subdir: str = "") -> Iterator[RealNode]:
    """A real node for a test module's (or a parametrized test's) fixture: ``with module_node(...) as n: yield n``.

    Skips without the real-node tier's environment; holds ``$GPUFLEET_E2E_LOCK`` (a flock) while the node is up when
    that names a lock file; a SIGTERM (CI's timeout) still tears the node down; the data go under
    ``$GPUFLEET_E2E_DATA`` (kept) or a temp dir (removed), the logs under ``$E2E_LOGS`` or the temp dir (kept), in
    ``logs_subdir`` when given.  ``env``: the node's own settings (node_up.sh, cp-up.sh: ``KUBELET_FEATURE_GATES``,
    ``KCM_EXTRA_ARGS``, ``APISERVER_EXTRA_ARGS``, ``SCHEDULER_EXTRA_ARGS``); an ``*_ARGS`` value is added to one the
    environment already has, any other replaces it.  ``n.up_s``: how long the node took to come up."""
    loc, why = e2e_env()
    if why:
        pytest.skip(why)
    base = Path(tempfile.mkdtemp(prefix=prefix))
    data = Path(os.environ.get("GPUFLEET_E2E_DATA") or base / "data")
    n = RealNode(loc, data, Path(os.environ.get("E2E_LOGS") or base / "logs") / logs_subdir)
    n.logs.mkdir(parents=True, exist_ok=True)
    for var, val in (env or {}).items():
        n.env[var] = f"{n.env.get(var, '')} {val}".strip() if var.endswith("ARGS") else val

    def interrupted(*_: object) -> None:
        raise KeyboardInterrupt

    with contextlib.ExitStack() as held:
        if os.environ.get("GPUFLEET_E2E_LOCK"):
            lock = held.enter_context(open(os.environ["GPUFLEET_E2E_LOCK"], "a"))
            fcntl.flock(lock, fcntl.LOCK_EX)
        old = signal.signal(signal.SIGTERM, interrupted)
        try:
            n.up_s = n.up()
            yield n
        finally:
            (n.logs / "teardown.log").write_text(n.down())
            signal.signal(signal.SIGTERM, old)
            shutil.rmtree(base / "data", ignore_errors=True)
