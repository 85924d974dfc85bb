"""Why a HorizontalPodAutoscaler on GPU metrics does or does not scale, down to the missing series.

An HPA that cannot get its metric keeps its replica count and says so in its ``ScalingActive`` condition, in the
words of whichever layer failed: the aggregated API (adapter down), prometheus-adapter (no rule for that name,
Prometheus unreachable, no series for those pods), or nothing at all when some pods simply have no value.  Those
words name the symptom; the cause is usually one step further: a pod that holds no GPU, an agent Prometheus does
not scrape, an agent without API access (no ``gpufleet_pod_gpu_allocated``), recording rules not loaded, a queue
name the scheduler does not know.  ``gather`` collects what it takes to tell those apart (the HPA, its target's
pods, the APIServices, the metrics API's own answer and, with Prometheus, the series behind each step) and
``diagnose`` (pure) turns it into lines a person can act on.
"""

from __future__ import annotations

import json
import urllib.parse
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Protocol

from ..engine.quantity import parse_quantity

CUSTOM = ("custom.metrics.k8s.io", "v1beta2")
EXTERNAL = ("external.metrics.k8s.io", "v1beta1")
KINDS = {"Deployment": "deployments", "StatefulSet": "statefulsets", "ReplicaSet": "replicasets"}
# what each gpufleet metric name is recorded from (deploy/autoscaling/prometheus-rules.yaml)
POD_RECORD = "gpufleet:pod_gpu_utilization:percent"
OBJECT_RECORD = {"Deployment": "gpufleet:deployment_gpu_utilization:percent",
                 "StatefulSet": "gpufleet:statefulset_gpu_utilization:percent"}
QUEUE_RECORD = {"gpufleet_queue_pending_gpus": ("gpufleet:queue_pending_gpus:max", "gpufleet_queue_pending_gpus"),
                "gpufleet_queue_pending_pods": ("gpufleet:queue_pending_pods:max", "gpufleet_queue_pending_pods")}


class ApiError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"HTTP {status}: {message}")
        self.status, self.message = status, message


class RawKube(Protocol):
    def get(self, path: str, params: Mapping[str, str] | None = None) -> Any: ...  # JSON, or raises ApiError


Query = Callable[[str], list[dict]]  # PromQL instant query -> result vector (raises on failure)


@dataclass
class MetricFacts:
    spec: dict  # one entry of the HPA's spec.metrics
    api: tuple[str, str]
    values: dict[str, float] | None = None  # what the metrics API answered: pod/object/series -> value
    error: str = ""  # or why it did not
    status: int = 0
    prom: dict[str, Any] = field(default_factory=dict)  # series found in Prometheus, per check


@dataclass
class Facts:
    key: str
    hpa: dict | None = None
    hpa_error: str = ""
    target_pods: list[dict] = field(default_factory=list)
    target_selector: str = ""
    target_error: str = ""
    apiservices: dict[str, tuple[str, str, str]] = field(default_factory=dict)  # name -> (status, reason, message)
    metrics: list[MetricFacts] = field(default_factory=list)
    prometheus: str = ""  # URL, when given
    prom_error: str = ""


def _selector(sel: Mapping[str, Any] | None) -> str:
    """A LabelSelector object -> the query string form (matchLabels and matchExpressions In/NotIn/Exists)."""
    if not sel:
        return ""
    parts = [f"{k}={v}" for k, v in sorted((sel.get("matchLabels") or {}).items())]
    for e in sel.get("matchExpressions") or []:
        op, k, vals = e.get("operator"), e.get("key"), ",".join(e.get("values") or [])
        parts.append({"In": f"{k} in ({vals})", "NotIn": f"{k} notin ({vals})", "Exists": f"{k}",
                      "DoesNotExist": f"!{k}"}.get(op, ""))
    return ",".join(p for p in parts if p)


def _value(q: Any) -> float:
    return float(parse_quantity(q))


def _api_path(api: tuple[str, str], ns: str, rest: str) -> str:
    return f"/apis/{api[0]}/{api[1]}/namespaces/{ns}/{rest}"


def _service_name(api: tuple[str, str]) -> str:
    return f"{api[1]}.{api[0]}"


