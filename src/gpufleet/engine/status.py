"""A closed status type with reasons, and Kubernetes-style aggregation.

One diagnosis feeds three consumers unchanged: Kubernetes ``FailedScheduling``
events, ``gpufleet explain`` and simulator reports.  The aggregate message
follows kube-scheduler's form: ``0/1213 nodes are available: 900 Insufficient
GPU milli, 313 node(s) had untolerated taint {gpu: true}.``
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

from .model import quick_frozen_init


class Code(Enum):
    SUCCESS = "success"
    UNSCHEDULABLE = "unschedulable"  # may fit later (resources free up, preemption)
    UNRESOLVABLE = "unresolvable"  # cannot fit as the cluster is (bad request, no such node)
    WAIT = "wait"  # held back on purpose (quota, gang not complete)
    ERROR = "error"  # a fault: bind failed, API error


@quick_frozen_init  # a refused pod's status is made on every refusal
@dataclass(frozen=True)
class Status:
    code: Code = Code.SUCCESS
    reasons: tuple[str, ...] = ()
    plugin: str = ""

    @property
    def ok(self) -> bool:
        return self.code is Code.SUCCESS

    @property
    def message(self) -> str:
        text = "; ".join(self.reasons)
        return f"{self.code.value}: {text}" if text else self.code.value

    def __str__(self) -> str:
        return self.message

    @staticmethod
    def success() -> "Status":
        return _SUCCESS

    @staticmethod
    def unschedulable(*reasons: str, plugin: str = "") -> "Status":
        return Status(Code.UNSCHEDULABLE, tuple(reasons), plugin)

    @staticmethod
    def unresolvable(*reasons: str, plugin: str = "") -> "Status":
        return Status(Code.UNRESOLVABLE, tuple(reasons), plugin)

    @staticmethod
    def wait(*reasons: str, plugin: str = "") -> "Status":
        return Status(Code.WAIT, tuple(reasons), plugin)

    @staticmethod
    def error(*reasons: str, plugin: str = "") -> "Status":
        return Status(Code.ERROR, tuple(reasons), plugin)


_SUCCESS = Status()


@dataclass
class Diagnosis:
    """Why no node fits: count of nodes per first failing reason."""

    total_nodes: int
    counts: dict[str, int] = field(default_factory=dict)
    by_node: dict[str, str] = field(default_factory=dict)  # filled for explain only
    plugins: tuple[str, ...] = ()  # the filter plugins that turned nodes away

    def message(self) -> str:
        if self.total_nodes == 0:
            return "0/0 nodes are available: no nodes in the cluster."
        parts = sorted(self.counts.items(), key=lambda kv: (-kv[1], kv[0]))
        detail = ", ".join(f"{n} {r}" for r, n in parts)
        return f"0/{self.total_nodes} nodes are available: {detail}."

    def status(self) -> Status:
        return Status.unschedulable(self.message())
