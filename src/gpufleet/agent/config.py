"""The agent's config file (YAML), validated: unknown keys and bad values are clear errors.

    migStrategy: mixed          # mixed | single | none
    replicas: 1                 # time-slicing: advertise each GPU this many times
    sharesPerGpu: 10            # kubelet devices per GPU for gpufleet-placed pods: at most this many pods per GPU
    renameShared: false         # with replicas > 1: advertise nvidia.com/gpu.shared
    recoverAfterSeconds: 300    # a GPU is healthy again after this long without a fatal XID
    deviceListStrategy: uuid    # NVIDIA_VISIBLE_DEVICES holds GPU UUIDs (the only one)
    mpsPipeDirectory: ""        # shares: mount this MPS pipe dir and set CUDA_MPS_PIPE_DIRECTORY
    labelIntervalSeconds: 60    # how often node labels / inventory are checked

At start a bad file stops the agent with the message; when the file changes
while running (a ConfigMap update) a bad version is reported and the running
configuration keeps serving.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from ..engine.errors import ConfigError

MAX_SHARES_PER_GPU = 64  # kubelet lists every device in ListAndWatch; 8 GPUs x 64 stays a small message


@dataclass(frozen=True)
class AgentConfig:
    mig_strategy: str = "mixed"
    replicas: int = 1
    shares_per_gpu: int = 10
    rename_shared: bool = False
    recover_after_s: float = 300.0
    mps_pipe_dir: str = ""
    label_interval_s: float = 60.0

    @property
    def slots(self) -> int:
        """kubelet devices per (non-MIG) GPU: time-slicing replicas or gpufleet's share slots, whichever is more."""
        return max(self.replicas, self.shares_per_gpu)


KEYS = {"migStrategy": "mig_strategy", "replicas": "replicas", "sharesPerGpu": "shares_per_gpu", "renameShared": "rename_shared",
        "recoverAfterSeconds": "recover_after_s", "deviceListStrategy": None, "mpsPipeDirectory": "mps_pipe_dir",
        "labelIntervalSeconds": "label_interval_s"}


def validate(cfg: AgentConfig, where: str) -> AgentConfig:
    if cfg.mig_strategy not in ("mixed", "single", "none"):
        raise ConfigError(f"{where}: migStrategy must be mixed, single or none, got {cfg.mig_strategy!r}")
    if not isinstance(cfg.replicas, int) or isinstance(cfg.replicas, bool) or cfg.replicas < 1:
        raise ConfigError(f"{where}: replicas must be an integer >= 1, got {cfg.replicas!r}")
    if not isinstance(cfg.shares_per_gpu, int) or isinstance(cfg.shares_per_gpu, bool) or not 1 <= cfg.shares_per_gpu <= MAX_SHARES_PER_GPU:
        raise ConfigError(f"{where}: sharesPerGpu must be an integer 1..{MAX_SHARES_PER_GPU}, got {cfg.shares_per_gpu!r}")
    if not isinstance(cfg.rename_shared, bool):
        raise ConfigError(f"{where}: renameShared must be true or false, got {cfg.rename_shared!r}")
    for name, v in (("recoverAfterSeconds", cfg.recover_after_s), ("labelIntervalSeconds", cfg.label_interval_s)):
        if not isinstance(v, (int, float)) or isinstance(v, bool) or not 0 <= v < float("inf"):  # nan, inf too
            raise ConfigError(f"{where}: {name} must be a number >= 0, got {v!r}")
    if not isinstance(cfg.mps_pipe_dir, str) or (cfg.mps_pipe_dir and not cfg.mps_pipe_dir.startswith("/")):
        raise ConfigError(f"{where}: mpsPipeDirectory must be an absolute path, got {cfg.mps_pipe_dir!r}")
    return cfg


def load_agent_config(path: str | Path) -> AgentConfig:
    p = Path(path)
    where = f"agent config {p}"
    try:
        data: Any = yaml.safe_load(p.read_text()) or {}
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{where}: {exc}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{where}: not valid YAML: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: must be a mapping")
    unknown = sorted(str(k) for k in set(data) - set(KEYS))  # YAML keys may be numbers
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {unknown}; known: {sorted(KEYS)}")
    kw: dict[str, Any] = {}
    for k, v in data.items():
        attr = KEYS[k]
        if attr is None:
            if v != "uuid":
                raise ConfigError(f"{where}: deviceListStrategy: only 'uuid' is supported, got {v!r}")
            continue
        kw[attr] = v
    return validate(AgentConfig(**kw), where)
