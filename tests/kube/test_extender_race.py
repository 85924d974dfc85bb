"""The extender under kube-scheduler's interleaving: filter of the next pod before the bind of the last.

kube-scheduler runs one scheduling cycle at a time (filter, prioritize, assume)
and each pod's binding cycle on its own goroutine, so ``/bind`` for pod A comes
after ``/filter`` for pod B.  Reservations made at filter keep B from being
offered A's GPUs: a burst of N+1 one-GPU pods on N GPUs gives N binds and one
clean "no node" answer, never a failed bind.
"""

from __future__ import annotations

import json
import logging
import threading
import time
import urllib.request
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.kube.fake_api import FakeApi
from gpufleet.kube.extender import Extender, ExtenderLoop, serve
from gpufleet.kube.extender_cli import _log_level
from gpufleet.policies import build_profile

from .test_loop import node, pod


def setup(nodes: dict[str, int], ttl_s: float = 30.0, latency_s: float = 0.0, policy: str = "default"):
    api = FakeApi()
    api.call_latency_s = latency_s
    for name, g in nodes.items():
        api.add_node(node(name, gpus=g, inventory=True))
    loop = ExtenderLoop(api, build_profile(policy), reservation_ttl_s=ttl_s)
    loop.resync()
    return api, loop, Extender(loop)


def new_pod(api, loop, name, gpus=1, milli=None):
    p = pod(name, gpus=gpus, milli=milli, scheduler="default-scheduler")
    api.add_pod(p)
    loop.handle("pod", "ADDED", api.pods[f"ml/{name}"])
    return api.pods[f"ml/{name}"]


def bind_args(p, node_name):
    m = p["metadata"]
    return {"PodName": m["name"], "PodNamespace": m["namespace"], "PodUID": m["uid"], "Node": node_name}


def events_to(loop, api):
    """Apply the FakeApi's watch log to the loop, as the Runner's reflector would."""
    for type_, obj in list(api.watch("pod", loop.cache.rv["pod"], 0)):
        loop.handle("pod", type_, obj)


def metric(text: str, name: str, **labels) -> float:
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                return s.value
    raise KeyError(f"{name}{labels}")


def used_milli(api) -> Counter:
    used: Counter = Counter()
    for p in api.pods.values():
        a = (p["metadata"].get("annotations") or {}).get("gpufleet.io/assignment")
        if a:
            a = json.loads(a)
            for g in a["gpus"]:
                used[(a["node"], g["index"])] += a.get("gpu_milli") or 1000
    return used


def test_filter_of_the_next_pod_before_the_last_bind_sees_its_gpus():
    """The exact interleaving from the issue: one free GPU, two pods, both filtered before either binds."""
    api, loop, ext = setup({"n": 1})
    a, b = new_pod(api, loop, "a"), new_pod(api, loop, "b")
    fa = ext.filter({"Pod": a, "NodeNames": ["n"]})
    fb = ext.filter({"Pod": b, "NodeNames": ["n"]})
    assert fa["NodeNames"] == ["n"] and fa["Error"] == ""
    assert fb["NodeNames"] == [] and fb["Error"] == "" and "Insufficient nvidia.com/gpu" in fb["FailedNodes"]["n"]
    assert ext.bind(bind_args(a, "n")) == {"Error": ""}
    assert api.binds == [("ml/a", "n")] and not loop.reservations


def test_filter_returns_only_the_chosen_node_and_holds_its_gpus():
    api, loop, ext = setup({"n1": 2, "n2": 2, "n3": 2}, policy="bestfit")
    p = new_pod(api, loop, "p")
    f = ext.filter({"Pod": p, "NodeNames": ["n1", "n2", "n3"]})
    assert len(f["NodeNames"]) == 1
    chosen = f["NodeNames"][0]
    others = {"n1", "n2", "n3"} - {chosen}
    assert set(f["FailedNodes"]) == others and all(f"placed the pod on {chosen}" in v for v in f["FailedNodes"].values())
    r = loop.reservations["ml/p"]
    assert r.assignment.node == chosen and loop.cache.state.assignments["ml/p"] == r.assignment
    assert ext.prioritize({"Pod": p, "NodeNames": [chosen]}) == [{"Host": chosen, "Score": 10}]
    assert ext.bind(bind_args(p, chosen))["Error"] == ""
    ann = json.loads(api.pods["ml/p"]["metadata"]["annotations"]["gpufleet.io/assignment"])
    assert ann["node"] == chosen and [g["index"] for g in ann["gpus"]] == list(r.assignment.gpu_indices)


