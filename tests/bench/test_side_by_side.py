"""``bench/side_by_side.py --same-stdout``: a speed-up measured side by side must not change what the command prints."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _checkout(root: Path, name: str) -> Path:
    c = root / name
    (c / "src" / "gpufleet").mkdir(parents=True)
    return c


def _side_by_side(old: Path, new: Path, code: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(REPO / "src"))
    return subprocess.run([sys.executable, str(REPO / "bench" / "side_by_side.py"), str(old), str(new), "--rounds", "2",
                           "--same-stdout", "--", sys.executable, "-c", code],
                          capture_output=True, text=True, env=env, timeout=120)


def test_the_same_output_in_every_run_passes(tmp_path):
    p = _side_by_side(_checkout(tmp_path, "a"), _checkout(tmp_path, "b"), "print('p99 1470')")
    assert p.returncode == 0, p.stderr
    assert "output: identical in every run (4 runs)" in p.stdout and "p99 1470" in p.stdout


def test_an_output_that_moves_is_reported_and_fails(tmp_path):
    # each checkout prints its own directory name: the new one differs from the old one's first run
    p = _side_by_side(_checkout(tmp_path, "a"), _checkout(tmp_path, "b"), "import os; print(os.path.basename(os.getcwd()))")
    assert p.returncode == 1
    assert "output: DIFFERS" in p.stdout and "round 1" in p.stdout
