"""Fault drills on a real node, with numbers: one command runs them all and writes the table.

    flock -w 1800 /work/realnode.lock env GPUFLEET_E2E_BIN=~/.cache/gpufleet/k8s/v1.37.2/bin \\
        PYTHONPATH=$PWD/src python3 -m pytest -q -s tests/e2e/test_fault_drills.py

A real node (Kubernetes 1.37.2: etcd, kube-apiserver, kube-scheduler, kube-controller-manager with its disruption
controller, kubelet, containerd; 8 fake H100s) with gpufleet's agent (default configuration) and two scheduler replicas
with leader election (as deploy/scheduler ships them).  A steady set of pods runs (whole GPUs and 250-milli shares)
under a PodDisruptionBudget (matchExpressions) that allows no disruption.  Each drill starts a burst of new pods,
injects the fault while they are being placed and admitted, and then creates a probe pod (one whole GPU):

* none (the baseline: what the same burst and probe take without a fault);
* kube-apiserver restart; etcd restart; kubelet restart;
* agent restart (SIGTERM, as a DaemonSet update does) while kubelet is admitting a burst (Allocate in flight);
* SIGKILL of the scheduler replica holding the Lease: mid-burst; in the middle of a gang (4 one-GPU members,
  minMember 4: killed while it holds room for the 2 members created so far, the other 2 created after); and during a
  preemption (the node full: 3 pods under a second budget allowing no disruption, 2 free ones; a 2-GPU pod of
  priority 1000; killed once its first victim goes).  The standby takes over; the killed one is started again;
* kube-apiserver unreachable for 30 s (SIGSTOP: connections hang, as behind a dead load balancer), then SIGCONT.

Per drill: **recover s**, from the end of the fault (the restart issued, the process continued; the kill for a
leader) until the probe and every pod of the burst run; **pods lost**, pods of ours that are gone or failed (the
preemption's 2 expected victims aside); **bound twice**, pods whose node or GPUs changed once they had them; **GPUs
over-committed**, GPUs whose assignments add up to more than one GPU or that kubelet (PodResources) gave to a pod the
assignment does not name; **PDB-protected pods disrupted**, pods under a budget allowing no disruption that went.
The table goes to stdout and to $E2E_LOGS/fault-drills.md.
"""

from __future__ import annotations

import json
import os
import signal
import time
import urllib.request
from pathlib import Path

import pytest

from .harness import NODE, RealNode, module_node, _exe, wait

PROFILE = "h100-nvlink"
UUIDS = [f"GPU-h100-{i:02d}" for i in range(8)]


@pytest.fixture(scope="module")
def node():
    yield from module_node("gpufleet-e2e-drills-")


def manifest(name: str, gpus: int = 1, milli: int | None = None, group: str | None = None, size: int = 0,
             app: str | None = None, priority_class: str | None = None) -> dict:
    ann = {}
    if milli:
        ann["gpufleet.io/gpu-milli"] = str(milli)
    if group:
        ann.update({"gpufleet.io/pod-group": group, "gpufleet.io/pod-group-min-member": str(size)})
    spec: dict = {"schedulerName": "gpufleet", "terminationGracePeriodSeconds": 0,
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


class Drills:
    def __init__(self, n: RealNode) -> None:
        self.n = n
        self.ours: set[str] = set()
        self.deleted: set[str] = set()
        self.first: dict[str, tuple[str, str]] = {}  # pod -> (node, assignment) when first seen running
        self.rows: list[dict] = []
        self.lost_now: list[str] = []
        self.extra: list[str] = []  # pods a fault created (the rest of a gang)
        self.protected: set[str] = set()  # pods a PodDisruptionBudget with no disruptions allowed covers
        self.note = ""  # what the last fault saw (said in its row)
        self.why: list[str] = []  # what the last audit found over-committed
        self.moved: list[str] = []  # and bound twice

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

    def delete(self, names: list[str]) -> None:
        self.n.kubectl("delete", "pod", *names, "--grace-period=0", "--force", "--wait=true", timeout=120, check=False)
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
            self.first.setdefault(name, key)
            if not a:
                why.append(f"{name} runs without gpufleet's assignment")
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
              victims: frozenset[str] = frozenset()) -> None:
        """``victims``: pods the drill expects to be evicted (preemption), neither lost nor disrupted."""
        n0 = self.audit()
        lost0 = set(self.lost_now)
        self.create(burst)
        t_end = fault()  # returns when the fault is over (restart issued, process continued)
        if probe_name:
            self.create([manifest(probe_name)])
        names = [b["metadata"]["name"] for b in burst] + self.extra + ([probe_name] if probe_name else [])
        self.extra = []
        ok = wait(lambda: self.all_running(names), timeout_s, 0.5)
        recover = round(time.monotonic() - t_end, 1) if ok else None
        time.sleep(2)
        gone = {v for v in victims if v not in self.pods()}
        self.deleted |= gone
        lost, twice, over = self.audit()
        new_lost = set(self.lost_now) - lost0
        row = {"drill": title, "recover_s": recover, "pods_lost": lost - n0[0], "bound_twice": twice - n0[1],
               "gpus_overcommitted": over, "pdb_disrupted": len(new_lost & self.protected),
               "note": self.note if ok else f"not all running after {timeout_s} s: "
               + ", ".join(sorted(x for x in names if not self.all_running([x])))}
        self.note = ""
        if new_lost:
            row["note"] += " lost: " + ", ".join(sorted(new_lost))
        if self.why or self.moved:
            row["note"] += " " + "; ".join(self.why + self.moved)
        print(json.dumps(row), flush=True)
        self.rows.append(row)
        self.delete(names)

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


