"""Placement policies and the plugin registry that the adapters use.

``registry()`` knows every plugin by name: the engine's built-in filters and
scores, and the policies here (the six of the FGD paper and gpufleet's own
default).  ``default_profile()`` is what runs when no config file is given.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

if TYPE_CHECKING:
    from ..engine.config import Registry
    from ..engine.framework import Profile

# The names below (the policy files, their aliases) read only this folder: importing this package imports no engine
# module, so a command that only names policies (``gpufleet simulate``'s parser and its checks) starts without the
# engine and the plugins; ``registry()`` and ``build_profile()`` import them when first called.


def registry() -> Registry:
    from ..engine.config import Registry
    from ..engine.plugins import spotcapacity
    from ..engine.plugins.gpufit import GpuFit
    from ..engine.plugins.gpuselect import BestFitGpu
    from ..engine.plugins.interpodaffinity import InterPodAffinity
    from ..engine.plugins.nodeaffinity import NodeAffinity
    from ..engine.plugins.nodedeclaredfeatures import NodeDeclaredFeatures
    from ..engine.plugins.nodeports import NodePorts
    from ..engine.plugins.noderesources import LeastAllocated, MostAllocated, NodeResourcesFit
    from ..engine.plugins.nodeunschedulable import NodeUnschedulable
    from ..engine.plugins.podtopologyspread import PodTopologySpread
    from ..engine.plugins.spread import Spread
    from ..engine.plugins.tainttoleration import TaintToleration
    from ..engine.plugins.volumes import NodeVolumeLimits, VolumeBinding

    r = Registry()
    r.register("NodeUnschedulable", NodeUnschedulable)
    r.register("NodeAffinity", NodeAffinity)
    r.register("TaintToleration", TaintToleration)
    r.register("NodeDeclaredFeatures", NodeDeclaredFeatures)
    r.register("NodeResourcesFit", NodeResourcesFit)
    r.register("GpuFit", GpuFit)
    r.register("NodePorts", NodePorts)
    r.register("VolumeBinding", VolumeBinding)
    r.register("NodeVolumeLimits", NodeVolumeLimits)
    r.register("InterPodAffinity", InterPodAffinity)
    r.register("PodTopologySpread", PodTopologySpread)
    r.register("LeastAllocated", LeastAllocated)
    r.register("MostAllocated", MostAllocated)
    r.register("Spread", Spread)
    r.register("BestFitGpu", BestFitGpu)
    r.register(spotcapacity.PLUGIN, spotcapacity.make)
    from ..engine.plugins.queuequota import register as _register_queues
    from . import paper

    paper.register(r)
    _register_queues(r)  # QueueQuota: preFilter/reserve; the adapter sets its QueueTree
    try:
        from . import default as _default

        _default.register(r)
    except ImportError:  # pragma: no cover
        pass
    return r


CONFIG_DIR = Path(__file__).parent / "profiles"


def profile_config(name: str) -> dict[str, Any]:
    import yaml

    p = CONFIG_DIR / f"{name}.yaml"
    if not p.exists():
        from ..engine.errors import ConfigError

        known = sorted(x.stem for x in CONFIG_DIR.glob("*.yaml"))
        raise ConfigError(f"unknown policy {name!r}; known: {', '.join(known)}")
    return yaml.safe_load(p.read_text())


def policy_names() -> list[str]:
    return sorted(x.stem for x in CONFIG_DIR.glob("*.yaml"))


def policy_names_with_aliases() -> list[str]:
    """Policy names for help texts, each alias shown with its policy: ``default (alias strandfrag)``."""
    aliases = policy_aliases()
    also: dict[str, list[str]] = {}
    for a, c in aliases.items():
        also.setdefault(c, []).append(a)
    return [n + (f" (alias {', '.join(also[n])})" if n in also else "") for n in policy_names() if n not in aliases]


def policy_aliases() -> dict[str, str]:
    """alias -> policy: profile files that differ only in the profile's name are one policy under two names
    (``strandfrag`` is ``default``); the canonical name is ``default`` when it is one of them, else the first."""
    import yaml

    by_body: dict[str, list[str]] = {}
    for name in policy_names():
        doc = yaml.safe_load((CONFIG_DIR / f"{name}.yaml").read_text()) or {}
        profiles = [dict(p, name="") for p in doc.get("profiles") or [] if isinstance(p, dict)]
        by_body.setdefault(repr(dict(doc, profiles=profiles)), []).append(name)
    out: dict[str, str] = {}
    for names in by_body.values():
        canon = "default" if "default" in names else names[0]
        out.update({n: canon for n in names if n != canon})
    return out


def build_profile(name_or_config: str | Mapping[str, Any], **plugin_args: Any) -> Profile:
    """A profile by policy name (``fgd``, ``bestfit``, ``default``, ...) or from a config mapping."""
    from ..engine.config import load_config

    cfg = profile_config(name_or_config) if isinstance(name_or_config, str) else name_or_config
    profs = load_config(cfg, registry())
    return next(iter(profs.values()))
