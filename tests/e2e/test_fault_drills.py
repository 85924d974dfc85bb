"""Fault drills on a real node, with numbers: one command runs them all, each drill N times, and writes the table.

    flock -w 1800 /work/realnode.lock env GPUFLEET_E2E_BIN=~/.cache/gpufleet/k8s/v1.37.2/bin \\
        PYTHONPATH=$PWD/src python3 -m pytest -q -s tests/e2e/test_fault_drills.py

``GPUFLEET_DRILL_RUNS`` (default 3) says how often each drill runs; the drills go in rounds (every drill once, then
again), so that the machine's load drifts over all of them alike.  The table gives the median time to recover and
the totals over the runs.  The real-node tier is not part of the default test command; ``GPUFLEET_DRILL_RUNS=1``
gives a quick pass, ``GPUFLEET_DRILLS=alloc`` (keys: ``DRILLS``) runs some drills only, and
``GPUFLEET_DRILL_API_WAIT_S=2`` gives the agent that ``--api-wait-s`` (default 30), so that a kube-apiserver restart
outlasts both of its waits while kubelet admits the burst.

A real node (Kubernetes 1.37.2: etcd, kube-apiserver, kube-scheduler, kube-controller-manager with its disruption
controller, kubelet, containerd; 8 fake H100s) with gpufleet's agent (default configuration) and two scheduler replicas
with leader election (as deploy/scheduler ships them).  A steady set of pods runs (whole GPUs and 250-milli shares)
under a PodDisruptionBudget (matchExpressions) that allows no disruption.  Beside gpufleet's pods, each set holds a
pod created with the default scheduler name: deploy/admission (applied as `kubectl apply -k deploy` does) routes it
to gpufleet, and the checks say so for each (on 1.35, which serves no MutatingAdmissionPolicy, kube-scheduler binds
it and the node guard stands alone; two schedulers placing pods at once may then race for a GPU, and the guard
refuses the loser: docs/safety.md).  Each drill starts a burst of new pods, injects the fault while they are being
placed and admitted, and then creates a probe pod (one whole GPU):

* none (the baseline: what the same burst and probe take without a fault);
* kube-apiserver restart; etcd restart; kubelet restart;
* agent restart (SIGTERM, as a DaemonSet update does) while kubelet is admitting a burst;
* agent SIGKILL in the middle of an Allocate (the agent runs behind its device-plugin endpoint, ``gpufleet
  agent-endpoint``, as deploy/agent ships it; the endpoint holds kubelet's connection): the agent is started with its
  test-only pause points
  (``GPUFLEET_AGENT_PAUSE_DIR``, gpufleet.agent.pause), the drill arms the Allocate point, and kills the agent while
  it sleeps there, its answer recorded in its checkpoint but not yet sent to kubelet; and the same with the endpoint
  killed instead (the fallback: kubelet sees a dead plugin);
* SIGKILL of the scheduler replica holding the Lease: mid-burst; in the middle of a gang (4 one-GPU members,
  minMember 4: killed while it holds room for the 2 members created so far, the other 2 created after); and during a
  preemption (the node full: 3 pods under a second budget allowing no disruption, 2 free ones; a 2-GPU pod of
  priority 1000; killed once its first victim goes).  The standby takes over; the killed one is started again;
* kube-apiserver unreachable for 30 s (SIGSTOP: connections hang, as behind a dead load balancer), then SIGCONT;
* (second test, DRA) the agent in ``--dra`` mode, claims allocated by kube-scheduler: SIGKILL in the middle of a
  NodePrepareResources (the claim recorded as prepared, kubelet not yet told).

Per drill: **recover s**, from the end of the fault (the restart issued, the process continued; the kill for a
leader) until the probe and every pod of the burst run; **pods lost**, pods of ours that are gone or failed (the
preemption's 2 expected victims aside); **refused at admission**, pods kubelet failed because the device plugin died
under their Allocate (kubelet does not call Allocate again: the pod is ``Failed``, ``UnexpectedAdmissionError``; the
drill's pods are bare, gpufleet re-creates each (kube/plugin_down; kube-scheduler's too, on 1.35, with
``--recreate-other-schedulers-pods``, once the plugin is back), and the drill waits for the copy: one not re-created
counts as lost); **bound twice**,
pods whose node or GPUs changed once they had them (DRA: a claim prepared twice); **GPUs over-committed**, GPUs whose
assignments add up to more than one GPU or that kubelet (PodResources) gave to a pod the assignment does not name
(DRA: a device in two claims, or a pod whose PodResources differ from its claim); **PDB-protected pods disrupted**,
pods under a budget allowing no disruption that went.  The table goes to stdout and to $E2E_LOGS/fault-drills.md.
"""

from __future__ import annotations

import json
import os
import re
import signal
import statistics
import time
import urllib.request
from pathlib import Path
from typing import Callable

import pytest
import yaml

from gpufleet.agent import pause as pause_points
from gpufleet.engine.annotations import GUARD_REFUSAL, RACED_REFUSAL

from tests.dra_release import release_of

from .harness import KUBELET_ROOT, NODE, RealNode, _exe, module_node, wait

PROFILE = "h100-nvlink"
UUIDS = [f"GPU-h100-{i:02d}" for i in range(8)]
REPO = Path(__file__).resolve().parents[2]
CDI_DIR = Path("/var/run/cdi")
DRIVER = "gpu.gpufleet.io"


def drill_runs() -> int:
    text = os.environ.get("GPUFLEET_DRILL_RUNS", "3")
    if not text.isdigit() or int(text) < 1:
        pytest.fail(f"GPUFLEET_DRILL_RUNS={text!r}: want a whole number >= 1", pytrace=False)
    return int(text)


DRILLS = ("base", "apiserver", "etcd", "kubelet", "agent", "alloc", "endpoint", "leader", "gang", "preempt", "cut")


