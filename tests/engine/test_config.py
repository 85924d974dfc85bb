"""Profiles from config: the registry, policy profiles, and clear start-up errors."""

from __future__ import annotations

import pytest

from gpufleet.engine.config import Registry, load_config
from gpufleet.engine.errors import ConfigError, GpufleetError
from gpufleet.engine.framework import Profile, Scheduler
from gpufleet.engine.plugins import DEFAULT_FILTERS
from gpufleet.engine.plugins.gpufit import GpuFit
from gpufleet.engine.plugins.gpuselect import BestFitGpu
from gpufleet.engine.plugins.noderesources import LeastAllocated
from gpufleet.engine.state import ClusterState
from gpufleet.policies import build_profile, policy_names, registry

from tests.builders import T4, make_node, make_pod

BUILTIN = {"NodeUnschedulable", "NodeAffinity", "TaintToleration", "NodeResourcesFit", "GpuFit", "LeastAllocated", "MostAllocated", "Spread", "BestFitGpu"}
PAPER = {"RandomScore", "RandomGpu", "DotProductScore", "GpuClusteringScore", "GpuPackingScore", "BestFitScore", "FGDScore"}


def test_registry_knows_builtin_and_policy_plugins():
    names = set(registry().names())
    assert BUILTIN | PAPER | {"DescentScore", "ModelPressure", "CpuReserve", "WholeGpuReserve"} <= names
    assert "WorkloadModel" not in names  # a component the default's plugins share, not a plugin


def test_policy_names_include_the_six_paper_policies_and_default():
    assert {"random", "dotprod", "clustering", "packing", "bestfit", "fgd", "default"} <= set(policy_names())


@pytest.mark.parametrize("name", ["random", "dotprod", "clustering", "packing", "bestfit", "fgd", "default", "strandfrag"])
def test_every_policy_profile_builds_and_schedules(name):
    prof = build_profile(name)
    assert isinstance(prof, Profile) and prof.name == name
    reserve = ["SpotCapacity", "CpuReserve", "WholeGpuReserve"] if name in ("default", "strandfrag") else []  # spot; the default's reserves
    assert [f.name for f in prof.filters] == list(DEFAULT_FILTERS) + reserve
    assert prof.scores and all(w > 0 for _, w in prof.scores)
    assert prof.gpu_selector is not None
    s = Scheduler(prof, ClusterState([make_node("a", 2, T4), make_node("b", 4, T4)]), seed=1)
    for k, kw in enumerate([dict(gpu="4"), dict(gpu="1"), dict(annotations={"gpufleet.io/gpu-milli": "300"}), dict()]):
        d = s.schedule(make_pod(f"p{k}", **kw))
        assert d.ok, (name, k, d.status)
    assert s.schedule(make_pod("too-big", gpu="4")).status.reasons[0].startswith("0/2 nodes are available")


def test_unknown_policy_name():
    with pytest.raises(ConfigError, match="unknown policy 'nope'; known: .*bestfit"):
        build_profile("nope")


def test_build_profile_from_mapping_and_defaults():
    prof = build_profile({"profiles": [{"name": "mine", "plugins": {"score": ["MostAllocated", {"name": "Spread", "weight": 3}]}}]})
    assert prof.name == "mine" and prof.tie_break == "random"
    assert [f.name for f in prof.filters] == list(DEFAULT_FILTERS)  # filters default to the built-in set
    assert [(p.name, w) for p, w in prof.scores] == [("MostAllocated", 1), ("Spread", 3)]
    assert isinstance(prof.gpu_selector, BestFitGpu)  # gpuSelect defaults to best fit


def test_one_instance_per_plugin_name_across_extension_points():
    prof = registry().build_profile({"plugins": {"filter": ["NodeAffinity"], "score": ["NodeAffinity"]}})
    assert prof.filters[0] is prof.scores[0][0]


def _profile(**plugins):
    return {"name": "p", "plugins": plugins}


