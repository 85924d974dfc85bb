"""gpufleet cost: known figures by hand, the identities on random cluster histories, prices, bad input, the CLI."""

from __future__ import annotations

import json
import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpufleet.cli.main import main
from gpufleet.engine.errors import ConfigError
from gpufleet.engine.prices import BUILTIN_INSTANCE_TYPES, BUILTIN_MODELS, PriceBook, model_key, parse_prices_text
from gpufleet.utilization.cost import NoData, Samples, check_identities, compute, load_prices, render_csv, render_json, render_table

H100 = "NVIDIA H100 80GB HBM3"
T0 = 1_700_000_000.0


def _samples(history, steps, step_s=60.0, gpus=None, util=None, rest=None):
    """Samples as Prometheus would answer at t = T0 + k*step (k = 1..steps).

    ``history``: [(host, gpu, ns, pod, share, first_step, last_step, queue, workload)];
    ``gpus``: {(host, gpu): (model, instance_type, capacity_type)}; ``util``: {(host, gpu, ns, pod): pct};
    ``rest``: {(host, gpu): pct} unattributed.
    """
    gpus = gpus or {(h[0], h[1]): (H100, "p5.48xlarge", "on-demand") for h in history}
    ts = [T0 + k * step_s for k in range(1, steps + 1)]
    info = [({"Hostname": h, "gpu": g, "modelName": m, "node": h, "instance_type": it, "capacity_type": ct},
             [(t, 1.0) for t in ts]) for (h, g), (m, it, ct) in gpus.items()]
    alloc, ut = [], []
    for (h, g, ns, pod, share, a, b, q, wl) in history:
        pts = [(ts[k - 1], share) for k in range(a, b + 1)]
        kind, _, name = wl.partition("/")
        alloc.append(({"Hostname": h, "gpu": g, "modelName": gpus[(h, g)][0], "namespace": ns, "pod": pod, "queue": q,
                       "workload_kind": kind, "workload": name}, pts))
        u = (util or {}).get((h, g, ns, pod))
        if u is not None:
            ut.append(({"Hostname": h, "gpu": g, "namespace": ns, "pod": pod}, [(t, u) for t, _ in pts]))
    for (h, g), pct in (rest or {}).items():
        ut.append(({"Hostname": h, "gpu": g, "namespace": "", "pod": ""}, [(t, pct) for t in ts]))
    return Samples(T0, T0 + steps * step_s, step_s, info, alloc, ut)


PRICES = PriceBook(currency="USD")  # built-in list prices: p5.48xlarge 6.88 USD per GPU-hour


def test_known_figures_on_a_shared_gpu():
    """One H100 (6.88/h) for one hour: a 0.25 share busy 24% of the GPU, a 0.5 share busy 30%, 9% nobody's."""
    hist = [("n1", "0", "a", "p1", 0.25, 1, 60, "team-a", "Deployment/web"),
            ("n1", "0", "b", "p2", 0.5, 1, 60, "team-b", "Job/train")]
    s = _samples(hist, 60, util={("n1", "0", "a", "p1"): 24.0, ("n1", "0", "b", "p2"): 30.0}, rest={("n1", "0"): 9.0})
    r = compute(s, PRICES)
    p1, p2 = r.pods["a/p1"].figures, r.pods["b/p2"].figures
    # p1 uses its 0.24 plus 0.09 * 0.25/0.75 = 0.03 of the unexplained part -> capped at its share 0.25
    assert p1.allocated_gpu_h == pytest.approx(0.25) and p1.used_gpu_h == pytest.approx(0.25) and p1.idle_gpu_h == pytest.approx(0)
    # p2: 0.30 + 0.09 * 0.5/0.75 = 0.36 of its 0.5
    assert p2.used_gpu_h == pytest.approx(0.36) and p2.idle_gpu_h == pytest.approx(0.14)
    assert p2.cost == pytest.approx(0.5 * 6.88) and p2.idle_cost == pytest.approx(0.14 * 6.88)
    c = r.cluster
    assert c.capacity_gpu_h == pytest.approx(1.0) and c.allocated_gpu_h == pytest.approx(0.75)
    assert c.unallocated_gpu_h == pytest.approx(0.25) and c.unallocated_cost == pytest.approx(0.25 * 6.88)
    assert [x.key for x in r.rows["queue"]] == ["team-b", "team-a"]
    assert [x.key for x in r.rows["workload"]] == ["b/Job/train", "a/Deployment/web"]
    assert check_identities(r) == []


