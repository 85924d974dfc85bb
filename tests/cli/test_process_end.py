"""``gpufleet`` as the process's own command line freezes the collector's view before the process ends
(``cli.main._ending``); ``main(argv)`` called inside a process that goes on (tests, scripts) leaves it alone."""

from __future__ import annotations

import gc
import json
import subprocess
import sys

from gpufleet.cli import main as cli


def test_only_the_process_command_line_freezes_the_collector(monkeypatch, capsys):
    frozen: list[bool] = []
    monkeypatch.setattr(gc, "freeze", lambda: frozen.append(True))
    monkeypatch.setattr(sys, "argv", ["gpufleet"])  # no command: the help and exit status 2
    assert cli.main() == 2 and frozen == [True]
    assert cli.main([]) == 2 and frozen == [True]  # an argv given: the caller goes on, nothing frozen
    capsys.readouterr()


def test_a_run_as_its_own_process_writes_everything_and_ends_cleanly(tmp_path):
    # the bundled-format tiny trace of the simulator tests, through ``python -m gpufleet`` (main(None): frozen at the end)
    from tests.simulator.test_packing_and_cli import NODES, pods_csv

    (tmp_path / "nodes.csv").write_text(NODES)
    (tmp_path / "pods.csv").write_text(pods_csv())
    out = subprocess.run([sys.executable, "-m", "gpufleet", "simulate", "--nodes", "nodes.csv", "--pods", "pods.csv",
                          "--policy", "bestfit,random", "--jobs", "2", "--json", "out.json", "--report", "r.html",
                          "--no-progress"], capture_output=True, text=True, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert json.loads((tmp_path / "out.json").read_text())["summary"].keys() == {"bestfit", "random"}
    assert (tmp_path / "r.html").read_text().rstrip().endswith("</html>")
    assert "bestfit" in out.stdout and "Traceback" not in out.stderr and "Exception" not in out.stderr