def _prom_has(query: Query, expr: str) -> set[str]:
    """Pods (or queues) with a series for ``expr``: the ``pod`` label, else ``queue``, else '' for any."""
    return {r.get("metric", {}).get("pod") or r.get("metric", {}).get("queue") or "" for r in query(expr)}


def _q(s: str) -> str:
    return s.replace("\\", "\\\\").replace('"', '\\"')


def gather(kube: RawKube, namespace: str, name: str, prom: Query | None = None, prometheus_url: str = "") -> Facts:
    """Everything ``diagnose`` looks at; never raises for what it finds broken (that is the point)."""
    f = Facts(f"{namespace}/{name}", prometheus=prometheus_url)
    try:
        f.hpa = kube.get(f"/apis/autoscaling/v2/namespaces/{namespace}/horizontalpodautoscalers/{name}")
    except ApiError as exc:
        f.hpa_error = exc.message
        return f
    ref = (f.hpa.get("spec") or {}).get("scaleTargetRef") or {}
    plural = KINDS.get(ref.get("kind", ""))
    if plural:
        try:
            target = kube.get(f"/apis/apps/v1/namespaces/{namespace}/{plural}/{ref.get('name')}")
            sel = f.target_selector = _selector((target.get("spec") or {}).get("selector"))
            pods = kube.get(f"/api/v1/namespaces/{namespace}/pods", {"labelSelector": sel} if sel else None)
            f.target_pods = [p for p in pods.get("items") or [] if not (p.get("metadata") or {}).get("deletionTimestamp")]
        except ApiError as exc:
            f.target_error = f"{ref.get('kind')} {ref.get('name')}: {exc.message}"
    else:
        f.target_error = f"scaleTargetRef kind {ref.get('kind')!r}: only {', '.join(KINDS)} are looked into"
    for spec in (f.hpa.get("spec") or {}).get("metrics") or []:
        kind = spec.get("type")
        if kind not in ("Pods", "Object", "External"):
            continue  # Resource / ContainerResource: metrics-server's business
        mf = MetricFacts(spec, EXTERNAL if kind == "External" else CUSTOM)
        f.metrics.append(mf)
        svc = _service_name(mf.api)
        if svc not in f.apiservices:
            try:
                a = kube.get(f"/apis/apiregistration.k8s.io/v1/apiservices/{svc}")
                c: dict = next((c for c in (a.get("status") or {}).get("conditions") or [] if c.get("type") == "Available"), {})
                f.apiservices[svc] = (str(c.get("status", "Unknown")), str(c.get("reason", "")), str(c.get("message", "")))
            except ApiError as exc:
                f.apiservices[svc] = ("Missing" if exc.status == 404 else "Unknown", "", exc.message)
        _ask_metrics_api(kube, namespace, f, mf)
        if prom is not None and not f.prom_error:
            try:
                _ask_prometheus(prom, namespace, f, mf)
            except Exception as exc:  # noqa: BLE001 - Prometheus away is one of the causes to report
                f.prom_error = " ".join(str(exc).split())[:300]
    return f


def _ask_metrics_api(kube: RawKube, ns: str, f: Facts, mf: MetricFacts) -> None:
    spec, kind = mf.spec, mf.spec["type"]
    try:
        if kind == "Pods":
            m = spec["pods"]["metric"]
            sel = f.target_selector or str(((f.hpa or {}).get("status") or {}).get("selector") or "")
            params = {"labelSelector": sel} if sel else {}
            if m.get("selector"):
                params["metricLabelSelector"] = _selector(m["selector"])
            doc = kube.get(_api_path(mf.api, ns, f"pods/*/{m['name']}"), params)
            mf.values = {i["describedObject"]["name"]: _value(i["value"]) for i in doc.get("items") or []}
        elif kind == "Object":
            o, m = spec["object"]["describedObject"], spec["object"]["metric"]
            group = o.get("apiVersion", "v1").split("/")[0] if "/" in o.get("apiVersion", "") else ""
            res = KINDS.get(o.get("kind", ""), o.get("kind", "").lower() + "s") + (f".{group}" if group else "")
            doc = kube.get(_api_path(mf.api, ns, f"{res}/{o['name']}/{m['name']}"),
                           {"metricLabelSelector": _selector(m["selector"])} if m.get("selector") else None)
            items = doc.get("items") if "items" in doc else [doc]
            mf.values = {i["describedObject"]["name"]: _value(i["value"]) for i in items or []}
        else:
            m = spec["external"]["metric"]
            sel = _selector(m.get("selector"))
            doc = kube.get(_api_path(mf.api, ns, m["name"]), {"labelSelector": sel} if sel else None)
            mf.values = {json.dumps(i.get("metricLabels") or {}, sort_keys=True): _value(i["value"]) for i in doc.get("items") or []}
    except ApiError as exc:
        mf.error, mf.status = exc.message, exc.status