def chosen(key: str) -> bool:
    """``GPUFLEET_DRILLS=alloc,base`` runs only those drills of test_fault_drills (keys: ``DRILLS``); unset: all."""
    text = os.environ.get("GPUFLEET_DRILLS", "")
    keys = {k.strip() for k in text.split(",") if k.strip()}
    if keys - set(DRILLS):
        pytest.fail(f"GPUFLEET_DRILLS={text!r}: unknown {sorted(keys - set(DRILLS))}; known: {', '.join(DRILLS)}",
                    pytrace=False)
    return not keys or key in keys


ROWS: list[dict] = []  # every run of every drill, both tests


@pytest.fixture(scope="module")
def node():
    with module_node("gpufleet-e2e-drills-") as n:
        yield n


def manifest(name: str, gpus: int = 1, milli: int | None = None, group: str | None = None, size: int = 0,
             app: str | None = None, priority_class: str | None = None, scheduler: str = "gpufleet") -> dict:
    ann = {}
    if milli:
        ann["gpufleet.io/gpu-milli"] = str(milli)
    if group:
        ann.update({"gpufleet.io/pod-group": group, "gpufleet.io/pod-group-min-member": str(size)})
    spec: dict = {"schedulerName": scheduler, "terminationGracePeriodSeconds": 0,
                  "containers": [{"name": "c", "image": "local/busybox:1", "imagePullPolicy": "Never",
                                  "command": ["sh", "-c", "env; sleep 3600"],
                                  "resources": {"limits": {"cpu": "10m", "memory": "16Mi", "nvidia.com/gpu": str(gpus)},
                                                "requests": {"cpu": "10m", "memory": "16Mi"}}}]}
    if priority_class:
        spec["priorityClassName"] = priority_class
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "default", "annotations": ann,
                                                            "labels": {"app": app or "drill"}}, "spec": spec}


def budget(name: str, app: str, min_available: int) -> dict:
    return {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": {"name": name, "namespace": "default"},
            "spec": {"minAvailable": min_available, "selector": {"matchExpressions": [
                {"key": "app", "operator": "In", "values": [app]}]}}}


def kill9(n: RealNode, name: str) -> int:
    """SIGKILL of a recorded process (a crash: no shutdown path runs); its record dropped. Returns its PID."""
    pid = n.pid_of(name)
    assert pid is not None, f"{name} is not running"
    exe = _exe(pid)
    os.kill(pid, signal.SIGKILL)
    t = time.monotonic()
    while _exe(pid) == exe and time.monotonic() - t < 10:
        time.sleep(0.05)
    n.npids.write_text("".join(ln + "\n" for ln in n.npids.read_text().splitlines() if not ln.startswith(f"{name} {pid} ")))
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass
    return pid


class PausePoints:
    """The drill's side of gpufleet.agent.pause: arm a point, wait until a call sleeps there, say which."""

    def __init__(self, d: Path) -> None:
        self.dir = d
        d.mkdir(parents=True, exist_ok=True)

    def arm(self, point: str, seconds: float = 60) -> None:
        (self.dir / f"{point}.paused").unlink(missing_ok=True)
        (self.dir / point).write_text(str(seconds))

    def disarm(self, point: str) -> None:
        (self.dir / point).unlink(missing_ok=True)

    def paused(self, point: str, timeout_s: float) -> str | None:
        f = self.dir / f"{point}.paused"
        return f.read_text() if wait(f.exists, timeout_s, 0.02) else None


