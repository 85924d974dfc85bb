"""The live loop (FakeApi) with pod-to-pod constraints: symmetry across a restart, namespaceSelector,
volumes from watched PVCs/PVs, preemption that removes an anti-affinity blocker, preemptionPolicy Never,
and the extender leaving these plugins to kube-scheduler."""

from __future__ import annotations

from tests.kube.fake_api import FakeApi
from gpufleet.kube.loop import SchedulerLoop
from gpufleet.policies import build_profile
from tests.kube.test_loop import Clock, node
from tests.kube.test_teams_live import bound, messages, pod, run

HOST = "kubernetes.io/hostname"


def anti(app, key=HOST, **extra):
    return {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
        {"labelSelector": {"matchLabels": {"app": app}}, "topologyKey": key, **extra}]}}


def cluster(n=2):
    api = FakeApi()
    for i in range(n):
        nd = node(f"n{i}", gpus=4, cpu="64")
        nd["metadata"].setdefault("labels", {})[HOST] = f"n{i}"
        api.add_node(nd)
    return api


def make(api, clock, **kw):
    loop = SchedulerLoop(api, build_profile("default"), clock=clock, **kw)
    loop.resync()
    return loop


def with_spec(p, **spec):
    p["spec"].update(spec)
    return p


def test_running_pods_anti_affinity_survives_a_restart():
    api = cluster(2)
    clock = Clock()
    loop = make(api, clock)
    api.add_pod(with_spec(pod("db", ns="ml", labels={"app": "db"}), affinity=anti("web")))
    run(api, loop, clock)
    db_node = api.pods["ml/db"]["spec"]["nodeName"]
    loop2 = make(api, clock)  # a restarted scheduler learns the running pod's terms from the API
    for i in range(2):
        api.add_pod(pod(f"web-{i}", ns="ml", labels={"app": "web"}, gpus=0))
    run(api, loop2, clock)
    assert all(api.pods[f"ml/web-{i}"]["spec"]["nodeName"] != db_node for i in range(2))


def test_namespace_selector_follows_namespace_labels():
    api = cluster(2)
    clock = Clock()
    api.put_object("namespace", {"metadata": {"name": "prod", "labels": {"env": "prod"}}})
    loop = make(api, clock)
    api.add_pod(pod("db", ns="prod", labels={"app": "db"}, gpus=0))
    run(api, loop, clock)
    term = anti("db", namespaceSelector={"matchLabels": {"env": "prod"}})
    for i in range(2):
        api.add_pod(with_spec(pod(f"x-{i}", ns="ml", labels={"app": "x"}, gpus=0), affinity=term))
    run(api, loop, clock)
    db_node = api.pods["prod/db"]["spec"]["nodeName"]
    placed = [api.pods[f"ml/x-{i}"]["spec"].get("nodeName") for i in range(2)]
    assert placed[0] and placed[1] and db_node not in placed