def test_the_recording_rules_case():
    """tests/deploy/monitoring/cost_rules_test.yaml's first case (8/h, two 0.25 shares busy 12.5% and 25%, 12.5% nobody's,
    a second GPU idle) for one hour: gpufleet cost gives the figures the recording rules give per hour."""
    hist = [("n1", "0", "a", "p1", 0.25, 1, 60, "team-a", "Deployment/web"),
            ("n1", "0", "b", "p2", 0.25, 1, 60, "team-b", "Job/train")]
    gpus = {("n1", "0"): (H100, "x", "on-demand"), ("n1", "1"): (H100, "x", "on-demand")}
    s = _samples(hist, 60, gpus=gpus, util={("n1", "0", "a", "p1"): 12.5, ("n1", "0", "b", "p2"): 25.0},
                 rest={("n1", "0"): 12.5, ("n1", "1"): 0.0})
    r = compute(s, parse_prices_text("instanceTypes:\n  x: {onDemandPerGpuHour: 8}\n", "p.yaml"))
    assert r.pods["a/p1"].figures.cost == pytest.approx(2) and r.pods["a/p1"].figures.idle_cost == pytest.approx(0.5)
    assert r.pods["a/p1"].figures.used_gpu_h == pytest.approx(0.1875)
    assert r.pods["b/p2"].figures.cost == pytest.approx(2) and r.pods["b/p2"].figures.idle_cost == pytest.approx(0)
    assert r.cluster.unallocated_cost == pytest.approx(12) and r.cluster.capacity_cost == pytest.approx(16)


def test_whole_gpu_holder_gets_all_of_its_utilisation():
    s = _samples([("n1", "3", "ml", "w", 1.0, 1, 30, "", "Pod/w")], 60, util={("n1", "3", "ml", "w"): 40.0})
    r = compute(s, PRICES)
    f = r.pods["ml/w"].figures
    assert f.allocated_gpu_h == pytest.approx(0.5) and f.used_gpu_h == pytest.approx(0.2) and f.idle_gpu_h == pytest.approx(0.3)
    assert r.pods["ml/w"].queue == "-"  # no queue: "-", not a queue named ""
    assert r.cluster.capacity_gpu_h == pytest.approx(1.0) and r.cluster.unallocated_gpu_h == pytest.approx(0.5)


