"""The framework's cache of raw scores (``Scheduler._score``): a node's cached score is refreshed when its version
moved since it was last scored, found from the state's change log; the scores must always be what scoring every
candidate afresh gives, whatever the candidates (nodes that change while they are no candidate included), through
reservations, releases, a renewed log and new epochs."""

from __future__ import annotations

import numpy as np
import pytest

from gpufleet.engine import state as state_mod
from gpufleet.engine.framework import Profile, Scheduler
from gpufleet.engine.model import Assignment, Gpu, Node, PodRequest
from gpufleet.engine.state import ClusterState


class Room:
    """A score of each node's free room (cpu and GPU milli) against the pod's cpu, cached by that cpu or not."""

    def __init__(self, cached: bool) -> None:
        self.name = "Room"
        self.cached = cached
        self.scored = 0

    def cache_key(self, cycle):
        return cycle.request.cpu_milli if self.cached else None

    def score(self, cycle, state, nodes):
        self.scored += nodes.size
        return (state.cpu_free[nodes] - cycle.request.cpu_milli) * 0.001 + state.gpu_free_milli[nodes].sum(axis=1) * 0.01

    def normalize(self, raw):
        return raw * 1.0


def _nodes(k: int) -> list[Node]:
    return [Node(f"n{i}", 8_000, 16_384, tuple(Gpu(j, f"g{i}-{j}", "T4", 16_000) for j in range(i % 3))) for i in range(k)]


@pytest.mark.parametrize("seed", range(3))
def test_cached_scores_are_fresh_scores(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(state_mod, "CHANGE_LOG_SIZE", 30)
    rng = np.random.default_rng(seed)
    state = ClusterState(_nodes(24))
    cached, fresh = Room(True), Room(False)
    a = Scheduler(Profile("a", scores=[(cached, 1)]), state, seed=0)
    b = Scheduler(Profile("b", scores=[(fresh, 1)]), state, seed=0)
    placed: list[str] = []
    for step in range(300):
        roll = rng.random()
        if placed and roll < 0.3:
            state.unreserve(placed.pop(int(rng.integers(len(placed)))))
        elif roll < 0.33:  # node metadata moved: a new epoch (every cached score stale)
            nodes = list(state.nodes)
            i = int(rng.integers(len(nodes)))
            nodes[i] = Node(nodes[i].name, int(rng.integers(4, 12)) * 1_000, 16_384, nodes[i].gpus)
            state.update_node(nodes[i])
        else:
            node = state.nodes[int(rng.integers(len(state)))]
            gpus = (int(rng.integers(len(node.gpus))),) if node.gpus and rng.random() < 0.5 else ()
            asg = Assignment(f"p/{step}", node.name, int(rng.integers(0, 3)) * 500, 256, gpus, 250 if gpus else 0,
                             (0,) * len(gpus))
            if state.check(asg) is None:
                state.reserve(asg)
                placed.append(asg.pod_key)
        r = PodRequest(f"q{step}", cpu_milli=int(rng.choice([0, 500, 1_000])))
        feasible = rng.random(len(state)) < rng.choice([0.1, 0.5, 0.95])  # few or most nodes candidates
        cand = feasible.nonzero()[0]
        if not cand.size:
            continue
        ca, cb = a.new_cycle(r), b.new_cycle(r)
        ca.feasible, cb.feasible = feasible, feasible
        got, want = a._score(ca, cand), b._score(cb, cand)
        assert got.tobytes() == want.tobytes(), step
    assert cached.scored < fresh.scored / 2  # the cache did keep scores
