"""NodeUnschedulable: a cordoned node takes only pods tolerating its taint."""

from __future__ import annotations

import pytest

from gpufleet.engine.plugins.nodeunschedulable import NodeUnschedulable

from tests.builders import make_node, make_pod, state_of, verdicts

UNSCHED = "node(s) were unschedulable"


@pytest.mark.parametrize(
    "tolerations, cordoned_ok",
    [
        ([], False),
        ([{"key": "node.kubernetes.io/unschedulable", "operator": "Exists", "effect": "NoSchedule"}], True),
        ([{"key": "node.kubernetes.io/unschedulable", "operator": "Exists"}], True),
        ([{"operator": "Exists"}], True),  # tolerates everything
        ([{"key": "node.kubernetes.io/unschedulable", "operator": "Exists", "effect": "NoExecute"}], False),
        ([{"key": "other", "operator": "Exists"}], False),
    ],
)
def test_node_unschedulable(tolerations, cordoned_ok):
    st = state_of(make_node("open"), make_node("cordoned", unschedulable=True))
    v = verdicts(NodeUnschedulable(), make_pod(tolerations=tolerations), st)
    assert v == {"open": None, "cordoned": None if cordoned_ok else UNSCHED}