def _history(rng, hosts=3, gpus=4, pods=40, steps=120):
    out, namespaces = [], ["ml", "web", "batch", "research"]
    load: dict[tuple, list[float]] = {}
    for i in range(pods):
        h, g = f"n{rng.randrange(hosts)}", str(rng.randrange(gpus))
        share = rng.choice([1.0, 0.5, 0.25, 0.1, 3 / 7])
        a = rng.randrange(1, steps + 1)
        b = rng.randrange(a, steps + 1)
        col = load.setdefault((h, g), [0.0] * (steps + 1))
        if any(col[k] + share > 1.0 + 1e-9 for k in range(a, b + 1)):
            continue  # the scheduler never over-commits a GPU
        for k in range(a, b + 1):
            col[k] += share
        ns = rng.choice(namespaces)
        out.append((h, g, ns, f"p{i}", share, a, b, f"q-{ns[0]}", f"Job/j{i % 5}"))
    gpus_of = {(f"n{x}", str(y)): (H100 if x % 2 == 0 else "Tesla T4", "", "spot" if x == 2 else "on-demand")
               for x in range(hosts) for y in range(gpus)}
    util = {(h, g, ns, p): rng.uniform(0, 100) for (h, g, ns, p, *_rest) in out}
    return out, gpus_of, util


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 10_000))
def test_random_histories_add_up_and_match_the_ground_truth(seed):
    rng = random.Random(seed)
    hist, gpus, util = _history(rng)
    prices = parse_prices_text("models:\n  NVIDIA-H100-80GB-HBM3: {onDemandPerGpuHour: 6.88, spotPerGpuHour: 2.5}\n"
                               "  Tesla-T4: {onDemandPerGpuHour: 0.526, spotPerGpuHour: 0.2}\n", "p.yaml")
    steps, step_s = 120, 30.0
    r = compute(_samples(hist, steps, step_s, gpus=gpus, util=util, rest={k: 5.0 for k in gpus}), prices)
    assert check_identities(r) == []
    for (_h, _g, ns, pod, share, a, b, *_x) in hist:  # allocated GPU-hours = share x time held, exactly
        assert r.pods[f"{ns}/{pod}"].figures.allocated_gpu_h == pytest.approx(share * (b - a + 1) * step_s / 3600)
    truth = math.fsum(h[4] * (h[6] - h[5] + 1) * step_s / 3600 for h in hist)
    assert r.cluster.allocated_gpu_h == pytest.approx(truth)  # what the cluster had allocated
    assert r.cluster.capacity_gpu_h == pytest.approx(len(gpus) * steps * step_s / 3600)
    for ns in {h[2] for h in hist}:  # per-pod cost summed over a namespace = the namespace's cost
        row = next(x for x in r.rows["namespace"] if x.key == ns)
        assert row.figures.cost == pytest.approx(math.fsum(p.figures.cost for p in r.pods.values() if p.namespace == ns))
    spot_truth = math.fsum(h[4] * (h[6] - h[5] + 1) * step_s / 3600 for h in hist if h[0] == "n2")
    assert math.fsum(p.figures.spot_gpu_h for p in r.pods.values()) == pytest.approx(spot_truth)


def test_a_gpu_held_more_than_once_over_is_split_in_proportion():
    """Two pods time-sliced on one GPU without gpufleet shares each count as holding all of it: each pays half."""
    hist = [("n1", "0", "a", "x", 1.0, 1, 60, "", "Pod/x"), ("n1", "0", "b", "y", 1.0, 1, 60, "", "Pod/y")]
    r = compute(_samples(hist, 60, util={("n1", "0", "a", "x"): 30.0, ("n1", "0", "b", "y"): 10.0}), PRICES)
    assert r.pods["a/x"].figures.allocated_gpu_h == pytest.approx(0.5) and r.pods["a/x"].figures.cost == pytest.approx(3.44)
    assert r.pods["b/y"].figures.used_gpu_h == pytest.approx(0.1)
    assert r.cluster.allocated_gpu_h == pytest.approx(1.0) and r.cluster.oversubscribed_gpu_h == pytest.approx(1.0)
    assert check_identities(r) == [] and "oversubscribed" in render_table(r)


def test_identity_check_can_fail():
    r = compute(_samples([("n1", "0", "a", "p", 0.5, 1, 10, "", "Pod/p")], 10), PRICES)
    r.rows["namespace"][0].figures.cost += 1.0
    assert any("namespace a: cost" in b for b in check_identities(r))
    r.pods["a/p"].figures.idle_gpu_h += 0.1
    assert any("used + idle != allocated" in b for b in check_identities(r))


# --- prices ------------------------------------------------------------------------------------------