def _ask_prometheus(query: Query, ns: str, f: Facts, mf: MetricFacts) -> None:
    kind = mf.spec["type"]
    if kind == "Pods" and mf.spec["pods"]["metric"]["name"] == "gpu_utilization":
        n = _q(ns)
        mf.prom["recorded"] = _prom_has(query, f'{POD_RECORD}{{namespace="{n}"}}')
        mf.prom["util"] = _prom_has(query, f'DCGM_FI_DEV_GPU_UTIL{{namespace="{n}",pod!=""}}')
        mf.prom["allocated"] = _prom_has(query, f'gpufleet_pod_gpu_allocated{{namespace="{n}"}}')
        mf.prom["agents"] = {r.get("metric", {}).get("Hostname", "") for r in query("count by (Hostname) (gpufleet_gpu_healthy)")}
    elif kind == "Object":
        o = mf.spec["object"]["describedObject"]
        rec = OBJECT_RECORD.get(o.get("kind", ""))
        if rec:
            mf.prom["recorded"] = bool(query(f'{rec}{{namespace="{_q(ns)}",{o["kind"].lower()}="{_q(o["name"])}"}}'))
    elif kind == "External" and mf.spec["external"]["metric"]["name"] in QUEUE_RECORD:
        rec, raw = QUEUE_RECORD[mf.spec["external"]["metric"]["name"]]
        q = ((mf.spec["external"]["metric"].get("selector") or {}).get("matchLabels") or {}).get("queue")
        mf.prom["queue"] = q
        mf.prom["raw_queues"] = _prom_has(query, raw)
        mf.prom["recorded_queues"] = _prom_has(query, rec)
        mf.prom["schedulers"] = len(query("gpufleet_pending_pods"))


def _metric_text(spec: dict) -> str:
    kind = spec["type"]
    body = spec[kind[0].lower() + kind[1:]]
    t = body.get("target") or {}
    target = t.get("averageValue") or t.get("value") or (f"{t.get('averageUtilization')}%" if t.get("averageUtilization") else "?")
    sel = _selector((body.get("metric") or {}).get("selector"))
    what = f" of {body['describedObject']['kind']} {body['describedObject']['name']}" if kind == "Object" else ""
    return f"{kind} {body['metric']['name']}{f' {{{sel}}}' if sel else ''}{what}, target {t.get('type', '?')} {target}"


def diagnose(f: Facts) -> list[str]:
    """Lines for a person: the HPA's state, then per metric what the API answered and the cause where one is found."""
    if f.hpa is None:
        return [f"{f.key}: HorizontalPodAutoscaler not readable: {f.hpa_error}"]
    spec, status = f.hpa.get("spec") or {}, f.hpa.get("status") or {}
    ref = spec.get("scaleTargetRef") or {}
    lines = [f"{f.key}: {ref.get('kind')} {ref.get('name')}, {status.get('currentReplicas', '?')} replica(s), "
             f"desired {status.get('desiredReplicas', '?')} (min {spec.get('minReplicas', 1)}, max {spec.get('maxReplicas')})"]
    for c in status.get("conditions") or []:
        lines.append(f"  {c.get('type')} {c.get('status')} ({c.get('reason', '')}): {c.get('message', '')}")
    if f.target_error:
        lines.append(f"  target: {f.target_error}")
    pods = sorted((p.get("metadata") or {}).get("name", "") for p in f.target_pods)
    if f.prometheus and f.prom_error:
        lines.append(f"  cause: Prometheus at {f.prometheus} does not answer ({f.prom_error}): the adapter cannot either, so "
                     "every HPA on its metrics holds its replica count")
    if not f.metrics:
        lines.append("  (no Pods, Object or External metrics: nothing for the metrics adapter to serve)")
    for i, mf in enumerate(f.metrics, 1):
        lines.append(f"  metric {i}: {_metric_text(mf.spec)}")
        lines += [f"    {x}" for x in _diagnose_metric(f, mf, pods)]
    return lines


