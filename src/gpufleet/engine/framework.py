"""The scheduling framework: typed extension points and one cycle per pod.

Modelled on kube-scheduler's framework: a ``Cycle`` carries one pod through
prefilter -> filter -> score -> pick node -> select GPUs -> reserve -> bind,
and unreserves on failure.  Two differences, both for speed and because the
engine also places *devices*:

* filters and scores work on all nodes at once (numpy columns of
  ``ClusterState``) rather than node by node;
* a score plugin may declare a cache key (normally the pod's resource shape);
  its raw scores are then cached per node and recomputed only for nodes whose
  ``version`` changed since (found from the state's log of changes, ``ClusterState.changed_since``, rather than
  by comparing every node's version each cycle).  That is what keeps FGD near a millisecond.

A filter plugin may also say, before it runs, that it has nothing to check for a pod (kube-scheduler's PreFilter
returning Skip): ``skips(request, state)``, reading only the request fields it names in ``skip_fields``, the state's
node metadata (which changes only with ``state.epoch``) and what its optional ``skip_stamp(state)`` returns.  The
framework asks once per (epoch, stamps, those fields) and keeps the filters that remain (``_FilterSkips``): a trace
pod (no selector, tolerations, terms...) then runs two filters instead of eleven.  A filter that skips would have
returned ``passes_all``, which the framework ignores anyway, so decisions and diagnoses are the same either way
(``Scheduler.skip_filters = False`` runs them all; tests/engine/test_filter_skip.py compares the two).
"""

from __future__ import annotations

from collections import OrderedDict
from operator import attrgetter
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar, Generic, Hashable, Protocol, Sequence, TypeVar, runtime_checkable

import numpy as np

from .. import native
from .model import GPU_MILLI, Assignment, PodRequest, quick_frozen_init
from .errors import StateError
from .state import ClusterState
from .status import Code, Diagnosis, Status

MAX_NODE_SCORE = 100
# a node whose room is kept for a pod nominated there (its victims are leaving), as kube-scheduler counts
# nominated pods on their node for pods of lower or equal priority; ``engine.round`` sets ``Scheduler.nominated``
NOMINATED_ROOM = "NominatedRoom"
TOP_IN_C_MAX = 2_048  # _pick: the most candidates whose best score _native.top finds (numpy's calls past it)
KEPT_OFF_REASON = "node(s) keep their room for a nominated pod of equal or higher priority"


@dataclass
class FilterResult:
    """Per-node verdict of one filter plugin.

    ``ok[i]`` says whether node i passes; failing nodes get ``reasons[0]``, or
    ``reasons[codes[i]]`` when ``codes`` is given.  The framework only reads ``ok``, and only in the
    cycle it was returned in (a plugin may hand out an array it keeps and updates); ``codes`` may be read
    later (a diagnosis), so it must not change after.
    """

    ok: np.ndarray
    reasons: tuple[str, ...] = ("rejected",)
    codes: np.ndarray | None = None
    passes_all: bool = False  # the plugin had nothing to check for this pod (``ok`` is all true)
    # ``codes`` made only when a diagnosis asks (most cycles never do); must not read state that may change later
    codes_of: Callable[[], np.ndarray] | None = None

    def reason_codes(self) -> np.ndarray | None:
        """Per-node index into ``reasons`` (None: every failing node has ``reasons[0]``), made now if lazy."""
        return self.codes if self.codes is not None or self.codes_of is None else self.codes_of()


T = TypeVar("T")


