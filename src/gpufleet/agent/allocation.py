"""What each GPU is and costs: the series ``gpufleet cost`` and the cost recording rules price the allocation with.

``gpufleet_pod_gpu_allocated`` (the exporter: the part of each GPU a container holds, with its workload and team
queue) says who holds what.  Cost also needs every GPU's capacity and price, whether held or not:

* ``gpufleet_gpu_info{gpu,UUID,modelName,Hostname,node,instance_type,capacity_type}`` = 1 for every GPU: the
  capacity the cost is measured against, with the node's instance type and whether it is spot
  (``engine.capacity``: the providers' and Karpenter's labels, plus the price file's ``spotLabels``);
* ``gpufleet_gpu_price_per_hour{gpu,UUID,modelName,Hostname,capacity_type,currency}``: its price per hour from
  the price file (``engine.prices``); a GPU without a known price has no series (unknown, not zero);
* ``gpufleet_price_file_ok``: 1 if the price file was valid at its last change.

They are exported in the same scrapes as the allocation series (when the node's pods could be read), so the
capacity and what is held of it line up sample by sample.  Everything here is pure and fed by the collector.
"""

from __future__ import annotations

import logging
from typing import Mapping, Sequence

from ..engine.capacity import SpotConfig, instance_type
from ..engine.prices import PriceBook
from .nvml import GpuInfo

log = logging.getLogger(__name__)

GPU_INFO = "gpufleet_gpu_info"
PRICE = "gpufleet_gpu_price_per_hour"
PRICES_OK = "gpufleet_price_file_ok"
INFO_LABELS = ["gpu", "UUID", "modelName", "Hostname", "node", "instance_type", "capacity_type"]
PRICE_LABELS = ["gpu", "UUID", "modelName", "Hostname", "capacity_type", "currency"]


def families(gpus: Sequence[GpuInfo], hostname: str, node: str, node_labels: Mapping[str, str], prices: PriceBook | None,
             prices_ok: bool | None = None, spot: SpotConfig | None = None) -> list:
    """The info, price and price-file families (prometheus_client GaugeMetricFamily) for one scrape."""
    from prometheus_client.core import GaugeMetricFamily

    spot = spot or (prices.spot if prices is not None else SpotConfig())
    itype = instance_type(node_labels)
    is_spot = spot.is_spot(node_labels)
    cap = "spot" if is_spot else "on-demand"
    info = GaugeMetricFamily(GPU_INFO, "1 per GPU: its node's instance type and capacity type (spot or on-demand).",
                             labels=INFO_LABELS)
    price = GaugeMetricFamily(PRICE, "Price of one hour of this GPU (per the price file; absent when unknown).",
                              labels=PRICE_LABELS)
    for g in gpus:
        info.add_metric([str(g.index), g.uuid, g.name, hostname, node, itype, cap], 1.0)
        if prices is not None:
            p = prices.price(node, itype, g.name, is_spot)
            if p.per_gpu_hour is not None:
                price.add_metric([str(g.index), g.uuid, g.name, hostname, cap, prices.currency], p.per_gpu_hour)
    out = [info, price]
    if prices_ok is not None:
        ok = GaugeMetricFamily(PRICES_OK, "1 if the price file was read and valid at its last change, else 0.")
        ok.add_metric([], 1.0 if prices_ok else 0.0)
        out.append(ok)
    return out


class PriceFile:
    """The price file, read again when it changes (a ConfigMap update); a bad version is logged and the last good
    one kept (the agent serves GPUs whatever the prices say).  No path, or a path that does not exist (an optional
    ConfigMap not created): the built-in list prices."""

    def __init__(self, path: str | None) -> None:
        self.path = path
        self._mtime: int | None = -1
        self.book: PriceBook = PriceBook()
        self.ok = True

    def get(self) -> tuple[PriceBook, bool]:
        import os

        from ..engine.errors import ConfigError
        from ..engine.prices import parse_prices_text

        if not self.path:
            return self.book, True
        try:
            m: int | None = os.stat(self.path).st_mtime_ns
        except OSError:
            m = None
        if m != self._mtime:
            self._mtime = m
            try:
                if m is None:
                    self.book = PriceBook()
                else:
                    with open(self.path, encoding="utf-8") as f:
                        self.book = parse_prices_text(f.read(), self.path)
                self.ok = True
            except (ConfigError, OSError, UnicodeDecodeError) as exc:
                log.error("%s; keeping the previous prices", exc)
                self.ok = False
        return self.book, self.ok
