"""Plugins by name: a registry, and profiles built from a YAML/dict config.

A profile names its plugins per extension point and weights its scores::

    profiles:
      - name: default
        plugins:
          filter: [NodeUnschedulable, NodeAffinity, TaintToleration, NodeResourcesFit, GpuFit]
          score:
            - {name: FGD, weight: 1}
          gpuSelect: FGD
        pluginConfig:                  # or kube-scheduler's form: [{name: FGD, args: {}}]
          FGD: {}

Everything is checked at start-up: an unknown plugin, a plugin placed at an
extension point it does not implement, a weight that is not a positive integer,
an unknown key -- each is a ``ConfigError`` that says where.

Plugins of one profile may share a component (kube-scheduler's framework handle): a component is
registered by name like a plugin (``register_shared``), takes its own ``pluginConfig`` entry, is
placed at no extension point, and is made once per profile; a plugin factory that takes a ``handle``
keyword gets a ``ProfileHandle`` and asks it for the component (``handle.shared(name)``).  The
default policy's plugins share the workload they learn this way.
"""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any, Callable, Mapping

import yaml

from .errors import ConfigError
from .framework import EXTENSION_POINTS, Profile
from .plugins import DEFAULT_FILTERS

Factory = Callable[..., object]


class ProfileHandle:
    """What a profile's plugins share: its components by name, each made once (from its ``pluginConfig``)."""

    def __init__(self, registry: Registry, config: Mapping[str, Any] | None = None) -> None:
        self.registry = registry
        self.config = config or {}
        self._made: dict[str, object] = {}

    def shared(self, name: str) -> Any:
        if name not in self._made:
            if name not in self.registry._shared:
                raise ConfigError(f"unknown shared component {name!r}")
            self._made[name] = self.registry.create(name, self.config.get(name), self)
        return self._made[name]


class Registry:
    def __init__(self) -> None:
        self._factories: dict[str, Factory] = {}
        self._wants_handle: set[str] = set()
        self._shared: set[str] = set()

    def register(self, name: str, factory: Factory) -> None:
        if name in self._factories:
            raise ConfigError(f"plugin {name!r} registered twice")
        self._factories[name] = factory
        try:
            if "handle" in inspect.signature(factory).parameters:
                self._wants_handle.add(name)
        except (TypeError, ValueError):  # a builtin without a signature: takes no handle
            pass

    def register_shared(self, name: str, factory: Factory) -> None:
        """A component the plugins of a profile share (see the module docstring); not a plugin."""
        self.register(name, factory)
        self._shared.add(name)

    def names(self) -> list[str]:
        """Plugin names (shared components left out)."""
        return sorted(set(self._factories) - self._shared)

    def create(self, name: str, args: Mapping[str, Any] | None = None, handle: ProfileHandle | None = None) -> object:
        """A plugin (or component) from its arguments; ``handle``: the profile's (a fresh one when None)."""
        if name not in self._factories:
            raise ConfigError(f"unknown plugin {name!r}; known plugins: {', '.join(self.names())}")
        kw = dict(args or {})
        if name in self._wants_handle:
            kw["handle"] = handle if handle is not None else ProfileHandle(self)
        try:
            return self._factories[name](**kw)
        except TypeError as exc:
            raise ConfigError(f"plugin {name!r}: bad pluginConfig: {exc}") from None

    def build_profile(self, cfg: Mapping[str, Any]) -> Profile:
        if not isinstance(cfg, Mapping):
            raise ConfigError("a profile must be a mapping")
        unknown = set(cfg) - {"name", "plugins", "pluginConfig", "tieBreak"}
        if unknown:
            raise ConfigError(f"profile: unknown key(s) {sorted(unknown)}")
        pname = cfg.get("name") or "default"
        plugins = cfg.get("plugins") or {}
        pconf = _plugin_config(cfg.get("pluginConfig"), pname)
        bad_points = set(plugins) - set(EXTENSION_POINTS)
        if bad_points:
            raise ConfigError(f"profile {pname!r}: unknown extension point(s) {sorted(bad_points)}; known: {sorted(EXTENSION_POINTS)}")
        instances: dict[str, object] = {}
        handle = ProfileHandle(self, pconf)

        def get(name: Any, point: str) -> object:
            if not isinstance(name, str):
                raise ConfigError(f"profile {pname!r}: {point}: plugin name must be a string, got {name!r}")
            if name in self._shared:
                raise ConfigError(f"profile {pname!r}: {point}: {name!r} is a component the plugins share, not a plugin")
            if name not in instances:
                instances[name] = self.create(name, pconf.get(name), handle)
            p = instances[name]
            if not isinstance(p, EXTENSION_POINTS[point]):
                raise ConfigError(f"profile {pname!r}: plugin {name!r} does not implement the {point} extension point")
            return p

        for n in pconf:
            if n not in self._factories:
                raise ConfigError(f"profile {pname!r}: pluginConfig for unknown plugin {n!r}")
        prof = Profile(name=pname)
        tb = cfg.get("tieBreak", "random")
        if tb not in ("random", "ordered"):
            raise ConfigError(f"profile {pname!r}: tieBreak must be 'random' or 'ordered', got {tb!r}")
        prof.tie_break = tb
        prof.pre_filters = [get(n, "preFilter") for n in _names(plugins.get("preFilter"), pname, "preFilter")]  # type: ignore[misc]
        flt = plugins.get("filter", list(DEFAULT_FILTERS))
        prof.filters = [get(n, "filter") for n in _names(flt, pname, "filter")]  # type: ignore[misc]
        for entry in plugins.get("score") or []:
            if isinstance(entry, str):
                name, weight = entry, 1
            elif isinstance(entry, Mapping):
                extra = set(entry) - {"name", "weight"}
                if extra:
                    raise ConfigError(f"profile {pname!r}: score entry {entry!r}: unknown key(s) {sorted(extra)}")
                raw_name, weight = entry.get("name"), entry.get("weight", 1)
                if not isinstance(raw_name, str):
                    raise ConfigError(f"profile {pname!r}: score entry {entry!r}: 'name' must be a plugin name")
                name = raw_name
            else:
                raise ConfigError(f"profile {pname!r}: score entry must be a name or {{name, weight}}, got {entry!r}")
            if not isinstance(weight, int) or isinstance(weight, bool) or weight <= 0:
                raise ConfigError(f"profile {pname!r}: score plugin {name!r}: weight must be a positive integer, got {weight!r}")
            prof.scores.append((get(name, "score"), weight))  # type: ignore[arg-type]
        sel = plugins.get("gpuSelect", "BestFitGpu")
        prof.gpu_selector = get(sel, "gpuSelect")  # type: ignore[assignment]
        prof.reserves = [get(n, "reserve") for n in _names(plugins.get("reserve"), pname, "reserve")]  # type: ignore[misc]
        for n in pconf:  # a component's arguments are checked even where no plugin of this profile uses it
            if n in self._shared:
                handle.shared(n)
        return prof


