"""Typed plugin arguments, checked once at start-up (kube-scheduler's ``<Plugin>Args`` with their validation).

Why: a plugin's ``pluginConfig`` is user input.  Each plugin that takes arguments declares them as a frozen
dataclass of ``PluginArgs``: every field has a type (bool, int or float), a default and a range
(``arg(default, lo, hi)``); ``from_config`` turns a ``pluginConfig`` mapping into it or raises a
``ConfigError`` naming the plugin and the field ("plugin 'CpuReserve': cpu_reserve must be a number >= 0,
got -1").  The plugin reads its arguments from one typed object instead of loose attributes.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import MISSING, Field, dataclass, field, fields
from typing import Any, TypeVar

from .errors import ConfigError

A = TypeVar("A", bound="PluginArgs")


def arg(default: bool | int | float, lo: float = 0, hi: float = math.inf) -> Any:
    """A plugin argument: its default and, for numbers, its range [lo, hi]."""
    return field(default=default, metadata={"range": (lo, hi)})


@dataclass(frozen=True)
class PluginArgs:
    """Base of a plugin's arguments; subclasses are frozen dataclasses whose fields are ``arg(...)``s."""

    @classmethod
    def from_config(cls: type[A], plugin: str, cfg: Mapping[str, Any] | None) -> A:
        cfg = dict(cfg or {})
        if not isinstance(cfg, dict):
            raise ConfigError(f"plugin {plugin!r}: pluginConfig must be a mapping, got {cfg!r}")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(cfg) - known)
        if unknown:
            raise ConfigError(f"plugin {plugin!r}: unknown argument(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
        args = cls(**cfg)
        args.check(plugin)
        return args

    def check(self, plugin: str) -> None:
        """Every field of the right type and in its range, or a ConfigError naming the plugin and the field."""
        for f in fields(self):
            _check(plugin, f, getattr(self, f.name))


def _check(plugin: str, f: Field, v: Any) -> None:
    default = f.default
    if default is MISSING:
        return
    if isinstance(default, bool):
        if not isinstance(v, bool):
            raise ConfigError(f"plugin {plugin!r}: {f.name} must be true or false, got {v!r}")
        return
    lo, hi = f.metadata.get("range", (0, math.inf))
    whole = isinstance(default, int)
    if isinstance(v, bool) or not isinstance(v, int if whole else (int, float)) or not lo <= v <= hi:
        what = f"an integer >= {lo}" if whole else (f"a number in [{float(lo)}, {float(hi)}]" if hi < math.inf else f"a number >= {lo}")
        raise ConfigError(f"plugin {plugin!r}: {f.name} must be {what}, got {v!r}")


__all__ = ["PluginArgs", "arg"]
