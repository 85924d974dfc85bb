"""The built image runs every part as its non-root user (skipped unless GPUFLEET_TEST_IMAGE names a local image).

    scripts/build-image.sh --tag localhost/gpufleet:dev
    GPUFLEET_TEST_IMAGE=localhost/gpufleet:dev python -m pytest tests/deploy/test_image.py

Runs it with podman (or $CONTAINER_ENGINE).  The rlimits are passed explicitly: on some machines root cannot raise
them to the engine's defaults.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

IMAGE = os.environ.get("GPUFLEET_TEST_IMAGE", "")
ENGINE = os.environ.get("CONTAINER_ENGINE") or shutil.which("podman") or shutil.which("docker") or ""
LIMITS = ["--ulimit", "nofile=1024:1024", "--ulimit", "nproc=4096:4096"]

pytestmark = [pytest.mark.skipif(not (IMAGE and ENGINE), reason="set GPUFLEET_TEST_IMAGE (and have podman or docker)"),
              pytest.mark.slow]


def run(*args: str, opts: tuple[str, ...] = (), entrypoint: str | None = None, timeout: float = 300):
    cmd = [ENGINE, "run", "--rm", *LIMITS, *opts, *(["--entrypoint", entrypoint] if entrypoint else []), IMAGE, *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)


def test_size_user_and_contents():
    info = json.loads(subprocess.check_output([ENGINE, "image", "inspect", IMAGE]))[0]
    size_mb = info["Size"] / 1e6
    print(f"{IMAGE}: {size_mb:.0f} MB uncompressed")
    assert size_mb < 500
    cfg = info.get("Config") or info.get("ContainerConfig") or {}
    assert cfg["User"] == "10001:10001" and cfg["Entrypoint"] == ["/opt/gpufleet/bin/gpufleet"]
    r = run("-c", "id -u; id -g; ls /opt/gpufleet/bin; sha256sum /etc/ssl/certs/ca-certificates.crt 2>/dev/null || true",
            entrypoint="/bin/sh")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.split()
    assert lines[:2] == ["10001", "10001"]
    assert "gpufleet" in lines and "pip" not in lines and "pip3" not in lines  # the runtime venv, no installers
    host_ca = Path("/etc/ssl/certs/ca-certificates.crt")
    if host_ca.is_file():  # the bundle mounted for the build's RUN steps never lands in the image
        assert hashlib.sha256(host_ca.read_bytes()).hexdigest() not in r.stdout


def test_simulate_runs_as_the_main_job():
    r = run("simulate", "--policy", "bestfit", "--jobs", "1", "--no-bound", "--no-progress")
    assert r.returncode == 0, r.stderr[-2000:]
    assert "bestfit" in r.stdout and "wrote report.html" in r.stderr  # in the image's writable working directory


def test_simulate_on_a_read_only_root_says_where_to_write():
    r = run("simulate", "--policy", "bestfit", "--no-progress", opts=("--read-only",), timeout=120)
    assert r.returncode == 2 and "cannot write there" in r.stderr and "Traceback" not in r.stderr, r.stderr
    r = run("simulate", "--policy", "bestfit", "--jobs", "1", "--no-bound", "--no-progress", "--report", "/tmp/r.html",
            opts=("--read-only", "--tmpfs", "/tmp"))
    assert r.returncode == 0 and "wrote /tmp/r.html" in r.stderr, r.stderr[-2000:]


@pytest.mark.parametrize("part", ["scheduler", "extender", "explain", "agent", "reclaim", "recommend", "top"])
def test_every_part_starts(part):
    r = run(part, "--help", timeout=120)
    assert r.returncode == 0 and f"usage: gpufleet {part}" in r.stdout, r.stderr[-2000:]


def test_agent_discovers_with_the_fake_backend_on_a_read_only_root():
    r = run("agent", "--nvml", "fake:a100-mig", "--once", opts=("--read-only",), timeout=120)
    assert r.returncode == 0 and "nvidia.com/mig-" in r.stdout, r.stderr[-2000:]


def test_scheduler_without_cluster_credentials_fails_cleanly():
    r = run("scheduler", "--kubeconfig", "/nonexistent", "--no-leader-elect", timeout=120)
    assert r.returncode == 2 and "Traceback" not in r.stdout + r.stderr, r.stdout + r.stderr