def _plugin_config(v: Any, pname: str) -> dict[str, Any]:
    """``pluginConfig`` as plugin name -> arguments, from gpufleet's mapping (``{CpuReserve: {cpu_reserve: 0}}``)
    or kube-scheduler's list (``[{name: CpuReserve, args: {cpu_reserve: 0}}]``)."""
    if v is None:
        return {}
    if isinstance(v, Mapping):
        out = dict(v)
    elif isinstance(v, list):
        out = {}
        for i, e in enumerate(v):
            where = f"profile {pname!r}: pluginConfig[{i}]"
            if not isinstance(e, Mapping) or not isinstance(e.get("name"), str):
                raise ConfigError(f"{where}: must be {{name: PLUGIN, args: {{...}}}}, got {e!r}")
            extra = set(e) - {"name", "args"}
            if extra:
                raise ConfigError(f"{where}: unknown key(s) {sorted(extra)}; known: args, name")
            if e["name"] in out:
                raise ConfigError(f"{where}: {e['name']!r} is configured twice")
            out[e["name"]] = e.get("args")
    else:
        raise ConfigError(f"profile {pname!r}: pluginConfig must be a mapping of plugin names to arguments or a list of "
                          f"{{name, args}}, got {v!r}")
    for name, args in out.items():
        if not isinstance(name, str):
            raise ConfigError(f"profile {pname!r}: pluginConfig: plugin name must be a string, got {name!r}")
        if args is not None and not isinstance(args, Mapping):
            raise ConfigError(f"profile {pname!r}: pluginConfig for {name!r} must be a mapping of arguments, got {args!r}")
    return out


def _names(v: Any, pname: str, point: str) -> list[str]:
    if v is None:
        return []
    if not isinstance(v, list):
        raise ConfigError(f"profile {pname!r}: {point} must be a list of plugin names")
    return v


def load_config(source: str | Path | Mapping[str, Any], registry: Registry) -> dict[str, Profile]:
    """Profiles by name from a YAML file path, YAML text or an already-parsed mapping."""
    if isinstance(source, Mapping):
        data: Any = source
    elif isinstance(source, str) and "\n" in source:  # YAML text (a path has no newline)
        try:
            data = yaml.safe_load(source)
        except yaml.YAMLError as exc:
            raise ConfigError(f"scheduler config: not valid YAML: {exc}") from None
    else:
        p = Path(source)
        try:
            text = p.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"cannot read scheduler config {p}: {exc}") from None
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise ConfigError(f"{p}: not valid YAML: {exc}") from None
    if not isinstance(data, Mapping) or not isinstance(data.get("profiles"), list) or not data["profiles"]:
        raise ConfigError("scheduler config needs a non-empty 'profiles' list")
    extra = set(data) - {"profiles", "apiVersion", "kind", "schedulerName"}
    if extra:
        raise ConfigError(f"scheduler config: unknown key(s) {sorted(extra)}")
    out: dict[str, Profile] = {}
    for p in data["profiles"]:
        prof = registry.build_profile(p)
        if prof.name in out:
            raise ConfigError(f"profile {prof.name!r} defined twice")
        out[prof.name] = prof
    return out