class StateKey(Generic[T]):
    """A typed key for per-cycle state (kube-scheduler's ``CycleState`` keys): a plugin that writes
    something for a later phase of the same cycle (a filter for the GPU selector, a term computed once per
    cycle) owns a key, so readers get its type and two plugins never clash on a string."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return f"StateKey({self.name!r})"


@quick_frozen_init
@dataclass(frozen=True)
class GpuChoice:
    gpu_indices: tuple[int, ...] = ()
    mig: tuple[tuple[int, int], ...] = ()


_NO_GPUS = GpuChoice()  # frozen: one for every pod that takes no GPU


# the GPUs the policy's selector picked for a pod asking by ResourceClaim (None: it picked none): DynamicResources
# tries them first when it allocates on the chosen node
DRA_CHOICE: StateKey[GpuChoice | None] = StateKey("DynamicResources/choice")


@dataclass
class Cycle:
    """One pod's trip through the framework."""

    request: PodRequest
    rng: np.random.Generator
    data: dict[Any, Any] = field(default_factory=dict)  # per-cycle plugin state: ``read``/``write`` by StateKey (older plugins: strings)
    feasible: np.ndarray | None = None
    fail_reasons: list[str] = field(default_factory=list)
    rejected_by: list[str] = field(default_factory=list)  # filter plugins that turned nodes away (queueing hints)
    candidates: np.ndarray | None = None
    scores: np.ndarray | None = None
    node: int = -1
    assignment: Assignment | None = None
    status: Status = field(default_factory=Status.success)
    only_nodes: np.ndarray | None = None  # bool mask: consider only these nodes (scheduler extender)
    # bool mask: nodes whose room is kept for a nominated pod of at least this pod's priority (``Scheduler.nominated``)
    kept_off: np.ndarray | None = None
    waited_s: float = 0.0  # how long the pod has waited in the caller's queue (0: unknown or just arrived)
    take_held: bool = False  # room plugins hold for pods not yet here may be taken (the caller would evict otherwise)
    # the filters' rejections in order: (nodes newly rejected, index of the first reason, per-node codes or None);
    # ``first_fail`` is built from them only when asked (a diagnosis), not on every cycle
    _rejections: list[tuple[np.ndarray, int, np.ndarray | Callable[[], np.ndarray] | None]] | None = field(
        default=None, repr=False)
    _first_fail: np.ndarray | None = field(default=None, repr=False)
    # the one-pass filter phase's rejections (Scheduler._filter, gpufleet._native.fit), before ``_rejections``'s:
    # each node's code (0 passed, 1-3 NodeResourcesFit's codes + 1, 4 GpuFit's) and each code's index into
    # ``fail_reasons`` (-1: none); None where the filters ran one by one
    _fused: tuple[bytearray, tuple[int, ...]] | None = field(default=None, repr=False)

    @property
    def first_fail(self) -> np.ndarray | None:
        """Per node: index into ``fail_reasons`` of the first filter that rejected it, -1 = passed (None: not filtered)."""
        if self._first_fail is None and self._rejections is not None:
            fused = self._fused
            if fused is not None:
                first = np.array(fused[1], dtype=np.int64).take(np.frombuffer(fused[0], dtype=np.uint8))
            else:
                first = np.full(self._rejections_n, -1, dtype=np.int64)
            for newly, base, codes in self._rejections:
                if callable(codes):
                    codes = codes()
                first[newly] = base if codes is None else base + codes[newly]
            self._first_fail = first
        return self._first_fail

    @first_fail.setter
    def first_fail(self, value: np.ndarray | None) -> None:
        self._first_fail = value
        self._rejections = None
        self._fused = None

    _rejections_n: int = field(default=0, repr=False)

    def read(self, key: StateKey[T]) -> T | None:
        """What a plugin wrote under ``key`` this cycle, or None."""
        return self.data.get(key)

    def write(self, key: StateKey[T], value: T) -> None:
        self.data[key] = value


# --- extension points ---------------------------------------------------------


@runtime_checkable
class PreFilterPlugin(Protocol):
    name: str

    def pre_filter(self, cycle: Cycle, state: ClusterState) -> Status: ...


@runtime_checkable
class FilterPlugin(Protocol):
    """``filter`` judges every node.  Optional, for a pod it never rejects (kube-scheduler's PreFilter Skip):
    ``skip_fields: tuple[str, ...]`` (the PodRequest attributes ``skips`` reads) and
    ``skips(request, state) -> bool``: True only if ``filter`` would return ``passes_all`` for this request on
    any state of the same epoch (node metadata) and the same ``skip_stamp(state)`` (optional: live state it
    reads, e.g. whether any placed pod carries anti-affinity); False is always safe."""

    name: str

    def filter(self, cycle: Cycle, state: ClusterState) -> FilterResult: ...


class _FilterSkips:
    """A profile's filters less those that say they skip a pod, kept per (epoch, skip stamps, the request fields
    the skipping plugins read): most pods share those fields (a trace pod's are all empty), so the plugins are
    asked once per class of pods and epoch rather than their filters called on every cycle."""

    __slots__ = ("filters", "size", "skippable", "sig", "stamps", "plans")

    def __init__(self, filters: list[FilterPlugin]) -> None:
        self.filters = filters
        self.size = len(filters)
        self.skippable = any(callable(getattr(p, "skips", None)) for p in filters)
        fields = sorted({f for p in filters if callable(getattr(p, "skips", None)) for f in getattr(p, "skip_fields", ())})
        self.sig: Callable[[PodRequest], Any] = attrgetter(*fields) if fields else _none
        self.stamps: tuple[Callable[[ClusterState], Hashable], ...] = tuple(
            s for p in filters if callable(getattr(p, "skips", None)) and (s := getattr(p, "skip_stamp", None)) is not None)
        self.plans: dict[Hashable, Sequence[FilterPlugin]] = {}

    def active(self, r: PodRequest, state: ClusterState) -> Sequence[FilterPlugin]:
        """The filters to run for ``r`` on ``state``, in profile order."""
        if not self.skippable:
            return self.filters
        stamps = self.stamps
        key = (state.epoch, self.sig(r), stamps[0](state) if len(stamps) == 1 else tuple([s(state) for s in stamps]))
        try:
            plan = self.plans.get(key)
        except TypeError:  # a field that cannot be hashed: ask the plugins, keep nothing
            return self._plan(r, state)
        if plan is None:
            if len(self.plans) > 256:
                self.plans.clear()
            plan = self.plans[key] = self._plan(r, state)
        return plan

    def _plan(self, r: PodRequest, state: ClusterState) -> Sequence[FilterPlugin]:
        out = []
        for p in self.filters:
            skips = getattr(p, "skips", None)
            if not (callable(skips) and skips(r, state)):
                out.append(p)
        return tuple(out)


