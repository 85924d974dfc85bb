"""The HTML report says what made it (provenance), marks the best policy, defines its metrics and shows spread only
when there is one; no absolute local paths."""

from __future__ import annotations

import hashlib
import json

import pytest

import gpufleet
from gpufleet.cli.main import main

from .test_packing_and_cli import NODES, pods_csv


@pytest.fixture
def tiny(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "nodes.csv").write_text(NODES)
    (tmp_path / "pods.csv").write_text(pods_csv())
    return tmp_path


def simulate(tiny, seeds: str) -> str:
    out = tiny / "r.html"
    assert main(["simulate", "--nodes", str(tiny / "nodes.csv"), "--pods", str(tiny / "pods.csv"), "--policy", "fgd,bestfit",
                 "--seeds", seeds, "--jobs", "1", "--no-progress", "--report", str(out), "--json", str(tiny / "r.json")]) == 0
    return out.read_text()


def test_one_seed_report(tiny):
    page = simulate(tiny, "42")
    assert f"<code>{gpufleet.__version__}</code>" in page and "UTC" in page
    for name in ("nodes.csv", "pods.csv"):
        assert hashlib.sha256((tiny / name).read_bytes()).hexdigest() in page
    assert str(tiny) not in page and "/tmp/" not in page  # file names only, not this machine's paths
    assert "(best)" in page and "class='best'" in page
    for metric in ("unallocated GPU %", "failed pods", "fragmentation amount", "fragmentation rate", "offline bound"):
        assert f"<dt>{metric}</dt>" in page
    assert "± std" not in page and "band" not in page  # no spread from one seed
    assert "Curves (seed 42)" in page and "--seeds 42-51" in page
    assert "offline bound" in page and "width=device-width" in page
    prov = json.loads((tiny / "r.json").read_text())["params"]["provenance"]
    assert prov["seeds"] == "42 (1)" and prov["bound"].endswith("(LP relaxation)")
    from gpufleet.version import git_commit  # looked up at the command's start, read at its end: the same answer

    assert prov["commit"] == (git_commit() or "unknown (not a git checkout)")


def test_several_seeds_show_spread(tiny):
    page = simulate(tiny, "1-3")
    assert "± std" in page and "band = ±1 std" in page and "Mean over 3 seeds" in page
    assert "1-3 (3)" in page


def test_no_bound_is_stated(tiny):
    out = tiny / "r.html"
    assert main(["simulate", "--nodes", "nodes.csv", "--pods", "pods.csv", "--policy", "fgd", "--no-bound", "--jobs", "1",
                 "--no-progress", "--report", str(out)]) == 0
    assert "not computed (--no-bound)" in out.read_text()


def test_input_problems_are_in_the_report(tiny):
    (tiny / "pods2.csv").write_text(pods_csv(30) + "px,nan,1,1,500,,LS,Running,1,2,1\nbig,1000,1,16,1000,,LS,Running,1,2,1\n")
    out = tiny / "r.html"
    assert main(["simulate", "--nodes", "nodes.csv", "--pods", "pods2.csv", "--policy", "fgd", "--jobs", "1", "--skip-bad-rows",
                 "--no-progress", "--report", str(out)]) == 0
    page = out.read_text()
    assert "1 pod rows skipped" in page and "pods2.csv:32: field cpu_milli" in page
    assert "1 pods no node of this cluster can hold" in page and "big: needs 16 GPUs; the largest node has 8" in page
