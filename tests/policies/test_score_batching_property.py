"""Property: a node's fragmentation score does not depend on how it was computed.

FGD and the default policy score stale nodes in batches, group identical nodes
(``state_groups``) and keep per-GPU scores for ``select_gpus``.  Each of those
shortcuts must give exactly what scoring the node on its own gives, or a
decision would depend on which other nodes happened to change (and a simulated
result on cache timing).
"""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpufleet.engine.framework import Cycle
from gpufleet.engine.model import GPU_MILLI, Assignment, PodRequest
from gpufleet.engine.state import ClusterState
from gpufleet.policies.default import DescentScore, WorkloadArgs, WorkloadModel
from gpufleet.policies.paper.fgd import DEDUPE_MIN_NODES, FGDScore, FragDescent, memo_keys, state_groups, state_ids
from gpufleet.policies.paper.workload import node_view

from tests.builders import A100, T4, make_node

SETTINGS = settings(max_examples=25, deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.too_slow])

SHAPES = [(4000, 1000, 1), (2000, 500, 1), (1000, 250, 1), (8000, 1000, 2), (6000, 300, 1), (500, 0, 0)]
WORKLOAD = [PodRequest(name=f"w{i}", cpu_milli=c, memory_mib=4096, gpu_count=n, gpu_milli=m)
            for i, (c, m, n) in enumerate(SHAPES * 3)]


def plugin(kind: str):
    p = FGDScore() if kind == "fgd" else DescentScore(model=WorkloadModel(WorkloadArgs(learn_online=False)))
    p.prime(WORKLOAD)
    return p


@st.composite
def cluster(draw) -> ClusterState:
    """40-80 nodes of two kinds, many left idle (so groups form), some partly used."""
    n = draw(st.integers(DEDUPE_MIN_NODES + 8, 80))
    nodes = [make_node(f"n{i}", 8 if i % 3 else 4, A100 if i % 3 else T4, cpu_milli=64_000, memory_mib=262_144) for i in range(n)]
    state = ClusterState(nodes)
    for k in range(draw(st.integers(0, 60))):
        i = draw(st.integers(0, n - 1))
        c, m, cnt = draw(st.sampled_from(SHAPES[:-1]))
        free = np.flatnonzero(state.gpu_free_milli[i] >= m)
        if free.size < cnt or state.cpu_free[i] < c:
            continue
        gpus = tuple(int(g) for g in free[:cnt])
        state.reserve(Assignment(pod_key=f"x{k}", node=nodes[i].name, cpu_milli=c, memory_mib=4096, gpu_indices=gpus,
                                 gpu_milli=m, gpu_memory_mib=(0,) * cnt if m < GPU_MILLI else tuple(int(state.gpu_mem_cap[i, g]) for g in gpus)))
    return state


def cycle(shape) -> Cycle:
    c, m, n = shape
    return Cycle(request=PodRequest(name="p", cpu_milli=c, memory_mib=4096, gpu_count=n, gpu_milli=m), rng=np.random.default_rng(0))


@SETTINGS
@given(state=cluster(), shape=st.sampled_from(SHAPES), kind=st.sampled_from(["fgd", "default"]))
def test_batched_grouped_scores_equal_one_node_at_a_time(state, shape, kind):
    nodes = np.arange(len(state))
    batched = plugin(kind).score(cycle(shape), state, nodes)
    alone = np.array([plugin(kind).score(cycle(shape), state, np.array([i]))[0] for i in nodes])
    np.testing.assert_array_equal(batched, alone)


@SETTINGS
@given(state=cluster(), shape=st.sampled_from([s for s in SHAPES if 0 < s[1] < GPU_MILLI]), kind=st.sampled_from(["fgd", "default"]))
def test_gpu_choice_from_the_score_cache_equals_a_fresh_choice(state, shape, kind):
    warm = plugin(kind)
    warm.score(cycle(shape), state, np.arange(len(state)))  # fills the per-GPU cache
    for i in range(len(state)):
        a = warm.select_gpus(cycle(shape), state, i)
        b = plugin(kind).select_gpus(cycle(shape), state, i)
        assert a == b, f"node {i}"


