"""The three sub-commands' argument handling and profile loading (no cluster needed)."""

from __future__ import annotations

import argparse

import pytest

from gpufleet.kube import cli, explain_cli, extender_cli
from tests.kube.fake_api import FakeApi
from gpufleet.policies import build_profile, policy_names

from .test_loop import node, pod


def parse(mod, argv):
    p = argparse.ArgumentParser()
    mod.add_arguments(p)
    return p.parse_args(argv)


def test_defaults_and_flags():
    a = parse(cli, [])
    assert a.scheduler_name == "gpufleet" and a.leader_elect and a.metrics_addr.endswith(":10251") and a.bind_workers == 16
    a = parse(cli, ["--no-leader-elect", "--scheduler-name", "gpu", "--config", "x.yaml"])
    assert not a.leader_elect and a.scheduler_name == "gpu" and a.config == "x.yaml"
    assert parse(extender_cli, ["--addr", "127.0.0.1:9"]).addr == "127.0.0.1:9"
    assert parse(explain_cli, ["ml/p"]).pod == "ml/p"


def test_load_profile_by_name_by_config_and_fallback(tmp_path, monkeypatch):
    assert cli.load_profile("bestfit", None).name
    f = tmp_path / "c.yaml"
    f.write_text("profiles:\n  - name: mine\n    plugins:\n      score: [{name: LeastAllocated, weight: 2}]\n")
    assert cli.load_profile("default", str(f)).name == "mine"
    import gpufleet.policies as pol

    monkeypatch.setattr(pol, "policy_names", lambda: [n for n in policy_names() if n != "default"])
    assert cli.load_profile("default", None) is not None  # falls back to a builtin that exists


def test_bad_config_exits_2(tmp_path, capsys):
    f = tmp_path / "bad.yaml"
    f.write_text("profiles:\n  - name: x\n    plugins:\n      score: [NoSuchPlugin]\n")
    assert cli.run(parse(cli, ["--config", str(f)])) == 2
    assert "NoSuchPlugin" in capsys.readouterr().err


def test_explain_text_for_pending_bound_and_missing():
    api = FakeApi()
    api.add_node(node("n1", gpus=1))
    api.add_node(node("n2", gpus=2))
    api.add_pod(pod("wide", gpus=4))
    p = pod("done")
    p["spec"]["nodeName"] = "n2"
    api.add_pod(p)
    prof = build_profile("bestfit")
    code, text = explain_cli.explain(api, prof, "ml/wide")
    assert code == 0 and "0/2 nodes are available" in text and "n1" in text and "Insufficient nvidia.com/gpu" in text
    code, text = explain_cli.explain(api, prof, "ml/done")
    assert code == 0 and "bound to n2" in text
    assert explain_cli.explain(api, prof, "ml/ghost")[0] == 1


@pytest.mark.parametrize("name", ["scheduler", "extender", "explain"])
def test_commands_are_wired_into_the_cli(name):
    from gpufleet.cli import main

    assert name in main.COMMANDS


@pytest.mark.parametrize("status,exc", [(409, "Conflict"), (404, "NotFound"), (410, "Gone"), (403, "ApiError")])
def test_http_errors_map_to_the_loops_exceptions(status, exc):
    from gpufleet.kube import api as kapi

    err = kapi._status_error(status, b'{"kind": "Status", "message": "pods \\"x\\" is forbidden: nope"}', "r")
    assert type(err) is getattr(kapi, exc) and "nope" in str(err)
    assert str(kapi._status_error(status, b"<html>proxy error</html>", "Bad Gateway")).endswith("Bad Gateway")
