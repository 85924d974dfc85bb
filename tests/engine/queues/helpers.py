"""Small clusters and pods for the queue, gang and preemption tests."""

from __future__ import annotations

from gpufleet.engine.framework import Scheduler
from gpufleet.engine.model import PodRequest
from gpufleet.engine.plugins.queuequota import QueueQuota
from gpufleet.engine.queues import QueueTree, request_vector
from gpufleet.engine.state import ClusterState
from gpufleet.policies import build_profile

from ..builders import gpu_node


def cluster(n_nodes=2, gpus=4, queues=None, nodes=None, policy="bestfit"):
    """(state, scheduler, tree): bestfit packing; QueueQuota at PreFilter and Reserve when queues are given."""
    state = ClusterState(nodes if nodes is not None else
                         [gpu_node(f"n{i}", gpus, cpu_milli=64_000, mem_mib=512_000) for i in range(n_nodes)])
    prof = build_profile(policy)
    tree = None
    if queues is not None:
        tree = QueueTree(queues, state)
        qq = QueueQuota(tree)
        prof.pre_filters = [qq] + list(prof.pre_filters)
        prof.reserves = [qq] + list(prof.reserves)
    return state, Scheduler(prof, state, seed=0), tree


def gpu_pod(name, n=1, queue=None, prio=0, group=None, group_min=0, milli=1000, ns="default", labels=()):
    return PodRequest(name=name, namespace=ns, cpu_milli=1000, memory_mib=1024, gpu_count=n, gpu_milli=milli,
                      queue=queue, priority=prio, pod_group=group, pod_group_min=group_min, labels=tuple(labels))


def brute_usage(state, tree):
    """Usage per queue recomputed from scratch (to check the incremental accounting)."""
    out = {n: {} for n in tree.queues}
    for a in state.assignments.values():
        if a.queue in tree.queues:
            for q in tree.path(a.queue):
                for k, v in request_vector(a).items():
                    if v:
                        out[q][k] = out[q].get(k, 0) + v
    return out
