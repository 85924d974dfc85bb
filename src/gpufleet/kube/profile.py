"""The profile the live scheduler runs, as the mode it runs in needs it (extender mode leaves kube-scheduler's
own pod-to-pod and volume plugins out)."""

from __future__ import annotations

from dataclasses import replace

from ..engine.framework import Profile


# pod-to-pod and volume plugins: in extender mode kube-scheduler runs its own, so gpufleet leaves them out
KUBE_SCHEDULER_HANDLES = ("NodePorts", "VolumeBinding", "NodeVolumeLimits", "InterPodAffinity", "PodTopologySpread",
                          "NodeDeclaredFeatures")


def without_plugins(profile: Profile, names: tuple[str, ...]) -> Profile:
    return replace(profile, filters=[p for p in profile.filters if p.name not in names],
                   scores=[(p, w) for p, w in profile.scores if p.name not in names])
