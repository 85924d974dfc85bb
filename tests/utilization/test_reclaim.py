"""Reclaim decisions against a recorded utilisation series."""

from __future__ import annotations

from gpufleet.utilization.reclaim import NamespacePolicy, PodInfo, decide

NOW = 100_000.0
H = 3600.0


def series(level, hours=2.0, step=60.0, spike_at=None):
    out = [(NOW - hours * H + i * step, level) for i in range(int(hours * H / step) + 1)]
    if spike_at is not None:
        out[spike_at] = (out[spike_at][0], 90.0)
    return out


def test_policies_and_protections():
    pods = [
        PodInfo("research", "idle", 1, NOW - 5 * H),
        PodInfo("research", "busy", 1, NOW - 5 * H),
        PodInfo("research", "young", 1, NOW - 0.5 * H),
        PodInfo("research", "optout", 1, NOW - 5 * H, annotations={"gpufleet.io/reclaim-opt-out": "true"}),
        PodInfo("research", "vip", 1, NOW - 5 * H, priority=2_000_000),
        PodInfo("prod", "idle-warned", 2, NOW - 5 * H, annotations={"gpufleet.io/idle-warning": str(NOW - 2 * H)}),
        PodInfo("prod", "idle-just-warned", 2, NOW - 5 * H, annotations={"gpufleet.io/idle-warning": str(NOW - 600)}),
        PodInfo("prod", "idle-pdb", 1, NOW - 5 * H, annotations={"gpufleet.io/idle-warning": str(NOW - 2 * H)}, pdb_allows=False),
        PodInfo("dev", "idle-report", 0.5, NOW - 5 * H),
        PodInfo("research", "nodata", 1, NOW - 5 * H),
    ]
    util = {f"{p.namespace}/{p.name}": series(1.0) for p in pods if p.name != "nodata"}
    util["research/busy"] = series(1.0, spike_at=100)  # a burst 20 min ago
    pol = {"research": NamespacePolicy("warn"), "prod": NamespacePolicy("evict", grace_s=H), "dev": NamespacePolicy("report")}
    acts = {a.pod: a for a in decide(NOW, pods, util, pol)}
    assert acts["research/idle"].action == "warn" and "holding 1 GPU" in acts["research/idle"].reason
    assert "research/busy" not in acts
    assert acts["research/young"].action == "protect"
    assert acts["research/optout"].action == "protect"
    assert acts["research/vip"].action == "protect"
    assert acts["prod/idle-warned"].action == "evict" and acts["prod/idle-warned"].gpu_hours == 2.0
    assert acts["prod/idle-just-warned"].action == "warn" and "eviction in" in acts["prod/idle-just-warned"].reason
    assert acts["prod/idle-pdb"].action == "protect" and "PodDisruptionBudget" in acts["prod/idle-pdb"].reason
    assert acts["dev/idle-report"].action == "report"
    assert acts["research/nodata"].action == "protect"


def test_partial_data_is_not_enough():
    pods = [PodInfo("a", "p", 1, NOW - 5 * H)]
    acts = decide(NOW, pods, {"a/p": series(0.0, hours=0.3)}, {"a": NamespacePolicy("evict")})
    assert acts[0].action == "protect" and "covers only" in acts[0].reason
