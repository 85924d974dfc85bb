"""Real-node tier: gpufleet as an extender of the real kube-scheduler on a real kubelet (the release
``scripts/build-k8s.sh`` built; 1.37 by default).

Skipped unless ``GPUFLEET_E2E_BIN`` names the built binaries (tests/e2e/locations.py), and we are root.  The node is one host-wide thing: set
``GPUFLEET_E2E_LOCK`` to a lock file to serialize with other users of it.
About 6 minutes:

    sudo GPUFLEET_E2E_BIN=$(scripts/build-k8s.sh --print-dir 1.37.2) python -m pytest -s tests/e2e/test_extender_node.py

The node comes up as the real-node tier's (tests/e2e/node_up.sh: control plane,
containerd, kubelet) with ``gpufleet agent --nvml fake:h100-nvlink`` in its
default configuration: 8 GPUs of ``sharesPerGpu`` (10) kubelet devices each,
allocatable ``nvidia.com/gpu`` 80.  What it checks, with kube-scheduler
configured from deploy/extender:

* bursts of N+1 one-GPU pods on N free GPUs: N binds and one pod Unschedulable
  with the extender's reason (kube-scheduler's own fit sees 80 devices, so it is
  the extender's filter that turns the pod away: its unschedulable refusals
  count it); no "binding rejected" event, no "Error
  scheduling pod; retrying" in kube-scheduler's log, no bind refused;
* binds/s and p99 create-to-bound beside the secondary-scheduler mode, same node;
* an extender restart and a kube-scheduler restart (SIGKILL) mid-burst: every
  pod bound, no GPU over-committed, kubelet admits every pod, reservations
  of the dead kube-scheduler's filters released;
* the real Prometheus scrapes the extender's /metrics.
"""

from __future__ import annotations

import fcntl
import json
import os
import signal
import tempfile
import time
from pathlib import Path

import pytest

from . import extender_node as h

WHY = h.missing()
pytestmark = pytest.mark.skipif(bool(WHY), reason=WHY or "runs")
NS = "ext-e2e"
GPUS = h.GPUS  # the agent's fake:h100-nvlink: 8 GPUs, each SHARES_PER_GPU kubelet devices
RESULTS: dict[str, list] = {}


_FAILED: list[str] = []  # pytest re-runs a module fixture that errored for every test: bring the node up once only


@pytest.fixture(scope="module")
def node():
    if _FAILED:
        pytest.fail(f"the real node did not come up: {_FAILED[0]}")
    workdir = Path(tempfile.mkdtemp(prefix="gpufleet-ext-e2e-"))
    lock = None
    if os.environ.get("GPUFLEET_E2E_LOCK"):
        lock = open(os.environ["GPUFLEET_E2E_LOCK"], "a")  # noqa: SIM115
        fcntl.flock(lock, fcntl.LOCK_EX)
    stack = None
    real = h.real_node()
    try:
        core, stack = h.bring_up(real, workdir, NS, prometheus=True)
    except Exception as exc:
        _FAILED.append(str(exc)[:2000])
        _teardown(stack, real, workdir, lock)
        raise
    try:
        yield stack, core
    finally:
        _teardown(stack, real, workdir, lock)


def _teardown(stack, real, workdir: Path, lock) -> None:
    if stack is not None:
        stack.stop_all()
    h.node_down(real, workdir / "run-e2e.log")
    if RESULTS:
        out = Path(os.environ.get("GPUFLEET_E2E_OUT") or workdir / "results.json")
        out.write_text(json.dumps(RESULTS, indent=1))
        print(f"\nresults in {out}; logs in {workdir}")
    if lock is not None:
        fcntl.flock(lock, fcntl.LOCK_UN)
        lock.close()


@pytest.fixture(autouse=True)
def _empty_namespace(request):
    """Each test starts with no pods of ours (a failed test leaves its pods; the node takes 20)."""
    if "node" in request.fixturenames:
        _, core = request.getfixturevalue("node")
        h.clear_pods(core, NS)


