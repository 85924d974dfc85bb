"""Team queues: quotas with borrowing, fair share by dominant resource, reclaim.

Why: a shared cluster needs each team to have a guaranteed share (its
*nominal quota*), the right to use what others leave idle (*borrowing*, up to
an optional *borrowing limit*), a fair order among teams that all want more
(weighted dominant resource fairness), and a way to get guaranteed quota back
(*reclaim*: preempt borrowed pods, lowest priority and youngest first).  The
model is Kueue's cohort: all root queues together form one pool of quota.

Usage is counted from the assignments in ``ClusterState`` -- the single source
of truth, so it survives restarts like everything else -- and kept up to date
incrementally.  Admission is a plugin (``QueueQuota``, in ``engine/plugins``) at PreFilter (fast,
from the request) and at Reserve (exact, from the chosen devices: a whole GPU
takes its whole memory).

Resources: ``gpu_milli`` (1000 per whole GPU), ``gpu_memory_mib``,
``cpu_milli``, ``memory_mib`` and ``mig:<profile>`` instance counts.  A
resource no queue on the path sets a quota for is not limited.

Hierarchy: a queue may name a parent.  A parent's usage is the sum of its
children's; a parent with no quota of its own for a resource has the sum of its
children's.  A pod must fit every queue on its path within quota + borrowing
limit; past its own quota it borrows from the lowest ancestor that still has
idle quota, and at the top from the pool of all root queues.
"""

from .spec import (PLUGIN, RESOURCES, NamespaceQueues, Queue, Vector, add_vector, fmt_amount, load_queues, namespace_queue,
                   parse_resources, request_vector, resource_label)
from .tree import QueueTree, ReclaimPlan, apply_reclaim

__all__ = ["PLUGIN", "RESOURCES", "NamespaceQueues", "Queue", "QueueTree", "ReclaimPlan", "Vector", "add_vector",
           "apply_reclaim", "fmt_amount", "load_queues", "namespace_queue", "parse_resources", "request_vector",
           "resource_label"]