class Drills:
    def __init__(self, n: RealNode) -> None:
        self.n = n
        self.ours: set[str] = set()
        self.deleted: set[str] = set()
        self.first: dict[str, tuple[str, str]] = {}  # pod -> (node, assignment) when first seen running
        self.lost_now: list[str] = []
        self.extra: list[str] = []  # pods a fault created (the rest of a gang)
        self.protected: set[str] = set()  # pods a PodDisruptionBudget with no disruptions allowed covers
        self.note = ""  # what the last fault saw (said in its row)
        self.after: Callable[[], str] | None = None  # more for the note, once the drill recovered
        self.why: list[str] = []  # what the last audit found over-committed
        self.moved: list[str] = []  # and bound twice
        self.takeover_s: float | None = None  # the last leader kill's take-over
        self.refused: list[str] = []  # pods kubelet refused at admission (re-created by gpufleet)
        self.refused_why: set[str] = set()  # kubelet's messages, shortened
        self.raced: list[str] = []  # of them, refused because the two schedulers raced for a GPU (1.35: no routing)
        self.foreign: set[str] = set()  # our pods created with the default scheduler name
        self.routing = False  # deploy/admission routes them to gpufleet (1.36+); else kube-scheduler binds them

    def create(self, items: list[dict]) -> None:
        for attempt in range(60):  # the apiserver may be restarting
            try:
                self.n.kubectl("create", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": items}))
                break
            except RuntimeError as exc:
                if "AlreadyExists" in str(exc) or attempt == 59:
                    raise
                time.sleep(1)
        self.ours.update(i["metadata"]["name"] for i in items)
        self.foreign.update(i["metadata"]["name"] for i in items if i["spec"].get("schedulerName") != "gpufleet")

    def delete(self, names: list[str]) -> None:
        self.n.kubectl("delete", "pod", *names, "--grace-period=0", "--force", "--wait=true", "--ignore-not-found",
                       timeout=120, check=False)
        self.deleted.update(names)

    def pods(self) -> dict[str, dict]:
        return {p["metadata"]["name"]: p for p in self.n.get_json("pods", "-n", "default")["items"]}

    @staticmethod
    def running(p: dict) -> bool:
        cs = (p.get("status") or {}).get("containerStatuses") or []
        return bool(cs) and all(c.get("ready") for c in cs)

    def all_running(self, names: list[str]) -> bool:
        ps = self.pods()
        return all(n in ps and self.running(ps[n]) for n in names)

    def follow_refused_pods(self, names: list[str]) -> None:
        """A bare pod kubelet refused at admission (the device plugin died under it) is re-created by gpufleet
        (kube/plugin_down: a copy whose ``gpufleet.io/moved-from`` names it); ``names`` then waits for the copy.
        One never re-created stays ``Failed``, and the audit counts it lost."""
        ps = self.pods()
        copies = {}
        for k, p in ps.items():
            try:
                copies[json.loads((p["metadata"].get("annotations") or {}).get("gpufleet.io/moved-from", "{}"))["pod"]] = k
            except (ValueError, KeyError, TypeError):
                pass
        for i, name in enumerate(names):
            p = ps.get(name)
            st = (p or {}).get("status") or {}
            if p and st.get("phase") == "Failed" and st.get("reason") == "UnexpectedAdmissionError":
                if name not in self.refused:
                    self.refused.append(name)
                    self.refused_why.add(re.sub(r"^Pod was rejected: ", "", st.get("message", ""))[:90])
                    if RACED_REFUSAL in st.get("message", "") or GUARD_REFUSAL in st.get("message", ""):
                        self.raced.append(name)  # two schedulers raced for a GPU (no routing: 1.35)
                copy = copies.get(f"default/{name}")
                if copy is not None:
                    self.deleted.add(name)
                    self.ours.add(copy)
                    if name in self.foreign:
                        self.foreign.add(copy)
                    names[i] = copy

    def settle_foreign(self, names: list[str], timeout_s: float = 30) -> None:
        """Until the agent has recorded kubelet's GPUs on our running default-scheduler pods (its loop: every second)."""
        def done() -> bool:
            ps = self.pods()
            return all("gpufleet.io/assignment" in (ps[n]["metadata"].get("annotations") or {})
                       for n in names if n in self.foreign and n in ps and self.running(ps[n]))
        wait(done, timeout_s, 0.5)

    def audit(self) -> tuple[int, int, int]:
        """(pods lost, bound twice, GPUs over-committed) over every pod of ours so far; ``self.why`` says which."""
        ps = self.pods()
        lost = [n for n in self.ours - self.deleted if n not in ps or ps[n]["status"].get("phase") == "Failed"]
        twice = 0
        milli: dict[int, dict[str, int]] = {}
        pr = self.n.pod_resources()
        why: list[str] = []
        for name, p in ps.items():
            if name not in self.ours or not self.running(p):
                continue
            a = (p["metadata"].get("annotations") or {}).get("gpufleet.io/assignment", "")
            key = (p["spec"].get("nodeName") or "", a)
            if name in self.first and self.first[name] != key:
                twice += 1
                why.append(f"{name} moved from {self.first[name]} to {key}")
            if a:
                self.first.setdefault(name, key)
            if name in self.foreign and self.routing and (p["spec"].get("schedulerName") != "gpufleet" or "gpufleet.io/routed-by"
                                                          not in (p["metadata"].get("annotations") or {})):
                why.append(f"{name}: created with the default scheduler name, not routed to gpufleet")
            if not a:
                why.append(f"{name} runs without an assignment" + (" (the agent did not record kubelet's GPUs)"
                                                                     if name in self.foreign else ""))
                continue
            d = json.loads(a)
            want = {g["uuid"] for g in d["gpus"]}
            for g in d["gpus"]:
                milli.setdefault(g["index"], {})[name] = int(d.get("gpu_milli") or 1000)
            got = {i.split("::")[0] for i in pr.get(("default", name), [])}
            if got != want:
                why.append(f"{name}: kubelet gave {sorted(got)}, its assignment names {sorted(want)}")
        why += [f"GPU {gi}: {sum(v.values())} milli ({', '.join(sorted(v))})" for gi, v in sorted(milli.items())
                if sum(v.values()) > 1000]
        self.lost_now = lost
        self.moved = [w for w in why if " moved from " in w]
        self.why = [w for w in why if " moved from " not in w]
        return len(lost), twice, len(self.why)

    def drill(self, title: str, burst: list[dict], fault, probe_name: str | None, timeout_s: float = 240,
              victims: frozenset[str] = frozenset(), before=None) -> dict:
        """``victims``: pods the drill expects to be evicted (preemption), neither lost nor disrupted; ``before``: runs
        before the burst is created (arms a pause point)."""
        n0 = self.audit()
        lost0 = set(self.lost_now)
        if before is not None:
            before()
        self.takeover_s = None
        self.refused, self.refused_why, self.raced = [], set(), []
        self.create(burst)
        t_end = fault()  # returns when the fault is over (restart issued, process continued)
        manifests = {b["metadata"]["name"]: b for b in burst}
        if probe_name:
            probe = manifest(probe_name)
            self.create([probe])
            manifests[probe_name] = probe
        names = list(manifests) + self.extra
        self.extra = []

        def done() -> bool:
            # every drill: without routing (1.35) the two schedulers may race for a GPU, and the loser is refused and
            # re-created (kube/plugin_down); the alloc drill's dead plugin refuses the burst
            self.follow_refused_pods(names)
            return self.all_running(names)
        ok = wait(done, timeout_s, 0.5)
        recover = round(time.monotonic() - t_end, 1) if ok else None
        time.sleep(2)
        self.settle_foreign(names)
        gone = {v for v in victims if v not in self.pods()}
        self.deleted |= gone
        lost, twice, over = self.audit()
        new_lost = set(self.lost_now) - lost0
        row = {"drill": title, "recover_s": recover, "pods_lost": lost - n0[0], "refused": len(self.refused),
               "bound_twice": twice - n0[1], "gpus_overcommitted": over, "pdb_disrupted": len(new_lost & self.protected),
               "takeover_s": self.takeover_s,
               "note": self.note if ok else f"not all running after {timeout_s} s: "
               + ", ".join(sorted(x for x in names if not self.all_running([x])))}
        if self.after is not None:
            row["note"] += self.after()
        self.note, self.after = "", None
        if self.refused:
            # bound before the plugin died: kubelet admits them at once; anything later means the hold let a pod through
            late = [x for x in self.refused if x not in {b["metadata"]["name"] for b in burst} and x not in self.raced]
            row["refused_late"] = len(late)
            row["refused_raced"] = len(self.raced)
            row["note"] += (f"; refused at admission: {len(self.refused)} ({', '.join(self.refused)}), of them placed "
                            f"after the kill: {len(late)}: " + " | ".join(sorted(self.refused_why)))
        if new_lost:
            row["note"] += " lost: " + ", ".join(sorted(new_lost))
        if self.why or self.moved:
            row["note"] += " " + "; ".join(self.why + self.moved)
        print(json.dumps(row), flush=True)
        ROWS.append(row)
        self.delete(names + self.refused)
        return row

    def leader(self) -> str:
        for _ in range(60):
            try:
                lease = json.loads(self.n.kubectl("get", "lease", "gpufleet-scheduler", "-n", "default", "-o", "json",
                                                  timeout=20))
                return lease["spec"].get("holderIdentity") or ""
            except (RuntimeError, ValueError, KeyError):
                time.sleep(1)
        return ""

    # --- faults ------------------------------------------------------------------------------
    def restart_cp(self, name: str) -> float:
        """etcd or kube-apiserver from the recipe's pids file: stop, start the same command line; returns when started."""
        import subprocess

        pids = self.n.data / "pids"
        rec = [ln.split() for ln in pids.read_text().splitlines() if ln.strip()]
        pid = next(int(p) for k, p in rec if k == name)
        argv = [a.decode() for a in Path(f"/proc/{pid}/cmdline").read_bytes().rstrip(b"\0").split(b"\0")]
        exe = _exe(pid)
        os.kill(pid, signal.SIGTERM)
        t = time.monotonic()
        while _exe(pid) == exe and time.monotonic() - t < 30:
            time.sleep(0.1)
        with open(self.n.logs / f"{name}.log", "a") as log:
            p = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        pids.write_text("".join(f"{k} {p.pid if k == name else q}\n" for k, q in rec))
        return time.monotonic()


def pdb_settled(n: RealNode, name: str, healthy: int) -> bool:
    st = n.get_json("pdb", name, "-n", "default").get("status") or {}
    return st.get("currentHealthy") == healthy and st.get("disruptionsAllowed") == 0


def leading(port: int) -> bool:
    """The replica's own ``gpufleet_leader`` gauge (False while it is down or a standby)."""
    try:
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=1).read().decode()
    except OSError:
        return False
    return any(ln.split()[-1] == "1.0" for ln in text.splitlines() if ln.startswith("gpufleet_leader "))


