"""The cluster snapshot the engine decides from, kept as numpy arrays.

Why arrays: a decision looks at every node (1,213 in the Alibaba trace, 5,000
in the live benchmark) and must take about a millisecond, so filters and
scores work on whole columns (``cpu_free``, ``gpu_free_milli[node, gpu]``)
instead of looping over Python objects.  ``version[node]`` goes up whenever a
node's free resources change, which lets score plugins cache per-node results
and recompute only the nodes that changed.

Invariants (property-tested): no free amount ever goes below zero or above
capacity, and ``unreserve`` restores exactly the state before ``reserve``.
"""

from __future__ import annotations

import itertools
from contextlib import contextmanager
from dataclasses import replace
from typing import TYPE_CHECKING, Iterable, Iterator

import numpy as np

from .errors import StateError
from .model import GPU_MILLI, Assignment, Node
from .podindex import PodIndex

if TYPE_CHECKING:
    from .dra.usage import ClaimHold, DraState
    from .volumes import VolumeCatalog

# Epochs are unique across all states: plugins cache node-metadata masks per epoch, and
# a per-state counter let a new state (same id() after GC, same epoch) hit a dead one's cache.
_EPOCHS = itertools.count(1)
# one per ClusterState object, copies included (a copy shares its original's epoch and versions): caches that trust
# per-node versions key on it, never on id(), which a dead copy's successor may reuse
_TOKENS = itertools.count(1)
NO_SLOT_LIMIT = 1 << 40
CHANGE_LOG_SIZE = 1 << 14  # entries in ClusterState.changes before a new log starts