def _none(r: PodRequest) -> None:
    return None


@runtime_checkable
class ScorePlugin(Protocol):
    name: str

    def score(self, cycle: Cycle, state: ClusterState, nodes: np.ndarray) -> np.ndarray:
        """Raw scores of ``nodes`` (indices); higher is better."""
        ...

    def normalize(self, raw: np.ndarray) -> np.ndarray:
        """Map the candidates' raw scores to 0..MAX_NODE_SCORE."""
        ...

    def cache_key(self, cycle: Cycle) -> Hashable | None:
        """Key under which raw per-node scores may be cached, or None.  A plugin whose keys carry a version that
        only moves forward (a learned workload) may also define ``cache_version() -> Hashable``: when it moves,
        the framework forgets the plugin's scores cached under the older one."""
        ...


@runtime_checkable
class GpuSelectPlugin(Protocol):
    name: str

    def select_gpus(self, cycle: Cycle, state: ClusterState, node: int) -> GpuChoice | None: ...


@runtime_checkable
class ReservePlugin(Protocol):
    name: str

    def reserve(self, cycle: Cycle, state: ClusterState) -> Status: ...

    def unreserve(self, cycle: Cycle, state: ClusterState) -> None: ...


EXTENSION_POINTS: dict[str, type] = {
    "preFilter": PreFilterPlugin,
    "filter": FilterPlugin,
    "score": ScorePlugin,
    "gpuSelect": GpuSelectPlugin,
    "reserve": ReservePlugin,
}


class SharedObserver:
    """A plugin whose ``observe_pod`` only hands the pod to a learner it may share with other plugins.

    It names that learner as ``observes`` (the attribute ``observed_attr`` names), so that the scheduler calls each
    shared learner once per cycle rather than once per plugin (each later call would find the cycle's pod learned)."""

    observed_attr: ClassVar[str] = "model"

    def observe_pod(self, cycle: Cycle) -> None:
        self.observes.observe_pod(cycle)

    @property
    def observes(self) -> Any:
        return getattr(self, self.observed_attr)


class Binder(Protocol):
    """What an adapter does once the engine has decided (bind a pod, record a placement)."""

    def bind(self, assignment: Assignment) -> None: ...


class BindError(Exception):
    pass


@dataclass
class Profile:
    """A scheduler's plugins by extension point, in order.

    The lists may be replaced or appended to (DRA's plugin registers itself by ``append``); a scheduler keeps what it
    derives from ``filters`` and ``scores`` (the filters it may skip, the score plugins' hooks) while the list is the
    same object of the same length, so change an element by assigning a new list, not in place."""

    name: str
    pre_filters: list[PreFilterPlugin] = field(default_factory=list)
    filters: list[FilterPlugin] = field(default_factory=list)
    scores: list[tuple[ScorePlugin, int]] = field(default_factory=list)
    gpu_selector: GpuSelectPlugin | None = None
    reserves: list[ReservePlugin] = field(default_factory=list)
    # equal best scores: "random" picks uniformly (kube-scheduler); "ordered" picks the
    # first node in a random order drawn once per scheduler (the FGD paper's simulator,
    # which prefixes node names with a seeded permutation and takes the smallest name)
    tie_break: str = "random"


@quick_frozen_init  # made on every decision (see quick_frozen_init)
@dataclass(frozen=True)
class Decision:
    pod_key: str
    status: Status
    assignment: Assignment | None = None
    score: float = 0.0
    feasible_nodes: int = 0
    diagnosis: Diagnosis | None = None

    @property
    def ok(self) -> bool:
        return self.status.ok

    @property
    def rejected_by(self) -> frozenset[str]:
        """The plugins that kept the pod out (filters that turned nodes away, or the one that failed it):
        what a change must concern for the pod to be worth trying again (``schedqueue.may_fit_after``)."""
        if self.diagnosis is not None and self.diagnosis.plugins:
            return frozenset(self.diagnosis.plugins)
        return frozenset((self.status.plugin,)) if self.status.plugin else frozenset()


