"""KubernetesApi's own plumbing, without an API server: the client limit (``--kube-api-qps``), the cached
Authorization header and its one retry on 401, the direct connection pool and a pool with room for the watches."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpufleet.kube.api import ApiError, KubernetesApi, RateLimiter


class FakeClock:
    def __init__(self) -> None:
        self.t = 100.0
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.t

    def sleep(self, s: float) -> None:
        self.slept.append(s)
        self.t += s


def test_rate_limiter_allows_a_burst_then_qps():
    c = FakeClock()
    lim = RateLimiter(10.0, 3, clock=c, sleep=c.sleep)
    assert [lim.take() for _ in range(3)] == [0.0, 0.0, 0.0]  # the burst
    assert lim.take() == pytest.approx(0.1)  # then one token every 1/qps
    assert lim.take() == pytest.approx(0.1)
    c.t += 10.0  # idle: the bucket fills up to the burst again, no more
    assert [lim.take() for _ in range(3)] == [0.0, 0.0, 0.0]
    assert lim.take() == pytest.approx(0.1)


def _kubeconfig(tmp_path: Path, server: str = "https://127.0.0.1:6443/prefix/") -> str:
    p = tmp_path / "kubeconfig"
    p.write_text(f"""apiVersion: v1
kind: Config
clusters:
- name: c
  cluster: {{server: "{server}", insecure-skip-tls-verify: true}}
users:
- name: u
  user: {{token: secret-token}}
contexts:
- name: x
  context: {{cluster: c, user: u}}
current-context: x
""")
    return str(p)


class Reply:
    def __init__(self, status: int, body: dict) -> None:
        self.status = status
        self.data = json.dumps(body).encode()
        self.reason = "x"


def _counting(api: KubernetesApi, replies: list[Reply]) -> tuple[list, list]:
    """Replace the network: record each request, answer from ``replies``; count asks for credentials."""
    sent: list = []
    asked: list = []
    real = api.api.update_params_for_auth

    def ask(*a, **kw):
        asked.append(1)
        return real(*a, **kw)

    api.api.update_params_for_auth = ask  # type: ignore[method-assign]
    api._urlopen = lambda method, path, body, headers, timeout, preload_content=True: (  # type: ignore[method-assign]
        sent.append((method, path, dict(headers))), replies.pop(0))[1]
    return sent, asked


def test_the_authorization_header_is_asked_for_once_per_ttl(tmp_path):
    api = KubernetesApi(_kubeconfig(tmp_path))
    sent, asked = _counting(api, [Reply(200, {"n": i}) for i in range(3)])
    assert [api._request("GET", "/api/v1/pods/x")["n"] for _ in range(3)] == [0, 1, 2]
    assert len(asked) == 1  # the kubeconfig is not reloaded per call
    assert all(h["authorization"] == "Bearer secret-token" for _, _, h in sent)
    api._auth = (api._auth[0] - api.AUTH_TTL_S - 1, api._auth[1])  # type: ignore[index]
    sent2, asked2 = _counting(api, [Reply(200, {})])
    api._request("GET", "/x")
    assert len(asked2) == 1  # past its time: asked again


def test_a_401_asks_for_the_credential_again_and_retries_once(tmp_path):
    api = KubernetesApi(_kubeconfig(tmp_path))
    sent, asked = _counting(api, [Reply(200, {}), Reply(401, {"message": "token expired"}), Reply(201, {"ok": 1})])
    api._request("GET", "/x")
    assert api._request("POST", "/y", {"a": 1}) == {"ok": 1}
    assert [m for m, _, _ in sent] == ["GET", "POST", "POST"] and len(asked) == 2
    sent, asked = _counting(api, [Reply(401, {"message": "no"}), Reply(401, {"message": "still no"})])
    with pytest.raises(ApiError, match="still no"):
        api._request("GET", "/z")
    assert len(sent) == 2  # once more, not a loop


def test_the_client_limit_applies_to_calls(tmp_path):
    api = KubernetesApi(_kubeconfig(tmp_path), qps=5.0, burst=2)
    c = FakeClock()
    assert api.limiter is not None
    api.limiter = RateLimiter(5.0, 2, clock=c, sleep=c.sleep)
    _counting(api, [Reply(200, {}) for _ in range(4)])
    for _ in range(4):
        api._request("GET", "/x")
    assert c.slept == pytest.approx([0.2, 0.2])
    assert KubernetesApi(_kubeconfig(tmp_path)).limiter is None  # default: no limit, as before


def test_requests_go_straight_to_the_servers_pool_with_its_path_prefix(tmp_path):
    api = KubernetesApi(_kubeconfig(tmp_path), pool_size=8)
    assert api._direct is not None and api._prefix == "/prefix"
    assert (api._direct.host, api._direct.port) == ("127.0.0.1", 6443)
    assert api.api.configuration.connection_pool_maxsize == 8 + KubernetesApi.WATCH_SLOTS  # the watches' own room
    seen = []
    api._direct.urlopen = lambda method, url, **kw: seen.append((method, url)) or Reply(200, {})  # type: ignore[method-assign]
    api._request("GET", "/api/v1/nodes")
    assert seen == [("GET", "/prefix/api/v1/nodes")]