def _sched_errors(stack) -> list[str]:
    return [line for line in stack.procs["kube-scheduler"].text().splitlines() if "Error scheduling pod; retrying" in line]


def _ext_metric(stack, name: str, **labels) -> float:
    from prometheus_client.parser import text_string_to_metric_families

    for fam in text_string_to_metric_families(h.http_get(stack.ext_url + "/metrics")):
        for s in fam.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                return s.value
    return 0.0


def _check_no_overcommit(core) -> None:
    used = h.gpu_use(core, NS)
    assert used and max(used.values()) <= 1000, used


def _kubelet_admitted_all(core) -> None:
    bad = [(p.metadata.name, p.status.reason, p.status.message) for p in core.list_namespaced_pod(NS).items
           if p.status.phase == "Failed"]
    assert not bad, bad


def test_burst_of_n_plus_one_gives_n_binds_and_one_clean_unschedulable(node):
    stack, core = node
    # kube-scheduler's own NodeResourcesFit sees SHARES_PER_GPU devices per GPU: it never runs out at N+1 pods,
    # so the one Unschedulable below can only come from the extender's filter
    alloc = int(core.read_node(h.NODE).status.allocatable.get("nvidia.com/gpu", "0"))
    assert alloc == GPUS * h.SHARES_PER_GPU > GPUS + 1, alloc
    for rnd in range(3):
        errors0 = _sched_errors(stack)
        refused0 = _ext_metric(stack, "gpufleet_extender_refusals_total", verb="bind", reason="failed")
        unsched0 = _ext_metric(stack, "gpufleet_extender_refusals_total", verb="filter", reason="unschedulable")
        b = h.burst(core, NS, "default-scheduler", GPUS + 1, gpus=1, prefix=f"n{rnd}-", expect_bound=GPUS)
        RESULTS.setdefault("n_plus_one_extender", []).append(b.summary())
        print(f"\nextender, burst of {GPUS + 1} one-GPU pods on {GPUS} GPUs: {b.summary()}")
        assert len(b.bound) == GPUS, b.summary()
        _check_no_overcommit(core)
        assert len(h.gpu_use(core, NS)) == GPUS
        leftover = sorted(set(b.created) - set(b.bound))
        h.wait_for(lambda lo=leftover: any(n == lo[0] for n, _ in h.events(core, NS)), 20, "FailedScheduling event")
        msgs = [m for n, m in h.events(core, NS) if n == leftover[0]]
        assert any("Insufficient nvidia.com/gpu" in m for m in msgs), msgs  # the extender's FailedNodes reason
        assert _ext_metric(stack, "gpufleet_extender_refusals_total", verb="filter", reason="unschedulable") > unsched0, \
            "the extender's filter did not turn the extra pod away"
        assert not [m for _, m in h.events(core, NS) if "binding rejected" in m.lower()]
        assert _sched_errors(stack) == errors0, f"kube-scheduler logged a scheduling error: {_sched_errors(stack)[len(errors0):]}"
        assert _ext_metric(stack, "gpufleet_extender_refusals_total", verb="bind", reason="failed") == refused0
        _kubelet_admitted_all(core)
        h.clear_pods(core, NS)


def test_same_burst_in_secondary_scheduler_mode(node):
    stack, core = node
    b = h.burst(core, NS, stack.secondary_name, GPUS + 1, gpus=1, prefix="s-", expect_bound=GPUS)
    RESULTS.setdefault("n_plus_one_secondary", []).append(b.summary())
    print(f"\nsecondary scheduler, burst of {GPUS + 1} one-GPU pods on {GPUS} GPUs: {b.summary()}")
    assert len(b.bound) == GPUS
    _check_no_overcommit(core)
    h.clear_pods(core, NS)


