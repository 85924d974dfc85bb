"""Reclaim's adapters: the official-client calls (event, annotation, Eviction API), the CLI end to end, agent scraping."""

from __future__ import annotations

import http.server
import json
import threading

import pytest
from kubernetes.client.exceptions import ApiException

from gpufleet.cli.main import main
from gpufleet.utilization import kube_actions
from gpufleet.utilization.kube_actions import KubeReclaimClient
from gpufleet.utilization.sources import AgentScrapeSource, agent_urls_from_nodes, parse_exposition

from .test_reclaim import CLUSTER, FIX, NOW, FakeKube


class FakeCore:
    def __init__(self, evict_status=None):
        self.calls = []
        self.evict_status = evict_status

    def patch_namespaced_pod(self, name, ns, body):
        self.calls.append(("patch", ns, name, body))

    def create_namespaced_event(self, ns, ev):
        self.calls.append(("event", ns, ev.involved_object.name, ev.reason, ev.type))

    def create_namespaced_pod_eviction(self, name, ns, body):
        if self.evict_status:
            raise ApiException(status=self.evict_status, reason="Too Many Requests")
        self.calls.append(("evict", ns, name, body.metadata.name, body.metadata.namespace))


def test_official_client_calls():
    core = FakeCore()
    k = KubeReclaimClient(core=core, policy=object())
    assert k.warn("ml", "nb", "2025-11-22T14:00:00Z", "idle") == "warned"
    assert core.calls[0] == ("patch", "ml", "nb", {"metadata": {"annotations": {"gpufleet.io/idle-warning": "2025-11-22T14:00:00Z"}}})
    assert core.calls[1] == ("event", "ml", "nb", "GpuIdle", "Warning")
    assert k.clear("ml", "nb", "busy") == "cleared"
    assert core.calls[2][3] == {"metadata": {"annotations": {"gpufleet.io/idle-warning": None}}}  # merge patch removes it
    assert k.evict("ml", "nb", "bye") == "evicted" and core.calls[4] == ("evict", "ml", "nb", "nb", "ml")
    assert KubeReclaimClient(core=FakeCore(429), policy=object()).evict("ml", "nb", "x") == "blocked"
    assert KubeReclaimClient(core=FakeCore(404), policy=object()).evict("ml", "nb", "x") == "gone"
    with pytest.raises(ApiException):
        KubeReclaimClient(core=FakeCore(500), policy=object()).evict("ml", "nb", "x")


@pytest.fixture
def prometheus():
    body = (FIX / "reclaim_util.json").read_bytes()
    seen = []

    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802
            seen.append(self.path)
            ok = self.path.startswith("/api/v1/query_range")
            self.send_response(200 if ok else 404)
            self.end_headers()
            self.wfile.write(body if ok else b"not found")

        def log_message(self, *a):
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{srv.server_address[1]}", seen
    srv.shutdown()


def test_cli_dry_run_json(prometheus, monkeypatch, tmp_path, capsys):
    url, seen = prometheus
    kube = FakeKube(CLUSTER["pods"], CLUSTER["pdbs"])
    monkeypatch.setattr(kube_actions, "KubeReclaimClient", lambda kubeconfig=None: kube)
    monkeypatch.setattr("time.time", lambda: NOW)
    pol = tmp_path / "policy.yaml"
    pol.write_text("namespaces:\n  prod: {action: evict, grace: 1h}\n  research: {action: warn}\n")
    assert main(["reclaim", "--prometheus", url, "--policy-file", str(pol), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["applied"] is False and doc["summary"]["evict"] == 3 and kube.calls == []
    assert {a["pod"] for a in doc["actions"] if a["action"] == "evict"} == {"prod/idle-warned-2h", "prod/pdb-a", "prod/bare"}
    assert seen and "query_range" in seen[0]


def test_cli_bad_policy_and_dead_prometheus(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(kube_actions, "KubeReclaimClient", lambda kubeconfig=None: FakeKube([], []))
    pol = tmp_path / "p.yaml"
    pol.write_text("namespaces:\n  prod: {action: nuke}\n")
    assert main(["reclaim", "--prometheus", "http://127.0.0.1:9", "--policy-file", str(pol)]) == 2
    assert "namespaces.prod.action" in capsys.readouterr().err
    assert main(["reclaim", "--prometheus", "http://127.0.0.1:9"]) == 1
    assert "utilisation source" in capsys.readouterr().err


def test_agent_scrape_source_builds_history():
    bodies = {
        "http://a/metrics": 'DCGM_FI_DEV_GPU_UTIL{gpu="0",namespace="ml",pod="p"} 3\nDCGM_FI_DEV_GPU_UTIL{gpu="1",namespace="ml",pod="p"} 7\n'
                            'DCGM_FI_DEV_GPU_UTIL{gpu="2",namespace="",pod=""} 99\n',
        "http://b/metrics": "garbage {{{\n",
    }

    def fetch(url, timeout_s):
        return bodies[url].encode()

    src = AgentScrapeSource(list(bodies), history_s=120, fetch=fetch)
    assert src.scrape(1000.0) == 1 and "http://b/metrics" in src.errors
    src.scrape(1060.0)
    src.scrape(1200.0)  # drops what is older than 120 s
    assert src.series(0, 2000) == {"ml/p": [(1200.0, 7.0)]} or src.series(0, 2000) == {"ml/p": [(1100.0, 7.0), (1200.0, 7.0)]}
    assert src.series(0, 2000)["ml/p"][0][0] >= 1080
    assert parse_exposition(bodies["http://a/metrics"]) == {"ml/p": 7.0}
    nodes = [{"status": {"allocatable": {"nvidia.com/gpu": "8"}, "addresses": [{"type": "InternalIP", "address": "10.0.0.5"}]}},
             {"status": {"allocatable": {"cpu": "8"}, "addresses": [{"type": "InternalIP", "address": "10.0.0.6"}]}}]
    assert agent_urls_from_nodes(nodes) == ["http://10.0.0.5:9400/metrics"]
