"""The layout enforces the architecture: a pure engine, adapters depending inward."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_import_contracts_hold():
    """import-linter contracts from pyproject.toml (engine/policies pure; layers point inward)."""
    exe = Path(sys.executable).with_name("lint-imports")
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "importlinter.cli"]
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


def test_engine_import_loads_no_adapter_libraries():
    code = (
        "import sys, gpufleet.engine.framework, gpufleet.engine.podspec, gpufleet.policies; "
        "bad = [m for m in ('kubernetes', 'grpc', 'pynvml', 'prometheus_client', 'gpufleet.kube', 'gpufleet.agent') if m in sys.modules]; "
        "print(','.join(bad))"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert r.stdout.strip() == "", f"engine pulled in: {r.stdout}"


def test_engine_does_no_io():
    """No file, socket, subprocess or environment use in the engine's decision code.

    ``engine/config.py`` is the one exception: it reads a profile YAML at start-up.
    """
    forbidden = ("open(", "read_text", "socket", "subprocess", "import requests", "urllib", "os.environ")
    for f in (ROOT / "src" / "gpufleet" / "engine").rglob("*.py"):
        if f.name == "config.py":
            continue
        text = f.read_text()
        for word in forbidden:
            assert word not in text, f"{f.relative_to(ROOT)} uses {word!r}"