class ClusterState:
    def __init__(self, nodes: Iterable[Node] = ()):
        self.nodes: list[Node] = []
        self.index: dict[str, int] = {}
        self.assignments: dict[str, Assignment] = {}
        self.pods_on_node: dict[str, set[str]] = {}
        self.model_names: list[str] = []
        self._model_ids: dict[str, int] = {}
        self.epoch = 0  # renewed (globally unique) when the node set or node metadata changes
        self.pod_index = PodIndex(0)
        self.volumes: VolumeCatalog | None = None  # a VolumeCatalog (PVCs, PVs, CSINode limits) when the adapter provides one
        # DRA: the slices, classes and allocated devices (None: no DRA), and the devices each allocated ResourceClaim
        # holds on the GPU columns here (a claim, not a pod, holds them: several pods may share one)
        self.dra: DraState | None = None
        self.claim_holds: dict[str, ClaimHold] = {}
        self.claim_users: dict[str, set[str]] = {}
        self._hold_applied: dict[str, tuple[int, list[tuple[int, int, int]], list[tuple[str, tuple[int, int]]]]] = {}
        self.token = next(_TOKENS)
        self._rebuild(list(nodes), usage=None)

    # --- construction -------------------------------------------------------------
    def _model_id(self, name: str) -> int:
        if name not in self._model_ids:
            self._model_ids[name] = len(self.model_names)
            self.model_names.append(name)
        return self._model_ids[name]

    def _rebuild(self, nodes: list[Node], usage: dict[str, Assignment] | None) -> None:
        names = [n.name for n in nodes]
        if len(set(names)) != len(names):
            raise StateError("duplicate node names")
        self.nodes = nodes
        self.index = {n: i for i, n in enumerate(names)}
        n = len(nodes)
        g = max([len(x.gpus) for x in nodes] + [1])
        self.max_gpus = g
        self.cpu_cap = np.array([x.cpu_milli for x in nodes], dtype=np.int64)
        self.mem_cap = np.array([x.memory_mib for x in nodes], dtype=np.int64)
        self.pods_cap = np.array([x.max_pods for x in nodes], dtype=np.int64)
        self.cpu_free = self.cpu_cap.copy()
        self.mem_free = self.mem_cap.copy()
        self.pods_free = self.pods_cap.copy()
        # nodes with no pod slot left (pods_free < 1), kept by reserve and unreserve: NodeResourcesFit skips the
        # pod-slot column while it is 0 (nearly always: a GPU node fills its GPUs long before its 110 pods)
        self.pods_short = int(np.count_nonzero(self.pods_free < 1))
        self.gpu_n = np.array([len(x.gpus) for x in nodes], dtype=np.int64)
        self.gpu_exists = np.zeros((n, g), dtype=bool)
        self.gpu_usable = np.zeros((n, g), dtype=bool)  # healthy, not in MIG mode
        self.gpu_model = np.full((n, g), -1, dtype=np.int32)
        self.gpu_mem_cap = np.zeros((n, g), dtype=np.int64)
        self.gpu_free_milli = np.zeros((n, g), dtype=np.int64)
        self.gpu_mem_free = np.zeros((n, g), dtype=np.int64)
        # kubelet devices left per GPU (Node.gpu_slots; "no limit" is a number no GPU reaches)
        self.gpu_slots_cap = np.array([x.gpu_slots if x.gpu_slots > 0 else NO_SLOT_LIMIT for x in nodes], dtype=np.int64)
        self.gpu_slots_free = np.zeros((n, g), dtype=np.int64)
        self.slots_limited = bool(any(x.gpu_slots > 0 for x in nodes))
        # kubelet's device count per node (allocatable nvidia.com/gpu): pods on GPUs hold len(gpu_indices) of them.
        # Only new placements are held to it (GpuFit): it drops to 0 while the agent restarts, and the pods already
        # there keep what they hold, so it may go below zero here
        self.gpu_dev_free = np.array([x.gpu_devices if x.gpu_devices >= 0 else NO_SLOT_LIMIT for x in nodes], dtype=np.int64)
        self.gpu_dev_cap = np.array([x.gpu_devices for x in nodes], dtype=np.int64)  # as reported; -1 unknown (DRA: 0 = DRA's)
        self.devices_limited = bool(any(x.gpu_devices >= 0 for x in nodes))
        self.gpu_plugin_down = np.array([x.gpu_plugin_down for x in nodes], dtype=bool)  # Node.gpu_plugin_down
        self.any_plugin_down = bool(self.gpu_plugin_down.any())
        # MIG instances: per node {profile: [(gpu, instance_id), ...free]}
        self.mig_free: list[dict[str, list[tuple[int, int]]]] = []
        for i, node in enumerate(nodes):
            free: dict[str, list[tuple[int, int]]] = {}
            for j, gpu in enumerate(node.gpus):
                if gpu.index != j:
                    raise StateError(f"node {node.name}: GPU indices must be 0..{len(node.gpus) - 1} in order")
                self.gpu_exists[i, j] = True
                self.gpu_model[i, j] = self._model_id(gpu.model)
                self.gpu_mem_cap[i, j] = gpu.memory_mib
                if gpu.mig_enabled:
                    if gpu.healthy:
                        for inst in gpu.mig_instances:
                            free.setdefault(inst.profile, []).append((j, inst.instance_id))
                    continue
                if gpu.healthy:
                    self.gpu_usable[i, j] = True
                    self.gpu_slots_free[i, j] = self.gpu_slots_cap[i]
                    self.gpu_free_milli[i, j] = GPU_MILLI
                    self.gpu_mem_free[i, j] = gpu.memory_mib
            for insts in free.values():
                insts.sort()  # the order unreserve restores, so reserve+unreserve is exact
            self.mig_free.append(free)
        self.mig_count: dict[str, np.ndarray] = {}
        for i, free in enumerate(self.mig_free):
            for prof, insts in free.items():
                self.mig_count.setdefault(prof, np.zeros(n, dtype=np.int64))[i] = len(insts)
        self.node_model = np.array(
            [self.gpu_model[i, 0] if len(x.gpus) else -1 for i, x in enumerate(nodes)], dtype=np.int32
        )
        self.gpu_milli_cap = self.gpu_usable.sum(axis=1).astype(np.int64) * GPU_MILLI
        # every other scalar resource any node reports (ephemeral-storage, hugepages-*, rdma/*, ...)
        self.scalar_cap: dict[str, np.ndarray] = {}
        for i, node in enumerate(nodes):
            for name, amount in node.scalars:
                self.scalar_cap.setdefault(name, np.zeros(n, dtype=np.int64))[i] = amount
        self.scalar_free = {k: v.copy() for k, v in self.scalar_cap.items()}
        self._topology: dict[str, tuple[np.ndarray, list[str]]] = {}
        self.pod_index = PodIndex(n, self.pod_index.ns_labels)
        self.version = np.zeros(n, dtype=np.int64)
        self.changes: list[int] = []  # see changed_since
        self.epoch = next(_EPOCHS)
        self.pods_on_node = {x.name: set() for x in nodes}
        old = usage or {}
        self.assignments = {}
        self.claim_users = {}
        for a in old.values():
            if a.node in self.index:
                self.reserve(a, overcommit=True)  # held before: kept, even where a resize over-committed the node
        self._hold_applied = {}
        for h in self.claim_holds.values():
            self._apply_hold(h)

    def add_node(self, node: Node) -> None:
        if node.name in self.index:
            self.update_node(node)
            return
        self._rebuild(self.nodes + [node], usage=self.assignments)

    def remove_node(self, name: str) -> list[Assignment]:
        """Drop a node; returns the assignments that were on it (now gone)."""
        if name not in self.index:
            return []
        lost = [a for a in self.assignments.values() if a.node == name]
        keep = {k: a for k, a in self.assignments.items() if a.node != name}
        self._rebuild([x for x in self.nodes if x.name != name], usage=keep)
        return lost

    def update_node(self, node: Node) -> list[Assignment]:
        """Replace a node's spec (labels, taints, GPUs); keeps the pods whose devices are still there.

        Returns the assignments that no longer fit (e.g. a GPU disappeared).
        """
        i = self.index[node.name]
        old = self.nodes[i]
        if old == node:
            return []
        nodes = list(self.nodes)
        nodes[i] = node
        keep = dict(self.assignments)
        on_node = [keep.pop(k) for k in sorted(self.pods_on_node.get(node.name, ()))]
        self._rebuild(nodes, usage=keep)
        lost = []
        for a in on_node:
            try:
                self.reserve(a, overcommit=True)  # only lost devices lose a pod: kubelet keeps running the rest
            except StateError:
                lost.append(a)
        return lost

    # --- the log of version changes -------------------------------------------------
    def _changed(self, i: int) -> None:
        log = self.changes
        log.append(i)
        if len(log) > CHANGE_LOG_SIZE:  # a new log: marks on the old one read as unknown, so their holders look at every node
            self.changes = [i]

    def change_mark(self) -> tuple[list[int], int]:
        """Where the log of version changes stands now, for ``changed_since``."""
        return self.changes, len(self.changes)

    def changed_since(self, mark: tuple[list[int], int] | None) -> list[int] | None:
        """The nodes whose ``version`` moved since ``mark`` (``change_mark``), in order, a node once per move; None
        where that is unknown (no mark, a mark of another state or copy, or the log was renewed since): then look at
        every node.  A cache that refreshes the nodes that changed since it last looked finds them here in the time
        of their number, not of a comparison of every node's version (1,213 to 5,000 a cycle, where one or two moved)."""
        if mark is None or mark[0] is not self.changes:
            return None
        return self.changes[mark[1]:]

    # --- queries ------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.nodes)

    def node_index(self, name: str) -> int:
        return self.index[name]

    def total_gpu_milli(self) -> int:
        return int(self.gpu_milli_cap.sum())

    def allocated_gpu_milli(self) -> int:
        return int((self.gpu_milli_cap - self.gpu_free_milli.sum(axis=1)).sum())

    def mig_free_count(self, profile: str) -> np.ndarray:
        c = self.mig_count.get(profile)
        return c if c is not None else np.zeros(len(self.nodes), dtype=np.int64)

    def topology(self, key: str) -> tuple[np.ndarray, list[str]]:
        """Per-node domain id for a topology key (-1: the node lacks the label), and the domain values."""
        t = self._topology.get(key)
        if t is None:
            ids: dict[str, int] = {}
            dom = np.full(len(self.nodes), -1, dtype=np.int64)
            for i, node in enumerate(self.nodes):
                v = node.labels.get(key)
                if v is not None:
                    dom[i] = ids.setdefault(v, len(ids))
            t = self._topology[key] = (dom, list(ids))
        return t

    def set_namespace_labels(self, labels: dict[str, dict[str, str]]) -> None:
        """Namespace labels, for affinity terms with a namespaceSelector."""
        self.pod_index.set_namespace_labels(labels)

    def copy(self) -> "ClusterState":
        """An independent snapshot for what-if runs (preemption, explain)."""
        c = object.__new__(ClusterState)
        c.__dict__.update(self.__dict__)
        c.token = next(_TOKENS)
        c.changes = []  # its own log: a mark taken on the original is unknown to the copy (changed_since: None)
        for k, v in self.__dict__.items():
            if isinstance(v, np.ndarray):
                setattr(c, k, v.copy())
        c.assignments = dict(self.assignments)
        c.pods_on_node = {k: set(v) for k, v in self.pods_on_node.items()}
        c.mig_free = [{p: list(ids) for p, ids in m.items()} for m in self.mig_free]
        c.mig_count = {p: v.copy() for p, v in self.mig_count.items()}
        c.scalar_free = {k: v.copy() for k, v in self.scalar_free.items()}
        c.pod_index = self.pod_index.copy()
        c.model_names = list(self.model_names)
        c._model_ids = dict(self._model_ids)
        c.claim_holds = dict(self.claim_holds)
        c.claim_users = {k: set(v) for k, v in self.claim_users.items()}
        c._hold_applied = dict(self._hold_applied)
        c.dra = self.dra.copy() if self.dra is not None else None
        return c

    # --- DRA: devices held by ResourceClaims ------------------------------------------
    def hold_claim(self, h: "ClaimHold") -> None:
        """An allocated claim takes its devices: the GPU columns (as far as they are free) and the DRA state.

        Never raises: a claim another scheduler allocated is counted even where this model thought the GPU
        taken (the node side refuses a double allocation); only what was free is taken from the columns, and
        exactly that is given back."""
        if h.key in self.claim_holds:
            self.release_claim(h.key)
        self.claim_holds[h.key] = h
        self._apply_hold(h)
        if self.dra is not None and h.allocation is not None:
            self.dra.allocated.add(h.allocation)

    def _apply_hold(self, h: "ClaimHold") -> None:
        i = self.index.get(h.node) if h.node else None
        if i is None:
            return
        gpus = []
        for j, milli, mem in h.gpus:
            if j >= self.gpu_n[i] or not self.gpu_usable[i, j]:
                continue
            m = min(milli, int(self.gpu_free_milli[i, j]))
            b = min(mem, int(self.gpu_mem_free[i, j]))
            self.gpu_free_milli[i, j] -= m
            self.gpu_mem_free[i, j] -= b
            gpus.append((j, m, b))
        migs = []
        for prof, inst in h.mig:
            free = self.mig_free[i].get(prof)
            if free is not None and inst in free:
                free.remove(inst)
                self.mig_count[prof][i] -= 1
                migs.append((prof, inst))
        self._hold_applied[h.key] = (i, gpus, migs)
        self.version[i] += 1
        self._changed(i)

    def release_claim(self, key: str) -> "ClaimHold | None":
        """A claim was deallocated (or deleted): its devices are free again."""
        h = self.claim_holds.pop(key, None)
        if h is None:
            return None
        applied = self._hold_applied.pop(key, None)
        if applied is not None:
            i, gpus, migs = applied
            for j, m, b in gpus:
                self.gpu_free_milli[i, j] += m
                self.gpu_mem_free[i, j] += b
            for prof, inst in migs:
                free = self.mig_free[i].setdefault(prof, [])
                free.append(inst)
                free.sort()
                self.mig_count.setdefault(prof, np.zeros(len(self.nodes), dtype=np.int64))[i] += 1
            self.version[i] += 1
            self._changed(i)
        if self.dra is not None and h.allocation is not None:
            self.dra.allocated.remove(h.allocation)
        return h

    # --- reserve / unreserve ------------------------------------------------------
    def check(self, a: Assignment, counts: bool = True) -> str | None:
        """Why ``a`` cannot be reserved now, or None if it can.  ``counts=False`` checks devices only (GPUs,
        MIG instances), not cpu, memory, pod slots and scalar resources: a pod kubelet already runs holds those
        even where the node is over-committed (an in-place resize, another scheduler's pods)."""
        if a.pod_key in self.assignments:
            return f"pod {a.pod_key} is already assigned to {self.assignments[a.pod_key].node}"
        i = self.index.get(a.node)
        if i is None:
            return f"node {a.node} does not exist"
        if counts:
            why = self._check_counts(a, i)
            if why:
                return why
        return self._check_devices(a, i)

    def _check_counts(self, a: Assignment, i: int) -> str | None:
        # .item: the value as a Python int (what the comparison needs), without a numpy scalar
        if self.cpu_free.item(i) < a.cpu_milli:
            return f"node {a.node}: cpu {a.cpu_milli}m requested, {self.cpu_free[i]}m free"
        if self.mem_free.item(i) < a.memory_mib:
            return f"node {a.node}: memory {a.memory_mib}Mi requested, {self.mem_free[i]}Mi free"
        if self.pods_free.item(i) < 1:
            return f"node {a.node}: no pod slots left"
        for name, amount in a.scalars:
            sfree = self.scalar_free.get(name)
            have = int(sfree[i]) if sfree is not None else 0
            if have < amount:
                return f"node {a.node}: {name} {amount} requested, {have} free"
        return None

    def _check_devices(self, a: Assignment, i: int) -> str | None:
        if len(set(a.gpu_indices)) != len(a.gpu_indices):
            return "GPU listed twice"
        if a.gpu_memory_mib and len(a.gpu_memory_mib) != len(a.gpu_indices):
            return f"gpu_memory_mib lists {len(a.gpu_memory_mib)} values for {len(a.gpu_indices)} GPUs"
        if len(set(a.mig)) != len(a.mig):
            return "MIG instance listed twice"
        for j, mem in zip(a.gpu_indices, a.gpu_memory_mib or (0,) * len(a.gpu_indices)):
            if j < 0 or j >= self.gpu_n.item(i) or not self.gpu_usable.item(i, j):
                return f"node {a.node}: GPU {j} does not exist or is not usable"
            if self.gpu_free_milli.item(i, j) < a.gpu_milli:
                return f"node {a.node}: GPU {j} has {self.gpu_free_milli[i, j]} milli free, {a.gpu_milli} requested"
            mem_free = self.gpu_mem_free.item(i, j)
            if mem_free < mem:
                return f"node {a.node}: GPU {j} has {self.gpu_mem_free[i, j]} MiB free, {mem} requested"
            if a.gpu_milli >= GPU_MILLI and mem_free != self.gpu_mem_cap.item(i, j):
                return f"node {a.node}: GPU {j} is partly used, a whole GPU was requested"
            if self.gpu_slots_free.item(i, j) < 1:
                return (f"node {a.node}: GPU {j} has no kubelet device left "
                        f"({self.gpu_slots_cap[i]} per GPU, one per pod on it)")
        free = self.mig_free[i].get(a.mig_profile or "", [])
        for inst in a.mig:
            if inst not in free:
                return f"node {a.node}: MIG instance {inst} ({a.mig_profile}) is not free"
        return None

    def reserve(self, a: Assignment, overcommit: bool = False) -> None:
        """Take the assignment's resources; raises StateError rather than double-book.  ``overcommit``: a
        running pod's cpu, memory, pod slot and scalars are counted even beyond what is free (see ``check``)."""
        why = self.check(a, counts=not overcommit)
        if why:
            raise StateError(why)
        i = self.index[a.node]
        if a.gpu_indices:
            # a whole GPU always takes all of its memory, whatever the assignment lists (check: one value per GPU, or none)
            if a.gpu_milli >= GPU_MILLI:
                mems = tuple(self.gpu_mem_cap[i].take(a.gpu_indices).tolist())
            else:
                mems = a.gpu_memory_mib or (0,) * len(a.gpu_indices)
            if mems != a.gpu_memory_mib:
                a = replace(a, gpu_memory_mib=mems)
        cpu, mem_free = self.cpu_free, self.mem_free  # (Python ints by .item, as ``unreserve``)
        cpu[i] = cpu.item(i) - a.cpu_milli
        mem_free[i] = mem_free.item(i) - a.memory_mib
        pods = self.pods_free.item(i)
        self.pods_free[i] = pods - 1
        if pods == 1:  # its last slot (overcommit may take it below 0: counted once, at 1 -> 0)
            self.pods_short += 1
        if a.gpu_indices:
            self.gpu_dev_free[i] -= len(a.gpu_indices)
            milli, g_milli, g_mem, g_slots = a.gpu_milli, self.gpu_free_milli, self.gpu_mem_free, self.gpu_slots_free
            for j, mem in zip(a.gpu_indices, a.gpu_memory_mib):
                g_milli[i, j] = g_milli.item(i, j) - milli
                g_mem[i, j] = g_mem.item(i, j) - mem
                g_slots[i, j] = g_slots.item(i, j) - 1
        if a.mig and a.mig_profile is not None:
            free = self.mig_free[i][a.mig_profile]
            for inst in a.mig:
                free.remove(inst)
            self.mig_count[a.mig_profile][i] -= len(a.mig)
        for name, amount in a.scalars:
            self.scalar_free[name][i] -= amount
        if a.terms is not None:
            self.pod_index.add(a.pod_key, a.terms, i)
        self.version[i] = self.version.item(i) + 1
        self._changed(i)
        self.assignments[a.pod_key] = a
        self.pods_on_node[a.node].add(a.pod_key)
        for c in a.claims:
            self.claim_users.setdefault(c, set()).add(a.pod_key)

    def unreserve(self, pod_key: str) -> Assignment | None:
        """Give back a pod's resources; returns its assignment (None if unknown)."""
        a = self.assignments.pop(pod_key, None)
        if a is None:
            return None
        i = self.index[a.node]
        # each element read as a Python int (.item) and written back: ``x[i] += n`` reads a numpy scalar and adds
        # numpy scalars, about a third dearer (a replay gives back every pod it placed)
        cpu, mem_free = self.cpu_free, self.mem_free
        cpu[i] = cpu.item(i) + a.cpu_milli
        mem_free[i] = mem_free.item(i) + a.memory_mib
        pods = self.pods_free.item(i)
        self.pods_free[i] = pods + 1
        if pods == 0:
            self.pods_short -= 1
        if a.gpu_indices:
            self.gpu_dev_free[i] += len(a.gpu_indices)
            milli, g_milli, g_mem, g_slots = a.gpu_milli, self.gpu_free_milli, self.gpu_mem_free, self.gpu_slots_free
            for j, mem in zip(a.gpu_indices, a.gpu_memory_mib):
                g_milli[i, j] = g_milli.item(i, j) + milli
                g_mem[i, j] = g_mem.item(i, j) + mem
                g_slots[i, j] = g_slots.item(i, j) + 1
        if a.mig:
            free = self.mig_free[i].setdefault(a.mig_profile or "", [])
            free.extend(a.mig)
            free.sort()
            self.mig_count[a.mig_profile or ""][i] += len(a.mig)
        for name, amount in a.scalars:
            self.scalar_free[name][i] += amount
        if a.terms is not None:
            self.pod_index.remove(pod_key)
        self.version[i] = self.version.item(i) + 1
        self._changed(i)
        self.pods_on_node[a.node].discard(pod_key)
        for c in a.claims:
            users = self.claim_users.get(c)
            if users is not None:
                users.discard(pod_key)
                if not users:
                    del self.claim_users[c]
        return a

    def resize(self, pod_key: str, cpu_milli: int, memory_mib: int, scalars: tuple[tuple[str, int], ...]) -> bool:
        """A running pod now holds other cpu, memory or scalar amounts (in-place resize): counted as given, even
        beyond what is free, so nothing else is placed into room the pod may take.  False if it holds nothing."""
        a = self.assignments.get(pod_key)
        if a is None:
            return False
        i = self.index[a.node]
        self.cpu_free[i] += a.cpu_milli - cpu_milli
        self.mem_free[i] += a.memory_mib - memory_mib
        for name, amount in a.scalars:
            self.scalar_free[name][i] += amount
        kept = tuple((n, v) for n, v in scalars if n in self.scalar_free)
        for name, amount in kept:
            self.scalar_free[name][i] -= amount
        self.assignments[pod_key] = replace(a, cpu_milli=cpu_milli, memory_mib=memory_mib, scalars=kept)
        self.version[i] += 1
        self._changed(i)
        return True

    @contextmanager
    def transaction(self) -> Iterator["Transaction"]:
        """Tentative reservations that commit together or roll back (gangs, preemption)."""
        tx = Transaction(self)
        try:
            yield tx
        except BaseException:
            tx.rollback()
            raise
        if not tx.committed:
            tx.rollback()


