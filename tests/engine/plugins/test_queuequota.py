"""QueueQuota: admission by team-queue quota at PreFilter (from the request) and Reserve (from the devices)."""

import pytest

from gpufleet.engine.errors import ConfigError
from gpufleet.engine.model import PodRequest
from gpufleet.engine.plugins.queuequota import QueueQuota, register
from gpufleet.engine.queues import Queue
from gpufleet.engine.status import Code

from ...builders import cycle_for
from ..queues.helpers import cluster, gpu_pod
from ..builders import mig_node


@pytest.mark.parametrize("queues, pod, code, words", [
    ([Queue("a", {"gpu_milli": 2000})], gpu_pod("p", n=2, queue="a"), Code.SUCCESS, ""),
    ([Queue("a", {"gpu_milli": 1000}, {"gpu_milli": 0})], gpu_pod("p", n=2, queue="a"), Code.WAIT, "GPU quota 1"),
    ([Queue("a", {"gpu_milli": 1000})], gpu_pod("p", queue="ghost"), Code.UNRESOLVABLE, "queue 'ghost' does not exist"),
    ([Queue("a", {"cpu_milli": 500}, {"cpu_milli": 0})], gpu_pod("p", queue="a"), Code.WAIT, "CPU quota"),
    ([Queue("a", {"gpu_milli": 1000})], gpu_pod("p", n=4), Code.SUCCESS, ""),  # no queue: not limited
])
def test_pre_filter_decides_from_the_request(queues, pod, code, words):
    state, _s, tree = cluster(queues=queues)
    st = QueueQuota(tree).pre_filter(cycle_for(pod), state)
    assert st.code is code, st
    assert words in (st.message or "")
    if code is not Code.SUCCESS:
        assert st.plugin == "QueueQuota"


def test_without_a_tree_it_admits_everything():
    state, _s, _t = cluster()
    qq = QueueQuota()
    assert qq.pre_filter(cycle_for(gpu_pod("p", n=8, queue="a")), state).code is Code.SUCCESS
    assert qq.reserve(cycle_for(gpu_pod("p", n=8, queue="a")), state).code is Code.SUCCESS


def test_gpu_memory_quota_is_exact_at_reserve_and_mig_quota():
    # whole T4s carry 16 GiB each: the request does not say so, the Reserve check does
    q = Queue("mem", {"gpu_memory_mib": 20 * 1024})
    state, s, tree = cluster(queues=[q])
    assert s.schedule(gpu_pod("w0", queue="mem")).ok
    assert tree.used("mem", "gpu_memory_mib") == 16 * 1024
    d = s.schedule(gpu_pod("w1", queue="mem"))
    assert not d.ok and "GPU memory quota 20Gi" in d.status.message
    assert "default/w1" not in state.assignments and tree.used("mem", "gpu_memory_mib") == 16 * 1024
    # MIG instances count per profile
    qm = Queue("mig", {"mig:1g.10gb": 1}, {"mig:1g.10gb": 0})
    state, s, tree = cluster(queues=[qm], nodes=[mig_node("m0")])
    def mig(n):
        return PodRequest(name=n, cpu_milli=100, memory_mib=100, gpu_count=1, gpu_milli=1000, mig_profile="1g.10gb", queue="mig")

    assert s.schedule(mig("m0")).ok
    assert "MIG 1g.10gb quota 1 exhausted" in s.schedule(mig("m1")).status.message


def test_plugin_is_registered_and_built_from_config():
    from gpufleet.policies import registry

    r = registry()
    if "QueueQuota" not in r.names():
        register(r)
    assert "QueueQuota" in r.names()
    with pytest.raises(ConfigError, match="registered twice"):
        register(r)
    prof = r.build_profile({"name": "q", "plugins": {"preFilter": ["QueueQuota"], "reserve": ["QueueQuota"],
                                                     "score": ["MostAllocated"]}})
    assert isinstance(prof.pre_filters[0], QueueQuota) and prof.pre_filters[0] is prof.reserves[0]
    assert prof.pre_filters[0].tree is None  # admits everything until the adapter gives it the queues
