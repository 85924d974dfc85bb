"""What a GPU costs per hour: the user's price file, checked, over a small table of public list prices.

Why here: ``gpufleet cost``, the node agent (which exports each GPU's price for the recording rules) and the
replay's spot-versus-on-demand comparison must price a GPU the same way, so the file format, its checks and
the lookup order live once, as pure functions (each adapter reads the file and hands its text to
``parse_prices_text``).

The file (a ConfigMap ``gpufleet-prices``, key ``prices.yaml``, or any YAML file)::

    currency: USD
    builtin: true                 # fill in from the list prices below what this file does not name
    spotLabels: ["node.kubernetes.io/lifecycle=spot"]   # more labels that mark spot nodes (engine.capacity)
    nodes:                        # by node name (on-premises machines, negotiated prices)
      gpu-node-7: {onDemandPerGpuHour: 1.10}
    instanceTypes:                # by node.kubernetes.io/instance-type
      p5.48xlarge: {onDemandPerGpuHour: 6.88, spotPerGpuHour: 2.45}
    models:                       # by GPU model (NVML's or GPU Feature Discovery's name; spaces or dashes, any case)
      NVIDIA-H100-80GB-HBM3: {onDemandPerGpuHour: 6.88, spotPerGpuHour: 2.45}

A GPU is priced by the first entry that names its node, then its node's instance type, then its model, then the
built-in instance types, then the built-in models, taking ``spotPerGpuHour`` on a spot node and
``onDemandPerGpuHour`` otherwise; an entry without the price its capacity type needs passes the question on.
When nothing answers, the price is *unknown*: callers report it as such (``gpufleet cost`` stops with the model,
node and file to fix), never as zero.

Built-in list prices: on-demand only, per GPU-hour, AWS us-east-1 Linux on-demand prices as the AWS Price List
API returned them on 2026-01-19 (recorded in Karpenter's generated table ``pkg/providers/pricing/
zz_generated.pricing_aws.go`` of ``aws/karpenter-provider-aws``, "generated at 2026-01-19T13:23:24Z for
us-east-1"), each instance's hourly price divided by its GPUs, so the node's CPU and memory are charged to its
GPUs (a GPU node is bought for them). A model's built-in price is that of the smallest instance type carrying it.
There is no built-in spot price: spot prices are market prices that change by zone and over time, with no list
price to cite; a spot node needs ``spotPerGpuHour`` from the user's file.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Mapping

import yaml

from .capacity import SpotConfig
from .errors import ConfigError

ON_DEMAND_KEY, SPOT_KEY = "onDemandPerGpuHour", "spotPerGpuHour"
SECTIONS = ("nodes", "instanceTypes", "models")
TOP_KEYS = ("currency", "builtin", "spotLabels", *SECTIONS)
BUILTIN_SOURCE = ("AWS us-east-1 on-demand, AWS Price List API via Karpenter's zz_generated.pricing_aws.go "
                  "(generated 2026-01-19), instance price / GPUs")

# instance type -> (instance USD/hour, GPUs, GPU model)
_AWS_INSTANCES: dict[str, tuple[float, int, str]] = {
    "p5.48xlarge": (55.04, 8, "NVIDIA-H100-80GB-HBM3"),
    "p5.4xlarge": (6.88, 1, "NVIDIA-H100-80GB-HBM3"),
    "p5en.48xlarge": (63.296, 8, "NVIDIA-H200"),
    "p4d.24xlarge": (21.957642, 8, "NVIDIA-A100-SXM4-40GB"),
    "p4de.24xlarge": (27.44705, 8, "NVIDIA-A100-SXM4-80GB"),
    "p6-b200.48xlarge": (113.9328, 8, "NVIDIA-B200"),
    "p3.2xlarge": (3.06, 1, "Tesla-V100-SXM2-16GB"),
    "p3.8xlarge": (12.24, 4, "Tesla-V100-SXM2-16GB"),
    "p3.16xlarge": (24.48, 8, "Tesla-V100-SXM2-16GB"),
    "p3dn.24xlarge": (31.212, 8, "Tesla-V100-SXM2-32GB"),
    "g4dn.xlarge": (0.526, 1, "Tesla-T4"),
    "g4dn.12xlarge": (3.912, 4, "Tesla-T4"),
    "g4dn.metal": (7.824, 8, "Tesla-T4"),
    "g5.xlarge": (1.006, 1, "NVIDIA-A10G"),
    "g5.12xlarge": (5.672, 4, "NVIDIA-A10G"),
    "g5.48xlarge": (16.288, 8, "NVIDIA-A10G"),
    "g6.xlarge": (0.8048, 1, "NVIDIA-L4"),
    "g6.12xlarge": (4.6016, 4, "NVIDIA-L4"),
    "g6.48xlarge": (13.3504, 8, "NVIDIA-L4"),
    "g6e.xlarge": (1.861, 1, "NVIDIA-L40S"),
    "g6e.12xlarge": (10.49264, 4, "NVIDIA-L40S"),
    "g6e.48xlarge": (30.13118, 8, "NVIDIA-L40S"),
}


def model_key(name: str) -> str:
    """``NVIDIA H100 80GB HBM3`` (NVML) and ``NVIDIA-H100-80GB-HBM3`` (GFD) are one model."""
    return "-".join(name.replace("_", " ").replace("-", " ").split()).lower()


def _builtin() -> tuple[dict[str, float], dict[str, float]]:
    by_type = {t: round(price / n, 6) for t, (price, n, _) in _AWS_INSTANCES.items()}
    by_model: dict[str, tuple[int, float]] = {}
    for price, n, model in _AWS_INSTANCES.values():
        k = model_key(model)
        if k not in by_model or n < by_model[k][0]:  # the smallest instance that carries the model
            by_model[k] = (n, round(price / n, 6))
    return by_type, {k: v for k, (_, v) in by_model.items()}


BUILTIN_INSTANCE_TYPES, BUILTIN_MODELS = _builtin()


@dataclass(frozen=True)
class Entry:
    on_demand: float | None
    spot: float | None
    where: str  # "prices.yaml:7 instanceTypes.p5.48xlarge"


@dataclass(frozen=True)
class Priced:
    """One GPU's hourly price and where it came from (``per_gpu_hour`` None: unknown)."""

    per_gpu_hour: float | None
    source: str


