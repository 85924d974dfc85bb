"""ClusterState: building from nodes, reserve/unreserve checks, copies, node updates, transactions."""

from __future__ import annotations

import numpy as np
import pytest

from gpufleet.engine.errors import StateError
from gpufleet.engine.model import Assignment, Gpu, MigInstance, Node

from tests.builders import A100, T4, assert_same_snapshot, make_node, snapshot, state_of


def _state():
    return state_of(
        make_node("n", 2, T4, cpu_milli=4_000, memory_mib=8_192, max_pods=3),
        make_node("m", 2, A100, mig={0: ["1g.10gb", "1g.10gb"]}),
    )


def test_columns_from_nodes():
    st = state_of(make_node("a", 2, T4, unhealthy=[1]), make_node("b"), make_node("c", 3, A100, mig={2: ["1g.10gb"]}))
    assert st.gpu_n.tolist() == [2, 0, 3] and st.max_gpus == 3
    assert st.gpu_usable.tolist() == [[True, False, False], [False, False, False], [True, True, False]]
    assert st.gpu_free_milli.tolist() == [[1000, 0, 0], [0, 0, 0], [1000, 1000, 0]]
    assert st.gpu_mem_free[0, 0] == 15_360 and st.gpu_mem_cap[2, 2] == 81_920
    assert st.total_gpu_milli() == 3_000 and st.allocated_gpu_milli() == 0
    assert st.mig_free_count("1g.10gb").tolist() == [0, 0, 1]
    assert st.mig_free_count("7g.80gb").tolist() == [0, 0, 0]
    assert [st.model_names[m] for m in st.node_model if m >= 0] == [T4, A100]


@pytest.mark.parametrize(
    "nodes, message",
    [
        ([make_node("a"), make_node("a")], "duplicate node names"),
        ([Node("a", 1, 1, gpus=(Gpu(1, "u", T4, 1),))], "GPU indices must be 0..0 in order"),
    ],
)
def test_bad_node_sets(nodes, message):
    with pytest.raises(StateError, match=message):
        state_of(*nodes)


RESERVE_ERRORS = [
    ("unknown node", Assignment("d/x", "nope", 0, 0), "node nope does not exist"),
    ("cpu", Assignment("d/x", "n", 4_001, 0), "node n: cpu 4001m requested, 4000m free"),
    ("memory", Assignment("d/x", "n", 0, 8_193), "node n: memory 8193Mi requested, 8192Mi free"),
    ("GPU twice", Assignment("d/x", "n", 0, 0, gpu_indices=(0, 0), gpu_milli=100, gpu_memory_mib=(0, 0)), "GPU listed twice"),
    ("GPU out of range", Assignment("d/x", "n", 0, 0, gpu_indices=(2,), gpu_milli=1000), "GPU 2 does not exist or is not usable"),
    ("negative GPU index", Assignment("d/x", "n", 0, 0, gpu_indices=(-1,), gpu_milli=1000), "GPU -1 does not exist"),
    ("MIG-mode GPU as a GPU", Assignment("d/x", "m", 0, 0, gpu_indices=(0,), gpu_milli=1000), "GPU 0 does not exist or is not usable"),
    ("GPU memory", Assignment("d/x", "n", 0, 0, gpu_indices=(0,), gpu_milli=10, gpu_memory_mib=(15_361,)), "GPU 0 has 15360 MiB free, 15361 requested"),
    ("MIG instance not there", Assignment("d/x", "m", 0, 0, mig=((0, 5),), mig_profile="1g.10gb"), "MIG instance (0, 5) (1g.10gb) is not free"),
    ("MIG wrong profile", Assignment("d/x", "m", 0, 0, mig=((0, 0),), mig_profile="3g.40gb"), "is not free"),
    (
        "memory list shorter than GPU list",
        Assignment("d/x", "n", 0, 0, gpu_indices=(0, 1), gpu_milli=1000, gpu_memory_mib=(15_360,)),
        "memory",
    ),
    ("MIG instance twice", Assignment("d/x", "m", 0, 0, mig=((0, 0), (0, 0)), mig_profile="1g.10gb"), "twice"),
]


@pytest.mark.parametrize("a, message", [c[1:] for c in RESERVE_ERRORS], ids=[c[0] for c in RESERVE_ERRORS])
def test_reserve_refuses_and_changes_nothing(a, message):
    st = _state()
    before = snapshot(st)
    why = st.check(a)
    assert why is not None and message in why, why
    with pytest.raises(StateError, match=None) as exc:
        st.reserve(a)
    assert message in str(exc.value)
    assert_same_snapshot(snapshot(st), before)