class Scheduler:
    """Runs cycles of one profile against one ClusterState.

    ``schedule`` decides and reserves (assumes) the devices at once, so the
    next cycle sees them taken; ``schedule_and_bind`` adds the binder call and
    unreserves when binding fails.
    """

    def __init__(self, profile: Profile, state: ClusterState, seed: int | None = 0, cache_size: int = 4096):
        self.profile = profile
        self.state = state
        self.rng = np.random.default_rng(seed)
        self._rank_rng = np.random.default_rng(None if seed is None else seed + 1)
        self._rank: np.ndarray | None = None
        # (plugin name, its cache key) -> [raw scores, stale (never scored, or the node's version moved since),
        # epoch, the state's change mark when last read (ClusterState.changed_since)]: see _score
        self._cache: OrderedDict[tuple, list[Any]] = OrderedDict()
        self._cache_size = cache_size
        self._cache_versions: dict[str, Hashable] = {}  # plugin name -> its cache_version when last asked (_drop_older)
        # plugins that learn the workload see every pod that passes prefilter, also one no node can take:
        # learning only from pods that reach scoring would hide the demand that fails (pods pinned to a full model)
        # A plugin whose ``observe_pod`` only hands the pod to a learner it shares with others (the default profile's
        # five plugins and one WorkloadModel) names it as ``observes``: the learner is called once per cycle, not once
        # per plugin (each call after the first would find the cycle's pod learned and return)
        seen: list = []
        for p in [q for q, _ in profile.scores] + list(profile.filters) + [profile.gpu_selector]:  # a filter may learn too
            if p is not None and hasattr(p, "observe_pod"):
                o = getattr(p, "observes", None)
                o = p if o is None else o
                if all(o is not q for q in seen):
                    seen.append(o)
        self._observers = seen
        # nodes whose room is kept for pods nominated there, counted during filtering (set by engine.round): the
        # nodes where the cycle's pod would leave a nominated pod of at least its priority no room, or None
        self.nominated: Callable[[Cycle, np.ndarray], np.ndarray | None] | None = None
        # filters that say they have nothing to check for a pod are not run (False: run every filter, for tests)
        self.skip_filters = True
        # NodeResourcesFit then GpuFit, a trace pod's whole filter phase, in one C pass where the extension is built
        # (``_fused_filter``; False: the plugins' filters one by one, as tests/engine/test_fused_filter.py compares)
        self.fuse_filters = True
        self._skips: _FilterSkips | None = None
        self._scorers: tuple[list, tuple] | None = None  # see _score_plugins

    # --- phases -------------------------------------------------------------------
    def _pre_filter(self, cycle: Cycle) -> Status:
        for p in self.profile.pre_filters:
            st = p.pre_filter(cycle, self.state)
            if not st.ok:
                return Status(st.code, st.reasons, st.plugin or p.name)
        return Status.success()

    def _filter(self, cycle: Cycle, explain: bool = False) -> np.ndarray:
        n = len(self.state)
        feasible: np.ndarray | None = None  # None: every node so far (made on the first rejection)
        rejections: list[tuple[np.ndarray, int, np.ndarray | Callable[[], np.ndarray] | None]] = []
        reasons: list[str] = []
        rejected: list[str] = []
        if cycle.only_nodes is not None:
            feasible = np.ones(n, dtype=bool)
            feasible &= cycle.only_nodes
            rejections.append((~cycle.only_nodes, 0, None))
            reasons.append("node(s) were not offered by kube-scheduler")
        st = self.state
        flt = self._active_filters(cycle.request, st) if self.skip_filters else self.profile.filters
        cycle.candidates = None
        cycle._fused = None
        if len(flt) == 2 and self.fuse_filters and native.fit is not None and cycle.only_nodes is None:
            fused = self._fused_filter(cycle, flt, n)
            if fused is not None:
                feasible, reasons, rejected = fused
                flt = ()
        for p in flt:
            res = p.filter(cycle, st)
            if res.passes_all:
                continue
            # feasible & ~ok in one pass (bool: True > False only); what newly.any() asks, without its wrapper
            newly = ~res.ok if feasible is None else np.greater(feasible, res.ok)
            if _any(newly):
                rejections.append((newly, len(reasons), res.codes if res.codes is not None else res.codes_of))
                reasons.extend(res.reasons)
                if feasible is None:
                    feasible = np.array(res.ok, dtype=bool)  # all-true & ok, a copy: never the plugin's own array
                else:
                    feasible &= res.ok
                rejected.append(p.name)
        if feasible is None:
            feasible = np.ones(n, dtype=bool)
        if self.nominated is not None:  # kube-scheduler's RunFilterPluginsWithNominatedPods
            cycle.kept_off = self.nominated(cycle, feasible)
            if cycle.kept_off is not None and (newly := feasible & cycle.kept_off).any():
                feasible &= ~cycle.kept_off
                cycle.candidates = None  # the fused pass's candidates no longer hold
                rejections.append((newly, len(reasons), None))
                reasons.append(KEPT_OFF_REASON)
                rejected.append(NOMINATED_ROOM)
        cycle.feasible = feasible
        cycle._first_fail = None
        cycle._rejections = rejections
        cycle._rejections_n = n
        cycle.fail_reasons = reasons
        cycle.rejected_by = rejected
        return feasible

    def _fused_filter(self, cycle: Cycle, flt: Sequence[FilterPlugin], n: int) -> tuple[np.ndarray, list[str], list[str]] | None:
        """NodeResourcesFit then GpuFit (a trace pod's whole filter phase) in one C pass (``gpufleet._native.fit``):
        their compares, the newly-rejected masks, the feasible mask and its candidates were a dozen numpy calls over
        every node a cycle.  Each node's first rejection is kept as a byte (``Cycle._fused``), so a diagnosis made
        now or later counts and names the same reasons as the filters run one by one (tests/engine/test_fused_filter.py).
        Returns (feasible, reasons, rejected-by), the candidates in ``cycle.candidates``; None where either plugin
        has more to check than its plain compare (it then runs as usual)."""
        a, g = flt
        fit_args = getattr(a, "fused_fit", None)
        gpu_args = getattr(g, "fused_gpu", None)
        if fit_args is None or gpu_args is None:
            return None
        st = self.state
        x = fit_args(cycle, st)
        y = gpu_args(cycle, st) if x is not None else None
        if y is None:
            return None
        assert x is not None and native.fit is not None
        cpu, mem, pods, fit_reasons = x
        fig, need, gpu_reasons = y
        feasible = np.empty(n, dtype=bool)
        codes = bytearray(n)
        cand = np.empty(n, dtype=np.intp)
        got = native.fit(st.cpu_free, st.mem_free, pods, fig, cpu, mem, need, feasible, codes, cand)
        if got is None:
            return None
        passed, by_fit, by_gpu = got
        reasons: list[str] = []
        rejected: list[str] = []
        table = [-1, -1, -1, -1, -1]
        if by_fit:
            table[1:4] = 0, 1, 2
            reasons.extend(fit_reasons)
            rejected.append(a.name)
        if by_gpu:
            table[4] = len(reasons)
            reasons.extend(gpu_reasons)
            rejected.append(g.name)
        if by_fit or by_gpu:
            cycle._fused = (codes, tuple(table))
        cycle.candidates = cand[:passed]
        return feasible, reasons, rejected

    def _active_filters(self, r: PodRequest, st: ClusterState) -> Sequence[FilterPlugin]:
        sk = self._skips
        flt = self.profile.filters
        if sk is None or sk.filters is not flt or sk.size != len(flt):  # the profile's list replaced or changed
            sk = self._skips = _FilterSkips(flt)
        return sk.active(r, st)

    def _score(self, cycle: Cycle, cand: np.ndarray) -> np.ndarray:
        """The weighted sum of the applying plugins' normalised scores of ``cand``, summed from 0.0 in profile order.

        The cached raw scores are read in place when every node is a candidate (no copy of [nodes]); the first
        term is added to 0.0 (``+ 0.0``: what adding it to zeros gives, -0.0 included) and a weight of 1 is not
        multiplied (exact), so the sum has the same bits as zeros plus each weighted term."""
        total: np.ndarray | None = None
        st = self.state
        n = len(st)
        feasible = cycle.feasible if cycle.feasible is not None and cycle.feasible.size == n else None
        for p, w, applies, post, cv in self._score_plugins():
            if applies is not None and not applies(cycle, st):  # optional: a plugin with no opinion on this pod is skipped
                continue
            key = p.cache_key(cycle)
            if key is None:
                raw = np.asarray(p.score(cycle, st, cand), dtype=np.float64)
            else:
                ck = (p.name, key)
                ent = self._cache.get(ck)
                if ent is None or ent[2] != st.epoch:  # every node is stale
                    if cv is not None:
                        self._drop_older(p.name, cv())
                    ent = [np.zeros(n, dtype=np.float64), np.ones(n, dtype=bool), st.epoch, st.change_mark()]
                    self._cache[ck] = ent
                    if len(self._cache) > self._cache_size:
                        self._cache.popitem(last=False)
                    vals, stale_at = ent[0], ent[1]
                else:
                    self._cache.move_to_end(ck)
                    vals, stale_at = ent[0], ent[1]
                    moved = st.changed_since(ent[3])  # the nodes whose version moved since this entry was last read
                    if moved is None:  # unknown (the log was renewed): all of them
                        stale_at.fill(True)
                    elif len(moved) <= 4:
                        for i in moved:
                            stale_at[i] = True
                    else:
                        stale_at[moved] = True
                    ent[3] = st.change_mark()
                if feasible is not None and cand.size * 4 > n:  # most nodes are candidates: whole columns
                    stale = (stale_at & feasible).nonzero()[0]  # np.flatnonzero, without its wrappers
                else:
                    stale = cand[stale_at.take(cand)]
                if stale.size:
                    vals[stale] = p.score(cycle, st, stale)
                    stale_at[stale] = False
                # cand: sorted, distinct; n of them: every node.  .take: what vals[cand] gives, twice as fast
                raw = vals if cand.size == n and post is None else vals.take(cand)
            if post is not None:
                raw = post(cycle, st, cand, raw)
            term = p.normalize(raw) if w == 1 else w * p.normalize(raw)
            if total is None:
                total = np.add(term, 0.0, dtype=np.float64)  # a new array: never the cache's
            else:
                total += term
        return total if total is not None else np.zeros(cand.size, dtype=np.float64)

    def _score_plugins(self) -> tuple[tuple[Any, int, Any, Any, Any], ...]:
        """The profile's score plugins with their optional hooks looked up once: (plugin, weight, ``applies``,
        ``post_score`` (a per-cycle part that must not be cached), ``cache_version``), each None where absent.
        Kept while the profile's list is the same list of the same length (as ``_active_filters`` does)."""
        sp = self._scorers
        scores = self.profile.scores
        if sp is None or sp[0] is not scores or len(sp[1]) != len(scores):
            sp = self._scorers = (scores, tuple((p, w, getattr(p, "applies", None), getattr(p, "post_score", None),
                                                 getattr(p, "cache_version", None)) for p, w in scores))
        return sp[1]

    def _drop_older(self, name: str, version: Hashable) -> None:
        """Forget plugin ``name``'s cached scores when its ``cache_version`` moved: its keys hold that version, which
        never comes back, so they would only sit in the cache (a [nodes] column each, 80 KB at 5,000 nodes) until
        pushed out; the default's learned workload moves a dozen times per few thousand pods."""
        if self._cache_versions.get(name, version) != version:
            for k in [k for k in self._cache if k[0] == name]:
                del self._cache[k]
        self._cache_versions[name] = version

    def _pick(self, cycle: Cycle, cand: np.ndarray, scores: np.ndarray) -> int:
        """The chosen node's position in ``cand`` (and ``scores``): the caller reads its node and its score there."""
        top = native.top
        # one C pass for the usual unique best (same compare, same ties); a scalar loop, so only where numpy's three
        # calls cost more than the pass: at 5,000 candidates numpy's vector loops win (tried: 1.05x the instructions)
        if top is not None and self.fuse_filters and scores.size <= TOP_IN_C_MAX:
            got = top(scores)
            if got is not None and got[0] == 1:
                return got[1]
        best = _max(scores)
        ties = (scores >= best - 1e-9).nonzero()[0]
        if ties.size == 1:
            return int(ties[0])
        if self.profile.tie_break == "ordered":
            rank = self._node_rank()
            t = cand.take(ties)  # cand[ties], rank[t]: the same, without fancy indexing's per-item checks
            return int(ties[rank.take(t).argmin()])
        return int(ties[int(self.rng.integers(ties.size))])

    def _node_rank(self) -> np.ndarray:
        n = len(self.state)
        if self._rank is None or self._rank.size != n:
            self._rank = self._rank_rng.permutation(n)
        return self._rank

    def diagnosis(self, cycle: Cycle, by_node: bool = False) -> Diagnosis:
        d = Diagnosis(total_nodes=len(self.state), plugins=tuple(cycle.rejected_by))
        rejections = cycle._rejections
        if not by_node and rejections is not None and cycle._first_fail is None:
            counts = d.counts
            fused = cycle._fused
            if fused is not None:  # the one-pass filter phase's codes, in the order of their reasons
                cnt = np.bincount(np.frombuffer(fused[0], dtype=np.uint8), minlength=5).tolist()
                for code in range(1, 5):
                    if cnt[code]:
                        r = cycle.fail_reasons[fused[1][code]]
                        counts[r] = counts.get(r, 0) + cnt[code]
            # the counts straight from the filters' rejections, without the per-node ``first_fail``: the nodes each
            # rejection turned away are disjoint (only nodes still feasible are counted as newly rejected) and come in
            # the order of their reasons, so these are the counts, and the order, that ``first_fail`` gives
            reasons = cycle.fail_reasons
            for newly, base, codes in rejections:
                if callable(codes):
                    codes = codes()
                if codes is None:
                    if c := int(np.count_nonzero(newly)):
                        r = reasons[base]
                        counts[r] = counts.get(r, 0) + c
                else:
                    cnt = np.bincount(codes[newly])
                    for j in cnt.nonzero()[0].tolist():
                        r = reasons[base + j]
                        counts[r] = counts.get(r, 0) + int(cnt[j])
            return d
        first = cycle.first_fail
        if first is None:
            return d
        if cycle.fail_reasons:
            cnt = np.bincount(first + 1, minlength=len(cycle.fail_reasons) + 1)[1:]  # slot 0: the nodes that passed
            for j in np.flatnonzero(cnt).tolist():
                r = cycle.fail_reasons[j]
                d.counts[r] = d.counts.get(r, 0) + int(cnt[j])
        if by_node:
            for i, f in enumerate(first):
                d.by_node[self.state.nodes[i].name] = cycle.fail_reasons[int(f)] if f >= 0 else "fits"
        return d

    def _assignment(self, cycle: Cycle, node: int, choice: GpuChoice) -> Assignment:
        r = cycle.request
        st = self.state
        on_dra = r.dra is not None and r.dra.on_node(st, node)
        if on_dra:  # the pod's claims hold its devices (ClusterState.hold_claim), not its assignment
            choice = GpuChoice()
        mems: tuple[int, ...] = ()
        if choice.gpu_indices:
            if r.gpu_milli >= GPU_MILLI:
                mems = tuple(int(st.gpu_mem_cap[node, j]) for j in choice.gpu_indices)
            else:
                mems = (r.gpu_memory_mib,) * len(choice.gpu_indices)
        return Assignment(
            pod_key=r.key,
            node=st.nodes[node].name,
            cpu_milli=r.cpu_milli,
            memory_mib=r.memory_mib,
            gpu_indices=choice.gpu_indices,
            gpu_milli=r.gpu_milli if choice.gpu_indices else 0,
            gpu_memory_mib=mems,
            mig=choice.mig,
            mig_profile=r.mig_profile if choice.mig else None,
            priority=r.priority,
            queue=r.queue,
            pod_group=r.pod_group,
            scalars=r.scalars,
            terms=r.terms,
            claims=r.dra.keys_on(on_dra) if r.dra is not None else (),
            dra_usage=_dra_usage(cycle, st, node) if on_dra else (),
        )

    # --- public API ---------------------------------------------------------------
    def new_cycle(self, request: PodRequest, waited_s: float = 0.0, take_held: bool = False) -> Cycle:
        return Cycle(request=request, rng=self.rng, waited_s=waited_s, take_held=take_held)

    def observe(self, request: PodRequest) -> None:
        """Show a pod to the plugins that learn the workload before it is tried (one waiting in the queue).

        A fresh scheduler with a backlog otherwise places the first pods against a workload of the
        few it has tried: small shares went to fresh GPUs because no whole-GPU pod had been seen yet,
        though several were waiting.  Each plugin learns from a pod once, however often it is shown.
        """
        if self._observers:
            cycle = self.new_cycle(request)
            for o in self._observers:
                o.observe_pod(cycle)

    def decide(self, cycle: Cycle, explain: bool = False) -> Decision:
        """Prefilter, filter, score, pick a node and its GPUs.  Changes nothing."""
        r = cycle.request
        if self.profile.pre_filters:
            st = self._pre_filter(cycle)
            if not st.ok:
                cycle.status = st
                return Decision(r.key, st)
        for o in self._observers:
            o.observe_pod(cycle)
        feasible = self._filter(cycle, explain)
        cand = cycle.candidates  # the fused filter pass's (``_fused_filter``); else:
        if cand is None:
            cand = feasible.nonzero()[0]  # np.flatnonzero of a 1-d mask, without its wrappers
            cycle.candidates = cand
        if cand.size == 0:
            d = self.diagnosis(cycle, by_node=explain)
            cycle.status = d.status()
            return Decision(r.key, cycle.status, diagnosis=d)
        scores = self._score(cycle, cand)
        cycle.scores = scores
        at = self._pick(cycle, cand, scores)
        node = int(cand[at])
        choice = _NO_GPUS
        if r.gpu_count > 0:
            sel = self.profile.gpu_selector
            picked = sel.select_gpus(cycle, self.state, node) if sel else None
            if r.dra is not None and r.dra.on_node(self.state, node):  # DRA: the policy's GPUs are the allocator's first choice
                cycle.write(DRA_CHOICE, picked)
                picked = GpuChoice()
            if picked is None:
                cycle.status = Status.error(
                    f"GPU selection found no devices on node {self.state.nodes[node].name} that passed the filters",
                    plugin=sel.name if sel else "",
                )
                return Decision(r.key, cycle.status, feasible_nodes=int(cand.size))
            choice = picked
        cycle.node = node
        cycle.assignment = self._assignment(cycle, node, choice)
        score = float(scores[at])
        diag = self.diagnosis(cycle, by_node=True) if explain else None
        return Decision(r.key, Status.success(), cycle.assignment, score, int(cand.size), diag)

    def reserve(self, cycle: Cycle) -> Status:
        a = cycle.assignment
        assert a is not None
        try:
            self.state.reserve(a)
        except StateError as exc:  # e.g. the pod is already placed (a duplicate event): a status, not a crash
            return Status.error(f"cannot reserve {a.pod_key} on {a.node}: {exc}")
        done: list[ReservePlugin] = []
        for p in self.profile.reserves:
            st = p.reserve(cycle, self.state)
            if not st.ok:
                for q in reversed(done):
                    q.unreserve(cycle, self.state)
                self.state.unreserve(a.pod_key)
                return Status(st.code, st.reasons, st.plugin or p.name)
            done.append(p)
        return Status.success()

    def unreserve(self, cycle: Cycle) -> None:
        for p in reversed(self.profile.reserves):
            p.unreserve(cycle, self.state)
        if cycle.assignment is not None:
            self.state.unreserve(cycle.assignment.pod_key)

    def _schedule(self, request: PodRequest, waited_s: float = 0.0, take_held: bool = False) -> tuple[Cycle, Decision]:
        cycle = self.new_cycle(request, waited_s, take_held)
        dec = self.decide(cycle)
        if dec.ok:
            st = self.reserve(cycle)
            if not st.ok:
                dec = Decision(request.key, st, feasible_nodes=dec.feasible_nodes)
        return cycle, dec

    def schedule(self, request: PodRequest, waited_s: float = 0.0, take_held: bool = False) -> Decision:
        """Decide and reserve: on success the devices are taken in the snapshot.

        ``waited_s``: how long the pod has been waiting, for plugins that hold back only for a while.
        ``take_held``: room that plugins hold for pods not yet here is the pod's to take; callers pass it
        rather than evict running pods for it (``schedqueue.plan_room`` says when)."""
        return self._schedule(request, waited_s, take_held)[1]

    def schedule_and_bind(self, request: PodRequest, binder: Binder) -> Decision:
        cycle, dec = self._schedule(request)
        if not dec.ok:
            return dec
        try:
            binder.bind(dec.assignment)  # type: ignore[arg-type]
        except Exception as exc:  # the adapter's failure must not corrupt the snapshot
            self.unreserve(cycle)
            return Decision(request.key, Status.error(f"bind failed: {exc}"), feasible_nodes=dec.feasible_nodes)
        return dec

    def explain(self, request: PodRequest, waited_s: float = 0.0) -> Decision:
        """Like ``decide`` but keeps the per-node reasons; never reserves.  ``waited_s`` as for ``schedule``."""
        return self.decide(self.new_cycle(request, waited_s), explain=True)

    def filters_for(self, request: PodRequest) -> Sequence[FilterPlugin]:
        """The filters a cycle of ``request`` runs now (those that skip it left out), in profile order."""
        return self._active_filters(request, self.state) if self.skip_filters else self.profile.filters

    def learns_from(self, request: PodRequest) -> bool:
        """Would a cycle of ``request`` teach a plugin that learns the workload anything?  (A pod it has seen: no;
        a learner that cannot say (no ``learns_from``): yes.)"""
        for o in self._observers:
            ask = getattr(o, "learns_from", None)
            if ask is None or ask(request):
                return True
        return False

    def forget(self, pod_key: str) -> Assignment | None:
        """A pod left (finished, deleted): release its devices."""
        return self.state.unreserve(pod_key)

    def invalidate_caches(self) -> None:
        self._cache.clear()


