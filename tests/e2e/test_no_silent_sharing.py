"""No GPU shared unasked, on a real node: 8 fake H100s, gpufleet's agent with its DEFAULT configuration (each GPU is
10 ``nvidia.com/gpu`` devices, for gpufleet's shares), gpufleet's scheduler, kube-scheduler, kubelet, containerd.

Nine pods asking ``nvidia.com/gpu: 1`` and no share, three times:

* ``default-scheduler`` with ``deploy/admission`` applied: routed to gpufleet, 8 run on 8 distinct GPUs, the 9th
  waits Pending with gpufleet's reason;
* ``gpufleet`` named by the pods: the same;
* ``default-scheduler`` in a namespace that opted out of the routing: kube-scheduler counts 80 allocatable and binds
  all nine; 8 run on 8 distinct GPUs and kubelet refuses the 9th (the agent's node guard), with a message that names
  the GPU and the pod using it -- never a 9th pod silently on a GPU another pod uses (the issue-35 finding).

On 1.35, which does not serve MutatingAdmissionPolicy (beta and off there), there is no routing: the first case
becomes ``default-scheduler`` in a plain namespace, and must end as the opted-out one does (the node guard holds).

The outcome per scheduler name is printed and written to $E2E_LOGS/no-silent-sharing.txt.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest

from tests.dra_release import release_of

from .harness import NODE, REPO, RealNode, module_node, wait

PROFILE = "h100-nvlink"  # 8 GPUs GPU-h100-00 .. 07


@pytest.fixture(scope="module")
def node():
    with module_node("gpufleet-e2e-sharing-") as n:
        yield n


def pod(name: str, ns: str, scheduler: str | None) -> dict:
    spec: dict = {"terminationGracePeriodSeconds": 0,
                  "containers": [{"name": "c", "image": "local/busybox:1", "imagePullPolicy": "Never",
                                  "command": ["sh", "-c", "env; sleep 3600"],
                                  "resources": {"limits": {"cpu": "10m", "memory": "16Mi", "nvidia.com/gpu": "1"},
                                                "requests": {"cpu": "10m", "memory": "16Mi"}}}]}
    if scheduler:
        spec["schedulerName"] = scheduler
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": ns}, "spec": spec}


def visible_gpu(n: RealNode, ns: str, name: str) -> str:
    m = re.search(r"^NVIDIA_VISIBLE_DEVICES=(.*)$", n.pod_logs(ns, name), re.M)
    return m.group(1) if m else ""


def run_nine(n: RealNode, ns: str, scheduler: str | None) -> dict:
    """Create nine one-GPU pods; wait until 8 run and the 9th has settled; what each got."""
    items = [pod(f"p{i}", ns, scheduler) for i in range(9)]
    n.kubectl("create", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": items}))

    def pods() -> list[dict]:
        return n.get_json("pods", "-n", ns)["items"]

    def settled() -> bool:
        ps = pods()
        running = [p for p in ps if p["status"].get("phase") == "Running"
                   and all(c.get("ready") for c in p["status"].get("containerStatuses") or [{}])]
        return len(running) == 8 and len(ps) == 9
    assert wait(settled, 180, 1.0), json.dumps([(p["metadata"]["name"], p["status"].get("phase")) for p in pods()])
    time.sleep(5)  # the 9th: give a wrong placement time to show
    out: dict = {"running": {}, "other": {}}
    for p in pods():
        name, st = p["metadata"]["name"], p["status"]
        if st.get("phase") == "Running":
            out["running"][name] = visible_gpu(n, ns, name)
        else:
            evs = n.get_json("events", "-n", ns, "--field-selector", f"involvedObject.name={name}")["items"]
            out["other"][name] = {"phase": st.get("phase"), "scheduler": p["spec"].get("schedulerName"),
                                  "node": p["spec"].get("nodeName"), "reason": st.get("reason"),
                                  "message": st.get("message") or "",
                                  "events": [(e.get("reason"), e.get("message")) for e in evs]}
    return out


def test_nine_one_gpu_pods_on_eight_gpus_never_share(node):
    n = node
    dev = n.fakedev(8)
    n.gpufleet("gpufleet-agent", ["agent", "--nvml", f"fake:{PROFILE}", "--node-name", NODE, "--kubeconfig", str(n.kubeconfig),
                                  "--device-plugin-dir", "/var/lib/kubelet/device-plugins", "--state-dir",
                                  str(n.data / "gpufleet-agent"), "--metrics-addr", "127.0.0.1:19400",
                                  "--dev-root", str(dev), "--interval", "1"])
    assert wait(lambda: (n.node()["status"].get("allocatable") or {}).get("nvidia.com/gpu") == "80", 90), \
        "the agent's default configuration: 8 GPUs x 10 devices"
    n.gpufleet("gpufleet-scheduler", ["scheduler", "--kubeconfig", str(n.kubeconfig), "--metrics-addr", "127.0.0.1:19251",
                                      "--no-leader-elect"])
    routing = release_of(Path(n.loc["bin"]) / "kube-apiserver") >= (1, 36)  # MutatingAdmissionPolicy GA, served
    if routing:
        n.kubectl("apply", "-f", str(REPO / "deploy/admission/route-gpu-pods.yaml"))
        n.kubectl("create", "namespace", "probe")
        probe = pod("probe", "probe", None)
        probe["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] = "100"  # never fits: only its name is looked at

        def routed() -> bool:
            n.kubectl("delete", "pod", "-n", "probe", "probe", "--ignore-not-found", "--grace-period=0", "--force", check=False)
            n.kubectl("create", "-f", "-", input=json.dumps(probe))
            return n.get_json("pod", "-n", "probe", "probe")["spec"]["schedulerName"] == "gpufleet"
        assert wait(routed, 60, 1.0), "the MutatingAdmissionPolicy never took effect"
        n.kubectl("delete", "namespace", "probe", "--wait=false")

    report, problems = [], []
    first = ("default-scheduler, routed by deploy/admission", "routed", None, {}) if routing else \
        ("default-scheduler, no routing (1.35 serves no MutatingAdmissionPolicy)", "optout", None, {})
    cases = [first,
             ("gpufleet", "named", "gpufleet", {}),
             *([("default-scheduler, namespace opted out of the routing", "optout", None, {"gpufleet.io/scheduler-routing": "off"})]
               if routing else [])]
    for title, ns, scheduler, labels in cases:
        n.kubectl("create", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "Namespace",
                                                        "metadata": {"name": ns, "labels": labels}}))
        got = run_nine(n, ns, scheduler)
        gpus = sorted(got["running"].values())
        line = f"{title}: {len(got['running'])} Running on {len(set(gpus))} distinct GPUs {gpus}"
        if len(set(gpus)) != 8 or len(gpus) != 8 or any("," in g or not g for g in gpus):
            problems.append(f"{title}: GPUs {got['running']}")
        for name, o in got["other"].items():
            line += f"; {name} {o['phase']} (scheduler {o['scheduler']}, node {o['node'] or '-'}): "
            if o["phase"] == "Pending" and not o["node"]:
                why = next((m for r, m in o["events"] if r == "FailedScheduling"), "")
                line += f"FailedScheduling: {why}"
                if "gpu" not in why.lower():
                    problems.append(f"{title}: {name} Pending without a GPU reason: {o}")
            elif o["phase"] == "Failed" and ns == "optout":
                line += f"{o['reason']}: {o['message']}"
                if "did not ask to share" not in o["message"]:
                    problems.append(f"{title}: {name} refused without the guard's reason: {o}")
            else:
                problems.append(f"{title}: {name}: {o}")
        if ns != "optout" and any(o["scheduler"] != "gpufleet" for o in got["other"].values()):
            problems.append(f"{title}: not scheduled by gpufleet: {got['other']}")
        report.append(line)
        n.kubectl("delete", "namespace", ns, "--wait=false")
        n.kubectl("delete", "pods", "--all", "-n", ns, "--grace-period=0", "--force", check=False)
        assert wait(lambda ns=ns: not n.get_json("pods", "-n", ns)["items"], 120, 1.0)
    text = "\n".join(report)
    print("\n" + text)
    (n.logs / "no-silent-sharing.txt").write_text(text + "\n")
    assert not problems, "\n".join(problems)