def test_reserve_refusals_that_depend_on_usage():
    st = _state()
    st.reserve(Assignment("d/a", "n", 0, 0, gpu_indices=(0,), gpu_milli=700, gpu_memory_mib=(1_000,)))
    assert "already assigned to n" in st.check(Assignment("d/a", "n", 0, 0))
    assert "GPU 0 has 300 milli free, 400 requested" in st.check(Assignment("d/b", "n", 0, 0, gpu_indices=(0,), gpu_milli=400, gpu_memory_mib=(0,)))
    st.reserve(Assignment("d/mem", "n", 0, 0, gpu_indices=(1,), gpu_milli=0, gpu_memory_mib=(1_000,)))  # memory only
    assert "GPU 1 is partly used, a whole GPU was requested" in st.check(Assignment("d/b", "n", 0, 0, gpu_indices=(1,), gpu_milli=1000, gpu_memory_mib=(0,)))
    st.reserve(Assignment("d/c", "n", 0, 0))
    assert st.check(Assignment("d/e", "n", 0, 0)) == "node n: no pod slots left"


def test_reserve_and_unreserve_bookkeeping():
    st = _state()
    before = snapshot(st)
    v0 = st.version.copy()
    a = Assignment("d/w", "n", 1_000, 2_048, gpu_indices=(1,), gpu_milli=1000)  # memory filled in by reserve
    st.reserve(a)
    assert st.cpu_free[0] == 3_000 and st.mem_free[0] == 6_144 and st.pods_free[0] == 2
    assert st.gpu_free_milli[0].tolist() == [1000, 0] and st.gpu_mem_free[0].tolist() == [15_360, 0]
    assert st.assignments["d/w"].gpu_memory_mib == (15_360,)
    assert st.pods_on_node["n"] == {"d/w"} and st.allocated_gpu_milli() == 1_000
    assert st.version[0] == v0[0] + 1 and st.version[1] == v0[1]
    got = st.unreserve("d/w")
    assert got.gpu_memory_mib == (15_360,)
    assert_same_snapshot(snapshot(st), before)
    assert st.unreserve("d/w") is None


def test_mig_reserve_unreserve():
    st = _state()
    before = snapshot(st)
    st.reserve(Assignment("d/m", "m", 0, 0, mig=((0, 1),), mig_profile="1g.10gb"))
    assert st.mig_free[1]["1g.10gb"] == [(0, 0)] and st.mig_free_count("1g.10gb").tolist() == [0, 1]
    st.unreserve("d/m")
    assert_same_snapshot(snapshot(st), before)


def test_unreserve_restores_mig_list_order_exactly():
    """Instances listed out of id order by the agent come back in the same order."""
    g = Gpu(0, "u", A100, 81_920, mig_enabled=True, mig_instances=(MigInstance("1g.10gb", 9_728, 3), MigInstance("1g.10gb", 9_728, 1)))
    st = state_of(Node("n", 1_000, 1_000, gpus=(g,)))
    before = snapshot(st)
    st.reserve(Assignment("d/m", "n", 0, 0, mig=((0, 3),), mig_profile="1g.10gb"))
    st.unreserve("d/m")
    assert_same_snapshot(snapshot(st), before)


def test_copy_is_independent():
    st = _state()
    st.reserve(Assignment("d/a", "n", 500, 0, gpu_indices=(0,), gpu_milli=300, gpu_memory_mib=(0,)))
    before = snapshot(st)
    c = st.copy()
    assert_same_snapshot(snapshot(c), before)
    c.reserve(Assignment("d/b", "n", 500, 0, gpu_indices=(0,), gpu_milli=300, gpu_memory_mib=(0,)))
    c.reserve(Assignment("d/m", "m", 0, 0, mig=((0, 0),), mig_profile="1g.10gb"))
    c.unreserve("d/a")
    c.add_node(make_node("extra"))
    assert_same_snapshot(snapshot(st), before)
    assert len(st) == 2 and len(c) == 3


def test_update_node_keeps_fitting_pods_and_returns_lost_ones():
    st = state_of(make_node("n", 2, T4, labels={"zone": "a"}), make_node("o", 1, T4))
    st.reserve(Assignment("d/g0", "n", 1_000, 0, gpu_indices=(0,), gpu_milli=1000))
    st.reserve(Assignment("d/g1", "n", 1_000, 0, gpu_indices=(1,), gpu_milli=1000))
    st.reserve(Assignment("d/o", "o", 1_000, 0, gpu_indices=(0,), gpu_milli=1000))
    epoch = st.epoch
    assert st.update_node(make_node("n", 2, T4, labels={"zone": "a"})) == []  # unchanged
    lost = st.update_node(make_node("n", 1, T4, labels={"zone": "b"}))  # GPU 1 disappeared
    assert [a.pod_key for a in lost] == ["d/g1"]
    assert set(st.assignments) == {"d/g0", "d/o"} and st.epoch != epoch
    assert st.cpu_free.tolist() == [15_000, 15_000] and st.gpu_free_milli[:, 0].tolist() == [0, 0]
    assert st.nodes[0].labels["zone"] == "b"


