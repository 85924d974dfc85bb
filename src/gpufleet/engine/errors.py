"""Typed errors for bad input.

Every error names the object and the field so that the same text can go into a
Kubernetes event, a CLI message or a simulator report unchanged.
"""

from __future__ import annotations


class GpufleetError(Exception):
    """Base class of every error gpufleet raises on purpose: bad input, so the CLI exits ``exit_code`` 2."""

    exit_code = 2

    def __reduce__(self):  # subclasses take their own __init__ arguments: pickle text + attributes instead,
        return _rebuild, (type(self), str(self), dict(self.__dict__))  # so an error in a worker process comes back


def _rebuild(cls: type[GpufleetError], text: str, state: dict) -> GpufleetError:
    exc = cls.__new__(cls)
    Exception.__init__(exc, text)
    exc.__dict__.update(state)
    return exc


class InvalidPodSpec(GpufleetError):
    """A pod's spec or annotations cannot be turned into a request."""

    def __init__(self, pod: str, field: str, message: str):
        self.pod = pod
        self.field = field
        self.message = message
        super().__init__(f"pod {pod}: field {field}: {message}")


class InvalidQuantity(GpufleetError):
    """A Kubernetes resource quantity string is malformed."""

    def __init__(self, value: object, message: str = "not a valid Kubernetes quantity"):
        self.value = value
        super().__init__(f"{value!r}: {message}")


class ConfigError(GpufleetError):
    """The scheduler profile configuration is wrong; raised at start-up."""


class InvalidNodeSpec(GpufleetError):
    """A node (or its GPU inventory) cannot be modelled."""

    def __init__(self, node: str, field: str, message: str):
        self.node = node
        self.field = field
        super().__init__(f"node {node}: field {field}: {message}")


class StateError(GpufleetError):
    """An operation would break the cluster state's invariants (double-booking)."""


class UsageError(GpufleetError):
    """Bad usage or input found by a command (a flag's value, a file it names): the CLI exits 2."""


class RuntimeFailure(GpufleetError):
    """Something outside gpufleet failed at run time (cluster or Prometheus unreachable, an API error):
    the CLI exits 1, where every other GpufleetError (bad input) exits 2."""

    exit_code = 1