def test_builtin_list_prices_and_lookup_order(tmp_path):
    assert BUILTIN_INSTANCE_TYPES["p5.48xlarge"] == pytest.approx(6.88)
    assert BUILTIN_MODELS[model_key("NVIDIA H100 80GB HBM3")] == pytest.approx(6.88)
    assert BUILTIN_MODELS[model_key("Tesla-T4")] == pytest.approx(0.526)  # g4dn.xlarge, the smallest T4 instance
    f = tmp_path / "prices.yaml"
    f.write_text("nodes:\n  onprem-1: {onDemandPerGpuHour: 1.1}\ninstanceTypes:\n  p5.48xlarge: {spotPerGpuHour: 2.4}\n"
                 "models:\n  nvidia h100 80gb hbm3: {onDemandPerGpuHour: 5.0}\n")
    b = load_prices(str(f))
    assert b.price("onprem-1", "p5.48xlarge", H100, False).per_gpu_hour == 1.1
    assert b.price("x", "p5.48xlarge", H100, True).per_gpu_hour == 2.4
    assert b.price("x", "p5.48xlarge", H100, False).per_gpu_hour == 5.0  # its type entry has no on-demand price: model
    assert b.price("x", "", "Tesla T4", False).source.startswith("built-in")
    unknown = b.price("x", "", "Tesla T4", True)  # no spot list price exists: unknown, never zero
    assert unknown.per_gpu_hour is None and "no spot price" in unknown.source and str(f) in unknown.source
    off = parse_prices_text("builtin: false\n", "p.yaml")
    assert off.price("x", "p5.48xlarge", H100, False).per_gpu_hour is None


@pytest.mark.parametrize("text, where", [
    ("models:\n  H100: {onDemandPerGpuHour: -1}\n", "p.yaml:2: models.H100.onDemandPerGpuHour: must not be negative"),
    ("models:\n  H100:\n    spotPerGpuHour: cheap\n", "p.yaml:3: models.H100.spotPerGpuHour: must be a number"),
    ("models:\n  H100: {onDemandPerGpuHour: .nan}\n", "p.yaml:2: models.H100.onDemandPerGpuHour: must be a number"),
    ("models:\n  H100: {onDemand: 3}\n", "p.yaml:2: models.H100.onDemand: unknown key"),
    ("model:\n  H100: {onDemandPerGpuHour: 3}\n", "p.yaml:1: model: unknown key"),
    ("models:\n  H100: 3\n", "p.yaml:2: models.H100: must be a mapping"),
    ("builtin: yes please\n", "p.yaml:1: builtin: must be true or false"),
    ("models:\n  NVIDIA H100: {onDemandPerGpuHour: 3}\n  nvidia-h100: {onDemandPerGpuHour: 4}\n", "p.yaml:3: models.nvidia-h100: the same model"),
    ("models: [1, 2\n", "p.yaml:2: not valid YAML"),
    ("spotLabels: spot\n", "p.yaml:1: spotLabels"),
])
def test_bad_price_files_name_file_line_and_key(text, where):
    with pytest.raises(ConfigError) as e:
        parse_prices_text(text, "p.yaml")
    assert str(e.value).startswith(where), str(e.value)


def test_missing_model_is_an_error_naming_it_unless_allowed():
    s = _samples([("n1", "0", "a", "p", 1.0, 1, 10, "", "Pod/p")], 10,
                 gpus={("n1", "0"): ("NVIDIA Z9000", "", "on-demand")})
    with pytest.raises(ConfigError, match="no on-demand price for model 'NVIDIA Z9000'.*built-in list prices"):
        compute(s, PRICES)
    r = compute(s, PRICES, allow_unpriced=True)
    row = r.pods["a/p"].to_json("USD")
    assert row["cost"] is None and row["unpriced_gpu_hours"] == pytest.approx(10 / 60, abs=1e-6)  # unknown, not zero
    assert "unknown" in render_table(r) and ",," in render_csv(r).splitlines()[1]


def test_spot_gpus_need_a_spot_price():
    s = _samples([("n1", "0", "a", "p", 1.0, 1, 10, "", "Pod/p")], 10, gpus={("n1", "0"): (H100, "p5.48xlarge", "spot")})
    with pytest.raises(ConfigError, match="no spot price"):
        compute(s, PRICES)
    r = compute(s, parse_prices_text("instanceTypes:\n  p5.48xlarge: {spotPerGpuHour: 2.0}\n", "p.yaml"))
    assert r.pods["a/p"].figures.cost == pytest.approx(2.0 * 10 / 60) and r.pods["a/p"].figures.spot_gpu_h > 0


def test_a_window_without_data_is_no_data_naming_the_flag():
    with pytest.raises(NoData, match="--window 2h: no GPU samples"):
        compute(Samples(T0, T0 + 7200, 60), PRICES, window_flag="--window 2h")