_any = np.logical_or.reduce  # ``a.any()`` of a 1-d bool array, without the method's Python wrapper
_max = np.maximum.reduce  # ``a.max()`` likewise


def _dra_usage(cycle: Cycle, st: ClusterState, node: int) -> tuple[tuple[str, int], ...]:
    """What a pod's claims will take, as team queues count it (the GPU fields describe its claims, engine/dra/shape.py;
    whole GPUs count the memory of the GPUs the policy picked)."""
    r = cycle.request
    if r.gpu_count <= 0:
        return ()
    if r.mig_profile:
        return ((f"mig:{r.mig_profile}", r.gpu_count),)
    if r.gpu_milli >= GPU_MILLI:
        choice = cycle.read(DRA_CHOICE)
        picked = list(choice.gpu_indices) if choice is not None and choice.gpu_indices else []
        caps = [int(st.gpu_mem_cap[node, j]) for j in picked] or [int(st.gpu_mem_cap[node].max())] * r.gpu_count
        return (("gpu_milli", r.gpu_count * GPU_MILLI), ("gpu_memory_mib", sum(caps[:r.gpu_count])))
    return (("gpu_milli", r.gpu_count * r.gpu_milli), ("gpu_memory_mib", r.gpu_count * r.gpu_memory_mib))


def feasible_reason_counts(cycle: Cycle) -> dict[str, int]:
    """Helper for reports: failing reason -> node count."""
    out: dict[str, int] = {}
    if cycle.first_fail is None:
        return out
    for f in cycle.first_fail:
        if f >= 0:
            r = cycle.fail_reasons[int(f)]
            out[r] = out.get(r, 0) + 1
    return out


__all__: Sequence[str] = [
    "Binder", "BindError", "Code", "Cycle", "DRA_CHOICE", "StateKey", "Decision", "FilterResult", "FilterPlugin", "GpuChoice",
    "GpuSelectPlugin", "PreFilterPlugin", "Profile", "ReservePlugin", "Scheduler", "ScorePlugin",
    "EXTENSION_POINTS", "KEPT_OFF_REASON", "MAX_NODE_SCORE", "NOMINATED_ROOM",
]