def summary(rows: list[dict]) -> list[dict]:
    """One line per drill over its runs: median recovery (min-max), totals, the take-over's median, the notes."""
    out: list[dict] = []
    for title in dict.fromkeys(r["drill"] for r in rows):
        rs = [r for r in rows if r["drill"] == title]
        rec = [r["recover_s"] for r in rs if r["recover_s"] is not None]
        med = (f"{statistics.median(rec):.1f} ({min(rec):.1f}-{max(rec):.1f})" if len(rec) > 1 else
               f"{rec[0]:.1f}" if rec else "none")
        if len(rec) < len(rs):
            med += f", {len(rs) - len(rec)} of {len(rs)} runs did not recover"
        tk = [r["takeover_s"] for r in rs if r.get("takeover_s") is not None]
        notes = [f"take-over median {statistics.median(tk):.1f} s"] if tk else []
        notes += [f"run {i + 1}: {r['note'].strip()}" for i, r in enumerate(rs) if r["note"].strip()]
        out.append({"drill": title, "runs": len(rs), "recover": med, **{k: sum(r[k] for r in rs) for k in (
            "pods_lost", "refused", "bound_twice", "gpus_overcommitted", "pdb_disrupted")}, "note": "; ".join(notes)})
    return out


def write_table(n: RealNode) -> str:
    lines = ["| drill | runs | recover s, median (min-max) | pods lost | refused at admission (re-created) | bound twice "
             "| GPUs over-committed | PDB-protected pods disrupted | note |", "|---|---|---|---|---|---|---|---|---|"]
    lines += [f"| {s['drill']} | {s['runs']} | {s['recover']} | {s['pods_lost']} | {s['refused']} | {s['bound_twice']} "
              f"| {s['gpus_overcommitted']} | {s['pdb_disrupted']} | {s['note']} |" for s in summary(ROWS)]
    text = "\n".join(lines)
    print("\n" + text, flush=True)
    (n.logs / "fault-drills.md").write_text(text + "\n")
    (n.logs / "fault-drills-runs.json").write_text(json.dumps(ROWS, indent=1) + "\n")
    return text


def bad_rows(rows: list[dict], refusals_allowed: tuple[str, ...] = ()) -> list[dict]:
    """Runs that broke an invariant.  Refusals at admission are allowed only where the drill kills the device plugin
    under kubelet: kubelet fails every admission whose Allocate meets the dead plugin (the paused one, and any that
    came before the new process registered) and never calls Allocate again for it; they are counted and re-created.
    And, in any drill, refusals of a pod that lost a race for a GPU between the two schedulers (no routing: 1.35; the
    agent refuses the loser rather than share the GPU) when the pod was re-created (one not re-created is lost).
    A refused pod the drill created after the kill (the probe, a copy) means gpufleet placed it on the node while it
    held it (kube/plugin_down): that breaks the invariant too."""
    return [r for r in rows if r["recover_s"] is None or r["pods_lost"] or r["bound_twice"] or r["gpus_overcommitted"]
            or r["pdb_disrupted"] or (r["refused"] > r.get("refused_raced", 0) and r["drill"] not in refusals_allowed)
            or r.get("refused_late")]


ALLOCATE_KILL = "agent SIGKILL in the middle of an Allocate"
ENDPOINT_KILL = "device-plugin endpoint SIGKILL in the middle of an Allocate"


