"""ClusterState's log of version changes (``changed_since``) and its count of nodes without a pod slot
(``pods_short``), which caches read instead of comparing every node: both must always say what the arrays say,
through reservations, releases, over-commits, node changes, copies and a renewed log; and NodeResourcesFit's
verdict and reason codes, which read ``pods_short``, must be what its numpy expressions give."""

from __future__ import annotations

import numpy as np
import pytest

from gpufleet.engine import state as state_mod
from gpufleet.engine.framework import Cycle
from gpufleet.engine.model import Assignment, Gpu, Node, PodRequest
from gpufleet.engine.plugins.noderesources import NodeResourcesFit
from gpufleet.engine.state import ClusterState


def _cluster() -> ClusterState:
    return ClusterState([Node(f"n{i}", 4_000 + 1_000 * (i % 3), 8_192, tuple(Gpu(j, f"g{i}-{j}", "T4", 16_000)
                                                                            for j in range(i % 3)), max_pods=1 + i % 4)
                         for i in range(12)])


def _want_codes(state: ClusterState, r: PodRequest) -> tuple[np.ndarray, np.ndarray]:
    cpu, mem, pods = state.cpu_free >= r.cpu_milli, state.mem_free >= r.memory_mib, state.pods_free >= 1
    return cpu & mem & pods, np.where(~pods, 0, np.where(~cpu, 1, 2))


def _check(state: ClusterState, marks: list[tuple[tuple[list[int], int], np.ndarray]]) -> None:
    assert state.pods_short == int(np.count_nonzero(state.pods_free < 1))
    for mark, versions in marks:  # every node whose version moved since a mark is in the log after it, and only those
        since = state.changed_since(mark)
        if since is not None:
            assert sorted(set(since)) == (state.version != versions).nonzero()[0].tolist()
    for cpu in (0, 1_500, 4_000, 6_000):
        for mem in (0, 4_096, 9_000):
            r = PodRequest("p", cpu_milli=cpu, memory_mib=mem)
            res = NodeResourcesFit().filter(Cycle(r, np.random.default_rng(0)), state)
            ok, codes = _want_codes(state, r)
            assert (res.ok == ok).all()
            if res.passes_all:
                assert ok.all()
            else:
                got = res.reason_codes()
                assert got is not None and got.dtype == codes.dtype and (got[~ok] == codes[~ok]).all()
                assert (got == codes).all()


@pytest.mark.parametrize("seed", range(4))
def test_log_and_pod_slots_follow_every_change(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(state_mod, "CHANGE_LOG_SIZE", 40)  # renewed several times in a walk
    rng = np.random.default_rng(seed)
    state = _cluster()
    placed: list[str] = []
    marks: list[tuple[tuple[list[int], int], np.ndarray]] = []
    renewed = 0
    for step in range(400):
        if rng.random() < 0.2:
            marks.append((state.change_mark(), state.version.copy()))
            marks = marks[-6:]
        log = state.changes
        roll = rng.random()
        if placed and roll < 0.35:
            state.unreserve(placed.pop(int(rng.integers(len(placed)))))
        elif roll < 0.4 and placed:  # a running pod resized, in place
            state.resize(placed[int(rng.integers(len(placed)))], int(rng.integers(0, 3_000)), 512, ())
        elif roll < 0.42:  # node metadata: a new epoch, new arrays, a new log
            i = int(rng.integers(len(state)))
            node = state.nodes[i]
            state.update_node(Node(node.name, node.cpu_milli, node.memory_mib, node.gpus, max_pods=int(rng.integers(1, 4))))
            marks.clear()
        else:
            node = state.nodes[int(rng.integers(len(state)))]
            a = Assignment(f"p/{step}", node.name, int(rng.integers(0, 3)) * 1_000, 1_024)
            over = rng.random() < 0.2  # a running pod kubelet admitted: counted beyond the node's slots
            if over or state.check(a) is None:
                state.reserve(a, overcommit=over)
                placed.append(a.pod_key)
        renewed += state.changes is not log and len(state.changes) == 1
        _check(state, marks)
        if step % 50 == 49:  # a what-if copy: its own log (a mark on the original is unknown to it), the same counts
            c = state.copy()
            assert all(c.changed_since(m) is None for m, _ in marks)
            for k in placed[:4]:
                c.unreserve(k)
            _check(c, [])
            _check(state, marks)
    assert renewed >= 3


def test_changed_since_unknown_marks() -> None:
    state = _cluster()
    assert state.changed_since(None) is None
    m = state.change_mark()
    assert state.changed_since(m) == []
    state.reserve(Assignment("a/b", "n1", 0, 0))
    state.reserve(Assignment("a/c", "n1", 0, 0))
    assert state.changed_since(m) == [1, 1]
    assert state.copy().changed_since(m) is None
