"""Wake-ups by what changed (schedqueue.may_fit_after, kube-scheduler's queueing hints): which waiting pods a
change may let fit, by the plugins that kept each out -- shared by the live queue and the replay."""

from __future__ import annotations

from gpufleet.engine.model import PodRequest
from gpufleet.engine.schedqueue import (COULD_FIT, EVERYTHING, NODES, PODS, ROOM, Change, may_fit_after, requeue_hints,
                                        room_need, room_on, room_only)
from tests.builders import T4, make_node, scheduler


def two_nodes():
    """n0: 1 T4, n1: 4 T4; a 1-GPU pod on n0 and a 4-GPU pod on n1: both full."""
    s = scheduler([make_node("n0", 1, T4), make_node("n1", 4, T4)], "bestfit")
    assert s.schedule(PodRequest("a", cpu_milli=1000, memory_mib=1024, gpu_count=1, gpu_milli=1000)).ok
    assert s.schedule(PodRequest("b", cpu_milli=1000, memory_mib=1024, gpu_count=4, gpu_milli=1000)).ok
    return s


def test_the_engine_names_the_plugins_that_kept_a_pod_out():
    s = two_nodes()
    d = s.schedule(PodRequest("big", cpu_milli=1000, memory_mib=1024, gpu_count=2, gpu_milli=1000))
    assert not d.ok and d.rejected_by == {"GpuFit"}
    d = s.schedule(PodRequest("sel", cpu_milli=1000, gpu_count=1, gpu_milli=1000, node_selector=(("zone", "x"),)))
    assert d.rejected_by == {"NodeAffinity"}


def test_built_in_plugins_say_what_may_lift_their_rejection():
    h = requeue_hints(scheduler([make_node("n0", 1, T4)], "default").profile)
    assert h["GpuFit"] == h["NodeResourcesFit"] == h["NodePorts"] == h[COULD_FIT] == ROOM
    assert h["NodeAffinity"] == h["TaintToleration"] == h["NodeUnschedulable"] == NODES
    assert h["InterPodAffinity"] == h["PodTopologySpread"] == PODS  # cluster-wide counts: any pod leaving
    assert h["CpuReserve"] == h["WholeGpuReserve"] == ROOM


def test_a_pod_kept_out_by_room_wakes_only_when_a_node_it_could_fit_on_gains_room():
    s = two_nodes()
    big = PodRequest("big", cpu_milli=1000, memory_mib=1024, gpu_count=2, gpu_milli=1000)
    h = requeue_hints(s.profile)
    s.forget("default/a")  # n0 has 1 GPU free: not enough
    assert not may_fit_after(Change((0,)), s.state, big, {"GpuFit"}, h)
    assert not room_on(s.state, room_need(big), [0])
    s.forget("default/b")
    assert may_fit_after(Change((1,)), s.state, big, {"GpuFit"}, h)
    assert may_fit_after(EVERYTHING, s.state, big, {"GpuFit"}, h)  # a node added or changed: everyone


def test_cluster_wide_and_node_property_rejections():
    s = two_nodes()
    big = PodRequest("big", cpu_milli=1000, memory_mib=1024, gpu_count=2, gpu_milli=1000)
    h = {"QueueQuota": PODS, "NodeAffinity": NODES, "GpuFit": ROOM}
    assert may_fit_after(Change((0,)), s.state, big, {"QueueQuota"}, h)  # quota usage moved
    assert not may_fit_after(Change((0,)), s.state, big, {"NodeAffinity"}, h)  # a pod leaving changes no label
    assert may_fit_after(Change((0,)), s.state, big, set(), h)  # unknown: wake
    assert may_fit_after(Change((0,)), s.state, big, {"SomethingNew"}, h)  # unnamed plugins count as PODS
    assert not may_fit_after(Change(()), s.state, big, {"QueueQuota"}, h)  # nothing left
    assert room_only({"GpuFit", "NodeAffinity"}, h) and not room_only({"GpuFit", "QueueQuota"}, h) and not room_only(set(), h)