def test_volumes_from_watched_claims_and_volumes():
    api = cluster(2)
    clock = Clock()
    loop = make(api, clock)
    api.add_pod(with_spec(pod("user", ns="ml", gpus=0), volumes=[{"name": "d", "persistentVolumeClaim": {"claimName": "data"}}]))
    run(api, loop, clock)
    assert "ml/user" not in bound(api)
    assert any('persistentvolumeclaim "data" not found' in m for m in messages(api, "ml/user", "FailedScheduling"))
    api.put_object("pv", {"metadata": {"name": "pv1"}, "spec": {"nodeAffinity": {"required": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": HOST, "operator": "In", "values": ["n1"]}]}]}}}})
    api.put_object("pvc", {"metadata": {"name": "data", "namespace": "ml"}, "spec": {"volumeName": "pv1"}})
    run(api, loop, clock)
    assert api.pods["ml/user"]["spec"]["nodeName"] == "n1"


def test_preemption_evicts_the_pod_whose_presence_breaks_anti_affinity_unless_never():
    api = cluster(1)
    clock = Clock()
    loop = make(api, clock)
    api.add_pod(pod("db", ns="ml", labels={"app": "db"}, gpus=0))
    run(api, loop, clock)
    polite = with_spec(pod("polite", ns="ml", labels={"app": "web"}, gpus=0, priority=100), affinity=anti("db"),
                       preemptionPolicy="Never")
    api.add_pod(polite)
    run(api, loop, clock)
    assert not api.evicted and "ml/polite" not in bound(api)
    summary, _ = loop.explain(api.pods["ml/polite"])
    assert "1 node(s) didn't match pod anti-affinity rules" in summary and "preemptionPolicy: Never" in summary
    api.add_pod(with_spec(pod("urgent", ns="ml", labels={"app": "web2"}, gpus=0, priority=100), affinity=anti("db")))
    run(api, loop, clock)
    assert [k for k, _ in api.evicted] == ["ml/db"]


def test_extender_mode_leaves_pod_to_pod_plugins_to_kube_scheduler():
    api = cluster(1)
    loop = SchedulerLoop(api, build_profile("default"), scheduler_name="x", policy_kinds=False, preemption=False,
                         constraint_kinds=False)
    names = {p.name for p in loop.profile.filters} | {p.name for p, _ in loop.profile.scores}
    assert not names & {"InterPodAffinity", "PodTopologySpread", "NodePorts", "VolumeBinding"} and "GpuFit" in names
    # DRA objects are watched (kube-scheduler allocates claims; the extender counts them), DynamicResources is not run
    assert loop.cache.watch_kinds == ["node", "pod", "resourceslice", "deviceclass", "resourceclaim", "resourceclaimtemplate"]
    assert "DynamicResources" not in {p.name for p in loop.profile.filters}


def _wffc_cluster():
    api = cluster(3)
    api.put_object("storageclass", {"metadata": {"name": "local"}, "provisioner": "kubernetes.io/no-provisioner",
                                    "volumeBindingMode": "WaitForFirstConsumer"})
    api.put_object("storageclass", {"metadata": {"name": "csi"}, "provisioner": "disk.csi.example.com",
                                    "volumeBindingMode": "WaitForFirstConsumer"})
    for name, where in (("local-n1", "n1"), ("local-n2", "n2")):
        api.put_object("pv", {"metadata": {"name": name}, "spec": {
            "storageClassName": "local", "capacity": {"storage": "100Gi"}, "accessModes": ["ReadWriteOnce"],
            "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [{"key": HOST, "operator": "In", "values": [where]}]}]}}},
            "status": {"phase": "Available"}})
    return api


def _claim(name, sc):
    return {"metadata": {"name": name, "namespace": "ml", "uid": f"uid-{name}"},
            "spec": {"storageClassName": sc, "accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "10Gi"}}},
            "status": {"phase": "Pending"}}


def _user(name, claim):
    return with_spec(pod(name, ns="ml", gpus=0), volumes=[{"name": "d", "persistentVolumeClaim": {"claimName": claim}}])


def test_wait_for_first_consumer_static_volume_is_bound_then_the_pod():
    api = _wffc_cluster()
    api.put_object("pvc", _claim("scratch", "local"))
    clock = Clock()
    loop = make(api, clock)
    api.add_pod(_user("u", "scratch"))
    run(api, loop, clock, rounds=2)
    # the scheduler chose a node with a free local PV and promised the PV to the claim; the pod waits
    refs = {n: pv["spec"].get("claimRef", {}).get("name") for n, pv in api.objects["pv"].items()}
    chosen = next(n for n, r in refs.items() if r == "scratch")
    assert "ml/u" not in bound(api) and sum(r == "scratch" for r in refs.values()) == 1
    # a second pod with its own claim must not be promised the same PV
    api.put_object("pvc", _claim("scratch2", "local"))
    api.add_pod(_user("u2", "scratch2"))
    run(api, loop, clock, rounds=2)
    refs = {n: pv["spec"].get("claimRef", {}).get("name") for n, pv in api.objects["pv"].items()}
    assert sorted(r for r in refs.values() if r) == ["scratch", "scratch2"]
    # the PV controller binds the claims: then the pods are bound, each on its volume's node
    for n, r in refs.items():
        api.patch_object("pvc", "ml", r, {"spec": {"volumeName": n}, "status": {"phase": "Bound"}})
    run(api, loop, clock, rounds=2)
    assert api.pods["ml/u"]["spec"]["nodeName"] == {"local-n1": "n1", "local-n2": "n2"}[chosen]
    assert {api.pods["ml/u"]["spec"]["nodeName"], api.pods["ml/u2"]["spec"]["nodeName"]} == {"n1", "n2"}


def test_wait_for_first_consumer_provisioning_selects_the_node_and_times_out_cleanly():
    api = _wffc_cluster()
    api.put_object("pvc", _claim("data", "csi"))
    clock = Clock()
    loop = make(api, clock, volume_bind_timeout_s=300)
    api.add_pod(_user("u", "data"))
    run(api, loop, clock, rounds=1)
    node = api.objects["pvc"]["ml/data"]["metadata"]["annotations"]["volume.kubernetes.io/selected-node"]
    assert "ml/u" not in bound(api)
    # the provisioner creates a PV for that node and the claim is bound: the pod follows
    api.put_object("pv", {"metadata": {"name": "pvc-data"}, "spec": {"storageClassName": "csi", "capacity": {"storage": "10Gi"},
                          "csi": {"driver": "disk.csi.example.com", "volumeHandle": "h"},
                          "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [{"key": HOST, "operator": "In", "values": [node]}]}]}}}})
    api.patch_object("pvc", "ml", "data", {"spec": {"volumeName": "pvc-data"}, "status": {"phase": "Bound"}})
    run(api, loop, clock, rounds=2)
    assert api.pods["ml/u"]["spec"]["nodeName"] == node
    # a claim nobody provisions: after the timeout the pod goes back to the queue with a reason, nothing leaks
    api.put_object("pvc", _claim("never", "csi"))
    api.add_pod(_user("w", "never"))
    run(api, loop, clock, rounds=8)  # each round advances the clock 61 s
    assert "ml/w" not in bound(api)
    assert any("timed out after 300 s waiting for PersistentVolumeClaims ml/never" in m for m in messages(api, "ml/w", "FailedScheduling"))
    # on the way out the selected node was taken back (it is set again on the next try)
    log = [(k, t, o) for _, k, t, o in api._log if k == "pvc" and o["metadata"]["name"] == "never"]
    assert any("volume.kubernetes.io/selected-node" not in (o["metadata"].get("annotations") or {}) for _, t, o in log if t == "MODIFIED")
