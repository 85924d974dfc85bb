"""The engine's built-in plugins, one module per plugin (kube-scheduler's layout); ``_common`` holds what they share.

``DEFAULT_FILTERS`` is the filter list of a profile that names none: kube-scheduler's filters, then ``GpuFit``.
"""

DEFAULT_FILTERS = ("NodeUnschedulable", "NodeAffinity", "TaintToleration", "NodeDeclaredFeatures", "NodeResourcesFit",
                   "NodePorts", "VolumeBinding", "NodeVolumeLimits", "InterPodAffinity", "PodTopologySpread", "GpuFit")
