"""A script of ``bench/`` loaded as a module, so its tests can call its pure parts (``bench/`` is not a package)."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

REPO = Path(__file__).resolve().parents[2]


def bench_module(name: str) -> ModuleType:
    """``bench/<name>.py``, executed afresh under the module name ``name``."""
    spec = importlib.util.spec_from_file_location(name, REPO / "bench" / f"{name}.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod
