"""NodeDeclaredFeatures (GA in 1.37): what a pod needs, inferred from its spec, against what nodes declare."""

from __future__ import annotations

from dataclasses import replace

import pytest

from gpufleet.engine.errors import InvalidNodeSpec, InvalidPodSpec
from gpufleet.engine.plugins.nodedeclaredfeatures import NodeDeclaredFeatures
from gpufleet.engine.podspec import parse_pod
from gpufleet.kube.convert import node_from_json

from tests.builders import make_node, state_of, verdicts

from ..builders import pod

NOT = "node(s) didn't match Pod's required features"


def _nodes():
    return state_of(replace(make_node("old"), declared_features=frozenset()),
                    replace(make_node("userns"), declared_features=frozenset({"UserNamespacesHostNetworkSupport"})),
                    replace(make_node("all"), declared_features=frozenset({
                        "UserNamespacesHostNetworkSupport", "RestartAllContainersOnContainerExits", "VolumeBindMountOptions"})))


def with_restart_all(p: dict) -> dict:
    p["spec"]["containers"][0]["restartPolicyRules"] = [{"action": "RestartAllContainers", "exitCodes": {"operator": "In", "values": [42]}}]
    return p


def with_bind_options(p: dict) -> dict:
    p["spec"]["initContainers"] = [{"name": "i", "image": "x", "volumeMounts": [{"name": "v", "mountPath": "/v", "bindMountOptions": ["nosymfollow"]}]}]
    return p


CASES = [
    ("nothing needed", pod(), {"old", "userns", "all"}),
    ("user namespaces alone need nothing", pod(hostUsers=False), {"old", "userns", "all"}),
    ("host network alone needs nothing", pod(hostNetwork=True), {"old", "userns", "all"}),
    ("host network in a user namespace", pod(hostNetwork=True, hostUsers=False), {"userns", "all"}),
    ("restart rule RestartAllContainers", with_restart_all(pod()), {"all"}),
    ("bind mount options in an init container", with_bind_options(pod()), {"all"}),
    ("all three", with_bind_options(with_restart_all(pod(hostNetwork=True, hostUsers=False))), {"all"}),
]


@pytest.mark.parametrize("name,p,ok", CASES, ids=[c[0] for c in CASES])
def test_nodes_lacking_a_needed_feature_are_filtered_out(name, p, ok):
    got = verdicts(NodeDeclaredFeatures(), parse_pod(p), _nodes())
    assert {n for n, why in got.items() if why is None} == ok
    assert all(why == NOT for n, why in got.items() if n not in ok)


def test_declared_features_come_from_the_node_status_and_bad_ones_are_named():
    obj = {"metadata": {"name": "n1"}, "status": {"allocatable": {"cpu": "4"}, "declaredFeatures": ["VolumeBindMountOptions"]}}
    assert node_from_json(obj).declared_features == frozenset({"VolumeBindMountOptions"})
    obj["status"]["declaredFeatures"] = "VolumeBindMountOptions"
    with pytest.raises(InvalidNodeSpec) as exc:
        node_from_json(obj)
    assert exc.value.field == "status.declaredFeatures"


def test_a_bad_host_users_value_is_named():
    with pytest.raises(InvalidPodSpec) as exc:
        parse_pod(pod(hostUsers="no"))
    assert exc.value.field == "spec.hostUsers"