def test_outputs_carry_the_same_numbers():
    r = compute(_samples([("n1", "0", "a", "p", 0.5, 1, 60, "qa", "Pod/p")], 60), PRICES)
    doc = json.loads(render_json(r))
    assert doc["rows"]["namespace"][0]["cost"] == pytest.approx(0.5 * 6.88)
    assert doc["cluster"]["capacity_gpu_h"] == pytest.approx(1.0)
    lines = render_csv(r, ["namespace", "pod"]).splitlines()
    assert lines[0].startswith("level,key") and lines[1].startswith("namespace,a,a,,0.5,0.0,0.5,")
    assert "a/p" in lines[2]


# --- the command -------------------------------------------------------------------------------------


def _run(capsys, *argv):
    code = main(["cost", *argv])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_cli_offline_from_samples_with_report(tmp_path, capsys):
    f = tmp_path / "s.json"
    hist = [("n1", "0", "a", "p1", 0.25, 1, 60, "team-a", "Deployment/web"), ("n1", "1", "b", "p2", 1.0, 1, 30, "", "Pod/p2")]
    f.write_text(json.dumps(_samples(hist, 60, util={("n1", "1", "b", "p2"): 50.0}).to_json()))
    page = tmp_path / "cost.html"
    code, out, err = _run(capsys, "--samples", str(f), "--report", str(page), "--level", "namespace,pod")
    assert code == 0, err
    assert "capacity 2.000 GPU-h" in out and "a/p1" in out
    html = page.read_text()
    assert "<svg" in html and "Per team queue" in html and "team-a" in html and "Checked:" in html
    code, out, _ = _run(capsys, "--samples", str(f), "--format", "json")
    assert code == 0 and json.loads(out)["cluster"]["allocated_gpu_h"] == pytest.approx(0.25 + 0.5)


@pytest.mark.parametrize("argv, code, text", [
    (["--samples", "/nonexistent.json"], 2, "--samples /nonexistent.json: No such file"),
    (["--samples", "S", "--level", "team"], 2, "--level: unknown level(s) team"),
    (["--samples", "S", "--prices", "P"], 2, "P:2: models.X.onDemandPerGpuHour: must not be negative"),
    (["--prometheus", "localhost:9090"], 2, "--prometheus: must start with http://"),
    (["--prometheus", "http://127.0.0.1:9", "--window", "1h", "--step", "2h"], 2, "--step 2h: must be > 0 and at most --window 1h"),
    (["--prometheus", "http://127.0.0.1:9", "--window", "soon"], 2, "--window: not a duration"),
    (["--prometheus", "http://127.0.0.1:9", "--timeout", "2"], 1, "GET http://127.0.0.1:9/api/v1/query_range"),
    (["--samples", "E"], 2, "--samples E: no GPU samples"),
])
def test_cli_bad_input_is_one_line(tmp_path, capsys, argv, code, text):
    s = tmp_path / "s.json"
    s.write_text(json.dumps(_samples([("n1", "0", "a", "p", 1.0, 1, 5, "", "Pod/p")], 5).to_json()))
    e = tmp_path / "e.json"
    e.write_text(json.dumps(Samples(T0, T0 + 600, 60).to_json()))
    p = tmp_path / "p.yaml"
    p.write_text("models:\n  X: {onDemandPerGpuHour: -2}\n")
    argv = [str(s) if a == "S" else str(p) if a == "P" else str(e) if a == "E" else a for a in argv]
    got, out, err = _run(capsys, *argv)
    assert got == code and len(err.strip().splitlines()) == 1, err
    assert text.replace("E:", f"{e}:").replace("P:", f"{p}:") in err, err


def test_the_example_price_file_is_valid():
    from pathlib import Path

    b = load_prices(str(Path(__file__).parents[2] / "examples" / "prices.yaml"))
    assert b.price("x", "p5.48xlarge", H100, True).per_gpu_hour == 2.75
    assert b.price("dgx-01", "", H100, False).per_gpu_hour == 1.90