def test_fault_drills(node):
    n = node
    runs = drill_runs()
    fakedev = n.data / "fakedev"
    fakedev.mkdir(exist_ok=True)
    for name, minor in [(f"nvidia{i}", i) for i in range(8)] + [("nvidiactl", 255)]:
        if not (fakedev / name).exists():
            os.mknod(fakedev / name, 0o666 | 0o020000, os.makedev(195, minor))
    points = PausePoints(n.data / "pause")
    n.env[pause_points.ENV] = str(points.dir)  # the agent's test-only pause points: nothing pauses until armed
    # as deploy/agent ships it: the agent behind its device-plugin endpoint (gpufleet agent-endpoint), which holds
    # kubelet's connection while the agent restarts
    endpoint_dir = str(n.data / "gpufleet-agent" / "endpoint")
    endpoint = ["agent-endpoint", "--device-plugin-dir", "/var/lib/kubelet/device-plugins", "--endpoint-dir", endpoint_dir]
    agent = ["agent", "--nvml", f"fake:{PROFILE}", "--node-name", NODE, "--kubeconfig", str(n.kubeconfig),
             "--device-plugin-dir", "/var/lib/kubelet/device-plugins", "--state-dir", str(n.data / "gpufleet-agent"),
             "--endpoint-dir", endpoint_dir,
             "--metrics-addr", "127.0.0.1:19400", "--dev-root", str(fakedev), "--interval", "1"]
    if os.environ.get("GPUFLEET_DRILL_API_WAIT_S"):  # a shorter --api-wait-s: a kube-apiserver restart outlasts both waits
        agent += ["--api-wait-s", os.environ["GPUFLEET_DRILL_API_WAIT_S"]]
    n.gpufleet("gpufleet-endpoint", endpoint)
    n.gpufleet("gpufleet-agent", agent)
    assert wait(lambda: (n.node()["status"].get("allocatable") or {}).get("nvidia.com/gpu") == "80", 90)
    port = {"a": 19251, "b": 19252}

    def sched(who: str) -> list[str]:  # two replicas with leader election, as deploy/scheduler ships them
        # --recreate-other-schedulers-pods: where nothing routes GPU pods to gpufleet (1.35), kube-scheduler's bare pod
        # refused for the dead plugin is re-created too, once the plugin is back (docs/safety.md); 1.36+ routes it
        return ["scheduler", "--kubeconfig", str(n.kubeconfig), "--metrics-addr", f"127.0.0.1:{port[who]}",
                "--lease-namespace", "default", "--identity", who, "--recreate-other-schedulers-pods"]
    for who in port:
        n.gpufleet(f"gpufleet-scheduler-{who}", sched(who))
    d = Drills(n)
    assert wait(lambda: d.leader() in port, 60), "no scheduler replica took the Lease"
    # GPU pods with the default scheduler name are routed to gpufleet by deploy/admission, as `kubectl apply -k deploy`
    # installs it (MutatingAdmissionPolicy: served from 1.36); the node guard stays on behind it
    d.routing = release_of(Path(n.loc["bin"]) / "kube-apiserver") >= (1, 36)
    if d.routing:
        n.kubectl("apply", "-f", str(REPO / "deploy/admission/route-gpu-pods.yaml"))
        probe = manifest("routing-probe", gpus=100, scheduler="default-scheduler")  # never fits: only its name matters

        def routed() -> bool:
            n.kubectl("delete", "pod", "routing-probe", "--ignore-not-found", "--grace-period=0", "--force", check=False)
            n.kubectl("create", "-f", "-", input=json.dumps(probe))
            return n.get_json("pod", "routing-probe")["spec"]["schedulerName"] == "gpufleet"
        assert wait(routed, 60, 1.0), "the MutatingAdmissionPolicy never took effect"
        n.kubectl("delete", "pod", "routing-probe", "--grace-period=0", "--force", check=False)
    # steady state: a whole GPU for gpufleet's pod and one for kube-scheduler's, 4 shares of 250 milli on one more,
    # under a budget that allows no disruption
    steady = [manifest("steady-w0", app="steady"), manifest("steady-d0", app="steady", scheduler="default-scheduler")] + [
        manifest(f"steady-s{i}", milli=250, app="steady") for i in range(4)]
    # without routing (1.35) kube-scheduler's pod created in the same instant as gpufleet's may race them for a GPU
    # (docs/safety.md: the bursts below still create them together); the steady set must stand for the drills to
    # measure anything, so there it comes after gpufleet's pods run
    if d.routing:
        d.create(steady)
    else:
        d.create([x for x in steady if x["spec"]["schedulerName"] == "gpufleet"])
        assert wait(lambda: d.all_running([x["metadata"]["name"] for x in steady if x["spec"]["schedulerName"] == "gpufleet"]),
                    180, 1.0), d.pods().keys()
        d.create([x for x in steady if x["spec"]["schedulerName"] != "gpufleet"])
    assert wait(lambda: d.all_running([s["metadata"]["name"] for s in steady]), 180, 1.0), d.pods().keys()
    n.kubectl("create", "-f", "-", input=json.dumps(budget("steady", "steady", len(steady))))
    assert wait(lambda: pdb_settled(n, "steady", len(steady)), 60), n.get_json("pdb", "steady", "-n", "default")
    d.protected |= {s["metadata"]["name"] for s in steady}
    d.settle_foreign([s["metadata"]["name"] for s in steady])
    d.audit()
    assert not d.why, d.why
    n.kubectl("create", "-f", "-", input=json.dumps({"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
                                                     "metadata": {"name": "drill-urgent"}, "value": 1000}))

    def burst(tag: str) -> list[dict]:
        """A whole GPU for gpufleet, one for kube-scheduler (the default scheduler name), 4 shares of one more."""
        return [manifest(f"{tag}-w0"), manifest(f"{tag}-d0", scheduler="default-scheduler")] + [
            manifest(f"{tag}-s{i}", milli=250) for i in range(4)]

    def kubelet_restart() -> float:
        argv = n.stop("kubelet")
        time.sleep(1)
        n.start("kubelet", argv)
        return time.monotonic()

    def agent_restart(tag: str):
        def fault() -> float:
            # the burst was just created: the schedulers bind it and kubelet starts calling Allocate
            wait(lambda: any(p["spec"].get("nodeName") for k, p in d.pods().items() if k.startswith(f"{tag}-")), 30, 0.05)
            n.stop("gpufleet-agent")  # SIGTERM: the agent taints its node and finishes the admissions in flight
            n.gpufleet("gpufleet-agent", agent)
            return time.monotonic()
        return fault

    def agent_killed_mid_allocate() -> float:
        who = points.paused("allocate", 60)  # armed before the burst: the first Allocate of the burst sleeps there
        if who is None:
            points.disarm("allocate")
            d.note = "no Allocate reached the pause point within 60 s"
            return time.monotonic()
        killed = time.time()
        resent = resent_calls()
        kill9(n, "gpufleet-agent")
        n.gpufleet("gpufleet-agent", agent)
        d.note = f"killed while kubelet waited for the Allocate of {who} (recorded in the agent's checkpoint, not answered)"
        d.after = lambda: f"; the endpoint sent {resent_calls() - resent} call(s) again to the new agent" + registered_after(killed)
        return time.monotonic()

    def resent_calls() -> int:
        """Calls the endpoint sent again because the agent died under them (its log)."""
        log = n.logs / "gpufleet-endpoint.log"
        return log.read_text().count("sending it again") if log.exists() else 0

    def endpoint_killed_mid_allocate() -> float:
        """The long-lived part itself dies (kill -9) while kubelet waits for an Allocate it forwarded: kubelet sees a
        dead plugin (the fallback: refusals, gpufleet's hold and copies), the endpoint is started again."""
        who = points.paused("allocate", 60)
        if who is None:
            points.disarm("allocate")
            d.note = "no Allocate reached the pause point within 60 s"
            return time.monotonic()
        killed = time.time()
        kill9(n, "gpufleet-endpoint")
        d.replace_refused = True
        n.gpufleet("gpufleet-endpoint", endpoint)
        d.note = f"the endpoint killed while kubelet waited for the Allocate of {who}"
        d.after = lambda: registered_after(killed).replace("new agent", "new endpoint")
        return time.monotonic()

    def registered_after(killed: float) -> str:
        """How long after the kill the new agent registered (its node annotation, this machine's clock)."""
        from gpufleet.kube.plugin_down import registered_at

        at = registered_at(n.node())
        return f"; the new agent registered {at - killed:.1f} s after the kill" if at and at > killed else ""

    def kill_leader(what: str) -> float:
        """kill -9 of the replica holding the Lease; the standby takes over; the killed one is started again (as its
        Deployment would) once the standby leads.  Returns the moment of the kill."""
        who = d.leader()
        other = "b" if who == "a" else "a"
        kill9(n, f"gpufleet-scheduler-{who}")
        t = time.monotonic()
        took = wait(lambda: leading(port[other]), 120, 0.05)
        takeover = time.monotonic() - t
        n.gpufleet(f"gpufleet-scheduler-{who}", sched(who))
        d.note = f"{who} killed {what}; {other} led after {takeover:.1f} s" if took else f"{other} never took the Lease"
        d.takeover_s = round(takeover, 1) if took else None
        return t

    def bound_of(prefix: str) -> int:
        return sum(1 for k, p in d.pods().items() if k.startswith(prefix) and p["spec"].get("nodeName"))

    def apiserver_unreachable() -> float:
        pid = int(next(p for k, p in (ln.split() for ln in (n.data / "pids").read_text().splitlines() if ln.strip())
                       if k == "kube-apiserver"))
        os.kill(pid, signal.SIGSTOP)
        time.sleep(30)
        os.kill(pid, signal.SIGCONT)
        return time.monotonic()

    def preemption_drill(t: str) -> None:
        # preemption: the node full (3 guarded pods, one of them kube-scheduler's, under a budget allowing no
        # disruption; 2 free ones), a 2-GPU pod of priority 1000; the leader is killed as soon as its first victim goes
        guard = [f"guard{t}-{i}" for i in range(3)]
        free = [f"free{t}-{i}" for i in range(2)]
        held = [manifest(g, app=f"guarded{t}", scheduler="default-scheduler" if i == 0 else "gpufleet")
                for i, g in enumerate(guard)] + [manifest(f, app="free") for f in free]
        d.create(held)
        assert wait(lambda ns=guard + free: d.all_running(ns), 120, 0.5), d.pods().keys()
        n.kubectl("create", "-f", "-", input=json.dumps(budget(f"guarded{t}", f"guarded{t}", 3)))
        assert wait(lambda t=t: pdb_settled(n, f"guarded{t}", 3), 60), n.get_json("pdb", f"guarded{t}", "-n", "default")
        d.protected |= set(guard)
        d.settle_foreign(guard)

        def going(names=guard + free) -> list[str]:
            ps = d.pods()
            return sorted(h for h in names if h not in ps or ps[h]["metadata"].get("deletionTimestamp"))

        def kill_leader_mid_preemption(going=going) -> float:
            wait(lambda: bool(going()), 60, 0.05)
            return kill_leader(f"once it was evicting {', '.join(going()) or 'nothing'}")
        d.drill("scheduler leader SIGKILL mid-preemption (PDB on the others)", [manifest(f"urgent{t}", gpus=2,
                priority_class="drill-urgent")], kill_leader_mid_preemption, None, victims=frozenset(free))
        assert not (set(guard) - set(d.pods())), "a pod under the budget was evicted"
        d.delete(guard + [f for f in free if f in d.pods()])
        n.kubectl("delete", "pdb", f"guarded{t}", "-n", "default", check=False)

    for r in range(runs):
        t = f"r{r}"
        if chosen("base"):
            d.drill("no fault (baseline: the same burst and probe)", burst(f"base{t}"), time.monotonic, f"base{t}-probe")
        if chosen("apiserver"):
            d.drill("kube-apiserver restart", burst(f"api{t}"), lambda: d.restart_cp("kube-apiserver"), f"api{t}-probe")
        if chosen("etcd"):
            d.drill("etcd restart", burst(f"etcd{t}"), lambda: d.restart_cp("etcd"), f"etcd{t}-probe")
        if chosen("kubelet"):
            d.drill("kubelet restart", burst(f"kubelet{t}"), kubelet_restart, f"kubelet{t}-probe")
        if chosen("agent"):
            d.drill("agent restart (SIGTERM) while kubelet admits a burst", burst(f"agent{t}"), agent_restart(f"agent{t}"),
                    f"agent{t}-probe")
        if chosen("alloc"):
            d.drill(ALLOCATE_KILL, burst(f"alloc{t}"), agent_killed_mid_allocate, f"alloc{t}-probe",
                    before=lambda: points.arm("allocate", 60))
        if chosen("endpoint"):
            d.drill(ENDPOINT_KILL, burst(f"ep{t}"), endpoint_killed_mid_allocate, f"ep{t}-probe",
                    before=lambda: points.arm("allocate", 5))
        if chosen("leader"):
            d.drill("scheduler leader SIGKILL just after a burst (2 replicas)", burst(f"lead{t}"),
                    lambda t=t: kill_leader(f"as the burst was created ({bound_of(f'lead{t}-')} of 6 bound)"),
                    f"lead{t}-probe")

        gang = [manifest(f"gang{t}-{i}", group=f"train{t}", size=4) for i in range(4)]

        def kill_leader_mid_gang(gang=gang, t=t) -> float:
            # two of four members are here: the leader holds room for the gang (in memory) and binds none of it
            time.sleep(3)
            k = kill_leader(f"holding 2 of 4 gang members ({bound_of(f'gang{t}-')} bound), the other 2 created after")
            d.create(gang[2:])
            d.extra = [g["metadata"]["name"] for g in gang[2:]]
            return k
        if chosen("gang"):
            d.drill("scheduler leader SIGKILL mid-gang (4 x 1 GPU)", gang[:2], kill_leader_mid_gang, f"gang{t}-probe")
        if chosen("preempt"):
            preemption_drill(t)
        if chosen("cut"):
            d.drill("kube-apiserver unreachable 30 s", burst(f"cut{t}"), apiserver_unreachable, f"cut{t}-probe",
                    timeout_s=300)

    write_table(n)
    bad = bad_rows(ROWS, (ENDPOINT_KILL,))  # the agent's crash must cost nothing now; the endpoint's is the fallback
    assert not bad, json.dumps(bad, indent=1)