def test_burst_n_plus_one_on_n_gpus_gives_n_binds_and_one_unschedulable_with_async_binds():
    """kube-scheduler's shape: filters one after another on one thread, each bind on its own thread, slow API."""
    api, loop, ext = setup({"a": 2, "b": 4, "c": 2}, latency_s=0.02)
    n = 8
    pods = [new_pod(api, loop, f"p{i}") for i in range(n + 1)]
    names = ["a", "b", "c"]
    results: list[dict] = []
    unschedulable = []
    with ThreadPoolExecutor(16) as pool:
        futs = []
        for p in pods:
            f = ext.filter({"Pod": p, "NodeNames": names})
            assert f["Error"] == ""
            if f["NodeNames"]:
                assert len(f["NodeNames"]) == 1
                futs.append(pool.submit(ext.bind, bind_args(p, f["NodeNames"][0])))
            else:
                unschedulable.append((p["metadata"]["name"], f["FailedNodes"]))
        results = [fu.result() for fu in futs]
    assert [r["Error"] for r in results] == [""] * n
    assert len(unschedulable) == 1 and all("Insufficient nvidia.com/gpu" in v for v in unschedulable[0][1].values())
    assert len(api.binds) == n and max(used_milli(api).values()) == 1000 and len(used_milli(api)) == n
    assert not loop.reservations and ext.metrics.refusals.labels("bind", "failed")._value.get() == 0