def test_fault_drills(node):
    n = node
    fakedev = n.data / "fakedev"
    fakedev.mkdir(exist_ok=True)
    for name, minor in [(f"nvidia{i}", i) for i in range(8)] + [("nvidiactl", 255)]:
        if not (fakedev / name).exists():
            os.mknod(fakedev / name, 0o666 | 0o020000, os.makedev(195, minor))
    agent = ["agent", "--nvml", f"fake:{PROFILE}", "--node-name", NODE, "--kubeconfig", str(n.kubeconfig),
             "--device-plugin-dir", "/var/lib/kubelet/device-plugins", "--state-dir", str(n.data / "gpufleet-agent"),
             "--metrics-addr", "127.0.0.1:19400", "--dev-root", str(fakedev), "--interval", "1"]
    n.gpufleet("gpufleet-agent", agent)
    assert wait(lambda: (n.node()["status"].get("allocatable") or {}).get("nvidia.com/gpu") == "80", 90)
    port = {"a": 19251, "b": 19252}

    def sched(who: str) -> list[str]:  # two replicas with leader election, as deploy/scheduler ships them
        return ["scheduler", "--kubeconfig", str(n.kubeconfig), "--metrics-addr", f"127.0.0.1:{port[who]}",
                "--lease-namespace", "default", "--identity", who]
    for who in port:
        n.gpufleet(f"gpufleet-scheduler-{who}", sched(who))
    d = Drills(n)
    assert wait(lambda: d.leader() in port, 60), "no scheduler replica took the Lease"
    # steady state: 2 whole GPUs and 4 shares of 250 milli on one more, under a budget that allows no disruption
    steady = [manifest(f"steady-w{i}", app="steady") for i in range(2)] + [
        manifest(f"steady-s{i}", milli=250, app="steady") for i in range(4)]
    d.create(steady)
    assert wait(lambda: d.all_running([s["metadata"]["name"] for s in steady]), 180, 1.0), d.pods().keys()
    n.kubectl("create", "-f", "-", input=json.dumps(budget("steady", "steady", len(steady))))
    assert wait(lambda: pdb_settled(n, "steady", len(steady)), 60), n.get_json("pdb", "steady", "-n", "default")
    d.protected |= {s["metadata"]["name"] for s in steady}
    d.audit()

    def burst(tag: str) -> list[dict]:
        return [manifest(f"{tag}-w{i}") for i in range(2)] + [manifest(f"{tag}-s{i}", milli=250) for i in range(4)]

    d.drill("no fault (baseline: the same burst and probe)", burst("base"), time.monotonic, "base-probe")
    d.drill("kube-apiserver restart", burst("api"), lambda: d.restart_cp("kube-apiserver"), "api-probe")
    d.drill("etcd restart", burst("etcd"), lambda: d.restart_cp("etcd"), "etcd-probe")

    def kubelet_restart() -> float:
        argv = n.stop("kubelet")
        time.sleep(1)
        n.start("kubelet", argv)
        return time.monotonic()
    d.drill("kubelet restart", burst("kubelet"), kubelet_restart, "kubelet-probe")

    def agent_restart() -> float:
        # the burst was just created: the scheduler binds it and kubelet starts calling Allocate
        wait(lambda: any(p["spec"].get("nodeName") for k, p in d.pods().items() if k.startswith("agent-")), 30, 0.05)
        n.stop("gpufleet-agent")  # SIGTERM: the agent taints its node and finishes the admissions in flight
        n.gpufleet("gpufleet-agent", agent)
        return time.monotonic()
    d.drill("agent restart (SIGTERM) during Allocate", burst("agent"), agent_restart, "agent-probe")

    def kill_leader(what: str) -> float:
        """kill -9 of the replica holding the Lease; the standby takes over; the killed one is started again (as its
        Deployment would) once the standby leads.  Returns the moment of the kill."""
        who = d.leader()
        other = "b" if who == "a" else "a"
        pid = n.pid_of(f"gpufleet-scheduler-{who}")
        assert pid is not None, who
        os.kill(pid, signal.SIGKILL)
        t = time.monotonic()
        took = wait(lambda: leading(port[other]), 120, 0.05)
        takeover = time.monotonic() - t
        n.npids.write_text("".join(ln + "\n" for ln in n.npids.read_text().splitlines()
                                   if not ln.startswith(f"gpufleet-scheduler-{who} {pid} ")))
        n.gpufleet(f"gpufleet-scheduler-{who}", sched(who))
        d.note = f"{who} killed {what}; {other} led after {takeover:.1f} s" if took else f"{other} never took the Lease"
        d.takeovers.append(takeover)  # type: ignore[attr-defined]
        return t
    d.takeovers = []  # type: ignore[attr-defined]

    def bound_of(prefix: str) -> int:
        return sum(1 for k, p in d.pods().items() if k.startswith(prefix) and p["spec"].get("nodeName"))

    def leader_killed_mid_burst() -> float:
        return kill_leader(f"as the burst was created ({bound_of('lead-')} of 6 bound)")
    d.drill("scheduler leader SIGKILL just after a burst (2 replicas)", burst("lead"), leader_killed_mid_burst, "lead-probe")

    gang = [manifest(f"gang-{i}", group="train", size=4) for i in range(4)]

    def kill_leader_mid_gang() -> float:
        # two of four members are here: the leader holds room for the gang (in memory) and binds none of it
        time.sleep(3)
        t = kill_leader(f"holding 2 of 4 gang members ({bound_of('gang-')} bound), the other 2 created after")
        d.create(gang[2:])
        d.extra = [g["metadata"]["name"] for g in gang[2:]]
        return t
    d.drill("scheduler leader SIGKILL mid-gang (4 x 1 GPU)", gang[:2], kill_leader_mid_gang, "gang-probe")

    # preemption: the node full (3 guarded pods under a budget allowing no disruption, 2 free ones), a 2-GPU pod of
    # priority 1000; the leader is killed as soon as its first victim goes
    n.kubectl("create", "-f", "-", input=json.dumps({"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
                                                     "metadata": {"name": "drill-urgent"}, "value": 1000}))
    held = [manifest(f"guard-{i}", app="guarded") for i in range(3)] + [manifest(f"free-{i}", app="free") for i in range(2)]
    d.create(held)
    assert wait(lambda: d.all_running([h["metadata"]["name"] for h in held]), 120, 0.5), d.pods().keys()
    n.kubectl("create", "-f", "-", input=json.dumps(budget("guarded", "guarded", 3)))
    assert wait(lambda: pdb_settled(n, "guarded", 3), 60), n.get_json("pdb", "guarded", "-n", "default")
    d.protected |= {f"guard-{i}" for i in range(3)}

    def going() -> list[str]:
        ps = d.pods()
        return sorted(h["metadata"]["name"] for h in held if h["metadata"]["name"] not in ps
                      or ps[h["metadata"]["name"]]["metadata"].get("deletionTimestamp"))

    def kill_leader_mid_preemption() -> float:
        wait(lambda: bool(going()), 60, 0.05)
        return kill_leader(f"once it was evicting {', '.join(going()) or 'nothing'}")
    d.drill("scheduler leader SIGKILL mid-preemption (PDB on the others)", [manifest("urgent", gpus=2,
            priority_class="drill-urgent")], kill_leader_mid_preemption, None, victims=frozenset({"free-0", "free-1"}))
    assert not ({f"guard-{i}" for i in range(3)} - set(d.pods())), "a pod under the budget was evicted"
    d.delete([f"guard-{i}" for i in range(3)] + [f"free-{i}" for i in range(2) if f"free-{i}" in d.pods()])

    def apiserver_unreachable() -> float:
        pid = int(next(p for k, p in (ln.split() for ln in (n.data / "pids").read_text().splitlines() if ln.strip())
                       if k == "kube-apiserver"))
        os.kill(pid, signal.SIGSTOP)
        time.sleep(30)
        os.kill(pid, signal.SIGCONT)
        return time.monotonic()
    d.drill("kube-apiserver unreachable 30 s", burst("cut"), apiserver_unreachable, "cut-probe", timeout_s=300)

    lines = ["| drill | recover s | pods lost | bound twice | GPUs over-committed | PDB-protected pods disrupted | note |",
             "|---|---|---|---|---|---|---|"]
    lines += [f"| {r['drill']} | {r['recover_s']} | {r['pods_lost']} | {r['bound_twice']} | {r['gpus_overcommitted']} "
              f"| {r['pdb_disrupted']} | {r['note']} |" for r in d.rows]
    text = "\n".join(lines)
    print("\n" + text)
    (n.logs / "fault-drills.md").write_text(text + "\n")
    bad = [r for r in d.rows if r["recover_s"] is None or r["pods_lost"] or r["bound_twice"] or r["gpus_overcommitted"]
           or r["pdb_disrupted"]]
    assert not bad, json.dumps(bad, indent=1)