def _diagnose_metric(f: Facts, mf: MetricFacts, pods: list[str]) -> list[str]:
    out = []
    svc = _service_name(mf.api)
    st, reason, msg = f.apiservices.get(svc, ("Unknown", "", ""))
    if st != "True":
        out.append(f"cause: APIService {svc} is {'not registered' if st == 'Missing' else f'not available ({reason})'}: "
                   f"{msg or 'no message'}; install or fix the adapter (kubectl apply -k deploy/autoscaling)")
        return out
    name = mf.spec[mf.spec["type"][0].lower() + mf.spec["type"][1:]]["metric"]["name"]
    if mf.error:
        out.append(f"{svc} answers HTTP {mf.status}: {mf.error}")
        low = mf.error.lower()
        if mf.status == 404 or "could not find" in low or "not found" in low:
            out.append(f"cause: the adapter serves no metric {name!r} for this object: no rule of its config matches that "
                       "name, or the rule's series is not in Prometheus (yet: the adapter re-lists series every "
                       "--metrics-relist-interval)" + _missing_record(mf))
        elif mf.status >= 500 and "unable to fetch metrics" in low or "prometheus" in low or "connection refused" in low:
            # prometheus-adapter answers any failed PromQL query with exactly "unable to fetch metrics"
            out.append("cause: the adapter cannot query Prometheus (down, or its --prometheus-url is wrong; the "
                       "adapter's log has Prometheus' error)")
        elif "unable to list matching resources" in low:
            out.append("cause: the adapter cannot list the target's pods: its RBAC (ClusterRole gpufleet:prometheus-adapter) "
                       "or its kubeconfig")
        else:
            out += _why_no_values(f, mf, pods, name)
        return out
    vals = mf.values or {}
    if mf.spec["type"] == "Pods":
        got = ", ".join(f"{p} {vals[p]:g}" for p in pods if p in vals) or "none"
        out.append(f"values: {got}")
        missing = [p for p in pods if p not in vals]
        if missing or not vals:
            out += _why_no_values(f, mf, missing or pods, name)
    else:
        out.append("values: " + (", ".join(f"{k} {v:g}" for k, v in sorted(vals.items())) or "none"))
        if not vals:
            out += _why_no_values(f, mf, pods, name)
    if mf.spec["type"] == "External" and len(vals) > 1:
        out.append(f"note: {len(vals)} series match: the HPA adds them up; select one queue (matchLabels: {{queue: NAME}})")
    return out


def _missing_record(mf: MetricFacts) -> str:
    if mf.prom.get("recorded") is False or mf.prom.get("recorded") == set():
        return "; Prometheus has no recorded series for it: are deploy/autoscaling/prometheus-rules.yaml loaded?"
    return ""


