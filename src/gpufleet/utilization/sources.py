"""Where per-pod GPU utilisation comes from: Prometheus' HTTP API, or the agents' ``/metrics``.

Both give ``{"namespace/pod": [(timestamp_s, value), ...]}``; for a pod with
several GPUs the value per timestamp is its busiest GPU (one busy GPU means
the pod works).  The series are the exporter's ``DCGM_FI_DEV_GPU_UTIL`` with
its ``pod``/``namespace`` labels, which dcgm-exporter also writes, so either
exporter works.

``PrometheusSource`` asks ``/api/v1/query_range`` and needs nothing else.
``AgentScrapeSource`` scrapes the agents directly and keeps the history in
memory, so it only knows what it saw since it started: fine for the
long-running controller, not for a one-shot run.  Parsing is pure and tested
on recorded responses; the HTTP fetcher is injectable.
"""

from __future__ import annotations

import json
import logging
import math
import threading
import urllib.error
import urllib.parse
import urllib.request
from collections import deque
from typing import Any, Callable, Iterable, Mapping

from ..engine.errors import GpufleetError

log = logging.getLogger(__name__)

UTIL_METRIC = "DCGM_FI_DEV_GPU_UTIL"
MAX_POINTS = 10_000  # Prometheus refuses more than 11,000 points per series

Series = dict[str, list[tuple[float, float]]]
Fetch = Callable[[str, float], bytes]  # (url, timeout_s) -> body


class SourceError(GpufleetError):
    """A utilisation source answered with an error or something unreadable."""


def http_get(url: str, timeout_s: float) -> bytes:
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as r:
            return r.read()
    except urllib.error.HTTPError as exc:
        body = exc.read()[:300].decode(errors="replace")
        raise SourceError(f"GET {url}: HTTP {exc.code}: {body}") from None
    except (urllib.error.URLError, OSError) as exc:
        raise SourceError(f"GET {url}: {exc}") from None


def _merge(out: Series, key: str, points: Iterable[tuple[float, float]]) -> None:
    """Add points to a pod's series, keeping the max per timestamp."""
    cur = {t: v for t, v in out.get(key, [])}
    for t, v in points:
        if math.isnan(v):
            continue
        cur[t] = max(v, cur.get(t, -math.inf))
    out[key] = sorted(cur.items())


def parse_query_range(doc: Any, what: str = "query_range") -> Series:
    """A Prometheus ``query_range`` answer (matrix) -> per-pod series.

    Series without ``pod``/``namespace`` labels are not about a pod and are
    skipped; bad values are skipped with a log line, never crash the round.
    """
    if not isinstance(doc, Mapping) or doc.get("status") != "success":
        err = doc.get("error") if isinstance(doc, Mapping) else None
        raise SourceError(f"{what}: Prometheus answered {err or 'something that is not a success'!r}")
    data = doc.get("data") or {}
    if data.get("resultType") != "matrix":
        raise SourceError(f"{what}: expected a matrix result, got {data.get('resultType')!r}")
    out: Series = {}
    for i, s in enumerate(data.get("result") or []):
        m = (s or {}).get("metric") or {}
        ns, pod = m.get("namespace"), m.get("pod")
        if not ns or not pod:
            continue
        pts = []
        for pair in s.get("values") or []:
            try:
                t, v = pair
                pts.append((float(t), float(v)))
            except (TypeError, ValueError):
                log.warning("%s: series %d (%s/%s): skipping bad sample %r", what, i, ns, pod, pair)
        _merge(out, f"{ns}/{pod}", pts)
    return out


