"""Every command path: bad input exits 2, a runtime failure exits 1, each with one line on stderr, never a traceback.

Each case is a failure reproduced through the real CLI (issue 15); the check is
the exit status and that stderr is exactly one line naming the flag, the
file:line and field, or the object.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpufleet.cli.main import build_parser, main
from gpufleet.engine.errors import ConfigError

NODES = "sn,cpu_milli,memory_mib,gpu,model\n" + "".join(f"n{i},32000,131072,{g},{m}\n" for i, (g, m) in
                                                       enumerate([(8, "V100M32"), (2, "T4"), (4, "P100")]))
HEADER = "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time"


def pod_rows(n: int = 20) -> list[str]:
    return [f"p{i},{1000 + i},4096,1,{250 * (1 + i % 4)},,LS,Running,{i * 10},{i * 10 + 600},{i * 10}" for i in range(n)]


def run(argv: list[str]) -> int:
    try:
        return main(argv)
    except SystemExit as exc:  # argparse
        return int(exc.code or 0)


@pytest.fixture
def d(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.kube/config
    monkeypatch.delenv("KUBECONFIG", raising=False)
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    (tmp_path / "nodes.csv").write_text(NODES)
    (tmp_path / "pods.csv").write_text("\n".join([HEADER, *pod_rows()]) + "\n")
    (tmp_path / "kc.yaml").write_text(
        "apiVersion: v1\nkind: Config\nclusters: [{name: c, cluster: {server: 'https://127.0.0.1:1'}}]\n"
        "users: [{name: u, user: {token: t}}]\ncontexts: [{name: x, context: {cluster: c, user: u}}]\ncurrent-context: x\n")
    return tmp_path


SIM = ["simulate", "--nodes", "nodes.csv", "--pods", "pods.csv", "--no-progress", "--report", "", "--jobs", "1", "--policy", "bestfit"]


def one_line(err: str) -> str:
    lines = [x for x in err.splitlines() if x.strip() and not x.startswith(("warning:", "packing experiment"))]
    assert len(lines) == 1, err
    assert "Traceback" not in err
    return lines[0]


def pods_file(d: Path, *rows: str, header: str = HEADER, raw: bytes | None = None) -> str:
    p = d / "bad.csv"
    if raw is not None:
        p.write_bytes(raw)
    else:
        p.write_text("\n".join([header, *pod_rows(3), *rows]) + "\n")
    return str(p.name)


@pytest.mark.parametrize("extra, needle", [
    (["--tune", "nan"], "argument --tune: must be a finite number"),
    (["--tune", "inf"], "argument --tune: must be a finite number"),
    (["--tune", "-1"], "argument --tune: must be in (0, 10]"),
    (["--jobs", "0"], "argument --jobs: must be an integer in [1, 256]"),
    (["--seeds", "1-100000"], "argument --seeds: at most 1000 seeds"),
    (["--seeds", "42,42"], "argument --seeds: seed 42 given twice"),
    (["--seeds", "-3"], "argument --seeds: bad seed or range"),
    (["--policy", ""], "--policy: no policy named"),
    (["--policy", " , "], "--policy: no policy named"),
    (["--policy", "nope"], "--policy: unknown policy 'nope'"),
    (["--teams", "0", "--experiment", "queues"], "argument --teams: must be an integer in [1, 64]"),
    (["--speedup", "0"], "argument --speedup"),
    (["--json", "missing-dir/x.json"], "--json missing-dir/x.json: directory missing-dir does not exist"),
    (["--report", "missing-dir/r.html"], "--report missing-dir/r.html: directory missing-dir does not exist"),
    (["--report", "."], "--report .: is a directory"),
    (["--report", "/proc/gpufleet-r.html"], "--report /proc/gpufleet-r.html: cannot write there"),  # even as root
    (["--nodes", "nope.csv"], "nope.csv: No such file or directory"),
])
def test_simulate_bad_flags_exit_2_with_one_line(d, capsys, extra, needle):
    assert run([*SIM, *extra]) == 2
    assert needle in one_line(capsys.readouterr().err)


def test_output_paths_are_checked_before_the_work(d, capsys, monkeypatch):
    from gpufleet.cli import simulate

    monkeypatch.setattr(simulate, "_load_all", lambda *a: pytest.fail("the run started before --json was checked"))
    assert run([*SIM, "--json", "nowhere/x.json"]) == 2


@pytest.mark.parametrize("make, needle", [
    (lambda d: pods_file(d, raw=(HEADER + "\np1,1000,10\xe9,1,500,,LS,Running,1,2,1\n").encode("latin-1")),
     "bad.csv:2: field memory_mib: byte 0xe9 is not UTF-8"),
    (lambda d: pods_file(d, raw=b"\x00\xff\xfe garbage\n"), "bad.csv:1:"),
    (lambda d: pods_file(d, "px,nan,4096,1,500,,LS,Running,1,2,1"), "bad.csv:5: field cpu_milli: expected a finite integer, got 'nan'"),
    (lambda d: pods_file(d, "px,1000,inf,1,500,,LS,Running,1,2,1"), "bad.csv:5: field memory_mib: expected a finite integer"),
    (lambda d: pods_file(d, "px,1" + "0" * 40 + ",4096,1,500,,LS,Running,1,2,1"), "bad.csv:5: field cpu_milli: must be in [0, 1000000000]"),
    (lambda d: pods_file(d, "px,1000,4096,2,500,,LS,Running,1,2,1"), "bad.csv:5: field gpu_milli: a pod with num_gpu 2 takes whole GPUs"),
    (lambda d: pods_file(d, header=HEADER.replace("memory_mib", "mem")), "bad.csv:1: field header: column 3 is 'mem', expected 'memory_mib'"),
])
def test_bad_pod_lists_name_file_line_and_field(d, capsys, make, needle):
    name = make(d)
    assert run([*SIM, "--pods", name]) == 2
    line = one_line(capsys.readouterr().err)
    assert needle in line and len(line) < 300, line


def test_bom_is_accepted(d, capsys):
    (d / "bom.csv").write_bytes(b"\xef\xbb\xbf" + ("\n".join([HEADER, *pod_rows()]) + "\n").encode())
    assert run([*SIM, "--pods", "bom.csv"]) == 0


@pytest.mark.parametrize("nodes, needle", [
    ("sn,cpu_milli,memory_mib,gpu,model\nc1,32000,1000,0,\n", "field gpu: none of the 1 nodes has a GPU"),
    ("sn,cpu_milli,memory_mib,gpu,model\nn1,1" + "0" * 40 + ",1000,2,T4\n", "nodes2.csv:2: field cpu_milli: must be in"),
    ("sn,cpu_milli,memory_mib,gpu,model\nn1,nan,1000,2,T4\n", "nodes2.csv:2: field cpu_milli: expected a finite integer"),
])
def test_bad_node_lists(d, capsys, nodes, needle):
    (d / "nodes2.csv").write_text(nodes)
    assert run([*SIM, "--nodes", "nodes2.csv"]) == 2
    assert needle in one_line(capsys.readouterr().err)


def test_skip_bad_rows_counts_nodes_and_pods_in_table_and_json(d, capsys):
    import json

    (d / "nodes2.csv").write_text(NODES + "nbad,inf,1000,2,T4\n")
    pods_file(d, "px,nan,4096,1,500,,LS,Running,1,2,1", "py,1000,4096,1,500,,LS,Running,1,2,1")
    assert run([*SIM, "--nodes", "nodes2.csv", "--pods", "bad.csv", "--skip-bad-rows", "--json", "o.json"]) == 0
    out, err = capsys.readouterr()
    assert "skipped 1 bad node row(s)" in err and "skipped 1 bad pod row(s)" in err
    assert "skipped bad rows: 1 node(s), 1 pod(s)" in out
    p = json.loads((d / "o.json").read_text())["params"]
    assert (p["skipped_node_rows"], p["skipped_pod_rows"], p["skipped_rows"]) == (1, 1, 2)


def test_pods_no_node_can_hold_are_counted_and_left_out(d, capsys):
    import json

    pods_file(d, "big,1000,4096,16,1000,,LS,Running,1,2,1", "a100,1000,4096,1,1000,A100,LS,Running,1,2,1",
              "cpu,99000,4096,1,1000,,LS,Running,1,2,1", "mem,1000,999999999,1,1000,,LS,Running,1,2,1")
    assert run([*SIM, "--pods", "bad.csv", "--json", "o.json"]) == 0
    out, err = capsys.readouterr()
    assert "4 pod(s) fit no node of this cluster" in err and "pods that fit no node (left out): 4" in out
    doc = json.loads((d / "o.json").read_text())
    assert doc["params"]["unplaceable_pods"] == 4
    reasons = " ".join(doc["input_problems"]["unplaceable_pods"])
    for text in ("needs 16 GPUs; the largest node has 8", "needs GPU model A100", "needs cpu_milli 99000", "needs memory_mib 999999999"):
        assert text in reasons


def test_aliases_run_once(d, capsys):
    assert run([*SIM[:-1], "default,strandfrag"]) == 0
    rows = [x for x in capsys.readouterr().out.splitlines()  # table rows, not the bound's headline
            if x.startswith(("default", "strandfrag")) and " leaves " not in x]
    assert len(rows) == 1 and rows[0].startswith("default")


@pytest.mark.parametrize("cmd", [["explain", "ns/p"], ["top", "--once"], ["reclaim", "--prometheus", "http://127.0.0.1:1"],
                                 ["recommend", "--prometheus", "http://127.0.0.1:1"], ["scheduler"], ["extender"],
                                 ["explain-hpa", "ns/h"]])
def test_missing_cluster_same_exit_code_everywhere(d, capsys, cmd):
    assert run([*cmd, "--kubeconfig", "/nonexistent/kubeconfig"]) == 2
    assert "--kubeconfig /nonexistent/kubeconfig: no such file" in one_line(capsys.readouterr().err)
    assert run(cmd) == 1
    assert "no Kubernetes cluster configured" in one_line(capsys.readouterr().err)


@pytest.mark.parametrize("path, why", [("/dev/null", "not a regular file"), (".", "is a directory")])
def test_kubeconfig_that_is_not_a_file_says_what_it_is(d, capsys, path, why):
    assert run(["explain", "ns/p", "--kubeconfig", path]) == 2
    assert f"--kubeconfig {path}: {why}" in one_line(capsys.readouterr().err)


@pytest.mark.parametrize("cmd", [["explain", "ns/p"], ["top", "--once"], ["explain-hpa", "ns/h"]])
def test_unreachable_api_server_is_one_line_exit_1(d, capsys, cmd):
    assert run([*cmd, "--kubeconfig", "kc.yaml"]) == 1
    assert "cannot reach the Kubernetes API server (127.0.0.1:1)" in one_line(capsys.readouterr().err)


def test_bad_context_and_bad_kubeconfig_are_usage_errors(d, capsys):
    assert run(["explain", "ns/p", "--kubeconfig", "kc.yaml", "--context", "nope"]) == 2
    assert "--context nope" in one_line(capsys.readouterr().err)
    (d / "bad.yaml").write_text("garbage: [\n")
    assert run(["top", "--once", "--kubeconfig", "bad.yaml"]) == 2
    assert "--kubeconfig bad.yaml: cannot be used" in one_line(capsys.readouterr().err)


@pytest.mark.parametrize("argv, needle", [
    (["scheduler", "--lease-duration", "0"], "argument --lease-duration"),
    (["scheduler", "--bind-workers", "0"], "argument --bind-workers"),
    (["scheduler", "--metrics-addr", "nohost"], "argument --metrics-addr: expected HOST:PORT"),
    (["extender", "--addr", "x:99999"], "argument --addr: expected HOST:PORT"),
    (["extender", "--log-level", "LOUD"], "argument --log-level"),
    (["reclaim", "--prometheus", "http://p", "--agent-port", "0"], "argument --agent-port"),
    (["recommend", "--prometheus", "http://p", "--headroom", "nan"], "argument --headroom: must be a finite number"),
    (["top", "--interval", "0"], "argument --interval"),
    (["agent", "--once", "--replicas", "0"], "flags: replicas must be an integer >= 1"),
    (["agent", "--once", "--recover-after", "nan"], "flags: recoverAfterSeconds must be a number"),
    (["agent", "--interval", "inf"], "argument --interval"),
    (["agent", "--metrics-addr", "9400"], "argument --metrics-addr: expected HOST:PORT"),
    (["explain", "a/b/c"], "pod 'a/b/c': expected NAMESPACE/NAME"),
    (["nosuchcommand"], "argument COMMAND: invalid choice"),
    # an unknown flag names the command it was given to and that command's help
    (["simulate", "--config", "x.yaml"], "gpufleet simulate: unrecognized arguments: --config x.yaml (see gpufleet simulate --help)"),
    (["top", "--once", "--nope"], "gpufleet top: unrecognized arguments: --nope (see gpufleet top --help)"),
    (["--bogus"], "gpufleet: unrecognized arguments: --bogus (see gpufleet --help)"),
    (["--bogus", "top", "--once"], "gpufleet: unrecognized arguments: --bogus (see gpufleet --help)"),
])
def test_bad_flags_everywhere_exit_2(d, capsys, argv, needle):
    assert run(argv) == 2
    assert needle in one_line(capsys.readouterr().err)


def test_internal_errors_are_one_line_unless_debug(d, capsys, monkeypatch):
    from gpufleet.cli import simulate

    def boom(*a, **k):
        raise ZeroDivisionError("surprise")

    monkeypatch.setattr(simulate, "_load_all", boom)
    assert run(SIM) == 1
    assert "internal error: ZeroDivisionError: surprise (run with --debug" in one_line(capsys.readouterr().err)
    with pytest.raises(ZeroDivisionError):
        main(["--debug", *SIM])


def test_every_flag_of_every_command_has_help():
    parser, _ = build_parser()
    missing = []

    def walk(p, path):
        for a in p._actions:
            if a.help is None or (not a.help.strip()):
                missing.append(f"{path} {'/'.join(a.option_strings) or a.dest}")
            if a.choices and hasattr(a, "_name_parser_map"):
                for name, sp in a._name_parser_map.items():
                    walk(sp, f"{path} {name}")

    walk(parser, "gpufleet")
    assert not missing, missing


def test_version_and_python_m(tmp_path):
    import gpufleet

    env = dict(os.environ, PYTHONPATH=str(Path(gpufleet.__file__).parent.parent))
    p = subprocess.run([sys.executable, "-m", "gpufleet", "--version"], capture_output=True, text=True, timeout=60, env=env, check=False)
    assert p.returncode == 0 and p.stdout.startswith(f"gpufleet {gpufleet.__version__}"), p
    p = subprocess.run([sys.executable, "-m", "gpufleet", "simulate", "--tune", "nan"], capture_output=True, text=True,
                       timeout=60, env=env, check=False)
    assert p.returncode == 2 and p.stderr.count("\n") == 1 and "--tune" in p.stderr and not p.stdout, p


def test_replay_on_a_five_column_trace_is_a_usage_error(d, capsys):
    (d / "short.csv").write_text("name,cpu_milli,memory_mib,num_gpu,gpu_milli\np1,1000,100,1,500\n")
    assert run([*SIM, "--pods", "short.csv", "--experiment", "replay", "--jobs", "2"]) == 2
    err = one_line(capsys.readouterr().err)
    assert "short" in err and "creation_time" in err and "11-column" in err


def test_typed_errors_survive_a_worker_process():
    import pickle

    from gpufleet.engine.errors import InvalidPodSpec, RuntimeFailure
    from gpufleet.simulator.traces.trace import TraceError

    for exc in (TraceError("f.csv", 3, "cpu_milli", "bad"), InvalidPodSpec("ns/p", "spec", "bad"), RuntimeFailure("away")):
        back = pickle.loads(pickle.dumps(exc))
        assert type(back) is type(exc) and str(back) == str(exc) and back.__dict__ == exc.__dict__
        assert back.exit_code == exc.exit_code


@pytest.mark.parametrize("argv, content, needle", [
    (["scheduler", "--config", "c.yaml"], b"profiles: [\n", "c.yaml: not valid YAML"),
    (["scheduler", "--config", "c.yaml"], b"\xff\xfe", "cannot read scheduler config c.yaml"),
    (["explain", "p", "--config", "c.yaml"], b"profiles:\n  - name: x\n    plugins: {score: [Nope]}\n", "unknown plugin 'Nope'"),
    (["reclaim", "--prometheus", "http://p", "--policy-file", "c.yaml"], b"\xff\xfe", "--policy-file c.yaml"),
    (["agent", "--once", "--config", "c.yaml"], b"recoverAfterSeconds: .nan\n", "recoverAfterSeconds must be a number"),
])
def test_bad_config_files_are_one_line_exit_2(d, capsys, argv, content, needle):
    (d / "c.yaml").write_bytes(content)
    assert run(argv) == 2
    assert needle in one_line(capsys.readouterr().err)


def test_a_trace_without_gpu_pods_is_an_error_not_a_hang(d, capsys):
    from gpufleet.simulator.experiments import packing
    from gpufleet.simulator.traces import trace

    (d / "cpu.csv").write_text("name,cpu_milli,memory_mib,num_gpu,gpu_milli\np1,1000,100,0,0\np2,1000,100,0,0\n")
    assert run([*SIM, "--pods", "cpu.csv"]) == 2
    assert "cpu.csv: no pod requests a GPU" in one_line(capsys.readouterr().err)
    pods = trace.load_pods(d / "cpu.csv").pods
    assert len(packing.workload_order(pods, 8000, 1.3, 42)) == 2  # returns instead of resampling forever


@pytest.mark.parametrize("extra, needle", [(["--step", "0s"], "--step 0s: must be > 0"), (["--window", "1m", "--step", "5m"], "at most --window"),
                                           (["--window", "-3"], "--window: not a duration")])
def test_recommend_durations(d, capsys, extra, needle):
    assert run(["recommend", "--prometheus", "http://p", *extra]) == 2
    assert needle in one_line(capsys.readouterr().err)


def test_reclaim_policy_durations_must_be_finite(d, capsys):
    (d / "p.yaml").write_text("default: {window: .nan}\n")
    assert run(["reclaim", "--prometheus", "http://p", "--policy-file", "p.yaml"]) == 2
    assert "must be a finite number" in one_line(capsys.readouterr().err)


ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("exc, code, needle", [
    (ConfigError("unknown policy 'x'"), 2, "unknown policy 'x'"),
    (FileNotFoundError(2, "No such file or directory", "/no/such.csv"), 1, "No such file or directory: /no/such.csv"),
    (RuntimeError("boom"), 1, "internal error: RuntimeError: boom (GPUFLEET_DEBUG=1 shows the traceback)"),
])
def test_scripts_keep_the_commands_error_contract(capsys, monkeypatch, exc, code, needle):
    from gpufleet.cli.main import run_script

    monkeypatch.delenv("GPUFLEET_DEBUG", raising=False)

    def main():
        raise exc

    assert run_script("tool.py", main) == code
    err = capsys.readouterr().err
    assert err.startswith("tool.py: ") and needle in err and len(err.splitlines()) == 1, err
    monkeypatch.setenv("GPUFLEET_DEBUG", "1")
    with pytest.raises(type(exc)):
        run_script("tool.py", main)


def test_every_bench_script_runs_under_the_error_contract():
    scripts = sorted((ROOT / "bench").glob("*.py"))
    assert scripts
    for p in scripts:
        assert f'run_script("{p.name}", main)' in p.read_text(), f"{p.name}: end with sys.exit(run_script(...))"


def test_a_bench_script_refuses_an_unknown_policy_in_one_line():
    r = subprocess.run([sys.executable, str(ROOT / "bench" / "bench_engine.py"), "--policies", "nope"],
                       capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "unknown policy 'nope'" in r.stderr, r.stderr
