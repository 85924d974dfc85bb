"""The layout enforces the architecture: a pure engine, adapters depending inward."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ADAPTER_LIBS = ("kubernetes", "grpc", "pynvml", "prometheus_client")


def _lint_imports(cwd: Path, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    exe = Path(sys.executable).with_name("lint-imports")
    # no script beside this interpreter (a venv that sees the system's import-linter): its click command directly
    # (``python -m importlinter.cli`` runs nothing and exits 0)
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-c", "from importlinter.cli import lint_imports_command; "
                                                                 "lint_imports_command()"]
    return subprocess.run(cmd + list(args), cwd=cwd, capture_output=True, text=True, env=env, timeout=120)


def _contracts() -> list[dict]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]


def test_import_contracts_hold():
    """import-linter contracts from pyproject.toml (engine/policies pure; layers point inward)."""
    r = _lint_imports(ROOT)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out
    n = len(_contracts())
    assert f"Contracts: {n} kept, 0 broken." in out, out
    for c in _contracts():
        assert f"{c['name']} KEPT" in out, out


def test_contracts_say_what_the_architecture_needs():
    """Deleting or loosening a contract must fail here, not pass silently."""
    forbidden = [c for c in _contracts() if c["type"] == "forbidden"]
    pure = next(c for c in forbidden if "gpufleet.engine" in c["source_modules"])
    assert {"gpufleet.engine", "gpufleet.policies"} <= set(pure["source_modules"])
    assert set(ADAPTER_LIBS) | {"gpufleet.kube", "gpufleet.agent", "gpufleet.simulator", "gpufleet.cli"} <= set(pure["forbidden_modules"])
    layers = next(c for c in _contracts() if c["type"] == "layers")["layers"]
    assert layers[-2:] == ["gpufleet.policies", "gpufleet.engine"]
    assert layers[0] == "gpufleet.cli"
    adapters = next(layer for layer in layers if "gpufleet.kube" in layer)
    assert {x.strip() for x in adapters.split("|")} == {"gpufleet.kube", "gpufleet.simulator", "gpufleet.agent"}


def test_import_linter_catches_a_violation(tmp_path):
    """The checker itself works: an engine that imports an adapter is reported broken."""
    pkg = tmp_path / "fakefleet"
    for sub, body in {"": "", "engine": "from fakefleet import kube\n", "kube": ""}.items():
        d = pkg / sub if sub else pkg
        d.mkdir(parents=True, exist_ok=True)
        (d / "__init__.py").write_text(body)
    (tmp_path / "setup.cfg").write_text(
        textwrap.dedent(
            """
            [importlinter]
            root_package = fakefleet

            [importlinter:contract:pure]
            name = engine is pure
            type = forbidden
            source_modules = fakefleet.engine
            forbidden_modules = fakefleet.kube
            """
        )
    )
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    r = _lint_imports(tmp_path, "--config", "setup.cfg", "--no-cache", env=env)
    assert r.returncode != 0 and "BROKEN" in r.stdout, r.stdout + r.stderr


def test_engine_import_loads_no_adapter_libraries():
    """Import every engine and policies module in a fresh interpreter; no adapter library may come along."""
    code = textwrap.dedent(
        f"""
        import importlib, pkgutil, sys
        import gpufleet.engine, gpufleet.policies
        for pkg in (gpufleet.engine, gpufleet.policies):
            for m in pkgutil.walk_packages(pkg.__path__, pkg.__name__ + "."):
                importlib.import_module(m.name)
        bad = sorted(m for m in sys.modules
                     if m.split(".")[0] in {ADAPTER_LIBS!r} + ("matplotlib", "tqdm")
                     or m.startswith(("gpufleet.kube", "gpufleet.agent", "gpufleet.simulator", "gpufleet.cli", "gpufleet.utilization")))
        print(",".join(bad))
        """
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    assert r.stdout.strip() == "", f"engine pulled in: {r.stdout}"


def test_engine_package_alone_is_light():
    code = "import sys, gpufleet.engine; print(','.join(m for m in " + repr(ADAPTER_LIBS) + " if m in sys.modules))"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    assert r.stdout.strip() == ""


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


# the engine's plugins: one module per plugin (kube-scheduler's families kept together), its tests beside it
PLUGIN_FAMILIES = {
    "noderesources": {"NodeResourcesFit", "LeastAllocated", "MostAllocated"},
    "volumes": {"VolumeBinding", "NodeVolumeLimits"},
    "gpuselect": {"BestFitGpu"},
}


def _registered_by_module(package: str) -> dict[str, set[str]]:
    """{module under ``package``: the plugin names registered from it}."""
    from gpufleet.policies import registry

    r = registry()
    where: dict[str, set[str]] = {}
    for name in r.names():
        module = type(r.create(name)).__module__
        if module.startswith(package + "."):
            where.setdefault(module.rsplit(".", 1)[1], set()).add(name)
    return where


def test_engine_plugins_one_module_each_with_tests_beside_it():
    where = _registered_by_module("gpufleet.engine.plugins")
    assert where, "no engine plugin found in the registry"
    for module, names in where.items():
        assert names == PLUGIN_FAMILIES.get(module, {n for n in names if n.lower() == module}), (module, names)
    src = ROOT / "src" / "gpufleet" / "engine" / "plugins"
    modules = {p.stem for p in src.glob("*.py") if not p.stem.startswith("_")}
    assert modules == set(where), "a plugin module that registers nothing, or a registered plugin outside engine/plugins"
    tests = ROOT / "tests" / "engine" / "plugins"
    assert [m for m in sorted(modules) if not (tests / f"test_{m}.py").exists()] == []


def test_paper_policies_one_module_each():
    """The FGD paper's six policies: a module each (random-fit's node score and GPU pick together)."""
    assert _registered_by_module("gpufleet.policies.paper") == {
        "randomfit": {"RandomScore", "RandomGpu"}, "dotproduct": {"DotProductScore"}, "clustering": {"GpuClusteringScore"},
        "packing": {"GpuPackingScore"}, "bestfit": {"BestFitScore"}, "fgd": {"FGDScore"},
    }