# --- DRA: the agent killed in the middle of a NodePrepareResources --------------------------------------------------
def claim_pod(name: str) -> dict:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "default", "labels": {"app": "dra"}},
            "spec": {"terminationGracePeriodSeconds": 0, "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "one-gpu"}],
                     "containers": [{"name": "c", "image": "local/busybox:1", "imagePullPolicy": "Never",
                                     "command": ["sh", "-c", "env; sleep 3600"],
                                     "resources": {"limits": {"cpu": "10m", "memory": "16Mi"}, "requests": {"cpu": "10m", "memory": "16Mi"},
                                                   "claims": [{"name": "gpu"}]}}]}}


def claim_devices(n: RealNode) -> dict[str, list[str]]:
    """pod -> the devices of its claims' allocations (driver gpu.gpufleet.io)."""
    out: dict[str, list[str]] = {}
    claims = {c["metadata"]["name"]: c for c in n.get_json("resourceclaims", "-n", "default")["items"]}
    for p in n.get_json("pods", "-n", "default")["items"]:
        for s in (p.get("status") or {}).get("resourceClaimStatuses") or []:
            c = claims.get(s.get("resourceClaimName") or "")
            alloc = ((c or {}).get("status") or {}).get("allocation")
            if alloc:
                out.setdefault(p["metadata"]["name"], []).extend(
                    r["device"] for r in alloc["devices"]["results"] if r["driver"] == DRIVER)
    return out