@dataclass
class PriceBook:
    currency: str = "USD"
    builtin: bool = True
    nodes: dict[str, Entry] = field(default_factory=dict)
    instance_types: dict[str, Entry] = field(default_factory=dict)
    models: dict[str, Entry] = field(default_factory=dict)  # keyed by model_key
    origin: str = "built-in list prices"
    spot: SpotConfig = field(default_factory=SpotConfig)  # which nodes are spot

    def price(self, node: str, instance_type: str, model: str, spot: bool) -> Priced:
        """The price of one GPU-hour on this node (see the module docstring for the order)."""
        what = "spot" if spot else "on-demand"
        candidates: list[Entry | None] = [self.nodes.get(node), self.instance_types.get(instance_type),
                                          self.models.get(model_key(model))]
        for e in candidates:
            if e is not None:
                v = e.spot if spot else e.on_demand
                if v is not None:
                    return Priced(v, e.where)
        if self.builtin and not spot:
            if instance_type in BUILTIN_INSTANCE_TYPES:
                return Priced(BUILTIN_INSTANCE_TYPES[instance_type], f"built-in {instance_type} ({BUILTIN_SOURCE})")
            if model_key(model) in BUILTIN_MODELS:
                return Priced(BUILTIN_MODELS[model_key(model)], f"built-in {model} ({BUILTIN_SOURCE})")
        return Priced(None, f"no {what} price for model {model!r}" + (f", instance type {instance_type!r}" if instance_type else "")
                      + f", node {node!r} in {self.origin}")


