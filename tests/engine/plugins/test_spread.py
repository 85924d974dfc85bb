"""Spread: fewer pods on a node scores higher."""

from __future__ import annotations

import pytest

from gpufleet.engine.model import Assignment
from gpufleet.engine.plugins.spread import Spread

from tests.builders import make_node, make_pod, score_order, scores, state_of


def test_spread_prefers_fewer_pods():
    st = state_of(make_node("a"), make_node("b"), make_node("c"))
    for k in range(3):
        st.reserve(Assignment(f"default/a{k}", "a", 0, 0))
    st.reserve(Assignment("default/b0", "b", 0, 0))
    assert score_order(Spread(), make_pod(), st) == ["c", "b", "a"]
    assert scores(Spread(), make_pod(), st).tolist() == pytest.approx([0.0, 200 / 3, 100.0])


def test_spread_all_equal():
    st = state_of(make_node("a"), make_node("b"))
    assert scores(Spread(), make_pod(), st).tolist() == [100.0, 100.0]