def test_throughput_side_by_side(node):
    """16 pods of 250 milli-GPU at once (the node takes 20 pods), modes alternating."""
    stack, core = node
    rows = []
    for rnd in range(2):
        for mode, sched in (("extender", "default-scheduler"), ("secondary", stack.secondary_name)):
            b = h.burst(core, NS, sched, 16, gpus=1, milli=250, prefix=f"t{rnd}{mode[0]}-")
            assert len(b.bound) == 16, (mode, b.summary())
            _check_no_overcommit(core)
            rows.append((mode, b.binds_per_s, b.p(0.99), b.p(0.5)))
            print(f"\nround {rnd + 1} {mode}: {b.summary()}")
            h.clear_pods(core, NS)
    for mode in ("extender", "secondary"):
        mine = [r for r in rows if r[0] == mode]
        RESULTS[f"throughput_{mode}"] = [{"binds_per_s": r[1], "p99_s": r[2], "p50_s": r[3]} for r in mine]


def _restart_mid_burst(stack, core, which: str, sig: int, prefix: str) -> h.Burst:
    state = {"done": False, "bound_at": -1}

    def during(nbound: int) -> None:
        if not state["done"] and nbound >= 3:
            state["done"], state["bound_at"] = True, nbound
            p = stack.procs[which]
            p.stop(sig)
            time.sleep(1.0)
            (stack.start_extender if which == "extender" else stack.start_kube_scheduler)()

    b = h.burst(core, NS, "default-scheduler", 16, gpus=1, milli=250, prefix=prefix, timeout_s=120, during=during)
    print(f"\n{which} restarted after {state['bound_at']} of 16 bound: {b.summary()}")
    RESULTS.setdefault(f"restart_{which}", []).append({"bound_at_restart": state["bound_at"], "summary": b.summary()})
    assert state["done"] and state["bound_at"] < 16, "the burst finished before the restart: nothing was tested"
    assert len(b.bound) == 16, b.summary()
    _check_no_overcommit(core)
    return b


def test_extender_restart_mid_burst(node):
    stack, core = node
    _restart_mid_burst(stack, core, "extender", signal.SIGTERM, "xr-")
    h.wait_for(lambda: all(p.status.phase == "Running" for p in core.list_namespaced_pod(NS).items), 120, "all Running", 1)
    _kubelet_admitted_all(core)
    h.clear_pods(core, NS)


def test_kube_scheduler_crash_mid_burst(node):
    stack, core = node
    _restart_mid_burst(stack, core, "kube-scheduler", signal.SIGKILL, "kr-")
    # what the dead kube-scheduler's filters reserved is either bound, re-filtered or expired: nothing stays held
    h.wait_for(lambda: _ext_metric(stack, "gpufleet_extender_reservations") == 0, stack.reservation_ttl_s + 10, "reservations released")
    h.wait_for(lambda: all(p.status.phase == "Running" for p in core.list_namespaced_pod(NS).items), 120, "all Running", 1)
    _kubelet_admitted_all(core)
    h.clear_pods(core, NS)


def test_prometheus_scrapes_the_extender(node):
    stack, _ = node
    time.sleep(3)
    up = stack.promql('up{job="gpufleet-extender"}')
    assert up and up[0]["value"][1] == "1", up
    binds = stack.promql('sum(increase(gpufleet_binds_total{job="gpufleet-extender"}[30m]))')
    assert binds and float(binds[0]["value"][1]) > 0, binds
    filters = stack.promql('sum(gpufleet_extender_requests_total{job="gpufleet-extender",verb="filter"})')
    assert filters and float(filters[0]["value"][1]) > 0
    age = stack.promql('gpufleet_snapshot_age_seconds{job="gpufleet-extender"}')
    assert age and float(age[0]["value"][1]) < 120, age
    p99 = stack.promql('histogram_quantile(0.99, sum by (le) (rate(gpufleet_extender_request_duration_seconds_bucket{verb="bind"}[30m])))')
    RESULTS["prometheus"] = {"binds": binds[0]["value"][1], "bind_call_p99_s": p99[0]["value"][1] if p99 else None}
    print(f"\nprometheus: extender binds {binds[0]['value'][1]}, bind verb p99 {RESULTS['prometheus']['bind_call_p99_s']} s")
