"""Kubernetes label selectors (``metav1.LabelSelector``): one type, one parser, one matcher.

Why one module: PodDisruptionBudgets, inter-pod affinity, topology spread, Queue
namespace selectors and the reclaim tool all select pods or namespaces by label,
and three copies of the matching rules used to drift apart (one rejected
``matchExpressions`` outright, so a budget written that way protected nothing).
Every selector in gpufleet is parsed here, once, at the edge, and matched here.

Semantics follow ``k8s.io/apimachinery/pkg/labels``: ``matchLabels`` and every
``matchExpressions`` requirement are ANDed; ``In`` needs the key with one of the
values, ``NotIn`` is also true when the key is absent, ``Exists`` /
``DoesNotExist`` test the key alone.  An empty selector (``{}``) matches every
object; a missing (null) selector matches none -- callers keep that as ``None``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from .model import Requirement

LABEL_OPERATORS = ("In", "NotIn", "Exists", "DoesNotExist")

# builds the caller's error from (field path, message): InvalidPodSpec for pods, ConfigError for objects
ErrorFactory = Callable[[str, str], Exception]


@dataclass(frozen=True)
class LabelSelector:
    """``metav1.LabelSelector``: matchLabels AND matchExpressions; empty matches all."""

    match_labels: tuple[tuple[str, str], ...] = ()
    match_expressions: tuple[Requirement, ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        for k, v in self.match_labels:
            if labels.get(k) != v:
                return False
        for r in self.match_expressions:
            if not r.matches(labels.get(r.key)):
                return False
        return True

    @property
    def empty(self) -> bool:
        return not self.match_labels and not self.match_expressions

    def __str__(self) -> str:
        """kubectl's form: ``app=db,tier in (a,b),!legacy``; ``<all>`` for the empty selector."""
        parts = [f"{k}={v}" for k, v in self.match_labels]
        for r in self.match_expressions:
            if r.operator == "In":
                parts.append(f"{r.key} in ({','.join(r.values)})")
            elif r.operator == "NotIn":
                parts.append(f"{r.key} notin ({','.join(r.values)})")
            elif r.operator == "Exists":
                parts.append(r.key)
            else:
                parts.append(f"!{r.key}")
        return ",".join(parts) or "<all>"


EVERYTHING = LabelSelector()


def selects(selector: LabelSelector | None, labels: Mapping[str, str]) -> bool:
    """Whether an optional selector selects these labels (None, a null selector, selects nothing)."""
    return selector is not None and selector.matches(labels)


def parse_label_selector(raw: Any, path: str, error: ErrorFactory) -> LabelSelector | None:
    """A ``metav1.LabelSelector`` at ``path`` of some object; None when absent (null: matches nothing).

    ``error(field, message)`` builds the exception raised for a bad value, so the caller's
    error names its own object: ``InvalidPodSpec`` for a pod, ``ConfigError`` for a budget.
    The checks are the API server's: known operators, values for In/NotIn and none for
    Exists/DoesNotExist, string label values.
    """
    if raw is None:
        return None
    if not isinstance(raw, Mapping):
        raise error(path, "must be an object")
    unknown = sorted(str(k) for k in raw if k not in ("matchLabels", "matchExpressions"))
    if unknown:
        raise error(f"{path}.{unknown[0]}", "unknown field; a label selector has matchLabels and matchExpressions")
    ml = raw.get("matchLabels")
    if ml is None:
        ml = {}
    if not isinstance(ml, Mapping):
        raise error(f"{path}.matchLabels", "must be an object")
    labels = []
    for k, v in ml.items():
        if not isinstance(k, str) or not k:
            raise error(f"{path}.matchLabels", f"keys must be non-empty strings, got {k!r}")
        if not isinstance(v, str):
            raise error(f"{path}.matchLabels[{k}]", f"must be a string, got {v!r}")
        labels.append((k, v))
    me = raw.get("matchExpressions")
    if me is None:
        me = []
    if not isinstance(me, list):
        raise error(f"{path}.matchExpressions", "must be a list")
    exprs = []
    for i, e in enumerate(me):
        p = f"{path}.matchExpressions[{i}]"
        if not isinstance(e, Mapping):
            raise error(p, "must be an object")
        op = e.get("operator")
        if op not in LABEL_OPERATORS:
            raise error(f"{p}.operator", f"unknown operator {op!r}; known: {', '.join(LABEL_OPERATORS)}")
        key = e.get("key")
        if not isinstance(key, str) or not key:
            raise error(f"{p}.key", "must be a non-empty string")
        vals = e.get("values")
        if vals is None:
            vals = []
        if not isinstance(vals, list):
            raise error(f"{p}.values", "must be a list")
        if not all(isinstance(v, str) for v in vals):
            raise error(f"{p}.values", f"must be strings, got {vals!r}")
        if op in ("In", "NotIn") and not vals:
            raise error(f"{p}.values", f"operator {op} needs at least one value")
        if op in ("Exists", "DoesNotExist") and vals:
            raise error(f"{p}.values", f"operator {op} takes no values")
        exprs.append(Requirement(key, op, tuple(vals)))
    return LabelSelector(tuple(sorted(labels)), tuple(exprs))


def with_label_keys(sel: LabelSelector | None, labels: Mapping[str, str], match: tuple[str, ...],
                    mismatch: tuple[str, ...] = ()) -> LabelSelector | None:
    """``matchLabelKeys`` / ``mismatchLabelKeys`` folded in with the pod's own values (kube-apiserver >= 1.29)."""
    if sel is None or not (match or mismatch):
        return sel
    extra = [Requirement(k, "In", (labels[k],)) for k in match if k in labels]
    extra += [Requirement(k, "NotIn", (labels[k],)) for k in mismatch if k in labels]
    return LabelSelector(sel.match_labels, sel.match_expressions + tuple(extra))


__all__ = ["EVERYTHING", "LABEL_OPERATORS", "LabelSelector", "parse_label_selector", "selects", "with_label_keys"]