def test_state_groups_put_identical_nodes_together_and_only_them():
    nodes = [make_node(f"n{i}", 8, A100) for i in range(6)]
    state = ClusterState(nodes)
    state.reserve(Assignment(pod_key="a", node="n2", cpu_milli=1000, memory_mib=1024, gpu_indices=(3,), gpu_milli=500, gpu_memory_mib=(0,)))
    state.reserve(Assignment(pod_key="b", node="n4", cpu_milli=1000, memory_mib=1024, gpu_indices=(3,), gpu_milli=500, gpu_memory_mib=(0,)))
    reps, inv = state_groups(state, np.arange(6))
    assert reps.size == 2
    groups = {int(i): int(inv[i]) for i in range(6)}
    assert groups[2] == groups[4] != groups[0]
    assert len({groups[i] for i in (0, 1, 3, 5)}) == 1
    for i in range(6):  # each node's representative is in the same state
        np.testing.assert_array_equal(state.gpu_free_milli[i], state.gpu_free_milli[reps[inv[i]]])
        assert state.cpu_free[i] == state.cpu_free[reps[inv[i]]]


@SETTINGS
@given(state=cluster(), shape=st.sampled_from(SHAPES), kind=st.sampled_from(["fgd", "default"]))
def test_a_remembered_node_state_scores_as_a_fresh_computation(state, shape, kind):
    """The memo of node states (FGDScore._remembered): a node scored after others in its state were is scored as
    a plugin that never saw those gives it, and nodes in a state seen before are not computed again."""
    warm = plugin(kind)
    n = len(state)
    warm.score(cycle(shape), state, np.arange(n // 2))
    computed: list[int] = []
    inner = warm._gpu_scores if 0 < shape[1] < GPU_MILLI else warm._node_scores

    def counting(c, s, nodes):
        computed.append(nodes.size)
        return inner(c, s, nodes)

    if inner == warm._gpu_scores:
        warm._gpu_scores = counting  # type: ignore[method-assign]
    else:
        warm._node_scores = counting  # type: ignore[method-assign]
    for i in range(n // 2, n):
        got = warm.score(cycle(shape), state, np.array([i]))
        np.testing.assert_array_equal(got, plugin(kind).score(cycle(shape), state, np.array([i])))
    seen = set(memo_keys(state, np.arange(n // 2)))
    fresh = 0
    for k in memo_keys(state, np.arange(n // 2, n)):  # states not seen before, each computed once
        fresh += k not in seen
        seen.add(k)
    assert sum(computed) == fresh


def test_the_memo_keeps_requests_and_device_slots_apart():
    """Two pods of one FGD shape that differ in memory score apart (the strand measure reads memory), and two nodes
    that differ only in free kubelet device slots are different states where slots are counted."""
    nodes = [make_node(f"n{i}", 8, A100, cpu_milli=64_000, memory_mib=65_536) for i in range(4)]
    state = ClusterState(nodes)
    p = plugin("default")
    small = Cycle(request=PodRequest(name="a", cpu_milli=2000, memory_mib=1024, gpu_count=1, gpu_milli=1000), rng=np.random.default_rng(0))
    big = Cycle(request=PodRequest(name="b", cpu_milli=2000, memory_mib=60_000, gpu_count=1, gpu_milli=1000), rng=np.random.default_rng(0))
    at = np.arange(4)
    p.score(small, state, at)
    np.testing.assert_array_equal(p.score(big, state, at), plugin("default").score(big, state, at))
    assert not np.array_equal(plugin("default").score(small, state, at), plugin("default").score(big, state, at))
    slotted = ClusterState([make_node(f"s{i}", 8, A100, cpu_milli=64_000, memory_mib=65_536) for i in range(2)])
    slotted.slots_limited = True
    slotted.gpu_slots_free[1, 0] = 0
    a, b = memo_keys(slotted, np.arange(2))
    assert a != b
    assert memo_keys(state, np.array([0])) == memo_keys(state, np.array([1]))


def test_state_ids_follow_every_change_and_keep_copies_apart():
    """state_ids renumbers a node when its version moves: a node that changes and changes back has its old number,
    and a copy that diverges from its original (copies share versions) is numbered from its own columns."""
    nodes = [make_node(f"n{i}", 8, A100) for i in range(3)]
    state = ClusterState(nodes)
    at = np.arange(3)
    idle = state_ids(state, at)
    assert idle[0] == idle[1] == idle[2]
    a = Assignment(pod_key="a", node="n1", cpu_milli=1000, memory_mib=1024, gpu_indices=(3,), gpu_milli=500, gpu_memory_mib=(0,))
    state.reserve(a)
    used = state_ids(state, at)
    assert used[1] != used[0] == used[2]
    copy = state.copy()
    state.unreserve("a")
    copy.reserve(Assignment(pod_key="b", node="n0", cpu_milli=1000, memory_mib=1024, gpu_indices=(3,), gpu_milli=500, gpu_memory_mib=(0,)))
    assert (state_ids(state, at) == idle).all()  # back where it was
    c = state_ids(copy, at)
    assert c[0] == c[1] == used[1] and c[2] == idle[2]


def _take_packed_reference(left: np.ndarray, milli: int, count: int) -> np.ndarray:
    """``NodeResource.Sub`` as the simulator writes it: a stable sort, the first ``count`` GPUs that hold ``milli``."""
    out = left.copy()
    order = np.argsort(out, axis=1, kind="stable")
    srt = np.take_along_axis(out, order, axis=1)
    ok = srt >= milli
    take = ok & (np.cumsum(ok, axis=1) <= count)
    np.put_along_axis(out, order, srt - take * milli, axis=1)
    return out


@SETTINGS
@given(rows=st.lists(st.lists(st.sampled_from([0, 100, 250, 300, 500, 700, 1000]), min_size=8, max_size=8), min_size=1, max_size=12),
       milli=st.sampled_from([100, 250, 500, 1000]), count=st.integers(1, 8))
def test_take_packed_takes_the_least_sufficient_gpus_first(rows, milli, count):
    """The one-GPU shortcut and the indexed form take exactly the GPUs the stable sort takes (ties: the first)."""
    from gpufleet.policies.paper._common import take_packed

    left = np.array(rows, dtype=np.int64)
    assert np.array_equal(take_packed(left, milli, count), _take_packed_reference(left, milli, count))
    assert np.array_equal(take_packed(left, milli, 1), _take_packed_reference(left, milli, 1))
    assert take_packed(np.zeros((3, 0), dtype=np.int64), milli, count).shape == (3, 0)


@SETTINGS
@given(rows=st.lists(st.lists(st.sampled_from([0, 100, 250, 300, 500, 700, 1000]), min_size=8, max_size=8), min_size=1, max_size=12),
       milli=st.sampled_from([0, 100, 250, 500]))
def test_distinct_placements_are_numpy_unique(rows, milli):
    """The hand-made unique gives np.unique's first occurrences and inverse, so the same placements stand for each group."""
    from gpufleet.policies.paper import fgd

    left = np.array(rows, dtype=np.int64)
    r, c = np.nonzero(left >= milli)
    _, ufirst, uinverse = np.unique(r * (GPU_MILLI + 1) + left[r, c], return_index=True, return_inverse=True)
    saved = fgd.DISTINCT_PY_MAX
    try:
        for py_max in (0, 10**9):  # the numpy path, then the plain-Python one
            fgd.DISTINCT_PY_MAX = py_max
            first, inverse = fgd.distinct_placements(left, r, c)
            assert first.dtype == np.intp and inverse.dtype == np.intp
            assert np.array_equal(first, ufirst) and np.array_equal(inverse, uinverse.ravel())
    finally:
        fgd.DISTINCT_PY_MAX = saved


@SETTINGS
@given(n=st.integers(0, 40), g=st.sampled_from([0, 1, 4, 8]), data=st.data())
def test_set_rows_is_fancy_row_assignment(n, g, data):
    """set_rows moves whole rows as records: the same bytes as ``dst[at] = src``, -inf and -0.0 included."""
    from gpufleet.policies.paper.fgd import set_rows

    at = np.array(sorted(data.draw(st.sets(st.integers(0, max(n - 1, 0)), max_size=n))) if n else [], dtype=np.intp)
    src = np.array(data.draw(st.lists(st.lists(st.sampled_from([-np.inf, -0.0, 0.0, 1.5, -713.25, 61.75]), min_size=g, max_size=g),
                                      min_size=at.size, max_size=at.size)), dtype=np.float64).reshape(at.size, g)
    want, got = np.full((n, g), -np.inf), np.full((n, g), -np.inf)
    want[at] = src
    set_rows(got, at, src)
    assert want.tobytes() == got.tobytes()


@SETTINGS
@given(state=cluster(), milli=st.sampled_from([100, 250, 300, 500, 700]), tight=st.booleans())
def test_share_terms_from_tables_equal_the_computed_ones(state, milli, tight):
    """DescentScore's per-free-milli tables of the pattern and share-fit terms give, bit for bit, what computing them
    per GPU gives (``_gpu_scores`` falls back to computing when a GPU's free milli is outside 0..GPU_MILLI)."""
    p = plugin("default")
    c = Cycle(request=PodRequest(name="p", cpu_milli=1000, memory_mib=4096, gpu_count=1, gpu_milli=milli), rng=np.random.default_rng(0))
    nodes = np.arange(len(state))
    if tight:  # the pattern term is off where CPU binds first
        p.args = type(p.args)(**{**p.args.__dict__, "quantile_tight": 0.0})
    fast = p._gpu_scores(c, state, nodes)
    view = node_view(state, nodes)
    slow = FragDescent._gpu_scores(p, c, state, nodes, view)  # the descent's placements, no per-GPU terms yet
    left = view[1]
    if p.patterns.on and p.model.cpu_tight(state) < p.args.quantile_tight:
        term = p.patterns.term(p.model.version, p.model.share_sizes, milli, left)
        if term is not None:
            slow = slow + term
    slow = slow - p.args.share_fit * np.minimum(np.maximum(left - milli, 0), GPU_MILLI) / GPU_MILLI
    assert fast.tobytes() == slow.tobytes()


def test_penalty_mean_over_quantiles_is_numpy_mean():
    """_penalty's sum over the quantile rows divided by their count is np.mean(axis=0), bit for bit."""
    rng = np.random.default_rng(7)
    for q in (1, 2, 3, 4, 7, 9):
        x = np.maximum(0.0, rng.normal(300, 400, size=(q, 50)))
        assert (np.add.reduce(x, axis=0) / q).tobytes() == np.mean(x, axis=0).tobytes()


@SETTINGS
@given(state=cluster())
def test_node_kinds_number_make_ups_as_numpy_unique_does(state):
    """The make-up numbering by bytes gives np.unique(axis=0)'s ids (distinct make-ups in sorted order)."""
    from gpufleet.policies.paper.fgd import _node_kinds

    static = np.concatenate([state.gpu_usable, state.gpu_model, state.gpu_mem_cap], axis=1).astype(np.int64)
    _, ref = np.unique(static, axis=0, return_inverse=True)
    assert np.array_equal(_node_kinds(state), ref.ravel())


@SETTINGS
@given(ids=st.lists(st.integers(0, 30), min_size=1, max_size=60))
def test_state_groups_are_numpy_unique_of_the_state_ids(ids):
    """Both of state_groups' paths (a table of every id; np.unique where ids are sparse) give np.unique's first
    occurrences and inverse over the nodes' state ids: the dense path's cumsum and fills, as methods, change nothing."""
    from gpufleet.policies.paper import fgd

    arr = np.array(ids, dtype=np.int64)
    nodes = np.arange(100, 100 + arr.size, dtype=np.int64)
    _, ufirst, uinverse = np.unique(arr, return_index=True, return_inverse=True)
    saved = fgd.state_ids
    try:
        for spread in (1, 1000):  # dense ids, then ids spread past 4x the nodes (the np.unique path)
            fgd.state_ids = lambda state, at, s=spread: arr[at - 100] * s
            reps, inverse = state_groups(None, nodes)  # type: ignore[arg-type]
            assert np.array_equal(reps, nodes[ufirst]) and np.array_equal(inverse, uinverse.ravel())
    finally:
        fgd.state_ids = saved


@SETTINGS
@given(state=cluster(), slots=st.booleans())
def test_memo_keys_of_one_or_two_nodes_are_the_rows_of_the_table(state, slots):
    """memo_keys builds one or two keys row by row (a cycle's changed nodes) and more as one [k, columns] table: the
    same bytes either way, since both kinds of key sit in one memo."""
    if slots:  # kubelet device slots counted, some taken
        state.slots_limited = True
        state.gpu_slots_free[:] = np.random.default_rng(len(state)).integers(0, 3, size=state.gpu_slots_free.shape)
    n = len(state)
    table = memo_keys(state, np.arange(n))
    for i in range(n):
        assert memo_keys(state, np.array([i])) == [table[i]]
    assert memo_keys(state, np.array([n - 1, 0])) == [table[n - 1], table[0]]


@SETTINGS
@given(data=st.data())
def test_frag_amount_by_table_is_the_binned_one_bit_for_bit(data):
    """frag_amount looks each GPU up in a per-workload table for up to TABLE_MAX_ROWS states: the binned path's bits,
    for any number of states and GPUs; free milli outside 0..GPU_MILLI takes the binned path."""
    from gpufleet.policies.paper import workload as wl

    tw = plugin("fgd").workload
    assert tw is not None
    acc = tw.access(["A100", "T4"])
    s = data.draw(st.integers(1, 90))
    g = data.draw(st.sampled_from([1, 4, 8]))
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    left = rng.choice(np.array([0, 100, 250, 300, 500, 750, 1000]), size=(s, g)) if data.draw(st.booleans()) \
        else rng.integers(0, GPU_MILLI + 1, size=(s, g))
    odd = data.draw(st.sampled_from(["none", "negative", "above"]))
    if odd != "none":
        left[rng.integers(s), rng.integers(g)] = -40 if odd == "negative" else GPU_MILLI + 7
    cpu = rng.integers(-1000, 70_000, size=s)
    model = rng.integers(-1, 2, size=s)
    saved = wl.DIRECT_MAX_ROWS, wl.TABLE_MAX_ROWS
    wl.DIRECT_MAX_ROWS = wl.TABLE_MAX_ROWS = 0
    try:
        binned = wl.frag_amount(cpu, left, model, tw, acc)
    finally:
        wl.DIRECT_MAX_ROWS, wl.TABLE_MAX_ROWS = saved
    assert wl.frag_amount(cpu, left, model, tw, acc).tobytes() == binned.tobytes()


@SETTINGS
@given(state=cluster(), picks=st.lists(st.integers(0, DEDUPE_MIN_NODES - 1), min_size=1, max_size=4))
def test_state_ids_of_a_few_nodes_by_scalars_are_the_array_ones(state, picks):
    """state_ids(as_list=True) of up to IDS_PY_MAX nodes (Python scalars) numbers nodes as the array path does, before
    and after a node changes; stale_nodes of a few nodes is the array path's selection."""
    from gpufleet.policies.paper.fgd import IDS_PY_MAX, stale_nodes

    nodes = np.array(picks, dtype=np.intp)
    assert nodes.size <= IDS_PY_MAX
    got = state_ids(state, nodes, as_list=True)
    assert got == state_ids(state, nodes).tolist()
    i = int(nodes[0])
    if state.gpu_free_milli[i, 0] >= 100:  # change a picked node: it is numbered again, as its new state
        state.reserve(Assignment(pod_key="changed", node=state.nodes[i].name, cpu_milli=1, memory_mib=1, gpu_indices=(0,),
                                 gpu_milli=100, gpu_memory_mib=(0,)))
    again = state_ids(state, nodes, as_list=True)
    assert again == state_ids(state.copy(), np.arange(len(state)))[nodes].tolist()  # a copy: numbered from its columns
    vers = state.version.copy()
    vers[nodes[::2]] -= 1
    np.testing.assert_array_equal(stale_nodes(vers, state.version, nodes), nodes[vers[nodes] != state.version[nodes]])


@SETTINGS
@given(state=cluster(), data=st.data())
def test_state_groups_are_np_unique_of_the_state_ids(state, data):
    """state_groups' table path gives np.unique's grouping of the nodes' state numbers: each distinct number's first
    node, in ascending number order, and each node's index into those."""
    n = len(state)
    nodes = np.array(sorted(data.draw(st.sets(st.integers(0, n - 1), min_size=1))), dtype=np.intp)
    reps, inv = state_groups(state, nodes)
    _, first, inverse = np.unique(state_ids(state, nodes), return_index=True, return_inverse=True)
    np.testing.assert_array_equal(reps, nodes[first])
    np.testing.assert_array_equal(inv, inverse.ravel())


@SETTINGS
@given(rows=st.lists(st.lists(st.integers(-50, 1100), min_size=1, max_size=10), min_size=1, max_size=4).filter(
           lambda rs: len({len(r) for r in rs}) == 1),
       milli=st.integers(0, 1000), count=st.integers(0, 10))
def test_take_packed_few_rows_in_python_match_the_array_path(rows, milli, count):
    """One to four rows of whole numbers go through plain Python: the same GPUs, values and dtype as the numpy path."""
    import gpufleet.policies.paper._common as common

    left = np.array(rows, dtype=np.int64)
    old = common.TAKE_PY_MAX
    try:
        common.TAKE_PY_MAX = 0
        want = common.take_packed(left, milli, count)
    finally:
        common.TAKE_PY_MAX = old
    got = common.take_packed(left, milli, count)
    assert got.dtype == want.dtype and got.shape == want.shape
    assert np.array_equal(got, want)
    assert np.array_equal(got, _take_packed_reference(left, milli, count))


@SETTINGS
@given(state=cluster(), shape=st.sampled_from([s for s in SHAPES if 0 < s[1] < GPU_MILLI]), kind=st.sampled_from(["fgd", "default"]),
       picks=st.lists(st.integers(0, 10_000), min_size=1, max_size=4, unique=True),
       extra=st.sampled_from(["none", "memory", "deny", "allow"]))
def test_gpu_scores_of_a_few_nodes_in_python_match_the_array_path(state, shape, kind, picks, extra):
    """Up to four nodes' per-GPU share scores, placements enumerated in Python: the same bits as the array path (also
    with GPU memory asked and GPU models denied or allowed, which ``eligible_on`` must read as ``eligible_gpus``)."""
    import dataclasses

    import gpufleet.policies.paper.fgd as fgd

    c = cycle(shape)
    if extra != "none":
        more = {"memory": {"gpu_memory_mib": 20_000}, "deny": {"gpu_models_deny": frozenset({T4})},
                "allow": {"gpu_models_allow": frozenset({T4})}}[extra]
        c = Cycle(request=dataclasses.replace(c.request, **more), rng=c.rng)
    nodes = np.array(sorted({p % len(state) for p in picks}), dtype=np.int64)
    old = fgd.GPU_SCORES_PY_MAX
    try:
        fgd.GPU_SCORES_PY_MAX = 0
        want = plugin(kind)._gpu_scores(c, state, nodes)
    finally:
        fgd.GPU_SCORES_PY_MAX = old
    got = plugin(kind)._gpu_scores(c, state, nodes)
    assert got.shape == want.shape and got.dtype == want.dtype
    np.testing.assert_array_equal(got.view(np.int64), want.view(np.int64))  # -inf, -0.0 and every bit