class PrometheusSource:
    """Per-pod GPU utilisation through Prometheus' HTTP API."""

    def __init__(self, base_url: str, step_s: float = 60.0, timeout_s: float = 30.0, fetch: Fetch | None = None,
                 query: str = f'max by (namespace, pod) ({UTIL_METRIC}{{pod!=""}})') -> None:
        if not base_url.startswith(("http://", "https://")):
            raise SourceError(f"Prometheus URL must start with http:// or https://, got {base_url!r}")
        self.base, self.step_s, self.timeout_s = base_url.rstrip("/"), step_s, timeout_s
        self.fetch = fetch or http_get
        self.query = query

    def query_range(self, query: str, start_s: float, end_s: float, step_s: float | None = None) -> Series:
        step = max(step_s or self.step_s, (end_s - start_s) / MAX_POINTS)
        url = f"{self.base}/api/v1/query_range?" + urllib.parse.urlencode(
            {"query": query, "start": f"{start_s:.3f}", "end": f"{end_s:.3f}", "step": f"{step:g}"})
        body = self.fetch(url, self.timeout_s)
        try:
            doc = json.loads(body)
        except ValueError as exc:
            raise SourceError(f"query_range {query!r}: not JSON: {exc}") from None
        return parse_query_range(doc, f"query_range {query!r}")

    def series(self, start_s: float, end_s: float) -> Series:
        return self.query_range(self.query, start_s, end_s)


def parse_exposition(text: str, metric: str = UTIL_METRIC) -> dict[str, float]:
    """One ``/metrics`` body -> ``{"namespace/pod": busiest GPU's value}``."""
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[str, float] = {}
    try:
        fams = list(text_string_to_metric_families(text))
    except ValueError as exc:
        raise SourceError(f"/metrics: not Prometheus text exposition: {exc}") from None
    for fam in fams:
        if fam.name != metric:
            continue
        for s in fam.samples:
            ns, pod = s.labels.get("namespace"), s.labels.get("pod")
            if ns and pod and not math.isnan(s.value):
                k = f"{ns}/{pod}"
                out[k] = max(out.get(k, -math.inf), float(s.value))
    return out


class AgentScrapeSource:
    """Scrape agents' ``/metrics`` each round and remember up to ``history_s`` of samples per pod."""

    def __init__(self, urls: Callable[[], list[str]] | list[str], history_s: float, timeout_s: float = 5.0,
                 fetch: Fetch | None = None) -> None:
        self._urls = urls if callable(urls) else (lambda: list(urls))
        self.history_s, self.timeout_s = history_s, timeout_s
        self.fetch = fetch or http_get
        self._hist: dict[str, deque[tuple[float, float]]] = {}
        self._lock = threading.Lock()
        self.errors: dict[str, str] = {}

    def scrape(self, now_s: float) -> int:
        """One round over the agents; returns how many answered.  A dead agent is logged, not fatal."""
        ok = 0
        self.errors = {}
        for url in self._urls():
            try:
                vals = parse_exposition(self.fetch(url, self.timeout_s).decode(errors="replace"))
            except SourceError as exc:
                self.errors[url] = str(exc)
                log.warning("scraping %s: %s", url, exc)
                continue
            ok += 1
            with self._lock:
                for k, v in vals.items():
                    self._hist.setdefault(k, deque()).append((now_s, v))
        with self._lock:
            for k in list(self._hist):
                d = self._hist[k]
                while d and d[0][0] < now_s - self.history_s:
                    d.popleft()
                if not d:
                    del self._hist[k]
        return ok

    def series(self, start_s: float, end_s: float) -> Series:
        with self._lock:
            out: Series = {}
            for k, d in self._hist.items():
                pts = [(t, v) for t, v in d if start_s <= t <= end_s]
                if pts:
                    _merge(out, k, pts)  # several agents may report one pod: max per timestamp
            return out


def agent_urls_from_nodes(nodes: list[Mapping[str, Any]], port: int = 9400) -> list[str]:
    """``http://<InternalIP>:port/metrics`` for nodes that advertise GPUs."""
    out = []
    for n in nodes:
        st = n.get("status") or {}
        alloc = st.get("allocatable") or {}
        if not any(k == "nvidia.com/gpu" or k.startswith("nvidia.com/mig-") for k in alloc):
            continue
        ip = next((a.get("address") for a in st.get("addresses") or [] if a.get("type") == "InternalIP"), None)
        if ip:
            host = f"[{ip}]" if ":" in ip else ip
            out.append(f"http://{host}:{port}/metrics")
    return sorted(out)
