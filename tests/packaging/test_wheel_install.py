"""A non-editable install works: the wheel carries every file the code reads, and its commands run from it.

The editable install of the README reads profiles and the bundled trace straight from ``src/``, so a file missing
from the package data shows up only in a wheel, a container image or a user's ``pip install``.  This builds the
wheel from a copy of the sources (offline: ``--no-build-isolation``), installs it with ``--no-deps`` into a fresh
venv and runs the commands from a directory outside the source tree with no ``PYTHONPATH``.

The venv borrows the dependencies of the running interpreter through a ``.pth`` file naming its site-packages,
not ``--system-site-packages``: that would see the *base* interpreter's packages, which are not the test's when
the suite itself runs in a venv, and a ``.pth`` line adds a directory without running the editable install's own
``.pth`` hooks in it, so ``gpufleet`` can only come from the wheel (checked).
"""

from __future__ import annotations

import json
import os
import shutil
import site
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]
PKG = ROOT / "src" / "gpufleet"

pytestmark = pytest.mark.skipif(not (ROOT / "pyproject.toml").is_file(), reason="needs the source tree")


def _clean_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "GPUFLEET_"))}
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    pytest.importorskip("setuptools", reason="the test extra installs setuptools to build the wheel offline")
    src = tmp_path_factory.mktemp("src")
    for name in ("pyproject.toml", "setup.py", "README.md"):
        shutil.copy(ROOT / name, src / name)
    shutil.copytree(ROOT / "src", src / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    out = tmp_path_factory.mktemp("wheel")
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "--no-index",
                        "-w", str(out), str(src)], check=False, capture_output=True, text=True, timeout=300, env=_clean_env())
    assert r.returncode == 0, r.stderr[-3000:]
    (whl,) = out.glob("gpufleet-*.whl")
    return whl


@pytest.fixture(scope="module")
def venv(wheel, tmp_path_factory) -> Path:
    v = tmp_path_factory.mktemp("venv")
    subprocess.run([sys.executable, "-m", "venv", str(v)], check=True, timeout=300)  # its pip: ensurepip, offline
    py = v / "bin" / "python"
    vsite = Path(subprocess.check_output([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                         text=True).strip())
    # the running interpreter's dependencies (numpy, kubernetes, grpc, ...), never its gpufleet
    deps = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"], *site.getsitepackages()}
    (vsite / "_gpufleet_test_deps.pth").write_text("".join(f"{d}\n" for d in sorted(deps) if Path(d).is_dir()))
    r = subprocess.run([str(py), "-m", "pip", "install", "-q", "--no-deps", "--no-index", "--disable-pip-version-check",
                        str(wheel)], check=False, capture_output=True, text=True, timeout=300, env=_clean_env())
    assert r.returncode == 0, r.stderr[-3000:]
    return v


def run(venv: Path, *args: str, cwd: Path | str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([str(venv / "bin" / "gpufleet"), *args], check=False, cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, env=_clean_env())


def test_wheel_holds_every_file_of_the_package(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    # the C extension's source is compiled into the wheel, not shipped (an in-place build's .so has the wheel's name)
    files = [p for p in PKG.rglob("*") if p.is_file() and "__pycache__" not in p.parts and p.suffix not in (".pyc", ".c")]
    missing = sorted(str(p.relative_to(PKG.parent)) for p in files if str(p.relative_to(PKG.parent)) not in names)
    assert not missing, f"not in the wheel (add them to [tool.setuptools.package-data]): {missing}"
    assert any(n.startswith("gpufleet/policies/profiles/") and n.endswith(".yaml") for n in names)


def test_wheel_holds_the_c_extension_where_required(wheel):
    """The extension is optional (built where a C compiler is found); CI sets GPUFLEET_REQUIRE_NATIVE=1 so that a
    wheel without it fails here instead of every figure measuring the numpy path."""
    built = [n for n in zipfile.ZipFile(wheel).namelist() if n.startswith("gpufleet/_native.") and n.endswith((".so", ".pyd"))]
    if os.environ.get("GPUFLEET_REQUIRE_NATIVE") == "1":
        assert built, f"no C extension in {wheel.name}"
    if built:
        assert not wheel.name.endswith("-none-any.whl"), wheel.name


def test_installed_package_comes_from_the_wheel(venv, tmp_path):
    out = subprocess.check_output(
        [str(venv / "bin" / "python"), "-c",
         ("import gpufleet, json; from gpufleet.policies import policy_names; from gpufleet.kube.cli import load_profile;"
          "load_profile('default', None); print(json.dumps([gpufleet.__file__, policy_names()]))")],
        cwd=tmp_path, text=True, env=_clean_env())
    where, names = json.loads(out)
    assert Path(where).resolve().is_relative_to(venv.resolve()), where
    shipped = sorted(p.stem for p in (PKG / "policies" / "profiles").glob("*.yaml"))
    assert names == shipped and "default" in names


def test_simulate_runs_from_the_wheel_outside_the_source_tree(venv, tmp_path):
    r = run(venv, "simulate", "--policy", "bestfit,default", "--jobs", "1", "--no-bound", "--no-progress",
            "--json", "runs.json", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "bestfit" in r.stdout and "default" in r.stdout
    assert (tmp_path / "report.html").stat().st_size > 10_000  # the default --report, in the working directory
    doc = json.loads((tmp_path / "runs.json").read_text())
    assert {x["policy"] for x in doc["runs"]} == {"bestfit", "default"}
    assert doc["published"]["bestfit"] > 0  # the bundled published figures were found too


def test_every_part_answers_from_the_wheel(venv, tmp_path):
    for cmd in ("scheduler", "extender", "agent", "reclaim", "explain", "recommend", "top"):
        r = run(venv, cmd, "--help", cwd=tmp_path, timeout=60)
        assert r.returncode == 0 and "usage: gpufleet " + cmd in r.stdout, (cmd, r.stderr[-2000:])
    r = run(venv, "agent", "--nvml", "fake:t4", "--once", cwd=tmp_path, timeout=60)
    assert r.returncode == 0 and "nvidia.com/gpu" in r.stdout, r.stderr[-2000:]


def test_simulate_in_an_unwritable_directory_says_so_before_running(venv, tmp_path):
    if os.geteuid() != 0:
        ro = tmp_path / "ro"
        ro.mkdir(mode=0o555)
        cwd: Path | str = ro
    else:
        cwd = "/proc"  # root writes through mode bits; nobody can create files in /proc
    r = run(venv, "simulate", "--policy", "bestfit", "--no-progress", cwd=cwd, timeout=60)
    assert r.returncode == 2
    assert "--report" in r.stderr and "report.html: cannot write there" in r.stderr and "Traceback" not in r.stderr
    assert "experiment:" not in r.stderr  # refused before the run started
