"""gpufleet: GPU scheduling and resource management for Kubernetes.

One pure engine (``gpufleet.engine`` and ``gpufleet.policies``) decides; the
adapters around it (``kube``, ``simulator``, ``agent``, ``cli``) feed it and
carry out its decisions.  Everything a simulation reports therefore speaks for
the live scheduler too.
"""

__version__ = "0.1.0"