class Transaction:
    def __init__(self, state: ClusterState):
        self.state = state
        self.reserved: list[str] = []
        self.removed: list[Assignment] = []
        self.released: list[ClaimHold] = []  # claims whose last user this transaction evicted
        self.committed = False

    def reserve(self, a: Assignment) -> None:
        self.state.reserve(a)
        self.reserved.append(a.pod_key)

    def evict(self, pod_key: str) -> Assignment | None:
        a = self.state.unreserve(pod_key)
        if a is not None:
            if pod_key in self.reserved:  # reserved inside this transaction: nothing left to undo
                self.reserved.remove(pod_key)
            else:
                self.removed.append(a)
            for c in a.claims:  # a claim nobody uses any more is deallocated (the resourceclaim controller does it)
                if c not in self.state.claim_users:
                    h = self.state.release_claim(c)
                    if h is not None:
                        self.released.append(h)
        return a

    def commit(self) -> None:
        self.committed = True

    def rollback(self) -> None:
        if self.committed:
            return
        for k in reversed(self.reserved):
            self.state.unreserve(k)
        for h in reversed(self.released):
            self.state.hold_claim(h)
        for a in reversed(self.removed):
            self.state.reserve(a, overcommit=True)
        self.reserved.clear()
        self.removed.clear()
        self.released.clear()
