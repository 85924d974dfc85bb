"""The scheduling engine: cluster model, pod requests, plugin framework.

Pure Python + numpy.  No Kubernetes client, no gRPC, no NVML, no I/O: the
engine decides from a snapshot, and adapters at the edges feed it.  An
import-linter contract in ``pyproject.toml`` (checked by a test) keeps it so.
"""
