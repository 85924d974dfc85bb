"""Logging set-up of the ``gpufleet`` command: INFO by default, DEBUG with -v, a command's own --log-level wins."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import tempfile
import time

import pytest

from gpufleet.cli import main as cli


@pytest.mark.parametrize("verbose, explicit, want", [
    (0, None, logging.INFO),
    (1, None, logging.DEBUG),
    (2, None, logging.DEBUG),
    (0, "warning", logging.WARNING),
    (1, "ERROR", logging.ERROR),  # the command's own flag wins over the global -v
    (0, " debug ", logging.DEBUG),
])
def test_log_level_table(verbose, explicit, want):
    assert cli.log_level(verbose, explicit) == want


def test_bad_log_level_is_a_usage_error():
    with pytest.raises(ValueError, match="--log-level"):
        cli.log_level(0, "LOUD")


@pytest.fixture
def restore_root_logging():
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


def test_configure_logging_replaces_an_earlier_configuration(restore_root_logging):
    logging.basicConfig(level=logging.WARNING, force=True)
    cli.configure_logging(logging.INFO)
    assert logging.getLogger().level == logging.INFO
    assert logging.getLogger("gpufleet.agent").isEnabledFor(logging.INFO)


def test_main_bad_log_level_exits_2(capsys, restore_root_logging):
    with pytest.raises(SystemExit) as exc:  # argparse refuses it: one usage line
        cli.main(["scheduler", "--log-level", "LOUD"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "gpufleet scheduler: argument --log-level" in err and "Traceback" not in err


def _agent_log(extra_global: list[str], extra_cmd: list[str]) -> str:
    d = tempfile.mkdtemp(dir="/tmp", prefix="glog")
    env = dict(os.environ, NODE_NAME="")
    proc = subprocess.Popen([sys.executable, "-m", "gpufleet.cli.main", *extra_global, "agent", "--nvml", "fake:t4",
                             "--device-plugin-dir", d, "--state-dir", os.path.join(d, "st"), "--metrics-addr", "",
                             "--interval", "0.2", *extra_cmd],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:  # the plugin socket exists once the agent serves (its signal handlers are installed by then)
        t = time.monotonic()
        while time.monotonic() - t < 60 and not any(f.endswith(".sock") for f in os.listdir(d)):
            time.sleep(0.2)
        time.sleep(0.5)
    finally:
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=20)
    assert proc.returncode == 0, out
    return out


@pytest.mark.parametrize("glob, cmd, info, debug", [
    ([], [], True, False),                        # INFO by default: the agent says that it serves
    (["-v"], [], True, True),                     # -v: DEBUG as well
    ([], ["--log-level", "WARNING"], False, False),  # the command's own level
    (["-v"], ["--log-level", "WARNING"], False, False),  # ... wins over -v
])
def test_agent_process_logs_at_the_chosen_level(glob, cmd, info, debug):
    out = _agent_log(glob, cmd)
    assert ("INFO gpufleet.agent: serving nvidia.com/gpu" in out) == info, out
    assert (" DEBUG " in out) == debug, out
