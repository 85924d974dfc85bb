"""The agent's config file (YAML), validated at start: unknown keys and bad values are clear errors.

    migStrategy: mixed        # mixed | single | none
    replicas: 1               # time-slicing: advertise each GPU this many times
    renameShared: false       # with replicas > 1: advertise nvidia.com/gpu.shared
    recoverAfterSeconds: 300  # a GPU is healthy again after this long without a fatal XID
    deviceListStrategy: uuid  # NVIDIA_VISIBLE_DEVICES holds GPU UUIDs
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from ..engine.errors import ConfigError


@dataclass(frozen=True)
class AgentConfig:
    mig_strategy: str = "mixed"
    replicas: int = 1
    rename_shared: bool = False
    recover_after_s: float = 300.0


KEYS = {"migStrategy": "mig_strategy", "replicas": "replicas", "renameShared": "rename_shared",
        "recoverAfterSeconds": "recover_after_s", "deviceListStrategy": None}


def load_agent_config(path: str | Path) -> AgentConfig:
    p = Path(path)
    try:
        data: Any = yaml.safe_load(p.read_text()) or {}
    except OSError as exc:
        raise ConfigError(f"agent config {p}: {exc}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"agent config {p}: not valid YAML: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"agent config {p}: must be a mapping")
    unknown = sorted(set(data) - set(KEYS))
    if unknown:
        raise ConfigError(f"agent config {p}: unknown key(s) {unknown}; known: {sorted(KEYS)}")
    kw: dict[str, Any] = {}
    for k, v in data.items():
        attr = KEYS[k]
        if attr is None:
            if v != "uuid":
                raise ConfigError(f"agent config {p}: deviceListStrategy: only 'uuid' is supported, got {v!r}")
            continue
        kw[attr] = v
    cfg = AgentConfig(**kw)
    if cfg.mig_strategy not in ("mixed", "single", "none"):
        raise ConfigError(f"agent config {p}: migStrategy must be mixed, single or none, got {cfg.mig_strategy!r}")
    if not isinstance(cfg.replicas, int) or cfg.replicas < 1:
        raise ConfigError(f"agent config {p}: replicas must be an integer >= 1, got {cfg.replicas!r}")
    if not isinstance(cfg.recover_after_s, (int, float)) or cfg.recover_after_s < 0:
        raise ConfigError(f"agent config {p}: recoverAfterSeconds must be >= 0, got {cfg.recover_after_s!r}")
    return cfg