# --- the file -----------------------------------------------------------------------------------


def _lines(node: Any, path: tuple = (), out: dict | None = None) -> dict[tuple, int]:
    """Path of every mapping key -> its 1-based line (from yaml.compose)."""
    out = {} if out is None else out
    if isinstance(node, yaml.MappingNode):
        for k, v in node.value:
            p = path + (k.value,)
            out[p] = k.start_mark.line + 1
            _lines(v, p, out)
    return out


def _number(v: Any, where: str) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise ConfigError(f"{where}: must be a number (per GPU-hour), got {v!r}")
    if v < 0:
        raise ConfigError(f"{where}: must not be negative, got {v!r}")
    return float(v)


def parse_prices(data: Any, origin: str = "prices", lines: Mapping[tuple, int] | None = None) -> PriceBook:
    """A parsed YAML document -> PriceBook; ConfigError names ``origin:line`` and the key."""
    lines = lines or {}

    def at(*path: str) -> str:
        ln = lines.get(tuple(path))
        return f"{origin}:{ln}: {'.'.join(path)}" if ln else f"{origin}: {'.'.join(path)}"

    if data is None:
        data = {}
    if not isinstance(data, Mapping):
        raise ConfigError(f"{origin}: must be a mapping with {', '.join(TOP_KEYS)}")
    for k in data:
        if k not in TOP_KEYS:
            raise ConfigError(f"{at(str(k))}: unknown key; known: {', '.join(TOP_KEYS)}")
    book = PriceBook(origin=origin)
    cur = data.get("currency", "USD")
    if not isinstance(cur, str) or not cur.strip():
        raise ConfigError(f"{at('currency')}: must be a currency code such as USD, got {cur!r}")
    book.currency = cur.strip()
    b = data.get("builtin", True)
    if not isinstance(b, bool):
        raise ConfigError(f"{at('builtin')}: must be true or false, got {b!r}")
    book.builtin = b
    if data.get("spotLabels") is not None:
        book.spot = SpotConfig.from_args(at("spotLabels"), spot_labels=data["spotLabels"])
    for section, target in (("nodes", book.nodes), ("instanceTypes", book.instance_types), ("models", book.models)):
        entries = data.get(section) or {}
        if not isinstance(entries, Mapping):
            raise ConfigError(f"{at(section)}: must be a mapping of name -> {{{ON_DEMAND_KEY}, {SPOT_KEY}}}")
        for name, e in entries.items():
            name = str(name)
            if not isinstance(e, Mapping) or not e:
                raise ConfigError(f"{at(section, name)}: must be a mapping with {ON_DEMAND_KEY} and/or {SPOT_KEY}, got {e!r}")
            for k in e:
                if k not in (ON_DEMAND_KEY, SPOT_KEY):
                    raise ConfigError(f"{at(section, name, str(k))}: unknown key; known: {ON_DEMAND_KEY}, {SPOT_KEY}")
            od = _number(e[ON_DEMAND_KEY], at(section, name, ON_DEMAND_KEY)) if ON_DEMAND_KEY in e else None
            sp = _number(e[SPOT_KEY], at(section, name, SPOT_KEY)) if SPOT_KEY in e else None
            key = model_key(name) if section == "models" else name
            if key in target:
                raise ConfigError(f"{at(section, name)}: the same {section[:-1]} is named twice")
            target[key] = Entry(od, sp, at(section, name))
    return book


def parse_prices_text(text: str, origin: str) -> PriceBook:
    try:
        node = yaml.compose(text)
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{origin}:{mark.line + 1}" if mark is not None else origin
        raise ConfigError(f"{where}: not valid YAML: {getattr(exc, 'problem', None) or exc}") from None
    return parse_prices(data, origin, _lines(node))
