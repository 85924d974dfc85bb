"""The CLI against a real kube-apiserver: answers, then a clear one-line error (exit 1) once it is gone.

(The control plane is shared by the module's tests; the API-server-gone case uses a kubeconfig pointing at a
closed port, so it does not stop the shared control plane.)
"""

from __future__ import annotations

import pytest

from gpufleet.cli.main import main

pytestmark = pytest.mark.apiserver  # needs KUBEBUILDER_ASSETS (tests/apiserver_support.py)


def run(argv):
    try:
        return main(argv)
    except SystemExit as exc:
        return int(exc.code or 0)


def test_explain_and_top_against_a_real_apiserver(control_plane, core, nodes, capsys):
    kc = str(control_plane.kubeconfig)
    nodes("live-a", 2, inventory=True)
    core.create_namespaced_pod("default", {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "want4"},
                                           "spec": {"schedulerName": "gpufleet", "containers": [{
                                               "name": "c", "image": "x", "resources": {"limits": {"nvidia.com/gpu": "4"}}}]}})
    try:
        assert run(["explain", "default/want4", "--kubeconfig", kc]) == 0
        out = capsys.readouterr().out
        assert "live-a" in out and "nvidia.com/gpu" in out
        assert run(["explain", "default/nope", "--kubeconfig", kc]) == 1
        assert capsys.readouterr().err.strip() == "pod default/nope not found"
        assert run(["top", "--once", "--kubeconfig", kc]) == 0
        assert "live-a" in capsys.readouterr().out
        assert run(["explain", "default/want4", "--kubeconfig", kc, "--context", "nope"]) == 2
        assert capsys.readouterr().err.count("\n") == 1
    finally:
        core.delete_namespaced_pod("want4", "default", grace_period_seconds=0)


@pytest.mark.parametrize("cmd", [["explain", "default/x"], ["top", "--once"]])
def test_apiserver_gone_is_one_line_exit_1(control_plane, tmp_path, capsys, cmd):
    import socket

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    kc = tmp_path / "kc"
    kc.write_text(control_plane.kubeconfig.read_text().replace(control_plane.url, f"https://127.0.0.1:{port}"))
    assert run([*cmd, "--kubeconfig", str(kc)]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "cannot reach the Kubernetes API server" in err and "Traceback" not in err
