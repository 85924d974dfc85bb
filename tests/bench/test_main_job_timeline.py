"""``bench/main_job_timeline.py``: each worker's tasks of ``gpufleet simulate`` on a timeline, and what it sums up."""

from __future__ import annotations

import multiprocessing
import os
import subprocess
import sys

import pytest

from tests.bench.loader import REPO, bench_module
from tests.simulator.test_packing_and_cli import NODES, pods_csv


def _module():
    return bench_module("main_job_timeline")


def test_summary_says_startup_makespan_against_cpu_tail_and_end():
    tasks = [  # worker 1: the bound then one run; worker 2: two runs, done 0.5 s before worker 1
        {"pid": 1, "task": "bound", "seed": 42, "start": 0.3, "end": 3.3, "cpu": 2.9},
        {"pid": 2, "task": "default", "seed": 42, "start": 0.3, "end": 2.8, "cpu": 2.5},
        {"pid": 2, "task": "bestfit", "seed": 42, "start": 2.8, "end": 4.3, "cpu": 1.4},
        {"pid": 1, "task": "fgd", "seed": 42, "start": 3.3, "end": 4.8, "cpu": 1.5},
    ]
    lines = _module().summary(tasks, done_s=4.9, parent_cpu_s=0.4, cores=2)
    assert lines[0] == "worker 1: 4.40 CPU s: bound 0.30-3.30 (2.90 CPU), fgd 3.30-4.80 (1.50 CPU)"
    assert lines[1] == "worker 2: 3.90 CPU s: default 0.30-2.80 (2.50 CPU), bestfit 2.80-4.30 (1.40 CPU)"
    assert ("start-up (this script's start to the first task): 0.30 s wall; the parent's CPU in all 0.40 s; "
            "the parent and the workers 8.70 CPU s") in lines
    assert "makespan: 4.50 s wall; the workers' CPU 8.30 s over 2: 4.15 s" in lines
    assert "tail: the last task ends 0.50 s after the first worker's last" in lines
    assert "end (the last task to the command's return): 0.10 s; all of it 4.90 s wall" in lines
    # the bound in a process of its own: three workers on two cores, the tail from when one core is left
    three = [dict(t, pid=3) if t["task"] == "bound" else t for t in tasks]
    lines = _module().summary(three, done_s=4.9, parent_cpu_s=0.4, cores=2)
    assert "makespan: 4.50 s wall; the workers' CPU 8.30 s over 2: 4.15 s" in lines
    assert "tail: the last task ends 0.50 s after the first of the last 2 workers to finish" in lines


@pytest.mark.skipif(multiprocessing.get_start_method(allow_none=False) != "fork", reason="needs the fork start method")
def test_times_every_task_in_its_worker(tmp_path):
    (tmp_path / "nodes.csv").write_text(NODES)
    (tmp_path / "pods.csv").write_text(pods_csv())
    env = dict(os.environ, PYTHONPATH=str(REPO / "src"))
    p = subprocess.run([sys.executable, str(REPO / "bench" / "main_job_timeline.py"), "--nodes", str(tmp_path / "nodes.csv"),
                        "--pods", str(tmp_path / "pods.csv"), "--policy", "fgd,bestfit,random", "--jobs", "2",
                        "--mip-rel-gap", "0.01"],
                       capture_output=True, text=True, env=env, timeout=300, cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    assert "offline bound" in p.stdout  # the command's own table
    workers = [line for line in p.stderr.splitlines() if line.startswith("worker ")]
    assert len(workers) == 3  # the first offline bound in a process of its own, the runs over two workers
    timed = " ".join(workers)
    for task in ("bound", "fgd", "bestfit", "random"):  # every task, in one worker or the other
        assert timed.count(f"{task} ") == 1, timed
    assert any(line.startswith("makespan: ") for line in p.stderr.splitlines())


def test_a_bad_gap_is_a_usage_error():
    env = dict(os.environ, PYTHONPATH=str(REPO / "src"))
    p = subprocess.run([sys.executable, str(REPO / "bench" / "main_job_timeline.py"), "--mip-rel-gap", "x"],
                       capture_output=True, text=True, env=env, timeout=120)
    assert p.returncode == 2 and "--mip-rel-gap needs a number" in p.stderr
