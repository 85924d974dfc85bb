"""NodePorts: host ports by port, protocol and IP; sidecar and hostNetwork ports count, init containers' do not."""

from __future__ import annotations

import pytest

from gpufleet.engine.plugins.nodeports import NO_FREE_PORTS, NodePorts
from gpufleet.engine.podspec import parse_pod
from gpufleet.engine.state import ClusterState

from tests.builders import verdicts

from ..builders import gpu_node, kpod, place


PORT_CASES = [
    ("same port, both wildcard", (8080,), (8080,), NO_FREE_PORTS),
    ("different port", (8080,), (8081,), None),
    ("same port, other protocol", (53, "UDP"), (53, "TCP"), None),
    ("same port, same protocol UDP", (53, "UDP"), (53, "UDP"), NO_FREE_PORTS),
    ("two specific IPs", (80, "TCP", "10.0.0.1"), (80, "TCP", "10.0.0.2"), None),
    ("same specific IP", (80, "TCP", "10.0.0.1"), (80, "TCP", "10.0.0.1"), NO_FREE_PORTS),
    ("wildcard vs specific IP", (80, "TCP", "0.0.0.0"), (80, "TCP", "10.0.0.2"), NO_FREE_PORTS),
    ("specific IP vs wildcard", (80, "TCP", "10.0.0.1"), (80,), NO_FREE_PORTS),
]


@pytest.mark.parametrize("held,wanted,expected", [c[1:] for c in PORT_CASES], ids=[c[0] for c in PORT_CASES])
def test_node_ports(held, wanted, expected):
    st = ClusterState([gpu_node("n1"), gpu_node("n2")])
    place(st, kpod("old", host_ports=(held,)), "n1")
    v = verdicts(NodePorts(), parse_pod(kpod("x", host_ports=(wanted,))), st)
    assert v == {"n1": expected, "n2": None}
    st.unreserve("default/old")
    assert verdicts(NodePorts(), parse_pod(kpod("x", host_ports=(wanted,))), st) == {"n1": None, "n2": None}


def test_sidecar_ports_count_ordinary_init_container_ports_do_not():
    p = kpod("x")
    p["spec"]["initContainers"] = [
        {"name": "init", "ports": [{"containerPort": 1, "hostPort": 9000}]},
        {"name": "side", "restartPolicy": "Always", "ports": [{"containerPort": 2, "hostPort": 9001}]},
    ]
    assert [hp.port for hp in parse_pod(p).terms.host_ports] == [9001]


def test_host_network_pods_hold_their_container_ports():
    p = kpod("x", hostNetwork=True)
    p["spec"]["containers"][0]["ports"] = [{"containerPort": 9100}]
    assert [(hp.port, hp.protocol) for hp in parse_pod(p).terms.host_ports] == [(9100, "TCP")]