def dra_pod_resources() -> dict[str, list[str]]:
    import grpc

    from gpufleet.agent.podresources import podresources_pb2 as pb
    from gpufleet.agent.podresources import podresources_pb2_grpc as pbg

    with grpc.insecure_channel(f"unix://{KUBELET_ROOT}/pod-resources/kubelet.sock") as ch:
        resp = pbg.PodResourcesListerStub(ch).List(pb.ListPodResourcesRequest(), timeout=10)
    out: dict[str, list[str]] = {}
    for p in resp.pod_resources:
        for c in p.containers:
            for dr in c.dynamic_resources:
                for cr in dr.claim_resources:
                    if cr.driver_name == DRIVER and p.namespace == "default":
                        out.setdefault(p.name, []).append(cr.device_name)
    return out


def test_dra_prepare_drills(node):
    """The DRA agent (--dra) on the same node, the device-plugin agent stopped; kube-scheduler allocates every claim.
    Per run: 3 pods with a one-GPU claim each; the Prepare pause point armed; the agent SIGKILLed while it sleeps in
    the first NodePrepareResources (the claim recorded as prepared, kubelet not told), started again.  kubelet retries
    the prepare; checked: every pod Running with exactly its claim's device in PodResources, the steady pods' devices
    unchanged, the paused claim still in the agent's checkpoint and prepared once (one 'prepared ResourceClaim' line
    per claim in the agent's log: a retry is answered from the checkpoint), no device in two claims' allocations or
    the checkpoint, and every deleted pod's claim unprepared (its CDI spec gone)."""
    n = node
    runs = drill_runs()
    points = PausePoints(n.data / "pause")
    n.env[pause_points.ENV] = str(points.dir)
    for part in ("gpufleet-agent", "gpufleet-endpoint"):  # the device-plugin agent's pod goes, as when an admin switches to DRA
        if n.pid_of(part) is not None:
            n.stop(part)
    n.kubectl("taint", "node", NODE, "gpufleet.io/agent-restarting-", check=False)  # its stop's taint: it will not return
    n.kubectl("delete", "pods", "--all", "-n", "default", "--grace-period=0", "--force", "--wait=true", timeout=180, check=False)
    n.kubectl("delete", "pdb", "--all", "-n", "default", check=False)
    fakedev = n.data / "fakedev"
    fakedev.mkdir(exist_ok=True)
    for name, minor in [(f"nvidia{i}", i) for i in range(8)] + [("nvidiactl", 255)]:
        if not (fakedev / name).exists():
            os.mknod(fakedev / name, 0o666 | 0o020000, os.makedev(195, minor))
    (n.data / "sys").mkdir(exist_ok=True)
    state = n.data / "gpufleet-agent-dra"
    agent = ["agent", "--dra", "--nvml", f"fake:{PROFILE}", "--node-name", NODE, "--kubeconfig", str(n.kubeconfig),
             "--state-dir", str(state), "--dev-root", str(fakedev), "--sysfs-root", str(n.data / "sys"),
             "--metrics-addr", "127.0.0.1:19400", "--interval", "1"]
    log = n.logs / "gpufleet-agent-dra.log"
    cdi_existed = CDI_DIR.exists()
    try:
        n.gpufleet("gpufleet-agent-dra", agent)

        def published() -> int:
            return sum(len([x for x in s["spec"].get("devices") or [] if re.fullmatch(r"gpu-\d+", x["name"])])
                       for s in n.get_json("resourceslices")["items"] if s["spec"].get("driver") == DRIVER)
        assert wait(lambda: published() == 8, 90), n.get_json("resourceslices")
        classes = [c for c in yaml.safe_load_all(n.kubectl("kustomize", str(REPO / "deploy" / "dra"))) if c and c["kind"] == "DeviceClass"]
        n.kubectl("apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": classes}))
        n.kubectl("create", "-f", "-", input=json.dumps({
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate", "metadata": {"name": "one-gpu", "namespace": "default"},
            "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.gpufleet.io"}}]}}}}))
        d = Drills(n)

        def running(names: list[str]) -> bool:
            return d.all_running(names)
        steady = ["dra-steady-0", "dra-steady-1"]
        n.kubectl("create", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": [claim_pod(s) for s in steady]}))
        assert wait(lambda: running(steady), 180, 1), n.get_json("pods", "-n", "default")
        steady_devs = {s: v for s, v in claim_devices(n).items() if s in steady}

        def registrations() -> int:
            return (log.read_text() if log.exists() else "").count("kubelet registered DRA driver")

        def prepared_lines() -> dict[str, int]:
            text = log.read_text() if log.exists() else ""
            out: dict[str, int] = {}
            for uid in re.findall(r"(?<!un)prepared ResourceClaim \S+ \(([0-9a-f-]+)\)", text):
                out[uid] = out.get(uid, 0) + 1
            return out

        for r in range(runs):
            names = [f"dra-r{r}-{i}" for i in range(3)]
            points.arm("prepare", 60)
            n.kubectl("create", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": [claim_pod(x) for x in names]}))
            who = points.paused("prepare", 90)
            t_end = time.monotonic()
            if who is None:
                points.disarm("prepare")
                note = "no NodePrepareResources reached the pause point within 90 s; "
            else:
                registered = registrations()
                kill9(n, "gpufleet-agent-dra")
                n.gpufleet("gpufleet-agent-dra", agent)
                t0 = time.monotonic()
                back = wait(lambda registered=registered: registrations() > registered, 60, 0.1)
                note = f"killed while kubelet waited for the prepare of {who.split(' (')[0]}; " + (
                    f"the restarted agent registered with kubelet after {time.monotonic() - t0:.1f} s; " if back else
                    "the restarted agent did not register within 60 s; ")
                t_end = t0
            ok = wait(lambda names=names: running(names), 240, 0.5)
            recover = round(time.monotonic() - t_end, 1) if ok else None
            time.sleep(2)
            devs = claim_devices(n)
            pr = dra_pod_resources()
            ps = d.pods()
            why: list[str] = []
            lost = [x for x in names + steady if x not in ps or ps[x]["status"].get("phase") == "Failed"]
            for x in names + steady:
                if x in ps and d.running(ps[x]) and sorted(pr.get(x, [])) != sorted(devs.get(x, [])):
                    why.append(f"{x}: PodResources {sorted(pr.get(x, []))}, its claim {sorted(devs.get(x, []))}")
            owners: dict[str, list[str]] = {}
            for x, ds in devs.items():
                for dev in ds:
                    owners.setdefault(dev, []).append(x)
            why += [f"{dev} allocated to {', '.join(o)}" for dev, o in owners.items() if len(o) > 1]
            cp = json.loads((state / f"dra-{DRIVER}.checkpoint.json").read_text())["claims"]
            held: dict[str, list[str]] = {}
            for c in cp.values():
                for dev in c["devices"]:
                    if dev.get("whole"):
                        held.setdefault(dev["device"], []).append(c["name"])
            why += [f"{dev} prepared for {', '.join(o)}" for dev, o in held.items() if len(o) > 1]
            moved = [f"{s}: {steady_devs[s]} -> {devs.get(s)}" for s in steady if devs.get(s) != steady_devs[s]]
            twice = [uid for uid, k in prepared_lines().items() if k > 1]
            missing = []
            if who is not None:
                uid = who.split("(")[-1].rstrip(")")
                if uid not in cp:
                    missing.append(f"the paused claim {who} is not in the checkpoint")
            row = {"drill": "DRA agent SIGKILL in the middle of a NodePrepareResources (kube-scheduler's claims)",
                   "recover_s": recover, "pods_lost": len(lost) + len(missing), "refused": 0,
                   "bound_twice": len(moved) + len(twice), "gpus_overcommitted": len(why), "pdb_disrupted": 0,
                   "takeover_s": None,
                   "note": note + ("" if ok else "not all running after 240 s; ") + "; ".join(lost + missing + moved + why)
                   + (f"; prepared twice: {twice}" if twice else "")}
            print(json.dumps(row), flush=True)
            ROWS.append(row)
            uids = [c["metadata"]["uid"] for c in n.get_json("resourceclaims", "-n", "default")["items"]
                    if any(c["metadata"]["name"].startswith(f"{x}-gpu") for x in names)]
            n.kubectl("delete", "pod", *names, "--grace-period=0", "--force", "--wait=true", timeout=120, check=False)
            if not wait(lambda uids=uids: not any((CDI_DIR / f"k8s.gpu.gpufleet.io-claim_{u}.json").exists() for u in uids), 90):
                row["note"] += "; a deleted pod's claim was not unprepared (CDI spec left)"
                row["gpus_overcommitted"] += 1
        write_table(n)
        bad = bad_rows([r for r in ROWS if r["drill"].startswith("DRA ")])
        assert not bad, json.dumps(bad, indent=1)
    finally:
        for p in CDI_DIR.glob("k8s.gpu.gpufleet.io-claim_*.json") if CDI_DIR.exists() else []:
            p.unlink()
        if not cdi_existed and CDI_DIR.exists() and not any(CDI_DIR.iterdir()):
            CDI_DIR.rmdir()