def test_add_and_remove_nodes():
    st = state_of(make_node("a", 1, T4))
    st.reserve(Assignment("d/x", "a", 100, 0, gpu_indices=(0,), gpu_milli=1000))
    st.add_node(make_node("b", 8, A100))
    assert st.max_gpus == 8 and st.gpu_free_milli[0, 0] == 0 and st.cpu_free[0] == 15_900
    assert [a.pod_key for a in st.remove_node("a")] == ["d/x"]
    assert st.assignments == {} and st.index == {"b": 0}
    assert st.remove_node("a") == []
    st.add_node(make_node("b", 1, T4))  # existing name: an update
    assert len(st) == 1 and st.gpu_n.tolist() == [1]


def test_transaction_commit_and_rollback():
    st = _state()
    st.reserve(Assignment("d/old", "n", 1_000, 0, gpu_indices=(0,), gpu_milli=1000))
    before = snapshot(st)
    with st.transaction() as tx:
        tx.evict("d/old")
        tx.reserve(Assignment("d/new", "n", 2_000, 0, gpu_indices=(0, 1), gpu_milli=1000))
        assert set(st.assignments) == {"d/new"}
    # not committed: rolled back at exit
    assert_same_snapshot(snapshot(st), before)

    with pytest.raises(RuntimeError):
        with st.transaction() as tx:
            tx.reserve(Assignment("d/new", "n", 100, 0))
            raise RuntimeError("boom")
    assert_same_snapshot(snapshot(st), before)

    with pytest.raises(StateError):
        with st.transaction() as tx:
            tx.reserve(Assignment("d/a", "n", 100, 0))
            tx.reserve(Assignment("d/b", "n", 100_000, 0))  # does not fit: whole transaction undone
    assert_same_snapshot(snapshot(st), before)

    with st.transaction() as tx:
        tx.evict("d/old")
        tx.reserve(Assignment("d/new", "n", 100, 0))
        tx.commit()
    assert set(st.assignments) == {"d/new"}
    assert tx.evict("d/missing") is None


def test_free_never_negative_after_failed_reserves():
    st = _state()
    for k in range(10):
        try:
            st.reserve(Assignment(f"d/{k}", "n", 1_500, 1_000, gpu_indices=(k % 2,), gpu_milli=600, gpu_memory_mib=(0,)))
        except StateError:
            pass
    assert (st.cpu_free >= 0).all() and (st.gpu_free_milli >= 0).all() and (st.pods_free >= 0).all()
    assert np.array_equal(st.gpu_free_milli[0], [400, 400])


@pytest.mark.parametrize("mems", [(), (0,), (1_024,)])
def test_whole_gpu_always_takes_all_its_memory(mems):
    """Whatever memory an assignment lists (e.g. rebuilt from an annotation without it), a whole GPU is all taken."""
    st = state_of(make_node("n", 2, T4))
    st.reserve(Assignment("d/w", "n", 0, 0, gpu_indices=(0,), gpu_milli=1000, gpu_memory_mib=mems))
    assert st.gpu_mem_free[0].tolist() == [0, 15_360]
    assert st.assignments["d/w"].gpu_memory_mib == (15_360,)
    # a memory-only share cannot slip onto the whole GPU
    assert st.check(Assignment("d/m", "n", 0, 0, gpu_indices=(0,), gpu_milli=0, gpu_memory_mib=(1_024,))) is not None
    st.unreserve("d/w")
    assert st.gpu_mem_free[0].tolist() == [15_360, 15_360]


def test_transaction_rollback_of_a_pod_reserved_then_evicted_inside_it():
    st = _state()
    st.reserve(Assignment("d/old", "n", 1_000, 0, gpu_indices=(0,), gpu_milli=1000))
    before = snapshot(st)
    with st.transaction() as tx:
        tx.reserve(Assignment("d/new", "n", 500, 0, gpu_indices=(1,), gpu_milli=500, gpu_memory_mib=(0,)))
        tx.evict("d/new")
        tx.evict("d/old")
        tx.reserve(Assignment("d/old", "n", 2_000, 0, gpu_indices=(1,), gpu_milli=1000))  # moved inside the tx
        tx.evict("d/old")
    assert_same_snapshot(snapshot(st), before)