CONFIG_ERRORS = [
    ("unknown score plugin", _profile(score=["Fastest"]), "unknown plugin 'Fastest'; known plugins: "),
    ("unknown filter plugin", _profile(filter=["GpuFit", "NodePortz"]), "unknown plugin 'NodePortz'"),
    ("unknown gpuSelect plugin", _profile(gpuSelect="Nearest"), "unknown plugin 'Nearest'"),
    ("filter as score", _profile(score=["GpuFit"]), "profile 'p': plugin 'GpuFit' does not implement the score extension point"),
    ("score as filter", _profile(filter=["LeastAllocated"]), "plugin 'LeastAllocated' does not implement the filter extension point"),
    ("score as gpuSelect", _profile(gpuSelect="LeastAllocated"), "plugin 'LeastAllocated' does not implement the gpuSelect extension point"),
    ("gpuSelect as preFilter", _profile(preFilter=["BestFitGpu"]), "does not implement the preFilter extension point"),
    ("filter as reserve", _profile(reserve=["GpuFit"]), "does not implement the reserve extension point"),
    ("zero weight", _profile(score=[{"name": "LeastAllocated", "weight": 0}]), "score plugin 'LeastAllocated': weight must be a positive integer, got 0"),
    ("negative weight", _profile(score=[{"name": "LeastAllocated", "weight": -2}]), "got -2"),
    ("fractional weight", _profile(score=[{"name": "LeastAllocated", "weight": 1.5}]), "got 1.5"),
    ("string weight", _profile(score=[{"name": "LeastAllocated", "weight": "2"}]), "got '2'"),
    ("bool weight", _profile(score=[{"name": "LeastAllocated", "weight": True}]), "got True"),
    ("score entry extra key", _profile(score=[{"name": "LeastAllocated", "wieght": 2}]), "unknown key(s) ['wieght']"),
    ("score entry not a name", _profile(score=[3]), "score entry must be a name or {name, weight}"),
    ("plugin name not a string", _profile(filter=[["GpuFit"]]), "plugin name must be a string"),
    ("filter not a list", _profile(filter="GpuFit"), "filter must be a list of plugin names"),
    ("unknown extension point", _profile(postBind=["X"]), "unknown extension point(s) ['postBind']"),
    ("unknown profile key", {"name": "p", "plugin": {}}, "profile: unknown key(s) ['plugin']"),
    ("bad tieBreak", {"name": "p", "tieBreak": "first"}, "tieBreak must be 'random' or 'ordered', got 'first'"),
    ("pluginConfig for unknown plugin", {"name": "p", "pluginConfig": {"FGDx": {}}}, "pluginConfig for unknown plugin 'FGDx'"),
    ("bad pluginConfig argument", {"name": "p", "pluginConfig": {"LeastAllocated": {"bogus": 1}}, "plugins": {"score": ["LeastAllocated"]}}, "plugin 'LeastAllocated': bad pluginConfig"),
    ("profile not a mapping", ["GpuFit"], "a profile must be a mapping"),
    ("negative memory_pods", {"name": "p", "pluginConfig": {"WorkloadModel": {"memory_pods": -1}}, "plugins": {"score": ["DescentScore"]}},
     "plugin 'WorkloadModel': memory_pods must be an integer >= 0, got -1"),
    ("component arguments checked with no plugin using it", {"name": "p", "pluginConfig": {"WorkloadModel": {"threshold": 2}}},
     "plugin 'WorkloadModel': threshold must be a number in [0.0, 1.0], got 2"),
    ("a component placed as a plugin", _profile(score=["WorkloadModel"]), "'WorkloadModel' is a component the plugins share, not a plugin"),
    ("unknown argument of a default plugin", {"name": "p", "pluginConfig": {"CpuReserve": {"reserve": 1}}, "plugins": {"filter": ["CpuReserve"]}},
     "plugin 'CpuReserve': unknown argument(s) reserve; known: cpu_reserve, reserve_max_wait_s, reserve_tight"),
    ("string refresh_max_pods", {"name": "p", "pluginConfig": {"FGDScore": {"refresh_max_pods": "8k"}}, "plugins": {"score": ["FGDScore"]}},
     "plugin 'FGDScore': refresh_max_pods must be an integer >= 0, got '8k'"),
    ("negative pattern_weight", {"name": "p", "pluginConfig": {"SharePatterns": {"pattern_weight": -1}}, "plugins": {"score": ["DescentScore"]}},
     "plugin 'SharePatterns': pattern_weight must be a number >= 0, got -1"),
    ("string learn_online", {"name": "p", "pluginConfig": {"WorkloadModel": {"learn_online": "yes"}}, "plugins": {"score": ["DescentScore"]}},
     "plugin 'WorkloadModel': learn_online must be true or false, got 'yes'"),
    ("string strand_quantiles", {"name": "p", "pluginConfig": {"DescentScore": {"strand_quantiles": 2.5}}, "plugins": {"score": ["DescentScore"]}},
     "plugin 'DescentScore': strand_quantiles must be an integer >= 0, got 2.5"),
    ("threshold above 1", {"name": "p", "pluginConfig": {"FGDScore": {"threshold": 90}}, "plugins": {"score": ["FGDScore"]}},
     "plugin 'FGDScore': threshold must be a number in [0.0, 1.0], got 90"),
    ("kube-scheduler's pluginConfig list, a bad value", {"name": "p", "pluginConfig": [{"name": "CpuReserve", "args": {"cpu_reserve": -1}}],
                                                         "plugins": {"filter": ["CpuReserve"]}},
     "plugin 'CpuReserve': cpu_reserve must be a number >= 0, got -1"),
    ("pluginConfig list entry without a name", {"name": "p", "pluginConfig": [{"args": {}}]},
     "profile 'p': pluginConfig[0]: must be {name: PLUGIN, args: {...}}"),
    ("pluginConfig list entry with an unknown key", {"name": "p", "pluginConfig": [{"name": "CpuReserve", "arg": {}}]},
     "pluginConfig[0]: unknown key(s) ['arg']"),
    ("pluginConfig list naming a plugin twice", {"name": "p", "pluginConfig": [{"name": "CpuReserve"}, {"name": "CpuReserve"}]},
     "pluginConfig[1]: 'CpuReserve' is configured twice"),
    ("pluginConfig a string", {"name": "p", "pluginConfig": "CpuReserve"}, "pluginConfig must be a mapping of plugin names"),
    ("pluginConfig arguments not a mapping", {"name": "p", "pluginConfig": {"CpuReserve": [1]}},
     "pluginConfig for 'CpuReserve' must be a mapping of arguments, got [1]"),
]


