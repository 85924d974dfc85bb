"""Node agent: NVML discovery, the kubelet device plugin, GPU Feature Discovery labels, health.

Runs as a DaemonSet on every GPU node (``gpufleet agent``).  GPUs are read
through NVML; a fake backend with realistic profiles stands in where there is
no GPU (tests, laptops) and is only ever used when asked for explicitly.
"""
