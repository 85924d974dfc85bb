"""What the promtool modules here share: ``promtool`` (None when it is not on PATH: Debian's package prometheus) and the
``rules_dir`` fixture.

A module names its PrometheusRule manifest (``RULES``) and its promtool unit tests beside this file (``UNIT_TESTS``).
promtool reads plain rule files, not prometheus-operator's manifest, so ``rules_dir`` writes the manifest's
``spec.groups`` to the rule file the unit tests name (their ``rule_files``) in a temporary dir, beside a copy of the
unit tests that a test may edit.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

HERE = Path(__file__).parent
PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(PROMTOOL is None, reason="promtool not on PATH (Debian package prometheus)")


def promtool(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([str(PROMTOOL), *args], cwd=cwd, capture_output=True, text=True, timeout=120, check=False)


@pytest.fixture
def rules_dir(request, tmp_path: Path) -> Path:
    rules: Path = request.module.RULES
    tests: str = request.module.UNIT_TESTS
    doc = yaml.safe_load(rules.read_text())
    assert doc["kind"] == "PrometheusRule", rules
    (rule_file,) = yaml.safe_load((HERE / tests).read_text())["rule_files"]
    (tmp_path / rule_file).write_text(yaml.safe_dump({"groups": doc["spec"]["groups"]}, sort_keys=False))
    shutil.copy(HERE / tests, tmp_path / tests)
    return tmp_path