def test_kube_schedulers_plugin_config_list_means_the_same_as_the_mapping():
    plugins = {"filter": ["CpuReserve"], "score": ["DescentScore"]}
    as_list = registry().build_profile({"name": "p", "plugins": plugins, "pluginConfig": [
        {"name": "CpuReserve", "args": {"cpu_reserve": 0.5}}, {"name": "WorkloadModel", "args": {"memory_pods": 7}}]})
    as_map = registry().build_profile({"name": "p", "plugins": plugins, "pluginConfig": {
        "CpuReserve": {"cpu_reserve": 0.5}, "WorkloadModel": {"memory_pods": 7}}})
    for prof in (as_list, as_map):
        assert prof.filters[0].args.cpu_reserve == 0.5  # type: ignore[attr-defined]
        assert prof.scores[0][0].model.args.memory_pods == 7  # type: ignore[attr-defined]


@pytest.mark.parametrize("cfg, message", [c[1:] for c in CONFIG_ERRORS], ids=[c[0] for c in CONFIG_ERRORS])
def test_profile_config_errors(cfg, message):
    with pytest.raises(ConfigError) as exc:
        registry().build_profile(cfg)
    assert isinstance(exc.value, GpufleetError)
    assert message in str(exc.value)


@pytest.mark.parametrize(
    "data, message",
    [
        ({}, "non-empty 'profiles' list"),
        ({"profiles": []}, "non-empty 'profiles' list"),
        ({"profiles": {"name": "x"}}, "non-empty 'profiles' list"),
        ({"profiles": [{"name": "x"}], "extenders": []}, "unknown key(s) ['extenders']"),
        ({"profiles": [{"name": "x"}, {"name": "x"}]}, "profile 'x' defined twice"),
        ({"profiles": [{"name": "x", "plugins": {"score": [{"name": "Spread", "weight": 0}]}}]}, "weight must be a positive integer"),
    ],
)
def test_load_config_errors(data, message):
    with pytest.raises(ConfigError, match=None) as exc:
        load_config(data, registry())
    assert message in str(exc.value)


def test_load_config_file(tmp_path):
    p = tmp_path / "sched.yaml"
    p.write_text(
        "apiVersion: gpufleet.io/v1\nkind: SchedulerConfiguration\nprofiles:\n"
        "  - name: a\n    plugins:\n      score: [LeastAllocated]\n"
        "  - name: b\n    tieBreak: ordered\n    plugins:\n      filter: [GpuFit]\n      score:\n        - {name: MostAllocated, weight: 2}\n"
    )
    profs = load_config(p, registry())
    assert list(profs) == ["a", "b"]
    assert [f.name for f in profs["b"].filters] == ["GpuFit"] and profs["b"].tie_break == "ordered"
    assert load_config(str(p), registry()).keys() == profs.keys()


def test_load_config_yaml_text():
    """The docstring promises YAML text as well as a path."""
    profs = load_config("profiles:\n  - name: t\n    plugins:\n      score: [Spread]\n", registry())
    assert [p.name for p, _ in profs["t"].scores] == ["Spread"]


def test_load_config_bad_files(tmp_path):
    with pytest.raises(ConfigError, match="cannot read scheduler config"):
        load_config(tmp_path / "missing.yaml", registry())
    bad = tmp_path / "bad.yaml"
    bad.write_text("profiles: [\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(bad, registry())


def test_registry_rejects_duplicates_and_lists_names():
    r = Registry()
    r.register("GpuFit", GpuFit)
    r.register("LeastAllocated", LeastAllocated)
    with pytest.raises(ConfigError, match="registered twice"):
        r.register("GpuFit", GpuFit)
    assert r.names() == ["GpuFit", "LeastAllocated"]
    with pytest.raises(ConfigError, match="known plugins: GpuFit, LeastAllocated"):
        r.create("Nope")


def test_default_gpu_selector_must_be_registered():
    r = Registry()
    r.register("GpuFit", GpuFit)
    with pytest.raises(ConfigError, match="unknown plugin 'BestFitGpu'"):
        r.build_profile({"plugins": {"filter": ["GpuFit"]}})
