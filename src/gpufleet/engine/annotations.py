"""Names of the ``gpufleet.io/`` annotations and labels, in one place.

Pods ask for fractional GPUs and pick queues through these; the scheduler
writes its GPU assignment through ``ASSIGNMENT``; the node agent publishes its
inventory through ``INVENTORY``.  A pod annotation under the prefix that is not
listed here is rejected, so a typo is an error rather than a silent no-op.
"""

PREFIX = "gpufleet.io/"

GPU_MILLI = PREFIX + "gpu-milli"  # share of one GPU, 1..1000
GPU_MEMORY = PREFIX + "gpu-memory"  # GPU memory per GPU, a quantity ("10Gi")
GPU_MODELS = PREFIX + "gpu-models"  # comma-separated allow list
GPU_MODELS_DENY = PREFIX + "gpu-models-deny"  # comma-separated deny list
QUEUE = PREFIX + "queue"
POD_GROUP = PREFIX + "pod-group"
POD_GROUP_MIN = PREFIX + "pod-group-min-member"
RECLAIM_OPT_OUT = PREFIX + "reclaim-opt-out"
SPOT = PREFIX + "spot"  # prefer | allow | never: may the pod run on spot nodes (engine.capacity)
RECREATE_ON_REFUSAL = PREFIX + "recreate-on-refusal"  # "false": a bare pod kubelet refused is not re-created (kube/plugin_down)

# written by gpufleet itself
ASSIGNMENT = PREFIX + "assignment"  # JSON: node, gpu indices/uuids, share
INVENTORY = PREFIX + "gpu-inventory"  # node annotation by the agent, JSON
IDLE_WARNING = PREFIX + "idle-warning"
MOVED_FROM = PREFIX + "moved-from"  # JSON: the pod a replacement replaces, moved off a node with an interruption notice
EXTENDER_RETRY = PREFIX + "extender-retry"  # time the extender asked kube-scheduler to retry a pod it had parked
PLUGIN_REGISTERED = PREFIX + "device-plugin-registered"  # node annotation by the agent: when it last registered (RFC 3339)
ROUTED_BY = PREFIX + "routed-by"  # deploy/admission's policy sent the pod to gpufleet (no silent GPU sharing)

POD_INPUT_ANNOTATIONS = frozenset(
    {GPU_MILLI, GPU_MEMORY, GPU_MODELS, GPU_MODELS_DENY, QUEUE, POD_GROUP, POD_GROUP_MIN, RECLAIM_OPT_OUT, SPOT,
     RECREATE_ON_REFUSAL}
)
POD_OUTPUT_ANNOTATIONS = frozenset({ASSIGNMENT, IDLE_WARNING, MOVED_FROM, EXTENDER_RETRY, ROUTED_BY})

# not an annotation: the words the agent puts in its refusal of a pod gpufleet placed on a GPU kubelet had already given
# to another scheduler's pod (agent/plugin), by which the scheduler knows to place that pod again (kube/plugin_down)
RACED_REFUSAL = "two schedulers raced for it"
# and in its refusal of another scheduler's pod that kubelet gave a GPU another pod uses (the node guard)
GUARD_REFUSAL = "kubelet picked a GPU another pod uses"