def _why_no_values(f: Facts, mf: MetricFacts, pods: list[str], name: str) -> list[str]:
    """The cause, as far as Prometheus shows it, for pods (or the object, or the queue) without a value."""
    if mf.spec["type"] == "Pods" and not pods:
        return ["cause: the target has no pods"]
    if not f.prometheus:
        return [f"no value for {', '.join(pods) if mf.spec['type'] == 'Pods' else 'it'}; "
                "run with --prometheus URL to find which input series are missing"]
    if f.prom_error:
        return []  # said once at the top
    p = mf.prom
    out = []
    if mf.spec["type"] == "Pods" and "util" in p:
        if not p.get("agents"):
            out.append("cause: Prometheus has no gpufleet agent at all (gpufleet_gpu_healthy): the agents are not scraped")
        for pod in pods:
            util, alloc, rec = pod in p["util"], pod in p["allocated"], pod in p["recorded"]
            if rec:
                why = "Prometheus has its recorded value: the adapter has not listed it yet (new series)"
            elif not util and not alloc:
                why = ("no DCGM_FI_DEV_GPU_UTIL and no gpufleet_pod_gpu_allocated: it holds no GPU, or the agent on its node "
                       "is not scraped" + (f" (agents seen: {', '.join(sorted(p['agents']))})" if p.get("agents") else ""))
            elif util and not alloc:
                why = ("utilisation but no gpufleet_pod_gpu_allocated: the agent cannot read the node's pods or their "
                       "assignments from the API server (or dcgm-exporter reports it): no share to divide by")
            elif alloc and not util:
                why = "allocated but no DCGM_FI_DEV_GPU_UTIL yet (just started)"
            else:
                why = (f"both inputs are there but not {POD_RECORD}: the recording rules "
                       "(deploy/autoscaling/prometheus-rules.yaml) are not loaded")
            out.append(f"cause: {pod}: {why}")
    elif mf.spec["type"] == "External" and "raw_queues" in p:
        q = p.get("queue")
        if not p.get("schedulers"):
            out.append("cause: Prometheus has no gpufleet scheduler (gpufleet_pending_pods): the scheduler is not scraped")
        elif q not in p["raw_queues"]:
            known = ", ".join(sorted(x for x in p["raw_queues"] if x)) or "none"
            out.append(f"cause: the scheduler exports no queue {q!r} (queues it knows: {known}): no such Queue object")
        elif q not in p["recorded_queues"]:
            out.append("cause: the scheduler exports the queue but the recording rules "
                       "(deploy/autoscaling/prometheus-rules.yaml) are not loaded")
    elif mf.spec["type"] == "Object" and p.get("recorded") is False:
        out.append("cause: Prometheus has no recorded value for the object: its pods report no GPU utilisation "
                   "(see a Pods metric on them), or the recording rules are not loaded")
    return out or [f"no value for {name}, and no cause found in Prometheus"]


class ClientKube:
    """``RawKube`` over the official client's ApiClient (GET with the configured credentials)."""

    def __init__(self, kubeconfig: str | None = None, context: str | None = None) -> None:
        from kubernetes import client

        from .kube_actions import load_client_config

        load_client_config(kubeconfig, context)
        self.api = client.ApiClient()

    def get(self, path: str, params: Mapping[str, str] | None = None) -> Any:
        import urllib3

        headers = {"Accept": "application/json", "User-Agent": "gpufleet-explain-hpa"}
        self.api.update_params_for_auth(headers, [], ["BearerToken"], path, "GET", None)
        url = self.api.configuration.host + path + ("?" + urllib.parse.urlencode(params) if params else "")
        r = self.api.rest_client.pool_manager.request("GET", url, headers=headers, timeout=urllib3.Timeout(total=20),
                                                      retries=False)  # one line on failure, not urllib3's retry warnings
        text = (r.data or b"").decode(errors="replace")
        if r.status >= 400:
            msg = text
            try:
                msg = json.loads(text).get("message") or text
            except (ValueError, AttributeError):
                pass
            raise ApiError(int(r.status), " ".join(str(msg).split())[:1000])
        return json.loads(text) if text else {}


def prometheus_query(url: str, fetch: Callable[[str, float], bytes] | None = None) -> Query:
    from .sources import SourceError, http_get

    def query(expr: str) -> list[dict]:
        body = (fetch or http_get)(f"{url.rstrip('/')}/api/v1/query?" + urllib.parse.urlencode({"query": expr}), 10.0)
        try:
            doc = json.loads(body)
        except ValueError as exc:
            raise SourceError(f"query {expr!r}: unreadable answer: {exc}") from None
        if doc.get("status") != "success":
            raise SourceError(f"query {expr!r}: {doc.get('error')}")
        return list(doc["data"]["result"])

    return query


__all__ = ["ApiError", "ClientKube", "Facts", "MetricFacts", "diagnose", "gather", "prometheus_query"]
