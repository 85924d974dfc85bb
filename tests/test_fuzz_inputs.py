"""Fuzzing every parser of outside input: it raises only gpufleet's typed errors, and never hangs.

Targets: the trace reader (pod and node CSV), the Pod JSON parser, the Queue
and PodGroup custom-resource parsers, the agent's config file and the
scheduler extender's HTTP JSON.  Each call runs under an alarm, so a loop
fails the test instead of hanging it.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import string
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from gpufleet.engine.errors import GpufleetError

EXAMPLES = int(os.environ.get("GPUFLEET_FUZZ_EXAMPLES", "150"))  # more for a longer hunt
FUZZ = settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


class Hang(Exception):
    pass


@contextlib.contextmanager
def no_hang(seconds: int = 5) -> Iterator[None]:
    def fire(*_):
        raise Hang(f"no answer within {seconds} s")

    old = signal.signal(signal.SIGALRM, fire)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def typed_only(fn, *args):
    """Call ``fn``; a GpufleetError is a fine answer, anything else (or a hang) fails the test."""
    with no_hang():
        try:
            return fn(*args)
        except GpufleetError:
            return None


json_leaf = st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats() | st.text(max_size=12)
json_any = st.recursive(json_leaf, lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=8), c, max_size=4),
                        max_leaves=16)
quantity = (st.from_regex(r"\A[+-]?[0-9]{0,25}(\.[0-9]{0,6})?(Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]|[eE][+-]?[0-9]{1,4})?\Z")
            | st.integers(-2**70, 2**70) | st.floats() | json_leaf)


def kube_shaped(keys: list[str], value) -> st.SearchStrategy:
    """A mapping over real field names (so the parser gets past its first checks) with fuzzed values."""
    return st.dictionaries(st.sampled_from(keys) | st.text(max_size=6), value, max_size=len(keys))


# --- the trace reader --------------------------------------------------------------------------------------

CSV_CELL = st.sampled_from(["0", "1", "2", "8", "500", "1000", "nan", "inf", "-1", "1e40", "1.5", "", "T4", "V100M32", "A100",
                            "x", '"', "\x00", "é", "1" + "0" * 30, "\ufeff", ",", "\r"]) | st.text(max_size=6)


@st.composite
def csv_bytes(draw, header: str) -> bytes:
    n = len(header.split(","))
    rows = draw(st.lists(st.lists(CSV_CELL, min_size=n - 1, max_size=n + 1).map(",".join), max_size=6))
    text = (draw(st.sampled_from(["", "\ufeff"])) + draw(st.sampled_from([header, header.upper(), header[:-3], ""]))
            + "\n" + "\n".join(rows))
    enc = draw(st.sampled_from(["utf-8", "latin-1", "utf-16"]))
    raw = text.encode(enc, errors="replace")
    if draw(st.booleans()):  # splice in raw garbage
        at = draw(st.integers(0, len(raw)))
        raw = raw[:at] + draw(st.binary(max_size=8)) + raw[at:]
    return raw


POD_HEADER = "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time"


@FUZZ
@given(raw=st.one_of(csv_bytes(POD_HEADER), csv_bytes(POD_HEADER.rsplit(",", 6)[0]), st.binary(max_size=200)),
       skip=st.booleans())
def test_pod_list_reader(tmp_path, raw, skip):
    from gpufleet.simulator.traces import trace

    p = tmp_path / "pods.csv"
    p.write_bytes(raw)
    tr = typed_only(trace.load_pods, p, skip)
    if tr is not None:
        for pod in tr.pods:  # what was accepted is a valid request
            assert pod.num_gpu <= 1024 and 0 <= pod.gpu_milli <= 1000 and pod.cpu_milli <= 10**9
            pod.request()


@FUZZ
@given(raw=st.one_of(csv_bytes("sn,cpu_milli,memory_mib,gpu,model"), st.binary(max_size=200)), skip=st.booleans())
def test_node_list_reader(tmp_path, raw, skip):
    from gpufleet.simulator.traces import trace

    p = tmp_path / "nodes.csv"
    p.write_bytes(raw)
    nl = typed_only(trace.read_nodes, p, skip)
    if nl is not None:
        assert nl.nodes and any(n.gpus for n in nl.nodes)
        assert all(0 < n.cpu_milli <= 10**9 for n in nl.nodes)


# --- Pod JSON ------------------------------------------------------------------------------------------------

RESOURCES = ["cpu", "memory", "nvidia.com/gpu", "nvidia.com/mig-1g.10gb", "nvidia.com/mig-3g.40gb", "pods", "ephemeral-storage"]
ANNOTATIONS = ["gpufleet.io/gpu-milli", "gpufleet.io/gpu-memory", "gpufleet.io/gpu-model", "gpufleet.io/queue",
               "gpufleet.io/pod-group", "gpufleet.io/unknown", "other.io/x"]
resources = kube_shaped(["requests", "limits"], kube_shaped(RESOURCES, quantity) | json_any)
container = kube_shaped(["name", "resources", "restartPolicy"], resources | json_any | st.sampled_from(["Always", "c"]))
requirement = kube_shaped(["key", "operator", "values"], st.sampled_from(["In", "NotIn", "Exists", "Gt", "Lt", "x"])
                          | st.lists(st.text(max_size=4), max_size=3) | json_any)
affinity = st.fixed_dictionaries({"nodeAffinity": kube_shaped(
    ["requiredDuringSchedulingIgnoredDuringExecution", "preferredDuringSchedulingIgnoredDuringExecution"],
    kube_shaped(["nodeSelectorTerms"], st.lists(kube_shaped(["matchExpressions", "matchFields"], st.lists(requirement, max_size=2)),
                                                max_size=2)) | st.lists(kube_shaped(["weight", "preference"], json_any), max_size=2)
    | json_any)})
spec = kube_shaped(
    ["containers", "initContainers", "overhead", "nodeSelector", "affinity", "tolerations", "priority", "schedulerName",
     "nodeName"],
    st.lists(container, max_size=3) | affinity | kube_shaped(RESOURCES, quantity) | st.lists(json_any, max_size=2) | json_any)
metadata = kube_shaped(["name", "namespace", "annotations", "labels", "uid"],
                       st.text(max_size=8) | kube_shaped(ANNOTATIONS, st.text(string.printable, max_size=8) | json_any) | json_any)
pod_json = kube_shaped(["metadata", "spec", "status"], metadata | spec | json_any) | json_any


@FUZZ
@given(pod=pod_json)
def test_pod_json_parser(pod):
    from gpufleet.engine.podspec import parse_pod

    typed_only(parse_pod, pod)


# --- Queue and PodGroup custom resources ------------------------------------------------------------------

queue_spec = kube_shaped(["quota", "borrowingLimit", "weight", "parent", "namespaces", "namespaceSelector"],
                         kube_shaped(RESOURCES + ["gpu-milli", "gpu-memory", "gpus"], quantity) | json_any)
queue_obj = kube_shaped(["apiVersion", "kind", "metadata", "spec"], st.sampled_from(["Queue", "gpufleet.io/v1alpha1"])
                        | kube_shaped(["name", "namespace"], st.text(max_size=6) | json_any) | queue_spec | json_any) | json_any
group_obj = kube_shaped(["metadata", "spec"], kube_shaped(["name", "namespace"], st.text(max_size=6) | json_any)
                        | kube_shaped(["minMember", "scheduleTimeoutSeconds", "queue", "priority"], json_any)) | json_any


@FUZZ
@given(objs=st.lists(queue_obj, max_size=4))
def test_queue_parser(objs):
    from gpufleet.engine.queues import Queue, load_queues

    for o in objs:
        typed_only(Queue.from_json, o)
    with no_hang():
        queues, errors = load_queues(objs)  # never raises: bad objects are reported
    assert len(queues) + len(errors) == len(objs)  # each object is either a queue or a reported error


@FUZZ
@given(obj=group_obj)
def test_podgroup_parser(obj):
    from gpufleet.engine.gang import PodGroup

    g = typed_only(PodGroup.from_json, obj)
    if g is not None:
        assert g.min_member >= 1


# --- the agent's config file ---------------------------------------------------------------------------------

AGENT_KEYS = ["migStrategy", "replicas", "renameShared", "recoverAfterSeconds", "labelIntervalSeconds", "mpsPipeDirectory",
              "deviceListStrategy", "sharing"]
yaml_scalar = st.sampled_from(["mixed", "single", "none", "1", "0", "-1", ".nan", ".inf", "-.inf", "true", "1e400", "uuid",
                               "/run/mps", "[1, 2]", "{a: 1}", "~", "'x'", "&a 1", "*a", "!!python/object:os.system x"]) \
    | st.text(max_size=8)


@st.composite
def agent_yaml(draw) -> bytes:
    lines = [f"{draw(st.sampled_from(AGENT_KEYS) | st.text(max_size=6))}: {draw(yaml_scalar)}"
             for _ in range(draw(st.integers(0, 5)))]
    raw = "\n".join(lines).encode()
    if draw(st.booleans()):
        raw += draw(st.binary(max_size=8))
    return raw


@FUZZ
@given(raw=agent_yaml() | st.binary(max_size=100))
@example(raw=b"sharing: mixed\n0: mixed")  # a number as a key once broke the unknown-key message
def test_agent_config(tmp_path, raw):
    import math

    from gpufleet.agent.config import load_agent_config

    p = tmp_path / "agent.yaml"
    p.write_bytes(raw)
    cfg = typed_only(load_agent_config, p)
    if cfg is not None:  # what was accepted is usable
        assert cfg.mig_strategy in ("mixed", "single", "none") and cfg.replicas >= 1
        assert math.isfinite(cfg.recover_after_s) and cfg.recover_after_s >= 0


# --- the scheduler extender's HTTP JSON ---------------------------------------------------------------------

@pytest.fixture(scope="module")
def extender():
    from tests.kube.fake_api import FakeApi
    from gpufleet.kube.extender import Extender, ExtenderLoop, serve
    from gpufleet.policies import build_profile
    from tests.kube.test_loop import node

    api = FakeApi()
    api.add_node(node("small", gpus=1, inventory=True))
    api.add_node(node("big", gpus=8, inventory=True))
    loop = ExtenderLoop(api, build_profile("default"))
    loop.resync()
    ext = Extender(loop)
    srv = serve(ext, "127.0.0.1:0")
    yield ext, f"http://127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()


ext_args = kube_shaped(["Pod", "pod", "NodeNames", "nodenames", "Nodes", "PodName", "PodNamespace", "PodUID", "Node"],
                       pod_json | st.lists(st.sampled_from(["small", "big", "ghost"]) | json_any, max_size=3)
                       | kube_shaped(["items"], st.lists(kube_shaped(["metadata"], metadata | json_any) | json_any, max_size=3))
                       | st.sampled_from(["small", "big", "ml", "p"]) | json_any)


@FUZZ
@given(args=ext_args, verb=st.sampled_from(["filter", "prioritize", "bind"]))
def test_extender_methods(extender, args, verb):
    ext, _ = extender
    out = typed_only(getattr(ext, verb), args)
    if out is not None:
        json.dumps(out)  # an answer kube-scheduler can read


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(body=st.one_of(ext_args.map(lambda a: json.dumps(a).encode()), st.binary(max_size=60), json_any.map(lambda a: json.dumps(a).encode())),
       verb=st.sampled_from(["filter", "prioritize", "bind", "nope"]))
def test_extender_http_always_answers_json(extender, body, verb):
    import urllib.error
    import urllib.request

    _, base = extender
    req = urllib.request.Request(f"{base}/{verb}", data=body, headers={"Content-Type": "application/json"})
    with no_hang(10):
        try:
            with urllib.request.urlopen(req, timeout=5) as r:
                code, text = r.status, r.read()
        except urllib.error.HTTPError as exc:
            code, text = exc.code, exc.read()
    assert code in (200, 400, 404)
    doc = json.loads(text)
    if code != 200:
        assert doc["Error"]


# --- command-line values ----------------------------------------------------------------------------------------

@FUZZ
@given(text=st.text(st.sampled_from("0123456789-,. +eEnaif"), max_size=20) | st.text(max_size=10))
def test_flag_values(text):
    import argparse
    import math

    from gpufleet.argtypes import float_range, host_port, int_range
    from gpufleet.cli.simulate import parse_seeds

    for parse in (parse_seeds, int_range(1, 256), float_range(0, 10, lo_open=True), host_port):
        with no_hang():
            try:
                v = parse(text)
            except argparse.ArgumentTypeError:
                continue
        if parse is parse_seeds:
            assert 1 <= len(v) <= 1000 and len(set(v)) == len(v) and all(0 <= s < 2**32 for s in v)
        elif isinstance(v, float):
            assert math.isfinite(v) and 0 < v <= 10