@pytest.mark.parametrize("seed", range(3))
def test_many_threads_over_http_never_overcommit_and_never_fail_a_bind(seed):
    """Several kube-scheduler-like clients at once over real HTTP (whole GPUs and 500-milli shares)."""
    import random

    api, loop, ext = setup({"a": 4, "b": 4, "c": 8}, latency_s=0.005)
    srv = serve(ext, "127.0.0.1:0")
    base = f"http://127.0.0.1:{srv.server_address[1]}"
    rng = random.Random(seed)
    specs = [(f"w{i}", 1, None) for i in range(10)] + [(f"s{i}", 1, 500) for i in range(16)] + [(f"d{i}", 2, None) for i in range(4)]
    rng.shuffle(specs)
    pods = [new_pod(api, loop, nm, gpus=g, milli=m) for nm, g, m in specs]

    def post(verb, body):
        req = urllib.request.Request(f"{base}/{verb}", data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=10) as r:
            return json.loads(r.read())

    bind_errors: list[str] = []
    fits = []

    def schedule(chunk):  # one scheduling "thread": sequential filters, async binds
        with ThreadPoolExecutor(4) as binds:
            futs = []
            for p in chunk:
                f = post("filter", {"Pod": p, "NodeNames": ["a", "b", "c"]})
                if f["NodeNames"]:
                    fits.append(p["metadata"]["name"])
                    futs.append(binds.submit(post, "bind", bind_args(p, f["NodeNames"][0])))
            for fu in futs:
                if fu.result()["Error"]:
                    bind_errors.append(fu.result()["Error"])

    try:
        threads = [threading.Thread(target=schedule, args=(pods[i::3],)) for i in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert bind_errors == []
        assert len(api.binds) == len(fits)
        used = used_milli(api)
        assert all(v <= 1000 for v in used.values())
        # 16 GPUs: whatever order, at least 14 GPUs' worth is placed (a 2-GPU pod may be left out by fragmentation)
        assert sum(used.values()) >= 14_000
        assert not loop.reservations
        text = urllib.request.urlopen(base + "/metrics", timeout=5).read().decode()
        assert metric(text, "gpufleet_binds_total") == len(fits)
        assert metric(text, "gpufleet_extender_requests_total", verb="bind", result="bound") == len(fits)
        assert metric(text, "gpufleet_extender_requests_total", verb="filter", result="unschedulable") == len(pods) - len(fits)
    finally:
        srv.shutdown()


def test_unbound_reservation_expires_and_gives_the_gpu_back():
    api, loop, ext = setup({"n": 1}, ttl_s=0.2)
    a, b = new_pod(api, loop, "a"), new_pod(api, loop, "b")
    assert ext.filter({"Pod": a, "NodeNames": ["n"]})["NodeNames"] == ["n"]
    assert ext.filter({"Pod": b, "NodeNames": ["n"]})["NodeNames"] == []
    time.sleep(0.3)  # kube-scheduler never came back for a
    assert ext.filter({"Pod": b, "NodeNames": ["n"]})["NodeNames"] == ["n"]
    assert loop.released["expired"] == 1 and list(loop.reservations) == ["ml/b"]
    # a late bind for a: no reservation any more, decided at bind, and the GPU is b's now
    assert "does not fit on n" in ext.bind(bind_args(a, "n"))["Error"]
    assert ext.bind(bind_args(b, "n"))["Error"] == ""


def test_the_sweeper_thread_releases_without_any_call():
    api, loop, ext = setup({"n": 1}, ttl_s=0.1)
    srv = serve(ext, "127.0.0.1:0", sweep_s=0.05)
    try:
        a = new_pod(api, loop, "a")
        ext.filter({"Pod": a, "NodeNames": ["n"]})
        deadline = time.monotonic() + 5
        while loop.reservations and time.monotonic() < deadline:
            time.sleep(0.02)
        assert not loop.reservations and not loop.cache.state.assignments
    finally:
        srv.shutdown()


def test_pod_deleted_or_bound_elsewhere_releases_its_reservation():
    api, loop, ext = setup({"n": 2})
    a, b = new_pod(api, loop, "a"), new_pod(api, loop, "b")
    ext.filter({"Pod": a, "NodeNames": ["n"]})
    ext.filter({"Pod": b, "NodeNames": ["n"]})
    assert len(loop.cache.state.assignments) == 2
    api.delete_pod("ml/a")
    events_to(loop, api)
    assert "ml/a" not in loop.reservations and "ml/a" not in loop.cache.state.assignments and loop.released["deleted"] == 1
    # someone else binds b (another scheduler, a human): the reservation goes, the real placement stays
    api.bind("ml", "b", "n", {})
    events_to(loop, api)
    assert "ml/b" not in loop.reservations and loop.released["bound_elsewhere"] == 1
    assert loop.cache.state.assignments["ml/b"].node == "n" and len(loop.cache.state.assignments) == 1


def test_refilter_replaces_the_reservation_and_a_new_pod_of_the_same_name_is_a_new_pod():
    api, loop, ext = setup({"n": 1})
    a = new_pod(api, loop, "a")
    for _ in range(3):  # kube-scheduler retries the pod (e.g. a later plugin failed): no leak
        assert ext.filter({"Pod": a, "NodeNames": ["n"]})["NodeNames"] == ["n"]
    assert len(loop.reservations) == 1 and loop.released["refiltered"] == 2
    # recreated with another UID: the old reservation must not be bound for it
    api.delete_pod("ml/a")
    a2 = pod("a", gpus=1, scheduler="default-scheduler")
    a2["metadata"]["uid"] = "uid-a-2"
    api.add_pod(a2)
    events_to(loop, api)
    assert not loop.reservations and not loop.cache.state.assignments


def test_bind_with_another_uid_or_node_than_reserved_is_decided_again():
    api, loop, ext = setup({"n1": 1, "n2": 1}, policy="bestfit")
    a = new_pod(api, loop, "a")
    chosen = ext.filter({"Pod": a, "NodeNames": ["n1", "n2"]})["NodeNames"][0]
    other = "n2" if chosen == "n1" else "n1"
    assert ext.bind(bind_args(a, other))["Error"] == ""  # decided on that node; the reservation is dropped
    assert loop.released["other_node"] == 1 and loop.cache.state.assignments["ml/a"].node == other
    assert sum(1 for x in loop.cache.state.assignments.values() if x.node == chosen) == 0


def test_extender_restart_between_filter_and_bind_decides_at_bind():
    api, loop, ext = setup({"n": 1})
    a = new_pod(api, loop, "a")
    assert ext.filter({"Pod": a, "NodeNames": ["n"]})["NodeNames"] == ["n"]
    loop2 = ExtenderLoop(api, build_profile("default"))  # a fresh process: nothing reserved
    loop2.resync()
    ext2 = Extender(loop2)
    assert ext2.bind(bind_args(a, "n"))["Error"] == ""
    assert api.binds == [("ml/a", "n")]


def test_a_relist_keeps_reservations():
    api, loop, ext = setup({"n": 2})
    a, b = new_pod(api, loop, "a"), new_pod(api, loop, "b")
    ext.filter({"Pod": a, "NodeNames": ["n"]})
    loop.resync()  # e.g. after 410 Gone
    assert "ml/a" in loop.cache.state.assignments and "ml/a" in loop.reservations
    ext.filter({"Pod": b, "NodeNames": ["n"]})
    c = new_pod(api, loop, "c")
    assert ext.filter({"Pod": c, "NodeNames": ["n"]})["NodeNames"] == []


def test_metrics_endpoint_and_log_lines(caplog):
    api, loop, ext = setup({"n": 1})
    srv = serve(ext, "127.0.0.1:0")
    base = f"http://127.0.0.1:{srv.server_address[1]}"
    try:
        a, b = new_pod(api, loop, "a"), new_pod(api, loop, "b")
        with caplog.at_level(logging.INFO, logger="gpufleet"):
            ext.filter({"Pod": a, "NodeNames": ["n"]})
            ext.filter({"Pod": b, "NodeNames": ["n"]})
            ext.filter({"Pod": pod("web", gpus=0), "NodeNames": ["n"]})
            ext.bind(bind_args(a, "n"))
        msgs = [r.getMessage() for r in caplog.records if r.name.startswith("gpufleet")]
        assert any(m.startswith("bound ml/a to n GPUs [0] in ") and "since its first filter" in m for m in msgs), msgs
        assert any(m.startswith("refused ml/b: 0/1 nodes are available: 1 Insufficient nvidia.com/gpu") for m in msgs), msgs
        assert not any("web" in m for m in msgs)  # per-call lines are DEBUG
        caplog.clear()
        with caplog.at_level(logging.DEBUG, logger="gpufleet"):
            ext.filter({"Pod": pod("web", gpus=0), "NodeNames": ["n"]})
        assert any("filter ml/web: no GPU requested" in r.getMessage() for r in caplog.records)
        text = urllib.request.urlopen(base + "/metrics", timeout=5).read().decode()
        assert metric(text, "gpufleet_extender_requests_total", verb="filter", result="fit") == 1
        assert metric(text, "gpufleet_extender_requests_total", verb="filter", result="unschedulable") == 1
        assert metric(text, "gpufleet_extender_requests_total", verb="filter", result="passthrough") == 2
        assert metric(text, "gpufleet_extender_requests_total", verb="bind", result="bound") == 1
        assert metric(text, "gpufleet_extender_request_duration_seconds_count", verb="filter") == 4
        assert metric(text, "gpufleet_binds_total") == 1
        assert metric(text, "gpufleet_extender_refusals_total", verb="filter", reason="unschedulable") == 1
        assert metric(text, "gpufleet_extender_reservations") == 0
        assert metric(text, "gpufleet_extender_reservations_made_total") == 1
        assert metric(text, "gpufleet_pod_scheduling_duration_seconds_count") == 1
        assert 0 <= metric(text, "gpufleet_snapshot_age_seconds") < 60
        assert metric(text, "gpufleet_extender_reservations_released_total", reason="expired") == 0
    finally:
        srv.shutdown()


def test_log_level_flag_sets_gpufleet_loggers_and_wins_over_verbose():
    import argparse

    root = logging.getLogger("gpufleet")
    old = root.level
    try:
        _log_level(argparse.Namespace(log_level="DEBUG", verbose=0))
        assert root.level == logging.DEBUG
        _log_level(argparse.Namespace(log_level="WARNING", verbose=0))
        assert root.level == logging.WARNING
        _log_level(argparse.Namespace(log_level="INFO", verbose=2))
        assert root.level == logging.INFO  # the command's own level wins over -v
        _log_level(argparse.Namespace(log_level=None, verbose=1))
        assert root.level == logging.DEBUG
    finally:
        root.setLevel(old)


def _parked(p, message, reason="SchedulerError"):
    p = json.loads(json.dumps(p))
    p["status"]["conditions"] = [{"type": "PodScheduled", "status": "False", "reason": reason, "message": message}]
    return p


def test_pods_parked_by_an_extender_outage_are_annotated_so_kube_scheduler_retries_them():
    api, loop, ext = setup({"n": 2})
    down = 'Post "http://127.0.0.1:8888/filter": dial tcp 127.0.0.1:8888: connect: connection refused'
    api.add_pod(_parked(pod("a", scheduler="default-scheduler"), down))
    api.add_pod(_parked(pod("b", scheduler="default-scheduler"), "0/1 nodes are available: 1 Insufficient nvidia.com/gpu.",
                        reason="Unschedulable"))  # a real no-fit: kube-scheduler retries it on cluster events itself
    api.add_pod(_parked(pod("c", gpus=0, scheduler="default-scheduler"), down))  # no GPU: not ours
    api.add_pod(_parked(pod("d", scheduler="default-scheduler"), "invalid pod spec: ..."))  # our own answer: retrying won't help
    loop.resync()  # the restarted extender lists them
    assert set(loop.stuck) == {"ml/a"}
    assert ext.retry_stuck(now=100.0) == 1
    assert "gpufleet.io/extender-retry" in api.pods["ml/a"]["metadata"]["annotations"]
    # kube-scheduler then filters the annotated pod: our own annotation must not make it invalid
    assert ext.filter({"Pod": api.pods["ml/a"], "NodeNames": ["n"]})["NodeNames"] == ["n"]
    loop.release("ml/a", "refiltered")
    assert ext.retry_stuck(now=101.0) == 0  # backoff: not again within 2 s
    assert ext.retry_stuck(now=102.5) == 1
    # kube-scheduler retried and it bound: nothing to do any more
    api.bind("ml", "a", "n", {})
    events_to(loop, api)
    assert not loop.stuck and ext.retry_stuck(now=1000.0) == 0
    assert ext.metrics.retries._value.get() == 2


def test_a_failed_bind_reply_is_also_retried_and_a_replaced_pod_is_not_annotated():
    api, loop, ext = setup({"n": 2})
    timeout = 'Post "http://127.0.0.1:8888/bind": context deadline exceeded (Client.Timeout exceeded while awaiting headers)'
    p = new_pod(api, loop, "a")
    api.add_pod(_parked(p, timeout))
    events_to(loop, api)
    assert set(loop.stuck) == {"ml/a"}
    api.delete_pod("ml/a")
    fresh = pod("a", scheduler="default-scheduler")
    fresh["metadata"]["uid"] = "uid-a-2"
    api.add_pod(fresh)  # the watch has not shown it yet: the UID precondition protects the new pod
    assert ext.retry_stuck(now=5.0) == 0
    assert "gpufleet.io/extender-retry" not in api.pods["ml/a"]["metadata"]["annotations"]


def test_shutdown_with_a_bind_in_flight_does_not_deadlock():
    """The runner closes the loop under the lock; the extender's binds finish on HTTP threads that need it."""
    api, loop, ext = setup({"n": 1}, latency_s=0.3)
    a = new_pod(api, loop, "a")
    ext.filter({"Pod": a, "NodeNames": ["n"]})
    out: list[dict] = []
    t = threading.Thread(target=lambda: out.append(ext.bind(bind_args(a, "n"))))
    t.start()
    time.sleep(0.1)
    t0 = time.monotonic()
    with ext.lock:
        loop.close()
    assert time.monotonic() - t0 < 1.0
    t.join(5)
    assert out == [{"Error": ""}]
