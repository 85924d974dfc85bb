"""The scheduler extender over real HTTP on localhost."""

from __future__ import annotations

import json
import urllib.request

import pytest

from tests.kube.fake_api import FakeApi
from gpufleet.kube.extender import Extender, ExtenderLoop, serve
from gpufleet.policies import build_profile

from .test_loop import node, pod


@pytest.fixture
def ext():
    api = FakeApi()
    api.add_node(node("small", gpus=1, inventory=True))
    api.add_node(node("big", gpus=8, inventory=True))
    api.add_node(node("cpu", gpus=0))
    loop = ExtenderLoop(api, build_profile("default"))
    loop.resync()
    e = Extender(loop)
    srv = serve(e, "127.0.0.1:0")
    yield api, loop, f"http://127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()


def post(url, body):
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=5) as r:
        return json.loads(r.read())


def test_filter_prioritize_bind(ext):
    api, loop, base = ext
    p = pod("train", gpus=4, scheduler="default-scheduler")
    api.add_pod(p)
    loop.handle("pod", "ADDED", p)
    names = ["small", "big", "cpu", "ghost"]
    f = post(base + "/filter", {"Pod": p, "NodeNames": names})
    assert f["NodeNames"] == ["big"] and f["Error"] == ""
    assert "Insufficient nvidia.com/gpu" in f["FailedNodes"]["small"] and "ghost" in f["FailedAndUnresolvableNodes"]
    pr = post(base + "/prioritize", {"Pod": p, "NodeNames": ["big"]})
    assert pr == [{"Host": "big", "Score": 10}]
    b = post(base + "/bind", {"PodName": "train", "PodNamespace": "ml", "PodUID": "uid-train", "Node": "big"})
    assert b["Error"] == ""
    a = json.loads(api.pods["ml/train"]["metadata"]["annotations"]["gpufleet.io/assignment"])
    assert a["node"] == "big" and len(a["gpus"]) == 4
    # the GPUs are taken in the snapshot: a second 8-GPU pod no longer fits on big
    f2 = post(base + "/filter", {"Pod": pod("x", gpus=8), "NodeNames": ["big"]})
    assert f2["NodeNames"] == []


def test_cpu_pods_pass_through_and_bad_requests_are_answered(ext):
    api, loop, base = ext
    f = post(base + "/filter", {"Pod": pod("web", gpus=0), "NodeNames": ["small", "cpu"]})
    assert f["NodeNames"] == ["small", "cpu"]
    bad = post(base + "/filter", {"Pod": pod("bad", annotations={"gpufleet.io/gpu-milli": "9999"}), "NodeNames": ["big"]})
    assert "gpufleet.io/gpu-milli" in bad["Error"]
    req = urllib.request.Request(base + "/filter", data=b"{not json", headers={"Content-Type": "application/json"})
    with pytest.raises(urllib.error.HTTPError) as exc:
        urllib.request.urlopen(req, timeout=5)
    assert exc.value.code == 400


def test_bind_to_a_node_that_does_not_fit_is_an_error(ext):
    api, loop, base = ext
    p = pod("big-one", gpus=4, scheduler="default-scheduler")
    api.add_pod(p)
    loop.handle("pod", "ADDED", p)
    r = post(base + "/bind", {"PodName": "big-one", "PodNamespace": "ml", "Node": "small"})
    assert "does not fit on small" in r["Error"] and not api.binds


def test_lowercase_keys_and_full_node_list_mode(ext):
    """Without nodeCacheCapable kube-scheduler sends a NodeList and expects a filtered NodeList back."""
    api, loop, base = ext
    p = pod("t", gpus=2, scheduler="default-scheduler")
    items = [{"metadata": {"name": n}} for n in ("small", "big")]
    f = post(base + "/filter", {"pod": p, "nodes": {"items": items}})
    assert [n["metadata"]["name"] for n in f["Nodes"]["items"]] == ["big"] and f["NodeNames"] is None
    pr = post(base + "/prioritize", {"pod": p, "nodenames": ["small", "big"]})
    assert {h["Host"]: h["Score"] for h in pr} == {"small": 0, "big": 10}


def test_bind_checks_uid_and_unknown_verbs_are_404(ext):
    api, loop, base = ext
    p = pod("u", gpus=1, scheduler="default-scheduler")
    api.add_pod(p)
    r = post(base + "/bind", {"PodName": "u", "PodNamespace": "ml", "PodUID": "someone-else", "Node": "big"})
    assert "UID" in r["Error"] and not api.binds and not loop.cache.state.assignments
    with pytest.raises(urllib.error.HTTPError) as exc:
        post(base + "/preempt", {})
    assert exc.value.code == 404


def test_not_synced_yet_is_an_error_not_an_empty_answer():
    import threading

    api = FakeApi()
    api.add_node(node("big", gpus=8))
    loop = ExtenderLoop(api, build_profile("bestfit"))
    ready = threading.Event()
    e = Extender(loop, ready=ready)
    r = e.filter({"Pod": pod("t", gpus=1, scheduler="default-scheduler"), "NodeNames": ["big"]})
    assert "not synced" in r["Error"] and r["NodeNames"] == []
    assert "not synced" in e.bind({"PodName": "t", "PodNamespace": "ml", "Node": "big"})["Error"]
    loop.resync()
    ready.set()
    assert e.filter({"Pod": pod("t", gpus=1, scheduler="default-scheduler"), "NodeNames": ["big"]})["NodeNames"] == ["big"]


def _created(ago_s: float | None) -> dict:
    from datetime import datetime, timedelta, timezone

    p = pod("w")
    if ago_s is not None:
        p["metadata"]["creationTimestamp"] = (datetime.now(timezone.utc) - timedelta(seconds=ago_s)).strftime("%Y-%m-%dT%H:%M:%SZ")
    return p


@pytest.mark.parametrize("ago_s, since_first_filter_s, lo, hi", [
    (700.0, 5.0, 699.0, 705.0),  # created 700 s ago: the policies' 10-minute limits are past
    (None, 30.0, 30.0, 30.0),  # no creationTimestamp: since kube-scheduler first asked
    (10.0, 120.0, 120.0, 120.0),  # the longer of the two
    (-300.0, 0.0, 0.0, 0.0),  # a clock ahead of ours: never negative
])
def test_the_extender_tells_the_policy_how_long_the_pod_has_waited(ago_s, since_first_filter_s, lo, hi):
    from gpufleet.kube.extender import waited_s

    assert lo <= waited_s(_created(ago_s), since_first_filter_s) <= hi
